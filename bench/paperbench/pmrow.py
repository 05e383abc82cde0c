"""The PostMark rows: the HyCache paper's sweep (Fig. 11-12: the data set from 0.5x to 2x
the fast tier) and PostMark's small default-like set of issue 31.  Each run is a process of
its own (postmark.py) in a memory-limited cgroup v1 memory controller, after drop_caches:
the page cache it fills is charged to that cgroup, so it cannot hold the set (the daemons
of the FUSE targets run outside it: their own memory is theirs, as on a user's machine)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hycache_harness import drop_caches

from .rows import Tick, rotated
from .targets import Target

MEMCG = Path("/sys/fs/cgroup/memory")
SCRIPT = Path(__file__).with_name("postmark.py")
SWEEP_LO, SWEEP_HI, SWEEP_BLOCK = 16 << 10, 1 << 20, 64 << 10


class MemCgroup:
    """A child of the memory hierarchy's root with a hard limit; ``run`` starts a process in it."""

    def __init__(self, limit: int) -> None:
        self.path = MEMCG / f"papers-bench-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        (self.path / "memory.limit_in_bytes").write_text(f"{limit}\n")
        self.limit = limit

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=enter)

    def close(self) -> None:
        try:
            (self.path / "memory.force_empty").write_text("0\n")
        except OSError:
            pass
        try:
            self.path.rmdir()
        except OSError as e:
            print(f"papers: could not remove {self.path}: {e}")


def postmark(cg: MemCgroup, t: Target, files: int, transactions: int, lo: int, hi: int, block: int) -> dict:
    d = t.dir / "postmark"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    drop_caches()
    argv = [sys.executable, str(SCRIPT), str(d), "--files", str(files), "--transactions", str(transactions),
            "--lo", str(lo), "--hi", str(hi), "--block", str(block)]
    out = cg.run(argv, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"postmark on {t.name} failed: {out.stderr[-1500:]}")
    shutil.rmtree(d, ignore_errors=True)
    return json.loads(out.stdout)


def sweep_row(targets: list[Target], fast_bytes: int, factors: list[float], cg: MemCgroup, tick: Tick) -> dict:
    """PostMark with files of 16 KiB - 1 MiB, the set ``factor`` x the fast tier, as many
    transactions as files."""
    out: dict = {t.name: {} for t in targets}
    mean = (SWEEP_LO + SWEEP_HI) // 2
    for i, factor in enumerate(factors):
        files = max(10, int(factor * fast_bytes / mean))
        for t in rotated(targets, i):
            r = postmark(cg, t, files, files, SWEEP_LO, SWEEP_HI, SWEEP_BLOCK)
            out[t.name][f"{factor:g}"] = {**r, "files": files, "set_mb": files * mean / 1e6}
            tick(f"postmark {factor:g}x {t.name}")
    return out


def small_row(targets: list[Target], files: int, transactions: int, cg: MemCgroup, tick: Tick) -> dict:
    """PostMark's small-file set (512 B - 16 KiB), issue 31's first row."""
    out: dict = {}
    for t in rotated(targets, 3):
        out[t.name] = {**postmark(cg, t, files, transactions, 512, 16 << 10, 4096), "files": files}
        tick(f"postmark small {t.name}")
    return out

"""The PostMark rows: the HyCache paper's sweep (Fig. 11-12: the data set from 0.5x to 2x
the fast tier) and PostMark's small default-like set of issue 31.  Each run is a process of
its own (postmark.py --drop-caches) started after drop_caches, which syncs each phase
(timed) and drops the page cache between its phases (not timed): the transactions' reads
of the created files reach the tiers.  (A memory-limited cgroup v1 for the process was
tried first: at 1 GiB of writes to the HDD model its dirty pages outran the write-back and
the cgroup's OOM killer ended it; cgroup v1 has no per-cgroup dirty throttling.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from hycache_harness import drop_caches

from .rows import Tick, rotated
from .targets import Target

SCRIPT = Path(__file__).with_name("postmark.py")
CACHES = ("drop_caches before each run; inside it, each phase synced (timed) and the page cache dropped "
          "between phases (not timed)")
SWEEP_LO, SWEEP_HI, SWEEP_BLOCK = 16 << 10, 1 << 20, 64 << 10


def postmark(t: Target, files: int, transactions: int, lo: int, hi: int, block: int) -> dict:
    d = t.dir / "postmark"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    drop_caches()
    argv = [sys.executable, str(SCRIPT), str(d), "--files", str(files), "--transactions", str(transactions),
            "--lo", str(lo), "--hi", str(hi), "--block", str(block), "--drop-caches"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"postmark on {t.name} failed: {out.stderr[-1500:]}")
    shutil.rmtree(d, ignore_errors=True)
    return json.loads(out.stdout)


def sweep_row(targets: list[Target], fast_bytes: int, factors: list[float], tick: Tick) -> dict:
    """PostMark with files of 16 KiB - 1 MiB, the set ``factor`` x the fast tier, as many
    transactions as files."""
    out: dict = {t.name: {} for t in targets}
    mean = (SWEEP_LO + SWEEP_HI) // 2
    for i, factor in enumerate(factors):
        files = max(10, int(factor * fast_bytes / mean))
        for t in rotated(targets, i):
            r = postmark(t, files, files, SWEEP_LO, SWEEP_HI, SWEEP_BLOCK)
            out[t.name][f"{factor:g}"] = {**r, "files": files, "set_mb": files * mean / 1e6}
            tick(f"postmark {factor:g}x {t.name}")
    return out


def small_row(targets: list[Target], files: int, transactions: int, tick: Tick) -> dict:
    """PostMark's small-file set (512 B - 16 KiB), issue 31's first row."""
    out: dict = {}
    for t in rotated(targets, 3):
        out[t.name] = {**postmark(t, files, transactions, 512, 16 << 10, 4096), "files": files}
        tick(f"postmark small {t.name}")
    return out

"""The fio rows of the papers' matrix.  Every timed job starts after ``drop_caches``
(``sync; echo 3 > /proc/sys/vm/drop_caches``: nothing a previous job read or wrote is in
the page cache); writes end with ``end_fsync=1`` (the write-back is inside the time);
random reads use O_DIRECT (each read reaches the file system's tier, not the page cache);
every other read reads each byte once.  Targets take turns within a row, the order
rotated at each step, so background load from other processes hits them alike."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from hycache_harness import drop_caches

from .targets import Target

Tick = Callable[[str], None]
CACHES = {
    "seq": "caches dropped before each job; buffered I/O (IOzone's default); writes end with fsync",
    "iops": "caches dropped before each job; writes buffered + fsync at the end (Table 2: random writes); "
            "reads O_DIRECT",
    "aggregate": "caches dropped before each job; buffered reads, each byte read once",
    "cold": "caches dropped after the demotion; buffered 1 MiB reads; the HDD model's counters show the bytes "
            "came from the slow device",
}


def fio(directory: Path, rw: str, bs: str, size: str, *extra: str, jobs: int = 1, name: str = "f") -> dict:
    """One fio run (``jobs`` processes, job i on file ``name``.i of ``size``): MB/s and IOPS
    summed over the jobs, and the wall seconds."""
    argv = ["fio", f"--name={name}", f"--directory={directory}", f"--filename_format={name}.$jobnum",
            f"--rw={rw}", f"--bs={bs}", f"--size={size}", f"--numjobs={jobs}", "--group_reporting",
            "--ioengine=psync", "--fallocate=none", "--output-format=json", *extra]
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"fio failed ({out.returncode}): {' '.join(argv)}\n{out.stderr[-1500:]}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"mbps": side["bw_bytes"] / 1e6, "iops": side["iops"], "seconds": wall}


def rotated(xs: list, k: int) -> list:
    k %= max(1, len(xs))
    return xs[k:] + xs[:k]


def clear(t: Target) -> None:
    """Remove a row's files from a target (so the next row starts on an empty fast tier)."""
    for p in t.dir.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def seq_row(targets: list[Target], sizes: list[str], file_size: str, tick: Tick) -> dict:
    """IOzone-style sequential write then read of one file of ``file_size`` at each block size."""
    out: dict = {t.name: {"write": {}, "read": {}} for t in targets}
    for i, bs in enumerate(sizes):
        for t in rotated(targets, i):
            (t.dir / "seq.0").unlink(missing_ok=True)
            drop_caches()
            out[t.name]["write"][bs] = fio(t.dir, "write", bs, file_size, "--end_fsync=1", name="seq")["mbps"]
            drop_caches()
            out[t.name]["read"][bs] = fio(t.dir, "read", bs, file_size, name="seq")["mbps"]
            tick(f"seq {bs} {t.name}")
    for t in targets:
        clear(t)
    return out


def iops_row(targets: list[Target], ios: int, runtime: int, file_size: str, tick: Tick) -> dict:
    """4 KiB random IOPS, 4 jobs on 4 files of ``file_size``: ``ios`` random writes per job
    then fsync (the papers' Table 2), and O_DIRECT random reads for ``runtime`` s."""
    out: dict = {}
    for t in targets:
        fio(t.dir, "write", "1M", file_size, "--end_fsync=1", jobs=4, name="rnd")  # the files, untimed
    for t in rotated(targets, 1):
        drop_caches()
        w = fio(t.dir, "randwrite", "4k", file_size, f"--number_ios={ios}", "--end_fsync=1", jobs=4, name="rnd")
        drop_caches()
        r = fio(t.dir, "randread", "4k", file_size, "--direct=1", "--time_based", f"--runtime={runtime}",
                jobs=4, name="rnd")
        # fio's write IOPS: its job time includes the end_fsync (the HDD's ~200 shows it);
        # the wall-clock rate adds fio's start-up, tens of ms
        out[t.name] = {"randwrite": w["iops"], "randwrite_wall": 4 * ios / w["seconds"], "randread": r["iops"]}
        tick(f"iops {t.name}")
        clear(t)
    return out


def aggregate_row(targets: list[Target], counts: list[int], file_size: str, tick: Tick) -> dict:
    """Aggregate read bandwidth of 1..N processes, each reading its own file, at 4 KiB and 64 KiB."""
    out: dict = {t.name: {"4k": {}, "64k": {}} for t in targets}
    for t in targets:
        fio(t.dir, "write", "1M", file_size, "--end_fsync=1", jobs=max(counts), name="agg")  # untimed
    step = 0
    for bs in ("4k", "64k"):
        for n in counts:
            for t in rotated(targets, step):
                drop_caches()
                out[t.name][bs][str(n)] = fio(t.dir, "read", bs, file_size, jobs=n, name="agg")["mbps"]
                tick(f"aggregate {bs} x{n} {t.name}")
            step += 1
    for t in targets:
        clear(t)
    return out


def cold_row(targets: list[Target], file_size: str, tick: Tick) -> dict:
    """Read a file whose bytes are only on the slow tier (demoted / evicted / moved)."""
    out: dict = {}
    for t in targets:
        fio(t.dir, "write", "1M", file_size, "--end_fsync=1", name="cold")
    for t in rotated(targets, 2):
        path = t.dir / "cold.0"
        t.make_cold(path)
        drop_caches()
        r0 = t.slow_bytes()[0]
        r = fio(t.dir, "read", "1M", file_size, name="cold")
        out[t.name] = {"mbps": r["mbps"], "slow_read_mb": (t.slow_bytes()[0] - r0) / 1e6}
        tick(f"cold {t.name}")
        clear(t)
    return out

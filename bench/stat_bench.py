"""How fast a FUSE server answers the simplest request: GETATTR of a file it knows, asked by
1 and by 4 processes at once (issue 33; the transport of ``--fuse-uring``).

Each caller stats its own files round and round with ``statx(AT_STATX_FORCE_SYNC)`` (what
``stat --cached=never`` does), so every call is a GETATTR whatever the kernel caches; the
rate is calls per second over the run, summed over the callers.  Printed per target, beside
mergerfs in the same run; a script with printed results, not a test:

    python bench/stat_bench.py                               # hycache (rings), hycache off, mergerfs
    python bench/stat_bench.py --callers 1,4,8 --seconds 5 --rounds 5

Targets: ``hycache-dht`` (the agent's defaults: io_uring where the kernel has it),
``hycache-dht`` again with ``--fuse-uring off`` (requests read from /dev/fuse by the reader
thread), ``mergerfs`` (fs_bench.py's options).  Each is its own run of fs_bench's target (one
mount at a time).  The callers are Python processes: ~1 µs of each call is theirs."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fs_bench

AT_FDCWD = -100
AT_STATX_FORCE_SYNC = 0x2000
STATX_BASIC_STATS = 0x7FF


def _caller(paths: list[bytes], start: float, seconds: float, out: mp.Queue) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buf = ctypes.create_string_buffer(256)
    statx = libc.statx
    n = 0
    while time.monotonic() < start:
        pass
    end = start + seconds
    while True:
        for p in paths:
            if statx(AT_FDCWD, p, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, buf) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), p.decode())
        n += len(paths)
        if time.monotonic() >= end:
            break
    out.put((n, time.monotonic() - start))


def rate(directory: Path, callers: int, files: int, seconds: float) -> float:
    """GETATTRs per second of ``callers`` processes, each over its own ``files`` files."""
    sets = []
    for c in range(callers):
        d = directory / f"c{c}"
        d.mkdir(exist_ok=True)
        paths = []
        for i in range(files):
            p = d / f"f{i}"
            if not p.exists():
                p.write_bytes(b"x" * 100)
            paths.append(bytes(p))
        sets.append(paths)
    out: mp.Queue = mp.Queue()
    start = time.monotonic() + 0.3
    procs = [mp.Process(target=_caller, args=(s, start, seconds, out)) for s in sets]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return sum(n for n, _ in results) / max(t for _, t in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", default="1,4", help="caller counts (default 1,4)")
    ap.add_argument("--files", type=int, default=1000, help="files per caller (default 1000)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one measurement (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per target and caller count; "
                    "the median is printed with the range (default 3)")
    ap.add_argument("--targets", default="hycache-dht,hycache-dht:--fuse-uring off,mergerfs",
                    help="fs_bench targets, each optionally NAME:AGENT FLAGS; comma-separated")
    args = ap.parse_args()
    callers = [int(c) for c in args.callers.split(",")]
    print(f"{'target':36} " + " ".join(f"{f'{c} caller(s)/s':>30}" for c in callers), flush=True)
    for spec in args.targets.split(","):
        name, _, flags = spec.partition(":")
        with tempfile.TemporaryDirectory(prefix="stat-bench-") as tmp:
            work = Path(tmp)
            cluster = fs_bench.Cluster(work) if name in fs_bench.DHT_TARGETS else None
            if cluster is not None:
                cluster.start()
            target = fs_bench.Target(name, work / "t", agent_args=tuple(flags.split()))
            try:
                target.start(cluster)
                assert target.path is not None
                cells = []
                for c in callers:
                    rates = [rate(target.path, c, args.files, args.seconds) for _ in range(args.rounds)]
                    cells.append(f"{statistics.median(rates):>10,.0f} ({min(rates):,.0f}–{max(rates):,.0f})")
                print(f"{spec:36} " + " ".join(f"{cell:>30}" for cell in cells), flush=True)
            finally:
                target.stop()
                if cluster is not None:
                    cluster.stop()


if __name__ == "__main__":
    main()

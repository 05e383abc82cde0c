"""The small-file serving workload of bench/fs_bench.py (issue 17): a directory of files
with a web-like size mix, read whole (open + read + close) by several reader processes
following one popularity-skewed request trace, as a web server's static files are.

* Files: ``--serve-files`` of them (default 1,250) in 16 subdirectories; sizes drawn from
  a log-normal around 8 KiB (sigma 1.5), clipped to 128 B – 2 MiB: most under 64 KiB,
  about 3 % above 256 KiB — the shape of a web server's static content.
* Trace: ``--serve-requests`` requests (default 10,000), file i requested with a
  probability proportional to 1 / (i + 1) (Zipf, s = 1): a few hot files, a long tail
  that is read once or twice.
* Readers: the trace is dealt round-robin to N processes, released together at a barrier;
  each request is open(O_RDONLY) + read(256 KiB) until EOF + close, timed on its own.

Reported per row: the mean and the 99th percentile of one request (ms) and the MB/s of
the whole trace (bytes / wall time of the slowest reader).  Pure functions and the worker;
fs_bench.py mounts, drops caches and rotates the targets."""

from __future__ import annotations

import math
import os
import random
import time

CHUNK = 256 << 10


def sizes(n: int, seed: int = 17) -> list[int]:
    rnd = random.Random(seed)
    return [min(2 << 20, max(128, int(rnd.lognormvariate(math.log(8 << 10), 1.5)))) for _ in range(n)]


def names(n: int) -> list[str]:
    return [f"d{i % 16:02d}/f{i:05d}.bin" for i in range(n)]


def make_tree(directory: str, n: int, seed: int = 17) -> int:
    """Write the n files; returns their total bytes."""
    total = 0
    for d in range(min(16, n)):
        os.makedirs(os.path.join(directory, f"d{d:02d}"), exist_ok=True)
    rnd = random.Random(seed + 1)
    for name, size in zip(names(n), sizes(n, seed)):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(rnd.randbytes(size))
        total += size
    return total


def trace(n_files: int, n_requests: int, seed: int = 17) -> list[int]:
    rnd = random.Random(seed + 2)
    weights = [1.0 / (i + 1) for i in range(n_files)]
    order = list(range(n_files))
    rnd.shuffle(order)  # popularity is not alphabetical
    return [order[i] for i in rnd.choices(range(n_files), weights=weights, k=n_requests)]


def serve(directory: str, requests: list[int], n_files: int) -> tuple[list[float], int, float]:
    """Serve ``requests`` (file indexes): per-request seconds, bytes read, wall seconds."""
    paths = [os.path.join(directory, name) for name in names(n_files)]
    lat: list[float] = []
    nbytes = 0
    t_start = time.perf_counter()
    for i in requests:
        t0 = time.perf_counter()
        fd = os.open(paths[i], os.O_RDONLY)
        try:
            while True:
                b = os.read(fd, CHUNK)
                if not b:
                    break
                nbytes += len(b)
        finally:
            os.close(fd)
        lat.append(time.perf_counter() - t0)
    return lat, nbytes, time.perf_counter() - t_start


def summary(latencies: list[float], nbytes: int, wall: float) -> dict[str, float]:
    xs = sorted(latencies)
    p99 = xs[min(len(xs) - 1, int(math.ceil(0.99 * len(xs))) - 1)] if xs else 0.0
    return {"mean_ms": 1000 * sum(xs) / max(1, len(xs)), "p99_ms": 1000 * p99,
            "mb_s": nbytes / 1e6 / wall if wall > 0 else 0.0}

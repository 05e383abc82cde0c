#!/usr/bin/env python3
"""HCCache benchmark: a web-server-like trace replayed through hybrid and block mode.

Two agents on a real Redis Cluster (started here): a holder ``x`` writes the files, a
reader ``y`` replays the trace through its mount, so every read is a real remote read
(range requests to ``x`` over the peer service) through ``y``'s HCCache.  The reader is
started fresh (cold cache) for each mode with the same cache size and block size; the
same trace runs in both.

The trace (fixed seed): ``--small`` small files (sizes log-normal, 1 KiB–250 KiB, a tenth
of them duplicates of others' content) and ``--large`` large files, Zipf popularity; each
request reads one whole file (open, read in 32 KiB chunks, close: a web server sending a
file); ``--readers`` threads replay their own sub-traces concurrently (the paper's cores).
The kernel's page cache does not help: remote files are opened without keep_cache.

Printed per mode: small-file mean latency and aggregate bandwidth, large-file
throughput, and the cache's hit ratio, byte hit ratio, ABD, ECDAL, ECDAB, dedup savings
(from ``hycache-agent status --json``).  Compare with the paper's +34.2 % bandwidth and
-6.1 % latency for small files.

Modes: ``hybrid`` (HCCache with the fast-tier second level for small files, the agent's
default), ``hybrid-mem`` (memory only, as in the paper), ``block`` (BICache, the baseline).

Usage: bench/hccache_bench.py [--small 600] [--large 4] [--requests 4000] [--readers 8]
       [--cache 24M] [--block 32K] [--large-share 0.01] [--modes hybrid,hybrid-mem,block]
       [--json FILE] [--plot FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from hycache_core.sizes import format_size, parse_size
from hycache_harness import Agent, cluster_secret, redis_seeds, start_redis_cluster

SMALL_LIMIT = 256 << 10


def make_files(n_small: int, n_large: int, large_size: int, rnd: random.Random) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    contents: list[bytes] = []
    for i in range(n_small):
        if contents and rnd.random() < 0.1:
            data = rnd.choice(contents)  # the same picture under another name
        else:
            size = int(min(250 << 10, max(1 << 10, rnd.lognormvariate(10.2, 1.0))))
            data = rnd.randbytes(size)
            contents.append(data)
        files[f"www/s{i:05d}.dat"] = data
    for i in range(n_large):
        files[f"www/L{i:02d}.bin"] = rnd.randbytes(large_size)
    return files


def make_trace(names: list[str], requests: int, readers: int, rnd: random.Random,
               large_share: float) -> list[list[str]]:
    """Zipf(0.9) popularity over a shuffled order; large files get a fixed small share."""
    small = [n for n in names if "/s" in n]
    large = [n for n in names if "/L" in n]
    rnd.shuffle(small)
    weights = [1 / (i + 1) ** 0.9 for i in range(len(small))]
    trace = []
    for _ in range(requests):
        if large and rnd.random() < large_share:
            trace.append(rnd.choice(large))
        else:
            trace.append(rnd.choices(small, weights)[0])
    return [trace[i::readers] for i in range(readers)]


def replay(mnt: Path, subtraces: list[list[str]]) -> dict:
    results: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    errors: list[str] = []

    def worker(sub: list[str]) -> None:
        local = []
        for name in sub:
            t0 = time.perf_counter()
            n = 0
            try:
                with open(mnt / name, "rb", buffering=0) as f:
                    while chunk := f.read(32 << 10):
                        n += len(chunk)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
                continue
            local.append((name, n, time.perf_counter() - t0))
        with lock:
            results.extend(local)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(s,)) for s in subtraces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    small = [(n, lat) for name, n, lat in results if n < SMALL_LIMIT and "/s" in name]
    large = [(n, lat) for name, n, lat in results if "/L" in name]
    return {
        "elapsed_s": elapsed,
        "errors": len(errors),
        "small_requests": len(small),
        "small_latency_ms": 1000 * statistics.mean(lat for _, lat in small) if small else None,
        "small_p99_ms": 1000 * sorted(lat for _, lat in small)[int(0.99 * (len(small) - 1))] if small else None,
        "small_bandwidth_MBps": sum(n for n, _ in small) / 1e6 / elapsed,
        "large_requests": len(large),
        "large_throughput_MBps": (sum(n for n, _ in large) / 1e6 / sum(lat for _, lat in large)) if large else None,
        "aggregate_MBps": sum(n for _, n, _ in results) / 1e6 / elapsed,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=600, help="small files (default 600)")
    p.add_argument("--large", type=int, default=4, help="large files (default 4)")
    p.add_argument("--large-size", default="8M", help="size of each large file (default 8M)")
    p.add_argument("--requests", type=int, default=4000, help="requests in the trace (default 4000)")
    p.add_argument("--readers", type=int, default=8, help="concurrent readers (default 8)")
    p.add_argument("--cache", default="24M", help="--hccache-size of the reader (default 24M)")
    p.add_argument("--block", default="32K", help="--hccache-block-size (default 32K, the paper's)")
    p.add_argument("--large-share", type=float, default=0.01, help="fraction of requests for large files (0.01)")
    p.add_argument("--modes", default="hybrid,hybrid-mem,block",
                   help="hybrid (with the fast-tier second level), hybrid-mem (memory only), block (BICache)")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    a = p.parse_args()
    if os.geteuid() != 0:
        print("hccache_bench: needs root (FUSE mounts)", file=sys.stderr)
        return 2
    for field in ("cache", "block", "large_size"):
        try:
            parse_size(getattr(a, field))
        except ValueError as exc:
            print(f"hccache_bench: --{field.replace('_', '-')}: {exc}", file=sys.stderr)
            return 2
    rnd = random.Random(a.seed)
    files = make_files(a.small, a.large, parse_size(a.large_size), rnd)
    subtraces = make_trace(sorted(files), a.requests, a.readers, rnd, a.large_share)
    small_bytes = sum(len(d) for n, d in files.items() if "/s" in n)
    print(f"{a.small} small files ({format_size(small_bytes)}), {a.large} large files of {a.large_size}; "
          f"{a.requests} requests by {a.readers} readers; cache {a.cache}, block {a.block}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="hycache-hccbench-"))
    secret = cluster_secret(work / "secret")
    cluster = start_redis_cluster(work / "redis", start=40000, stop=44000)
    redis = redis_seeds(cluster.nodes)
    namespace = f"hccbench-{os.getpid()}"
    rows = []
    try:
        def agent(name: str, *extra: str) -> Agent:
            return Agent(work / name, name, "--rebalance-interval", "0", *extra, redis=redis, secret=secret,
                         namespace=namespace).start()

        x = agent("x", "--hccache-size", "0")
        try:
            (x.mnt / "www").mkdir()
            for name, data in files.items():
                (x.mnt / name).write_bytes(data)
            while x.status()["cluster"]["backlog"]:
                time.sleep(0.2)
            time.sleep(1.5)
            for mode in a.modes.split(","):
                extra = ["--no-hccache-second-level"] if mode == "hybrid-mem" else []
                y = agent(f"y-{mode}", "--hccache-size", a.cache, "--hccache-mode", mode.split("-")[0],
                          "--hccache-block-size", a.block, *extra)
                try:
                    deadline = time.monotonic() + 30
                    while not (y.mnt / "www").exists() and time.monotonic() < deadline:
                        time.sleep(0.2)
                    row = {"mode": mode, **replay(y.mnt, subtraces)}
                    hc = y.status()["hccache"]
                    row.update({k: hc[k] for k in ("hit_ratio", "byte_hit_ratio", "abd", "ecdal", "ecdab",
                                                   "memory_bytes", "limit_bytes", "dedup_saved_bytes",
                                                   "cas_lookups", "block_fetches", "object_fetches",
                                                   "second_level_hits", "fetched_bytes", "evictions")})
                finally:
                    y.stop()
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            x.stop()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    by_mode = {r["mode"]: r for r in rows}
    if "block" in by_mode and len(rows) > 1:
        b = by_mode["block"]
        others = [r for r in rows if r is not b]
        fmt = {"small_latency_ms": "{:.2f}", "small_p99_ms": "{:.2f}", "small_bandwidth_MBps": "{:.1f}",
               "large_throughput_MBps": "{:.1f}", "aggregate_MBps": "{:.1f}", "hit_ratio": "{:.3f}",
               "byte_hit_ratio": "{:.3f}", "abd": "{:.2f}", "ecdal": "{:.3e}", "ecdab": "{:.3e}",
               "fetched_bytes": "{:.0f}", "dedup_saved_bytes": "{:.0f}"}
        print(f"\n{'metric':24s}" + "".join(f"{r['mode']:>12s}" for r in rows)
              + "".join(f"{r['mode'] + ' vs block':>22s}" for r in others))
        for k, f in fmt.items():
            line = f"{k:24s}" + "".join(f"{f.format(r[k]) if r.get(k) is not None else '-':>12s}" for r in rows)
            for r in others:
                hv, bv = r.get(k), b.get(k)
                line += f"{(f'{100 * (hv - bv) / bv:+.1f} %' if hv is not None and bv else '-'):>22s}"
            print(line)
        print("paper (httpd trace, simulated): small-file bandwidth +34.2 %, latency -6.1 %")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    if a.plot and rows:
        plot(rows, a.plot)
        print(f"plot written to {a.plot}")
    return 0


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("small_latency_ms", "small-file latency (ms)"), ("small_bandwidth_MBps", "small-file MB/s"),
               ("large_throughput_MBps", "large-file MB/s"), ("hit_ratio", "hit ratio"),
               ("byte_hit_ratio", "byte hit ratio"), ("abd", "ABD (blocks)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3 * len(metrics), 3.2))
    for ax, (k, title) in zip(axes, metrics):
        vals = [r.get(k) or 0 for r in rows]
        ax.bar([r["mode"] for r in rows], vals, color=["tab:blue", "tab:green", "tab:orange"][:len(rows)])
        ax.set_title(title, fontsize=9)
    fig.suptitle("HCCache: hybrid vs block (BICache), real remote reads between two agents")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Global-namespace benchmark: metadata operations through the mount with the DHT on and
off, with 1, 2 and 4 agents, against raw ``redis-benchmark`` on the same Redis Cluster,
and cross-node read throughput against a local read.

For every agent count N: N agents (each with its own root and mount, all joined to one
local Redis Cluster) and N client processes, each creating/stat-ing files in its own
agent's mount.  The standalone row runs one agent without --redis.

Then write takeover: node y appends to a file node x holds (y fetches the bytes once and
becomes the primary), once for a file y never read and once for one y had just read (its
cached copy becomes the local file: nothing crosses the network).

Usage: bench/cluster_bench.py [--files 2000] [--agents 1,2,4] [--read-size 256M] [--json FILE]
                              [--plot FILE.png]
Needs root (FUSE mounts, drop_caches).  Prints a table; writes nothing else unless --json/--plot.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hycache_core.sizes import parse_size
from hycache_dht.localcluster import LocalRedisCluster
from hycache_harness import Agent, cluster_secret, drop_caches, redis_seeds, start_redis_cluster

REPO = Path(__file__).resolve().parent.parent


def _client(args) -> tuple[float, float]:
    directory, n = args
    os.makedirs(directory, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{directory}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
    t1 = time.perf_counter()
    for i in range(n):
        os.stat(f"{directory}/f{i}")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def metadata_run(agents: list[Agent], files: int) -> dict:
    jobs = [(str(a.mnt / f"client{i}"), files) for i, a in enumerate(agents)]
    with multiprocessing.Pool(len(jobs)) as pool:
        t0 = time.perf_counter()
        try:
            results = pool.map(_client, jobs)
        except OSError:
            for a in agents:
                tail = a.log_tail().splitlines()[-30:]
                print(f"--- {a.logfile} ---", *tail, sep="\n", file=sys.stderr)
            raise
        wall = time.perf_counter() - t0
    total = files * len(agents)
    create = max(r[0] for r in results)
    stat = max(r[1] for r in results)
    t_pub = time.perf_counter()
    while any(a.backlog() for a in agents):  # until every create reached the DHT
        if time.perf_counter() - t_pub > 300:
            raise SystemExit("the agents' outboxes did not drain within 300 s")
        time.sleep(0.1)
    published = time.perf_counter() - t_pub
    return {"agents": len(agents), "files": total, "creates_per_s": total / create, "stats_per_s": total / stat,
            "wall_s": wall, "publish_tail_s": published}


def redis_benchmark(cluster: LocalRedisCluster) -> dict:
    host, port = cluster.nodes[0]
    out = subprocess.run(["redis-benchmark", "-h", host, "-p", str(port), "--cluster", "-t", "set,get",
                          "-n", "100000", "-c", "50", "-q"], capture_output=True, text=True, timeout=300)
    res = {}
    for line in out.stdout.replace("\r", "\n").splitlines():
        if ":" in line and "requests per second" in line:
            name, _, rest = line.partition(":")
            res[name.strip()] = float(rest.split()[0])
    return res


def read_mbps(path: Path) -> float:
    drop_caches()
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n / (time.perf_counter() - t0) / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=2000, help="files per client (default 2000)")
    p.add_argument("--agents", default="1,2,4")
    p.add_argument("--read-size", default="256M")
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="write a PNG of the results")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("cluster_bench: needs root", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hycache-clbench-"))
    secret = cluster_secret(work / "secret")
    cluster = start_redis_cluster(work / "redis", start=36000, stop=40000)
    redis = redis_seeds(cluster.nodes)
    namespace = f"bench-{os.getpid()}"
    rows = []
    try:
        ceiling = redis_benchmark(cluster)
        print("redis-benchmark (C, 50 connections, the ceiling):", ceiling, flush=True)
        rows.append({"mode": "redis-benchmark", **ceiling})
        agent = Agent(work / "standalone" / "solo", "solo").start()
        try:
            rows.append({"mode": "standalone", **metadata_run([agent], a.files)})
        finally:
            agent.stop()
        for n in [int(x) for x in a.agents.split(",")]:
            agents = []
            try:
                for i in range(n):
                    agents.append(Agent(work / f"dht{n}" / f"n{i}", f"n{i}", redis=redis, secret=secret,
                                        namespace=namespace).start())
                rows.append({"mode": "dht", **metadata_run(agents, a.files)})
            finally:
                for ag in agents:
                    ag.stop()
        for r in rows[1:]:
            print(f"{r['mode']:10s} agents {r['agents']}  creates/s {r['creates_per_s']:8.0f}  "
                  f"stats/s {r['stats_per_s']:8.0f}  (publication finished {r['publish_tail_s']:.2f} s after "
                  f"the last create)", flush=True)
        size = parse_size(a.read_size)
        x = Agent(work / "read" / "x", "x", redis=redis, secret=secret, namespace=namespace).start()
        y = None
        try:
            y = Agent(work / "read" / "y", "y", redis=redis, secret=secret, namespace=namespace).start()
            path = x.mnt / "big.bin"
            with open(path, "wb") as f:
                block = os.urandom(1 << 20)
                for _ in range(size // (1 << 20)):
                    f.write(block)
            while x.backlog():
                time.sleep(0.1)
            time.sleep(1.2)
            local = read_mbps(path)
            remote_first = read_mbps(y.mnt / "big.bin")  # fetched from x through the peer service
            remote_cached = read_mbps(y.mnt / "big.bin")  # y's local copy
            print(f"read {a.read_size}: local {local:.0f} MB/s, cross-node first read {remote_first:.0f} MB/s, "
                  f"cross-node again (cached copy) {remote_cached:.0f} MB/s", flush=True)
            rows.append({"mode": "read", "size": size, "local_MBps": local, "remote_first_MBps": remote_first,
                         "remote_cached_MBps": remote_cached})
            with open(x.mnt / "fresh.bin", "wb") as f:
                for _ in range(size // (1 << 20)):
                    f.write(block)
            while x.backlog():
                time.sleep(0.1)
            time.sleep(1.2)
            drop_caches()
            fresh = takeover_seconds(y.mnt / "fresh.bin")
            cached = takeover_seconds(y.mnt / "big.bin")  # y read it above: its copy is reused
            print(f"takeover of a {a.read_size} file: {fresh:.2f} s ({size / fresh / 1e6:.0f} MB/s) fetching it, "
                  f"{cached:.3f} s when the reader's cached copy is current", flush=True)
            rows.append({"mode": "takeover", "size": size, "fetch_s": fresh, "cached_s": cached})
        finally:
            x.stop()
            if y is not None:
                y.stop()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    if a.plot:
        plot(rows, a.plot)
        print(f"plot written to {a.plot}")
    return 0


def takeover_seconds(path: Path) -> float:
    """Open another node's file for appending (the takeover) and write one byte."""
    t0 = time.perf_counter()
    with open(path, "ab") as f:
        f.write(b"!")
    return time.perf_counter() - t0


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = [r for r in rows if r["mode"] in ("standalone", "dht")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    labels = ["standalone" if r["mode"] == "standalone" else f"DHT, {r['agents']} agent{'s' * (r['agents'] > 1)}"
              for r in meta]
    xs = range(len(meta))
    ax1.bar([x - 0.2 for x in xs], [r["creates_per_s"] for r in meta], 0.4, label="creates/s (all clients)")
    ax1.bar([x + 0.2 for x in xs], [r["stats_per_s"] for r in meta], 0.4, label="stats/s (all clients)")
    ceiling = next((r for r in rows if r["mode"] == "redis-benchmark"), {})
    if ceiling.get("SET"):
        ax1.axhline(ceiling["SET"], color="grey", ls="--", lw=1, label=f"redis-benchmark SET {ceiling['SET']:.0f}/s")
    ax1.axhline(10_000, color="red", ls=":", lw=1, label="target: 10k creates/s per agent")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("operations / s")
    ax1.set_yscale("log")
    ax1.set_title("metadata through the mount")
    ax1.legend(fontsize=8)
    read = next((r for r in rows if r["mode"] == "read"), None)
    if read:
        names = ["local", "cross-node\n1st read", "cross-node\ncached"]
        vals = [read["local_MBps"], read["remote_first_MBps"], read["remote_cached_MBps"]]
        take = next((r for r in rows if r["mode"] == "takeover"), None)
        if take:
            names.append("takeover\n(fetch)")
            vals.append(take["size"] / take["fetch_s"] / 1e6)
        ax2.bar(names, vals, color=["C2", "C0", "C1", "C3"][: len(vals)])
        ax2.set_ylabel("MB/s (page cache dropped)")
        ax2.set_title(f"reading a {read['size'] >> 20} MiB file")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

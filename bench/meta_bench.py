"""Metadata store throughput on a local Redis Cluster (a script that prints a table).

    uv run python bench/meta_bench.py            # starts its own 3+3 cluster
    uv run python bench/meta_bench.py --nodes 127.0.0.1:7000 -n 5000

Rows:
* the ceiling: ``redis-benchmark --cluster -c 50 -n 200000 -t set,get`` (C, 50 connections);
* the store (RedisClusterStore, blocking API): create/get from 1 thread and 4 threads,
  creates published through ``apply`` in batches of 100, with and without ``WAIT``
  (durable_replicas=1 is the default); LocalStore (SQLite) for reference;
* the client question, from a trio program: redis-py through ``trio.to_thread`` vs
  coredis (anyio, native under trio) for SET/GET one at a time, from 4 concurrent tasks,
  and pipelines of 100.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import trio
from hycache_dht.local_store import LocalStore
from hycache_dht.meta import EntryMeta, Op, dir_meta
from hycache_dht.redis_store import RedisClusterStore
from hycache_harness import start_redis_cluster, timed

META = EntryMeta("file", 0o100644, 1000, 1000, 4096, 1, 2, 3, primary="node-1",
                 replicas=["node-2"], tier="fast")

rows: list[tuple[str, str, float]] = []


def row(section: str, what: str, ops: int, seconds: float) -> None:
    rate = ops / seconds
    rows.append((section, what, rate))
    print(f"  {what:<58} {rate:>10,.0f} ops/s", flush=True)


# -- the ceiling --------------------------------------------------------------------------


def redis_benchmark(host: str, port: int, n: int) -> None:
    print(f"redis-benchmark --cluster -c 50 -n {n} -t set,get (the ceiling)")
    out = subprocess.run(
        ["redis-benchmark", "--cluster", "-h", host, "-p", str(port), "-c", "50", "-n", str(n),
         "-t", "set,get", "-q"], capture_output=True, text=True, timeout=600)
    for cmd, rate in re.findall(r"(SET|GET): ([\d.]+) requests per second", out.stdout):
        rows.append(("ceiling", f"redis-benchmark {cmd} (C, 50 connections)", float(rate)))
        print(f"  {'redis-benchmark ' + cmd + ' (C, 50 connections)':<58} {float(rate):>10,.0f} ops/s")


# -- the store ----------------------------------------------------------------------------


def bench_store(name: str, store, n: int) -> None:
    print(f"{name}")
    store.create(b"/bench", dir_meta())
    dirs = [b"/bench/d%d" % i for i in range(4)]
    for d in dirs:
        store.create(d, dir_meta())

    def creates(d: bytes, lo: int, hi: int) -> int:
        for i in range(lo, hi):
            store.create(d + b"/f%d" % i, META)
        return hi - lo

    def gets(d: bytes, lo: int, hi: int) -> int:
        for i in range(lo, hi):
            store.get(d + b"/f%d" % i)
        return hi - lo

    row(name, "create, 1 thread", *timed(lambda: creates(dirs[0], 0, n)))
    row(name, "get, 1 thread", *timed(lambda: gets(dirs[0], 0, n)))

    def threaded(fn) -> int:
        ts = [threading.Thread(target=fn, args=(dirs[t], n, 2 * n)) for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return 4 * n

    row(name, "create, 4 threads", *timed(lambda: threaded(creates)))
    row(name, "get, 4 threads", *timed(lambda: threaded(gets)))

    def batches() -> int:
        for s in range(2 * n, 6 * n, 100):
            store.apply([Op.create(dirs[1] + b"/f%d" % i, META) for i in range(s, s + 100)])
        return 4 * n

    row(name, "create via apply(), batches of 100, 1 thread", *timed(batches))


# -- redis-py via to_thread vs coredis, from trio -------------------------------------------


async def trio_clients(host: str, port: int, n: int) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    print("clients from a trio program (SET/GET of 64-byte values)")
    value = b"v" * 64
    rc = RedisCluster(startup_nodes=[ClusterNode(host, port)])
    tag = uuid.uuid4().hex[:6]

    async def seq(op) -> int:
        for i in range(n):
            await op(i)
        return n

    async def par(op, tasks: int = 4) -> int:
        per = n // tasks
        async with trio.open_nursery() as nursery:
            for t in range(tasks):
                async def run(t=t):
                    for i in range(t * per, (t + 1) * per):
                        await op(i)
                nursery.start_soon(run)
        return per * tasks

    async def atimed(coro) -> tuple[int, float]:
        t0 = time.perf_counter()
        k = await coro
        return k, time.perf_counter() - t0

    def key(i: int) -> str:
        return f"bench:{tag}:{i}"

    async def rp_set(i):
        await trio.to_thread.run_sync(rc.set, key(i), value)

    async def rp_get(i):
        await trio.to_thread.run_sync(rc.get, key(i))

    def rp_pipe_sync(lo: int) -> None:
        p = rc.pipeline()
        for i in range(lo, lo + 100):
            p.set(key(i), value)
        p.execute()

    async def rp_pipes() -> int:
        for lo in range(0, n, 100):
            await trio.to_thread.run_sync(rp_pipe_sync, lo)
        return n - n % 100

    for i in range(200):  # warm up: connections to every node, thread pool
        await rp_set(i)
        await rp_get(i)
    row("trio", "redis-py via trio.to_thread: SET, 1 task", *await atimed(seq(rp_set)))
    row("trio", "redis-py via trio.to_thread: GET, 1 task", *await atimed(seq(rp_get)))
    row("trio", "redis-py via trio.to_thread: SET, 4 tasks", *await atimed(par(rp_set)))
    row("trio", "redis-py via trio.to_thread: GET, 4 tasks", *await atimed(par(rp_get)))
    row("trio", "redis-py via trio.to_thread: pipelines of 100 SET", *await atimed(rp_pipes()))
    rc.close()

    try:
        import coredis
    except ImportError:
        print("  coredis not installed (uv sync installs hycache-dht[bench])")
        return
    c = coredis.RedisCluster(host, port)
    async with c:
        async def cd_set(i):
            await c.set(key(i), value)

        async def cd_get(i):
            await c.get(key(i))

        for i in range(200):
            await cd_set(i)
            await cd_get(i)

        async def cd_pipes() -> int:
            for lo in range(0, n, 100):
                async with c.pipeline() as p:
                    for i in range(lo, lo + 100):
                        p.set(key(i), value)
            return n - n % 100

        row("trio", f"coredis {coredis.__version__} (native trio): SET, 1 task", *await atimed(seq(cd_set)))
        row("trio", f"coredis {coredis.__version__} (native trio): GET, 1 task", *await atimed(seq(cd_get)))
        row("trio", f"coredis {coredis.__version__} (native trio): SET, 4 tasks", *await atimed(par(cd_set)))
        row("trio", f"coredis {coredis.__version__} (native trio): GET, 4 tasks", *await atimed(par(cd_get)))
        row("trio", f"coredis {coredis.__version__} (native trio): pipelines of 100 SET",
            *await atimed(cd_pipes()))


async def trio_store(store: RedisClusterStore, n: int) -> None:
    """What the agent will do: the blocking store from trio through worker threads."""
    store.create(b"/tbench", dir_meta())

    async def go() -> int:
        for i in range(n):
            await trio.to_thread.run_sync(store.create, b"/tbench/f%d" % i, META)
        return n

    t0 = time.perf_counter()
    k = await go()
    row("trio", "RedisClusterStore.create via trio.to_thread, 1 task", k, time.perf_counter() - t0)


# -- main ---------------------------------------------------------------------------------


def run_all(nodes: list[tuple[str, int]], a) -> None:
    host, port = nodes[0]
    redis_benchmark(host, port, a.ceiling_n)
    ns = "bench-" + uuid.uuid4().hex[:6]
    with RedisClusterStore(nodes, namespace=ns + "w") as s:
        bench_store("RedisClusterStore (WAIT 1 replica: the default)", s, a.n)
        trio.run(trio_store, s, a.n)
    with RedisClusterStore(nodes, namespace=ns + "n", durable_replicas=0) as s:
        bench_store("RedisClusterStore (durable_replicas=0: no WAIT)", s, a.n)
    with tempfile.TemporaryDirectory() as d, LocalStore(Path(d) / "m.db") as s:
        bench_store("LocalStore (SQLite, WAL, synchronous=NORMAL)", s, a.n)
    trio.run(trio_clients, host, port, a.n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", help="host:port[,host:port...] of a running cluster "
                                    "(default: start a local 3+3 cluster on free ports)")
    ap.add_argument("-n", type=int, default=5000, help="operations per row (default 5000)")
    ap.add_argument("--ceiling-n", type=int, default=200000, help="redis-benchmark -n")
    ap.add_argument("--repeat", type=int, default=1, help="run everything N times, print medians")
    a = ap.parse_args(argv)
    cluster = None
    tmp = None
    if a.nodes:
        nodes = [(h, int(p)) for h, p in (x.rsplit(":", 1) for x in a.nodes.split(","))]
    else:
        tmp = tempfile.TemporaryDirectory(prefix="hycache-bench-")
        cluster = start_redis_cluster(Path(tmp.name))
        nodes = cluster.nodes
        print(f"started a local cluster on {nodes[0][0]}:{nodes[0][1]}..{nodes[-1][1]}")
    load = [os.getloadavg()[0]]
    try:
        host, port = nodes[0]
        for r in range(a.repeat):
            print(f"-- run {r + 1} of {a.repeat}")
            run_all(nodes, a)
            load.append(os.getloadavg()[0])
    finally:
        if cluster is not None:
            cluster.stop()
            tmp.cleanup()
    medians: dict[tuple[str, str], list[float]] = {}
    for section, what, rate in rows:
        medians.setdefault((section, what), []).append(rate)
    print(f"\n{len(os.sched_getaffinity(0))} CPUs, 1-min load average {min(load):.1f}-{max(load):.1f}"
          f" during the run; median of {a.repeat} run(s), -n {a.n}\n")
    print("| section | operation | ops/s |\n|---|---|---:|")
    for (section, what), rates in medians.items():
        print(f"| {section} | {what} | {statistics.median(rates):,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

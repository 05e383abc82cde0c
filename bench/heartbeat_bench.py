"""Heartbeats from N simulated nodes against real ``hycache-control serve`` processes on
PostgreSQL, with dashboards on the stream, and the issue-20 table.

    .venv/bin/python bench/heartbeat_bench.py --nodes 100,1000 --seconds 20
    .venv/bin/python bench/heartbeat_bench.py --nodes 1000 \\
        --baseline /work/main/.venv/bin/hycache-control          # A/B in one run

Each simulated node posts a realistic heartbeat (a ~1 KB status, growing counters) with its
own node token and honours the ``interval`` of the answer, as the agent does.  The load
generator is lean on purpose (asyncio, raw HTTP/1.1 keep-alive, ``--conns`` connections
sharing the nodes in ``--procs`` processes) because it shares the machine with the server:
its CPU is printed beside the server's.  ``--streams`` dashboards hold ``GET /api/v1/stream``
open (their bytes/s are printed) and ``--readers`` dashboards poll ``GET /nodes?limit=1000``
and a node's metrics once a second.  A temporary PostgreSQL is started (Debian's binaries,
as the tests do); every scenario gets a fresh database.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hycache_harness import ControlPlane, HarnessError, free_port, pct

BIN = Path(sys.executable).parent / "hycache-control"


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its live descendants (serve --workers N: the workers)."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0.0))[1]
        todo += [c for c, (ppid, _) in stats.items() if ppid == p]
    return total


def status_doc(i: int) -> dict:
    return {"pid": 1000 + i, "policy": "lru", "watermarks": {"high": 0.9, "low": 0.7},
            "tiers": {"fast": {"capacity": 64 << 30, "device_capacity": 252 << 30, "used": i << 20, "files": 100 + i,
                               "device_free": 78 << 30},
                      "slow": {"capacity": 4 << 40, "device_capacity": 4 << 40, "used": i << 24, "files": 5000,
                               "device_free": 2 << 40}},
            "migrations": {"migrations_done": i, "bytes_promoted": i << 20, "bytes_demoted": 0, "active": []},
            "cluster": {"state": "ok", "backlog": 0, "node_id": f"n{i}", "published_ops": i * 10}}


# -- a minimal HTTP/1.1 keep-alive client (the generator must cost little CPU) -------------------

class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Length: {len(body or b'')}\r\n"
                + ("Content-Type: application/json\r\n" if body else "") + "\r\n").encode()
        try:
            self.w.write(head + (body or b""))
            raw = await self.r.readuntil(b"\r\n\r\n")
            status = int(raw[9:12])
            length = 0
            chunked = False
            for line in raw.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                k = k.strip().lower()
                if k == b"content-length":
                    length = int(v)
                elif k == b"transfer-encoding" and b"chunked" in v.lower():
                    chunked = True
            if chunked:
                parts = []
                while True:
                    size = int((await self.r.readuntil(b"\r\n")).strip(), 16)
                    data = await self.r.readexactly(size + 2)
                    if size == 0:
                        break
                    parts.append(data[:-2])
                return status, b"".join(parts)
            return status, await self.r.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


@dataclass
class Result:
    hb_lat: list = field(default_factory=list)
    hb_err: list = field(default_factory=list)
    rd_lat: list = field(default_factory=list)
    rd_err: list = field(default_factory=list)
    stream_bytes: int = 0
    intervals: list = field(default_factory=list)


async def node_conn(host, port, nodes, tokens, interval, start_at, stop_at, res: Result):
    """One keep-alive connection driving a slice of the nodes, each at the interval the
    control plane answers (as many agents behind one connection would)."""
    conn = Conn(host, port)
    heap = [(start_at + interval * k / max(1, len(nodes)), i) for k, i in enumerate(nodes)]
    heapq.heapify(heap)
    node_interval = {i: interval for i in nodes}
    seqs = {i: 0 for i in nodes}
    statuses = {i: status_doc(i) for i in nodes}
    loop = asyncio.get_running_loop()
    while heap:
        due, i = heapq.heappop(heap)
        if due >= stop_at:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        seqs[i] += 1
        seq = int(time.time() * 1000)  # grows across runs of the bench
        body = json.dumps({"node_id": f"n{i}", "version": "0.1.0", "boot_id": f"boot-{i}", "seq": seq,
                           "sent_at": time.time(), "address": f"10.0.{i // 250}.{i % 250}:7070",
                           "status": statuses[i],
                           "counters": {"fast": {"read_bytes": seq * 1000, "write_bytes": seq * 10, "hits": seq // 100},
                                        "misses": seq // 1000, "metadata_ops": seq // 20},
                           "policy_version": 0, "action_results": []}).encode()
        t0 = loop.time()
        try:
            status, data = await conn.request("POST", f"/api/v1/nodes/n{i}/heartbeats", tokens[i], body)
            if status == 200:
                res.hb_lat.append(loop.time() - t0)
                iv = json.loads(data).get("interval")
                if isinstance(iv, (int, float)) and iv > 0:
                    node_interval[i] = float(iv)
            else:
                res.hb_err.append(status)
        except Exception as e:
            res.hb_err.append(type(e).__name__)
        heapq.heappush(heap, (max(due + node_interval[i], loop.time() - node_interval[i]), i))
    conn.close()


async def reader(host, port, admin, nodes, stop_at, res: Result):
    conn = Conn(host, port)
    loop = asyncio.get_running_loop()
    k = 0
    while loop.time() < stop_at:
        k += 1
        path = "/api/v1/nodes?limit=1000" if k % 2 else f"/api/v1/nodes/n{k % nodes}/metrics"
        t0 = loop.time()
        try:
            status, _ = await conn.request("GET", path, admin)
            (res.rd_lat.append(loop.time() - t0) if status == 200 else res.rd_err.append(status))
        except Exception as e:
            res.rd_err.append(type(e).__name__)
        await asyncio.sleep(max(0.0, min(1.0 - (loop.time() - t0), stop_at - loop.time())))
    conn.close()


async def streamer(host, port, admin, stop_at, res: Result):
    """A dashboard on the stream: reads everything, counts the bytes."""
    loop = asyncio.get_running_loop()
    try:
        r, w = await asyncio.open_connection(host, port)
        w.write(f"GET /api/v1/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {admin}\r\n"
                f"Accept: text/event-stream\r\n\r\n".encode())
        while loop.time() < stop_at:
            try:
                data = await asyncio.wait_for(r.read(1 << 16), timeout=max(0.01, stop_at - loop.time()))
            except TimeoutError:
                break
            if not data:
                break
            res.stream_bytes += len(data)
        w.close()
    except OSError as e:
        res.rd_err.append(f"stream {type(e).__name__}")


def load_process(host, port, slices, tokens, interval, seconds, readers, streams, admin, nodes, q):
    res = Result()

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        stop_at = start + seconds
        tasks = [node_conn(host, port, sl, tokens, interval, start, stop_at, res) for sl in slices]
        tasks += [reader(host, port, admin, nodes, stop_at, res) for _ in range(readers)]
        tasks += [streamer(host, port, admin, stop_at, res) for _ in range(streams)]
        await asyncio.gather(*tasks)

    asyncio.run(main())
    q.put((res, time.process_time()))


def drive(host, port, tokens, admin, nodes, readers, streams, seconds, interval, procs, conns):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ids = list(range(nodes))
    slices = [ids[k::conns] for k in range(conns)]
    per = [slices[p::procs] for p in range(procs)]
    ps = [ctx.Process(target=load_process, args=(host, port, per[p], tokens, interval, seconds,
                                                  readers if p == 0 else 0, streams if p == 0 else 0, admin, nodes, q))
          for p in range(procs)]
    for p in ps:
        p.start()
    total, cpu = Result(), 0.0
    for _ in ps:
        res, c = q.get(timeout=seconds + 180)
        total.hb_lat += res.hb_lat
        total.hb_err += res.hb_err
        total.rd_lat += res.rd_lat
        total.rd_err += res.rd_err
        total.stream_bytes += res.stream_bytes
        cpu += c
    for p in ps:
        p.join()
    return total, cpu


def make_tokens(url_db: str, nodes: int) -> tuple[list[str], str]:
    """Node tokens and an admin token, inserted in one transaction (the schema of every
    revision so far: a baseline binary's database works too)."""
    from hycache_control.db import make_engine
    from hycache_control.services.tokens import hash_secret, new_secret
    from sqlalchemy import create_engine, text
    eng = make_engine(url_db) if "postgresql" in url_db else create_engine(url_db)
    tokens = [new_secret() for _ in range(nodes)]
    admin = new_secret()
    rows = [{"name": f"n{i}", "scope": "node", "node_id": f"n{i}", "hash": hash_secret(t), "ts": time.time()}
            for i, t in enumerate(tokens)]
    rows.append({"name": "bench-admin", "scope": "admin", "node_id": None, "hash": hash_secret(admin), "ts": time.time()})
    with eng.begin() as c:
        c.execute(text("INSERT INTO tokens (name, scope, node_id, hash, created_at) "
                       "VALUES (:name, :scope, :node_id, :hash, :ts)"), rows)
    eng.dispose()
    return tokens, admin


def loop_stats(urls: list[str], admin: str) -> dict | None:
    """The servers' event-loop lag and GC pause histograms (``GET /metrics``, loopwatch.py),
    summed over the processes; None when the build has none (an older baseline)."""
    import httpx
    out: dict = {}
    for u in urls:
        try:
            text = httpx.get(f"{u}/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=60).text
        except httpx.HTTPError:
            return None
        for line in text.splitlines():
            if line.startswith(("hycache_control_loop_lag_seconds", "hycache_control_gc_pause_seconds",
                                "hycache_control_loop_lag_max", "hycache_control_loop_stalls_total")):
                k, _, v = line.rpartition(" ")
                out[k] = out.get(k, 0.0) + float(v) if "max" not in k else max(out.get(k, 0.0), float(v))
    return out or None


def lag_summary(before: dict | None, after: dict | None, wall: float) -> dict | None:
    if not before or not after:
        return None
    d = {k: after[k] - before.get(k, 0.0) for k in after}

    def over(name: str, bound: str, labels: str = "") -> float:
        total = d.get(f'{name}_count{{{labels}}}' if labels else f"{name}_count", 0.0)
        sep = "," if labels else ""
        return total - d.get(f'{name}_bucket{{{labels}{sep}le="{bound}"}}', 0.0)
    lag = "hycache_control_loop_lag_seconds"
    gcp = "hycache_control_gc_pause_seconds"
    return {"busy": d.get('hycache_control_loop_stalls_total{cause="busy"}', 0.0),
            "starved": d.get('hycache_control_loop_stalls_total{cause="starved"}', 0.0),
            "lag_over_20ms": over(lag, "0.02"), "lag_over_50ms": over(lag, "0.05"),
            "lag_sum": d.get(f"{lag}_sum", 0.0) / wall,
            "gc2": d.get(f'{gcp}_count{{generation="2"}}', 0.0), "gc2_sum": d.get(f'{gcp}_sum{{generation="2"}}', 0.0),
            "gc_sum": sum(d.get(f'{gcp}_sum{{generation="{g}"}}', 0.0) for g in range(3)) / wall,
            "gc_over_20ms": sum(over(gcp, "0.02", f'generation="{g}"') for g in range(3))}


def scenario(label, binary, url_db, args, nodes, tmp) -> dict:
    import httpx
    from hycache_control.testing import start_haproxy
    subprocess.run([str(binary), "db", "upgrade", "--db", url_db], check=True, capture_output=True)
    tokens, admin = make_tokens(url_db, nodes)
    procs, backends = [], []
    lb = None
    try:
        for k in range(args.processes):
            proc = ControlPlane("--heartbeat-interval", str(args.interval), "--log-level", "warning",
                                *args.server_arg, db=url_db, state_dir=tmp, binary=str(binary),
                                log=tmp / f"server-{label}-{nodes}-{k}.log", append_log=False, ready_path="/healthz")
            procs.append(proc)
            backends.append(proc.port)
            try:
                proc.start(120)
            except HarnessError as e:
                print(e)
                raise SystemExit(1) from None
        if args.processes > 1:  # several processes (as on several hosts) behind HAProxy
            port = free_port()
            lb = start_haproxy(tmp, port, backends, maxconn=4000, check="inter 1s fall 3 rise 2")
        else:
            port = backends[0]
        url = f"http://127.0.0.1:{port}"
        direct = [f"http://127.0.0.1:{p}" for p in backends]
        drive("127.0.0.1", port, tokens, admin, nodes, 0, 0, args.warmup, args.interval, args.procs, args.conns)
        # the measured run starts where the agents are after the warm-up: on the interval the
        # control plane hands them now (not all at the base interval again)
        start_interval = args.interval
        try:
            start_interval = max(args.interval, float(httpx.get(f"{url}/api/v1/summary", timeout=60, headers={
                "Authorization": f"Bearer {admin}"}).json()["interval"]))
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            pass
        spies = []
        if args.profile:
            for k, proc in enumerate(procs):
                spies.append(subprocess.Popen(
                    [args.profile, "record", "--pid", str(proc.pid), "--duration", str(int(args.seconds)),
                     "--rate", "200", "--format", "raw", "--nonblocking", "--subprocesses", "--threads", "--gil", "-o",
                     str(Path(args.profile_dir) / f"{label}-{nodes}{f'-{k}' if k else ''}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        lag0 = loop_stats(direct, admin)
        cpu0, wall0, t0 = sum(cpu_seconds(p.pid) for p in procs), time.monotonic(), time.time()
        lbcpu0 = cpu_seconds(lb.pid) if lb else 0.0
        res, me = drive("127.0.0.1", port, tokens, admin, nodes, args.readers, args.streams, args.seconds,
                        start_interval, args.procs, args.conns)
        wall = time.monotonic() - wall0
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
        lbcpu = (cpu_seconds(lb.pid) - lbcpu0) if lb else 0.0
        lag = lag_summary(lag0, loop_stats(direct, admin), wall)
        for spy in spies:
            spy.wait(timeout=60)
        # the states right after the load (no grace beyond the down window has passed)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=60) as c:
            up = c.get("/api/v1/nodes", params={"state": "up", "limit": 1}).json()["total"]
            # each process's own view (behind HAProxy the line above is one of them)
            up_each = [httpx.get(f"{d}/api/v1/nodes", params={"state": "up", "limit": 1}, timeout=60,
                                 headers={"Authorization": f"Bearer {admin}"}).json()["total"] for d in direct]
            t1 = time.time()
            interval = c.get("/api/v1/summary").json().get("interval")
            time.sleep(args.interval * 2 + 0.5)  # let the writer flush the last samples
            samples = len(c.get("/api/v1/nodes/n0/metrics", params={"since": time.time() - args.seconds}).json()["samples"])
    finally:
        if lb is not None:
            lb.terminate()
            lb.wait(timeout=30)
        for proc in procs:
            proc.stop(60)
    import psycopg
    with psycopg.connect(url_db.replace("postgresql+psycopg", "postgresql")) as conn:
        rows, size = conn.execute("SELECT count(*), pg_total_relation_size('metric_samples') FROM metric_samples").fetchone()
        # steady: the transitions to down the leader recorded during the measured run
        flaps = conn.execute("SELECT count(*) FROM events WHERE kind = 'node' AND result = 'down' AND ts BETWEEN %s AND %s",
                             (t0, t1)).fetchone()[0]
    return {"sample_rows": rows, "sample_bytes": size,"label": label, "nodes": nodes, "wall": wall, "ok": len(res.hb_lat), "errors": res.hb_err,
            "p50": pct(res.hb_lat, 0.50), "p99": pct(res.hb_lat, 0.99), "max": max(res.hb_lat, default=0.0),
            "reads": len(res.rd_lat), "read_errors": res.rd_err, "rd_p50": pct(res.rd_lat, 0.50),
            "rd_p99": pct(res.rd_lat, 0.99), "cpu": cpu / wall, "gen_cpu": me / wall, "up": up, "up_each": up_each, "flaps": flaps, "samples": samples,
            "stream_bps": res.stream_bytes / wall / max(1, args.streams), "load": os.getloadavg()[0],
            "lag": lag, "lb_cpu": lbcpu / wall, "interval": interval, "start_interval": start_interval}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000", help="comma-separated node counts, one row each (e.g. 100,1000)")
    ap.add_argument("--readers", type=int, default=5, help="dashboards polling /nodes and metrics (1 request/s each)")
    ap.add_argument("--streams", type=int, default=5, help="dashboards on GET /api/v1/stream")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0, help="--heartbeat-interval of the server")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--conns", type=int, default=64, help="keep-alive connections the nodes share")
    ap.add_argument("--baseline", metavar="BIN", help="another hycache-control to measure first (A/B in one run)")
    ap.add_argument("--processes", type=int, default=1,
                    help="serve processes on one database; above 1 behind HAProxy (as several hosts' processes)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for serve (repeat), e.g. --server-arg=--workers --server-arg=2")
    ap.add_argument("--profile", metavar="PY_SPY", help="py-spy binary: record the server during each measured run")
    ap.add_argument("--profile-dir", default=".", help="where the collapsed stacks go (LABEL-NODES.txt)")
    args = ap.parse_args()

    from hycache_control.testing import start_postgres
    pg = start_postgres()
    tmp = Path(tempfile.mkdtemp(prefix="hc-bench-"))
    rows = []
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            runs = ([("before", Path(args.baseline))] if args.baseline else []) + [("after" if args.baseline else "this", BIN)]
            for label, binary in runs:
                rows.append(scenario(label, binary, pg.create_database("bench"), args, n, tmp))
                r = rows[-1]
                print(f"[{label}] {n} nodes: {r['ok'] / r['wall']:.0f}/s, p99 {r['p99'] * 1000:.1f} ms, "
                      f"{r['up']} up, errors {len(r['errors'])}", file=sys.stderr, flush=True)
    finally:
        pg.stop()
        shutil.rmtree(pg.base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"PostgreSQL, {args.readers} polling + {args.streams} stream dashboards, {args.seconds:g} s measured "
          f"after {args.warmup:g} s warm-up, {os.cpu_count()} cores; interval {args.interval:g} s "
          f"(the server may stretch it){'; serve ' + ' '.join(args.server_arg) if args.server_arg else ''}"
          f"{f'; {args.processes} processes behind HAProxy' if args.processes > 1 else ''}")
    print()
    print("| build | simulated nodes | interval | heartbeats accepted (offered at the start of the measured run) | p50 | p99 | max | errors "
          "| server CPU | server CPU per request | load generator CPU | nodes up after (each process's view) | down transitions in the run | reads p50 / p99 | stream bytes/s per dashboard "
          "| loop lag > 20 ms / > 50 ms | GC full / all pauses | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    tail = []
    for r in rows:
        errs = f"{len(r['errors'])} {sorted(set(map(str, r['errors'])))[:3]}" if r["errors"] else "0"
        lg = r["lag"]
        lagcol = (f"{lg['lag_over_20ms']:.0f} / {lg['lag_over_50ms']:.0f} (busy {lg['busy']:.0f}, starved "
                  f"{lg['starved']:.0f}; {lg['lag_sum'] * 100:.1f} % late)"
                  if lg else "n/a")
        gccol = (f"{lg['gc2']:.0f} in {lg['gc2_sum'] * 1000:.0f} ms / {lg['gc_sum'] * 100:.1f} % of the time"
                 if lg else "n/a")
        cpucol = f"{r['cpu'] * 100:.0f} %" + (f" (+ HAProxy {r['lb_cpu'] * 100:.0f} %)" if r["lb_cpu"] else "")
        print(f"| {r['label']} | {r['nodes']:,} | {r['interval']} s | {r['ok'] / r['wall']:,.0f}/s ({r['nodes'] / r['start_interval']:,.0f}/s) "
              f"| {r['p50'] * 1000:.1f} ms | {r['p99'] * 1000:.1f} ms | {r['max'] * 1000:.0f} ms | {errs} "
              f"| {cpucol} | {r['cpu'] * r['wall'] / max(1, r['ok'] + r['reads']) * 1000:.2f} ms "
              f"| {r['gen_cpu'] * 100:.0f} % | {r['up']:,}"
              f"{' (' + ' / '.join(f'{u:,}' for u in r['up_each']) + ')' if len(r['up_each']) > 1 else ''} "
              f"| {r['flaps']:,} | {r['rd_p50'] * 1000:.0f} / "
              f"{r['rd_p99'] * 1000:.0f} ms | {r['stream_bps']:,.0f} | {lagcol} | {gccol} | {r['load']:.1f} |")
        if r["sample_rows"]:
            tail.append(f"{r['label']} {r['nodes']:,} nodes: metric_samples {r['sample_rows']:,} rows, "
                        f"{r['sample_bytes'] / 2**20:.1f} MiB with indexes ({r['sample_bytes'] / r['sample_rows']:.0f} B/row)")
    print()
    print("\n".join(tail))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Heartbeats from N simulated nodes at the real interval against one control plane (a
real ``hycache-control serve`` process) on PostgreSQL, plus dashboard-like readers.

    .venv/bin/python backend/benchmarks/heartbeat_bench.py --nodes 1000 --seconds 30

Prints sustained requests/s, p50/p99 latency of heartbeats and reads, the server's CPU, and
whether the samples reached the database.  Without ``--db`` it starts a temporary
PostgreSQL (Debian's binaries, as the tests do).  The load generator (``--procs`` processes,
``--conns`` keep-alive connections each driving a slice of the nodes) runs on the same machine: its CPU is reported too, since it competes with the
server for the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from hycache_control.db import Database
from hycache_control.services.tokens import TokenService
from hycache_control.testing import free_port, start_postgres

BIN = Path(sys.executable).parent / "hycache-control"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_doc(i: int) -> dict:
    return {"pid": 1000 + i, "policy": "lru", "watermarks": {"high": 0.9, "low": 0.7},
            "tiers": {"fast": {"capacity": 64 << 30, "device_capacity": 252 << 30, "used": i << 20, "files": 100 + i,
                               "device_free": 78 << 30},
                      "slow": {"capacity": 4 << 40, "device_capacity": 4 << 40, "used": i << 24, "files": 5000,
                               "device_free": 2 << 40}},
            "migrations": {"migrations_done": i, "bytes_promoted": i << 20, "bytes_demoted": 0, "active": []},
            "cluster": {"state": "ok", "backlog": 0, "node_id": f"n{i}", "published_ops": i * 10}}


def node_thread(url, nodes, tokens, interval, stop_at, out):
    """One connection driving a slice of the nodes, each at ``interval`` (as many agents
    behind one keep-alive connection would)."""
    lat, errors = [], []
    next_t = {i: time.monotonic() + interval * k / max(1, len(nodes)) for k, i in enumerate(nodes)}
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < stop_at:
            i = min(next_t, key=next_t.get)
            delay = next_t[i] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            seq = int(time.time() * 1000)  # grows across runs of the bench
            body = {"node_id": f"n{i}", "version": "0.1.0", "boot_id": f"boot-{i}", "seq": seq, "sent_at": time.time(),
                    "address": f"10.0.{i // 250}.{i % 250}:7070", "status": status_doc(i),
                    "counters": {"fast": {"read_bytes": seq * 1000, "write_bytes": seq * 10, "hits": seq // 100},
                                 "misses": seq // 1000, "metadata_ops": seq // 20},
                    "policy_version": 0, "action_results": []}
            t0 = time.perf_counter()
            try:
                r = client.post(f"/api/v1/nodes/n{i}/heartbeats", json=body,
                                headers={"Authorization": f"Bearer {tokens[i]}"})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors.append(r.status_code)
            except httpx.HTTPError as e:
                errors.append(type(e).__name__)
            next_t[i] = max(next_t[i] + interval, time.monotonic() - interval)
    out.put(("hb", lat, errors))


def reader_thread(url, admin, nodes, stop_at, out):
    lat, errors = [], []
    k = 0
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {admin}"}) as client:
        while time.monotonic() < stop_at:
            k += 1
            path = "/api/v1/nodes?limit=1000" if k % 2 else f"/api/v1/nodes/n{k % nodes}/metrics"
            t0 = time.perf_counter()
            try:
                r = client.get(path)
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors.append(r.status_code)
            except httpx.HTTPError as e:
                errors.append(type(e).__name__)
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
    out.put(("rd", lat, errors))


def load_process(url, slices, tokens, interval, stop_at, out, readers, admin, nodes):
    import threading
    ths = [threading.Thread(target=node_thread, args=(url, sl, tokens, interval, stop_at, out)) for sl in slices]
    ths += [threading.Thread(target=reader_thread, args=(url, admin, nodes, stop_at, out)) for _ in range(readers)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    out.put(("cpu", time.process_time(), None))


def drive(url, tokens, admin, nodes, readers, seconds, interval, procs, conns):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    stop_at = time.monotonic() + seconds
    ids = list(range(nodes))
    slices = [ids[k::conns] for k in range(conns)]
    per = [slices[p::procs] for p in range(procs)]
    ps = [ctx.Process(target=load_process, args=(url, per[p], tokens, interval, stop_at, out,
                                                  readers if p == 0 else 0, admin, nodes)) for p in range(procs)]
    for p in ps:
        p.start()
    hb_lat, hb_err, rd_lat, rd_err, cpu = [], [], [], [], 0.0
    expected = conns + readers + procs
    for _ in range(expected):
        kind, a, b = out.get(timeout=seconds + 120)
        if kind == "hb":
            hb_lat += a
            hb_err += b
        elif kind == "rd":
            rd_lat += a
            rd_err += b
        else:
            cpu += a
    for p in ps:
        p.join()
    return hb_lat, hb_err, rd_lat, rd_err, cpu


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--readers", type=int, default=5, help="dashboard-like readers (1 request/s each)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--db", help="database URL (default: a temporary PostgreSQL)")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--conns", type=int, default=64, help="keep-alive connections the nodes share")
    args = ap.parse_args()

    pg = None
    tmp = Path(tempfile.mkdtemp(prefix="hc-bench-"))
    try:
        if args.db:
            url_db = args.db
        else:
            pg = start_postgres()
            url_db = pg.create_database("bench")
        db = Database(url_db)
        db.upgrade()
        ts = TokenService(db)
        tokens = [ts.create(f"n{i}", "node", f"n{i}")[1] for i in range(args.nodes)]
        admin = ts.create("bench-admin", "admin")[1]
        db.close()
        port = free_port()
        log = open(tmp / "server.log", "wb")
        proc = subprocess.Popen([str(BIN), "serve", "--db", url_db, "--listen", f"127.0.0.1:{port}",
                                 "--state-dir", str(tmp), "--heartbeat-interval", str(args.interval),
                                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print((tmp / "server.log").read_text()[-3000:])
                return 1
            time.sleep(0.5)
        try:
            drive(url, tokens, admin, args.nodes, 0, args.warmup, args.interval, args.procs, args.conns)
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            hb_lat, hb_err, rd_lat, rd_err, me = drive(url, tokens, admin, args.nodes, args.readers, args.seconds,
                                                       args.interval, args.procs, args.conns)
            wall = time.monotonic() - wall0
            cpu = cpu_seconds(proc.pid) - cpu0
            time.sleep(2 * 0.5 + 0.5)
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=60) as c:
                up = c.get("/api/v1/nodes", params={"state": "up", "limit": 1}).json()["total"]
                samples = len(c.get("/api/v1/nodes/n0/metrics", params={"since": time.time() - args.seconds}).json()["samples"])
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        total = len(hb_lat) + len(rd_lat)
        print(f"nodes {args.nodes} at {args.interval:g} s + {args.readers} readers, {wall:.1f} s measured "
              f"(database {'PostgreSQL' if 'postgresql' in url_db else url_db.split(':')[0]})")
        print(f"  heartbeats ok      {len(hb_lat)} ({len(hb_lat) / wall:.0f}/s; offered {args.nodes / args.interval:.0f}/s), "
              f"errors {len(hb_err)} {sorted(set(map(str, hb_err)))[:5]}")
        print(f"  heartbeat latency  p50 {pct(hb_lat, 50) * 1000:.1f} ms  p99 {pct(hb_lat, 99) * 1000:.1f} ms  "
              f"max {max(hb_lat, default=0) * 1000:.0f} ms")
        print(f"  reads ok           {len(rd_lat)} ({len(rd_lat) / wall:.1f}/s), errors {len(rd_err)}; "
              f"p50 {pct(rd_lat, 50) * 1000:.1f} ms  p99 {pct(rd_lat, 99) * 1000:.1f} ms")
        print(f"  sustained          {total / wall:.0f} requests/s")
        print(f"  server CPU         {cpu / wall * 100:.0f} % of one core; load generator {me / wall * 100:.0f} %")
        print(f"  after the run      {up} nodes up; node n0 has {samples} samples in the window")
        print(f"  machine            {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
        return 0
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Peer data service throughput: fetching over loopback vs ``cp`` of the same file.

A server process (``PeerServer`` over a plain directory, as a peer agent would run it)
serves a SIZE file of random bytes and STREAMS copies of it; this process fetches them
with ``PeerClient.fetch_to_file`` (httpx on trio) and, for reference, with ``curl`` (a C
client, to separate the server's cost from the Python client's) and copies them with
``cp``.  Each case runs with the source in the page cache (warm) and evicted from it
(cold: ``posix_fadvise(DONTNEED)`` on the source files, no global drop_caches).
Destinations are fresh files on the same file system, not fsync'd (neither is cp's).

``httpx>null`` fetches into /dev/null: the network path without the destination's page
cache and disk.  Printed per case: median MB/s over --repeat runs (min–max), CPU seconds per GiB of the
server and of this process, and the longest stall of this process's trio loop.

Usage: bench/peer_bench.py [--size 1G] [--streams 4] [--repeat 3] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from hycache_agent.transport.auth import authorization, load_secret
from hycache_agent.transport.client import PeerClient
from hycache_agent.transport.server import PeerServer
from hycache_agent.transport.wire import files_target
from hycache_core.sizes import format_size, parse_size
from hycache_harness.dirfiles import DirFiles
from hycache_harness.loopwatch import loop_gaps

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- server process
def serve(root: str, staging: str, secret_file: str) -> None:
    """Run the server until stdin closes; print the port first."""
    secret = load_secret(secret_file)

    async def main() -> None:
        server = PeerServer(DirFiles(root, staging), node_id="bench-server", secret=secret)
        async with trio.open_nursery() as n:
            _, port = await n.start(server.serve, "127.0.0.1", 0)
            print(port, flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            n.cancel_scope.cancel()

    trio.run(main)


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------- helpers
def evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.readinto(bytearray(8 << 20)):
                pass


def make_sources(root: Path, size: int, streams: int) -> list[Path]:
    srcs = [root / f"src{i}" for i in range(streams)]
    if all(p.exists() and p.stat().st_size == size for p in srcs):
        return srcs
    print(f"writing {streams} × {format_size(size)} of random data under {root} ...", flush=True)
    with open(srcs[0], "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n
        os.fsync(f.fileno())
    for p in srcs[1:]:
        subprocess.run(["cp", "--reflink=never", str(srcs[0]), str(p)], check=True)
    os.sync()
    return srcs


class Runner:
    def __init__(self, root: Path, srcs: list[Path], port: int, secret: bytes, server_pid: int) -> None:
        self.root, self.srcs, self.port, self.secret, self.server_pid = root, srcs, port, secret, server_pid
        self.out = root / "out"

    def fresh_out(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir()

    def run_cp(self, k: int) -> None:
        procs = [subprocess.Popen(["cp", str(s), str(self.out / s.name)]) for s in self.srcs[:k]]
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError("cp failed")

    def run_curl(self, k: int) -> None:
        procs = []
        for s in self.srcs[:k]:
            target = files_target(b"/" + s.name.encode())
            auth = authorization(self.secret, "bench-client", "GET", target)
            procs.append(subprocess.Popen(["curl", "-sS", "--fail", "-o", str(self.out / s.name),
                                           "-H", f"Authorization: {auth}",
                                           f"http://127.0.0.1:{self.port}{target}"]))
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError("curl failed")

    def run_client(self, k: int, null: bool = False) -> float:
        """Fetch k files concurrently (into /dev/null: the network path alone); returns
        the longest trio-loop stall in seconds."""
        async def main() -> float:
            async with PeerClient("bench-client", self.secret) as c, loop_gaps() as gaps:
                async with trio.open_nursery() as fetches:
                    for s in self.srcs[:k]:
                        fetches.start_soon(c.fetch_to_file, f"127.0.0.1:{self.port}",
                                           b"/" + s.name.encode(), "/dev/null" if null else self.out / s.name)
            return max(gaps, default=0.0)

        return trio.run(main)

    def measure(self, tool: str, k: int, cold: bool) -> dict:
        srcs = self.srcs[:k]
        self.fresh_out()
        os.sync()
        if cold:
            evict(srcs)
        else:
            warm(srcs)
        c0, s0, t0 = self_cpu(), proc_cpu(self.server_pid), time.perf_counter()
        stall = None
        if tool == "cp":
            self.run_cp(k)
        elif tool == "curl":
            self.run_curl(k)
        else:
            stall = self.run_client(k, null=tool == "httpx>null")
        dt = time.perf_counter() - t0
        c1, s1 = self_cpu(), proc_cpu(self.server_pid)
        total = sum(s.stat().st_size for s in srcs)
        for s in srcs:  # all bytes arrived (content checked once per case below)
            assert tool == "httpx>null" or (self.out / s.name).stat().st_size == s.stat().st_size, s
        gib = total / (1 << 30)
        return {"seconds": dt, "mbps": total / dt / 1e6,
                "server_cpu_per_gib": (s1 - s0) / gib if tool != "cp" else None,
                "client_cpu_per_gib": (c1 - c0) / gib if tool.startswith("httpx") else None,
                "max_loop_stall_ms": stall * 1000 if stall is not None else None}


def same_bytes(a: Path, b: Path) -> bool:
    return subprocess.run(["cmp", "-s", str(a), str(b)], check=False).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=str(REPO / ".work" / "peer-bench"))
    ap.add_argument("--keep", action="store_true", help="keep the source files for the next run")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--serve", nargs=3, metavar=("ROOT", "STAGING", "SECRET"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return

    size = parse_size(args.size)
    root = Path(args.dir)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    srcs = make_sources(data, size, args.streams)
    secret_file = root / "secret"
    secret_file.write_bytes(os.urandom(24).hex().encode())
    os.chmod(secret_file, 0o600)
    secret = load_secret(secret_file)
    staging = tempfile.mkdtemp(dir=root, prefix="staging-")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(data), staging, str(secret_file)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        runner = Runner(root, srcs, port, secret, server.pid)
        print(f"loopback 127.0.0.1:{port}; {format_size(size)} per stream; {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f}; median of {args.repeat}\n")
        cases = [(tool, k, cold) for k in (1, args.streams) for cold in (False, True)
                 for tool in ("cp", "httpx", "curl", *(() if cold else ("httpx>null",)))]
        results: dict[str, list[dict]] = {}
        checked = set()
        for _ in range(args.repeat):  # interleaved, so drifting machine load hits every case
            for tool, k, cold in cases:
                key = f"{tool} ×{k} {'cold' if cold else 'warm'}"
                results.setdefault(key, []).append(runner.measure(tool, k, cold))
                if (tool, k) not in checked and tool != "httpx>null":
                    assert all(same_bytes(s, runner.out / s.name) for s in srcs[:k]), key
                    checked.add((tool, k))
        rows = []
        print(f"{'case':<22} {'MB/s':>7} {'(min–max)':>13} {'server CPU s/GiB':>17} "
              f"{'client CPU s/GiB':>17} {'loop stall ms':>14}")
        for key, runs in results.items():
            mb = sorted(r["mbps"] for r in runs)

            def med(field: str, runs=runs) -> float | None:
                vals = [r[field] for r in runs if r[field] is not None]
                return statistics.median(vals) if vals else None

            def fmt(v: float | None, spec: str) -> str:
                return "-" if v is None else format(v, spec)

            row = {"case": key, "mbps": statistics.median(mb), "min": mb[0], "max": mb[-1],
                   "server_cpu_per_gib": med("server_cpu_per_gib"),
                   "client_cpu_per_gib": med("client_cpu_per_gib"),
                   "max_loop_stall_ms": max((r["max_loop_stall_ms"] for r in runs
                                             if r["max_loop_stall_ms"] is not None), default=None)}
            rows.append(row)
            print(f"{key:<22} {row['mbps']:>7.0f} {f'({mb[0]:.0f}–{mb[-1]:.0f})':>13} "
                  f"{fmt(row['server_cpu_per_gib'], '.2f'):>17} {fmt(row['client_cpu_per_gib'], '.2f'):>17} "
                  f"{fmt(row['max_loop_stall_ms'], '.0f'):>14}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(root / "out", ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()

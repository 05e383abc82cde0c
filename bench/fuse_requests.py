#!/usr/bin/env python3
"""Kernel FUSE requests per operation and their latency by opcode (issue 17).

Runs fs_bench's create / stat / remove phases (the same writer processes, the same
targets and launcher) while the kernel's ``fuse:fuse_request_send`` and
``fuse:fuse_request_end`` trace points record every request of the target's connection,
in a private tracefs instance. For each phase it prints the rate, the requests per
operation and, per opcode, how long the kernel waited for the answer (send → end: the
request's time in the queue, in the agent and back), so that what a writer waits for is
visible. The caches are dropped before each phase as fs_bench does (``--warm``: not).
E.g.

    .venv/bin/python bench/fuse_requests.py --targets hycache-dht --writers 1,4 --files 1000
    .venv/bin/python bench/fuse_requests.py --baseline /work/base \\
        --targets base-hycache-dht,hycache-dht --writers 4 --repeat 2

Needs root (tracefs) and, for the DHT targets, redis-server. Prints results only; the
trace points add a little work per request, so the rates here run a bit below
fs_bench's. Targets alternate within each repeat (A/B in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fs_bench as fb
from hycache_harness import pct

TRACEFS = Path("/sys/kernel/tracing")
OPCODES = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 10: "UNLINK", 14: "OPEN", 15: "READ",
           16: "WRITE", 18: "RELEASE", 20: "FSYNC", 22: "GETXATTR", 25: "FLUSH", 27: "OPENDIR",
           28: "READDIR", 29: "RELEASEDIR", 35: "CREATE", 42: "BATCH_FORGET", 44: "READDIRPLUS"}
PHASES = ("create", "stat", "remove")


def parse_trace(text: str) -> dict[str, list[float]]:
    """{opcode name: [latency ms, ...]} from the trace's text (send → end of each request;
    requests sent before the trace began or not answered when it stopped are left out)."""
    sent: dict[int, tuple[float, int]] = {}
    lat: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("#") or ": fuse_request_" not in line:
            continue
        head, rest = line.split(": fuse_request_", 1)
        try:
            ts = float(head.split()[-1].rstrip(":"))
        except ValueError:
            continue
        f = rest.split()
        # "send: connection C req U opcode N (NAME) len L" / "end: connection C req U len L error E"
        if f[0] == "send:":
            sent[int(f[4])] = (ts, int(f[6]))
        elif f[0] == "end:" and int(f[4]) in sent:
            t0, op = sent.pop(int(f[4]))
            lat.setdefault(OPCODES.get(op, str(op)), []).append((ts - t0) * 1e3)
    return lat


def agent_counts(t) -> dict | None:
    """(outside the timed part) The agent's commits and blob-pool counters, from
    ``hycache-agent status`` (None: not an agent, or an agent without them)."""
    daemon = getattr(t, "daemon", None)
    if daemon is None or not hasattr(daemon, "status"):
        return None
    try:
        st = daemon.status()
    except (RuntimeError, OSError, ValueError):
        return None
    pool = st.get("blob_pool") or {}
    return {"commits": st.get("metadata", {}).get("commits"), "pool_misses": pool.get("misses"),
            "pool_refills": pool.get("refills"), "pool_low": pool.get("low")}


def counts_delta(before: dict | None, after: dict | None) -> dict | None:
    """What a phase added to the counters (the watermark: its value after)."""
    if before is None or after is None:
        return None
    return {k: (after[k] if k == "pool_low" or before[k] is None or after[k] is None else after[k] - before[k])
            for k in after}


class Trace:
    """The two fuse trace points of one connection, in a tracefs instance of our own."""

    def __init__(self, name: str) -> None:
        self.dir = TRACEFS / "instances" / name

    def start(self, mount_dev: int) -> None:
        if not (TRACEFS / "instances").is_dir():  # a fresh host: tracefs not mounted yet
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
        self.dir.mkdir(exist_ok=True)
        (self.dir / "tracing_on").write_text("0")
        (self.dir / "buffer_size_kb").write_text("65536")
        (self.dir / "trace").write_text("")
        conn = os.minor(mount_dev)  # the kernel's dev_t of an anonymous super block: (0, minor)
        for ev in ("fuse_request_send", "fuse_request_end"):
            (self.dir / "events/fuse" / ev / "filter").write_text(f"connection == {conn}")
            (self.dir / "events/fuse" / ev / "enable").write_text("1")
        (self.dir / "tracing_on").write_text("1")

    def stop(self) -> dict[str, list[float]]:
        """Stops tracing; returns {opcode name: [latency ms, ...]}."""
        (self.dir / "tracing_on").write_text("0")
        text = (self.dir / "trace").read_text()
        for ev in ("fuse_request_send", "fuse_request_end"):
            (self.dir / "events/fuse" / ev / "enable").write_text("0")
        (self.dir / "trace").write_text("")
        return parse_trace(text)

    def remove(self) -> None:
        try:
            self.dir.rmdir()
        except OSError:
            pass


def summary(lat: dict[str, list[float]], ops: int) -> dict[str, dict[str, float]]:
    total = sum(sum(xs) for xs in lat.values()) or 1.0
    out = {}
    for name, xs in sorted(lat.items(), key=lambda kv: -sum(kv[1])):
        xs.sort()
        out[name] = {"per_op": len(xs) / ops, "p50_ms": pct(xs, 0.5), "p90_ms": pct(xs, 0.9),
                     "p99_ms": pct(xs, 0.99), "mean_ms": sum(xs) / len(xs), "share": sum(xs) / total}
    return out


def print_phase(r: dict) -> None:
    reqs = sum(v["per_op"] for v in r["opcodes"].values())
    print(f"{r['target']:>18} {r['phase']:<6} w{r['writers']}  {r['rate']:>9,.0f} ops/s  "
          f"{reqs:.2f} requests/op")
    a = r.get("agent")
    if a:
        print(f"{'':>20}agent: {a['commits']} commits; blob pool: {a['pool_misses']} misses, "
              f"{a['pool_refills']} refills, low watermark {a['pool_low']}")
    for name, v in r["opcodes"].items():
        print(f"{'':>20}{name:<12} {v['per_op']:5.2f}/op  p50 {v['p50_ms']:6.3f}  p90 {v['p90_ms']:6.3f}  "
              f"p99 {v['p99_ms']:7.3f}  mean {v['mean_ms']:6.3f} ms  {100 * v['share']:3.0f} % of request time")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="hycache-dht", help="fs_bench targets (default: %(default)s)")
    ap.add_argument("--writers", default="1,4")
    ap.add_argument("--files", type=int, default=1000, help="files per writer (default: %(default)s)")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline", type=Path, default=None, help="checkout whose agent base-* targets run")
    ap.add_argument("--warm", dest="drop_caches", action="store_false",
                    help="do not drop the caches before each phase (fs_bench drops them)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--workdir", type=Path, default=fb.REPO / ".work" / "fuse_requests")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (tracefs, FUSE passthrough)", file=sys.stderr)
        return 2
    names = args.targets.split(",")
    phases = args.phases.split(",")
    if "create" not in phases or "remove" not in phases:
        ap.error("--phases needs create and remove (each pass starts from an empty directory)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    cluster = None
    targets: list[fb.Target] = []
    trace = Trace(f"fuse_requests_{os.getpid()}")
    caches = fb.Caches(args.drop_caches)
    results = []
    try:
        if any(n in fb.DHT_TARGETS for n in names):
            cluster = fb.Cluster(args.workdir)
            cluster.start()
        for n in names:
            t = fb.Target(n, args.workdir / n)
            if n in fb.BASE_TARGETS:
                if args.baseline is None:
                    ap.error(f"{n} needs --baseline DIR")
                t.agent_bin = args.baseline / ".venv" / "bin" / "hycache-agent"
            t.start(cluster)
            targets.append(t)
        for rep in range(args.repeat):
            for w in [int(x) for x in args.writers.split(",")]:
                for t in targets:
                    dirs = [t.path / f"req-w{w}-{rep}-{i}" for i in range(w)]
                    for d in dirs:
                        d.mkdir()
                    barrier = fb.FORK.Barrier(w)
                    with fb._workers(fb._meta_worker, [(str(d), args.files, barrier) for d in dirs]) as conns:
                        for phase in phases:
                            before = agent_counts(t)
                            caches.drop()  # as fs_bench: a stat after a drop is a LOOKUP
                            trace.start(os.stat(t.path).st_dev)
                            for c in conns:
                                c.send(phase)
                            took = max(fb._answer(c, f"{t.name}: {phase}") for c in conns)
                            lat = trace.stop()
                            ops = w * args.files
                            r = {"target": t.name, "phase": phase, "writers": w, "repeat": rep,
                                 "rate": ops / took, "opcodes": summary(lat, ops)}
                            if t.name in fb.DHT_TARGETS and phase in ("create", "remove"):
                                t.daemon.wait_published(timeout=300)
                            r["agent"] = counts_delta(before, agent_counts(t))
                            print_phase(r)
                            results.append(r)
                        for c in conns:
                            c.send(None)
                    for d in dirs:
                        d.rmdir()
    finally:
        for t in targets:
            t.stop()
        if cluster is not None:
            cluster.stop()
        trace.remove()
    if args.json is not None:
        args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                         "load": os.getloadavg(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

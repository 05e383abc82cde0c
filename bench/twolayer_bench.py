#!/usr/bin/env python3
"""2-Layer Scheduling end to end: one workflow run three ways on a real cluster.

For each mode a fresh cluster is started — a local Redis Cluster namespace, a control plane
(``hycache-control serve``, SQLite) and N agents (``hycache-agent mount`` with small fast
tiers, linked to the control plane) — and the workflow runner (``hycache-control run``'s
:class:`Runner`) runs the same workflow through the agents' mounts:

- ``rr-lru``: round-robin placement (``--solver round-robin``), no plans (the agents' LRU
  with promotion on open does all the tiering);
- ``layer1``: data-aware placement (``--solver local``), no plans;
- ``2ls``: placement and each node's prefetch/evict plan, carried out by the agents.

"No plans" = the manifest is cancelled right after it is submitted (DELETE cancels its
pending plan steps; the few released to an agent in between are counted in the table as
``steps done``), and the runner does not report job start/finish (a cancelled manifest
refuses them).

Measured from the agents' own counters (``hycache-agent status --json``) before and after
the run, summed over the nodes: bytes fetched from other nodes (remote fetch bytes),
fast-tier hit ratio (hits / (hits + misses) of opens for reading), bytes read from the
slow tier, and the makespan (first job start to last job finish, as the runner measures).

Usage: bench/twolayer_bench.py [--nodes 3] [--fast 24M] [--scale 1] [--json FILE]
Needs root (FUSE mounts).  Prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
AGENT, CONTROL = str(BIN / "hycache-agent"), str(BIN / "hycache-control")

import httpx  # noqa: E402
from hycache_control.runner import Runner  # noqa: E402
from hycache_core.sizes import format_size, parse_size  # noqa: E402
from hycache_dht.localcluster import LocalRedisCluster, find_free_base  # noqa: E402

M = 1 << 20
MODES = (("rr-lru", "round-robin", False), ("layer1", "local", False), ("2ls", "local", True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workflow(width: int) -> dict:
    """A four-stage workflow in the project's manifest format (sizes in MiB × 1):
    ``prep_i`` reads raw_i (8 MiB) and the shared ref.db (4 MiB), writes chunk_i (8 MiB);
    ``proc_i`` reads chunk_i and ref.db, writes out_i (4 MiB); two ``merge`` jobs read half
    of the outs each and write m_k (4 MiB); ``final`` reads both m_k."""
    jobs = []
    for i in range(width):
        jobs.append({"name": f"prep{i}", "accesses": [
            {"path": f"raw{i}", "size": 8 * M}, {"path": "ref.db", "size": 4 * M},
            {"path": f"chunk{i}", "size": 8 * M, "op": "W"}]})
    for i in range(width):
        jobs.append({"name": f"proc{i}", "accesses": [
            {"path": f"chunk{i}", "size": 8 * M}, {"path": "ref.db", "size": 4 * M},
            {"path": f"out{i}", "size": 4 * M, "op": "W"}]})
    half = width // 2
    for k, part in enumerate((range(half), range(half, width))):
        jobs.append({"name": f"merge{k}", "accesses": [
            *({"path": f"out{i}", "size": 4 * M} for i in part), {"path": f"m{k}", "size": 4 * M, "op": "W"}]})
    jobs.append({"name": "final", "accesses": [
        {"path": "m0", "size": 4 * M}, {"path": "m1", "size": 4 * M}, {"path": "result", "size": M, "op": "W"}]})
    return {"version": 1, "name": f"bench-{width}", "jobs": jobs}


def cli(*argv: str) -> str:
    return subprocess.run([CONTROL, *argv], capture_output=True, text=True, check=True).stdout.strip()


class Cluster:
    """A control plane and N agents on one Redis Cluster namespace, under ``base``."""

    def __init__(self, base: Path, redis: str, namespace: str, nodes: int, fast: int) -> None:
        self.base, self.procs, self.logs, self.mounts = base, [], [], {}
        db = f"sqlite:///{base / 'control.db'}"
        self.admin = cli("token", "create", "--db", db, "--scope", "admin", "--name", "bench")
        (base / "admin.token").write_text(self.admin)
        (base / "admin.token").chmod(0o600)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._start("control", [CONTROL, "serve", "--db", db, "--listen", f"127.0.0.1:{port}", "--state-dir",
                                str(base), "--ui-dir", str(base / "no-ui"), "--redis", redis, "--dht-namespace",
                                namespace, "--heartbeat-interval", "0.3", "--log-level", "warning"])
        self._wait(lambda: httpx.get(self.url + "/healthz", timeout=2).status_code == 200, "the control plane")
        secret = base / "cluster.secret"
        secret.write_text(os.urandom(32).hex())
        secret.chmod(0o600)
        for i in range(nodes):
            name = f"n{i}"
            tok = base / f"{name}.token"
            tok.write_text(cli("token", "create", "--db", db, "--scope", "node", "--node-id", name))
            tok.chmod(0o600)
            root, mnt = base / name, base / name / "mnt"
            mnt.mkdir(parents=True)
            self._start(name, [AGENT, "mount", str(root), str(mnt), "--log-level", "WARNING",
                               "--fast-capacity", str(fast), "--redis", redis, "--dht-namespace", namespace,
                               "--node-id", name, "--listen", f"127.0.0.1:{free_port()}",
                               "--cluster-secret-file", str(secret), "--rebalance-interval", "0",
                               "--control-plane", self.url, "--control-token-file", str(tok)])
            self._wait(lambda: os.path.ismount(mnt), f"agent {name} to mount")
            self.mounts[name] = mnt
        h = {"Authorization": f"Bearer {self.admin}"}

        def all_up():
            r = httpx.get(self.url + "/api/v1/nodes", headers=h, timeout=5).json()
            items = r["items"] if isinstance(r, dict) else r
            return {n["id"] for n in items if n["state"] == "up"} >= set(self.mounts)
        self._wait(all_up, "every agent's heartbeat")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.base / f"{name}.log", "wb")
        self.logs.append(log)
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def _wait(self, pred, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"a process exited while waiting for {what}; logs in {self.base}")
            try:
                if pred():
                    return
            except (OSError, httpx.HTTPError):
                pass
            time.sleep(0.1)
        raise SystemExit(f"timed out waiting for {what}; logs in {self.base}")

    def counters(self) -> dict[str, dict]:
        out = {}
        for name, mnt in self.mounts.items():
            st = subprocess.run([AGENT, "status", str(mnt.parent), "--json"], capture_output=True, text=True,
                                check=True)
            out[name] = json.loads(st.stdout)["counters"]
        return out

    def wait_published(self) -> None:
        def drained():
            for mnt in self.mounts.values():
                st = subprocess.run([AGENT, "status", str(mnt.parent), "--json"], capture_output=True, text=True)
                if st.returncode != 0 or json.loads(st.stdout)["cluster"]["backlog"]:
                    return False
            return True
        self._wait(drained, "the agents' outboxes to drain", timeout=120)
        time.sleep(1.2)  # the kernel's entry timeout

    def stop(self) -> None:
        for p in reversed(self.procs):  # agents first, then the control plane
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        for mnt in self.mounts.values():
            if os.path.ismount(mnt):
                subprocess.run(["fusermount3", "-uz", str(mnt)])
        for log in self.logs:
            log.close()


class BenchRunner(Runner):
    """The runner, waiting before it submits until every input it wrote is published in the
    DHT (so that placement sees where it is and every node can open it)."""

    cluster: Cluster

    def _call(self, method: str, url: str, **kw):
        # before the submission and before each job's start: the outputs of finished jobs
        # (the job's parents) are published, so a job on another node finds them
        if method == "POST" and (url == "/manifests" or url.endswith("/start")):
            self.cluster.wait_published()
        return super()._call(method, url, **kw)


class NoPlanRunner(BenchRunner):
    """The runner with the manifest's plans cancelled at once (placement only)."""

    def _call(self, method: str, url: str, **kw):
        if method == "POST" and url.endswith("/start"):
            self.cluster.wait_published()
            return {}
        if method == "POST" and url.endswith("/finish"):
            return {}
        out = super()._call(method, url, **kw)
        if method == "POST" and url == "/manifests":
            super()._call("DELETE", f"/manifests/{out['id']}")
        return out


def total(before: dict, after: dict, *keys: str) -> int:
    def get(c):
        for k in keys:
            c = c.get(k, 0) if isinstance(c, dict) else 0
        return int(c or 0)
    return sum(get(after[n]) - get(before[n]) for n in after)


def run_mode(base: Path, redis: str, mode: tuple, args, doc: dict) -> dict:
    name, solver, plans = mode
    cluster = Cluster(base / name, redis, f"tl-{os.getpid()}-{name}", args.nodes, args.fast)
    try:
        cls = BenchRunner if plans else NoPlanRunner
        cls.cluster = cluster
        runner = cls(cluster.url, cluster.admin, cluster.mounts, scale=args.scale, solver=solver,
                     plan_wait=args.plan_wait, log=lambda msg: print(f"[{name}] {msg}", file=sys.stderr))
        before = cluster.counters()
        res = runner.run(doc)
        time.sleep(1.0)  # steps of the last jobs (evictions) finishing
        after = cluster.counters()
    finally:
        cluster.stop()
    hits, misses = total(before, after, "fast", "hits"), total(before, after, "misses")
    steps = {k: sum(s.get(k, 0) for s in res["steps"].values()) for k in ("total", "done", "failed", "skipped",
                                                                          "cancelled")}
    return {"mode": name, "solver": solver, "plans": plans, "makespan_s": res["makespan"],
            "remote_fetch_bytes": total(before, after, "remote", "fetch_bytes"),
            "planned_transfer_bytes": res["transfer_bytes"]["placed"],
            "hits": hits, "misses": misses, "hit_ratio": hits / (hits + misses) if hits + misses else 0.0,
            "slow_read_bytes": total(before, after, "slow", "read_bytes"),
            "fast_read_bytes": total(before, after, "fast", "read_bytes"),
            "remote_read_bytes": total(before, after, "remote", "read_bytes"), "steps": steps,
            "placement": res["placement"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--nodes", type=int, default=3, help="agents (default 3)")
    ap.add_argument("--fast", type=parse_size, default=24 * M, help="each agent's fast tier (default 24M)")
    ap.add_argument("--width", type=int, default=6, help="prep/proc jobs per stage (default 6, even)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every file size (default 1)")
    ap.add_argument("--plan-wait", type=float, default=30.0, help="the runner's wait for a job's steps (s)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    if args.nodes < 2 or args.width < 2 or args.width % 2:
        ap.error("--nodes must be ≥ 2 and --width even and ≥ 2")
    if os.geteuid() != 0:
        ap.error("needs root (FUSE mounts)")
    doc = workflow(args.width)
    base = Path(tempfile.mkdtemp(prefix="twolayer-bench-"))
    redis = LocalRedisCluster(base / "redis", find_free_base(6), masters=3, replicas=1).start()
    rows = []
    try:
        seeds = ",".join(f"{h}:{p}" for h, p in redis.nodes[:3])
        for mode in MODES:
            rows.append(run_mode(base, seeds, mode, args, doc))
    finally:
        redis.stop()
    print(f"\n{len(doc['jobs'])} jobs on {args.nodes} nodes, fast tier {format_size(args.fast)} each, "
          f"scale {args.scale}")
    head = f"{'mode':8} {'makespan s':>10} {'moved MiB':>10} {'planned MiB':>11} {'hit ratio':>9} " \
           f"{'hits/misses':>11} {'slow read MiB':>13} {'steps done/failed/skipped/total':>32}"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["steps"]
        print(f"{r['mode']:8} {r['makespan_s']:10.2f} {r['remote_fetch_bytes'] / M:10.1f} "
              f"{r['planned_transfer_bytes'] / M:11.1f} {r['hit_ratio']:9.2f} {r['hits']:>5}/{r['misses']:<5} "
              f"{r['slow_read_bytes'] / M:13.1f} {s['done']:>10}/{s['failed']}/{s['skipped']}/{s['total']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One workflow run three ways on a real local cluster (Redis Cluster, the control plane,
two agents with FUSE mounts): round-robin placement with the agents' LRU only, layer 1 only
(placement by data, no plans), and full 2LS (placement + plans carried out by the agents).
Each way runs on a fresh cluster state (its own DHT namespace, control-plane database and
agents), ``--runs`` times, the order of the ways rotated from run to run (run r starts with
way r mod 3), so the three share the machine's load alike.  Prints, per way, the median and
min–max of the makespan, and the medians of bytes moved between nodes (the agents' remote
fetch bytes), fast-tier hit ratio (hits / (hits + misses) of the jobs' opens), opens served
by a node's own slow tier, and the seconds jobs waited for a prefetch under way.

With ``--slow-tier-mbps N`` (root) the agents' slow tiers are directories on one file
system on a loop device throttled to N MB/s for reads and writes (``bench/slowtier.py``: a
disk, or a parallel file system's share, that the two nodes share), and its page cache is
dropped once each run's inputs are written, so the jobs' slow-tier reads reach the device;
the table then also gives the bytes the device served (read) per run.

    .venv/bin/python bench/twolayer_bench.py [--manifest pipeline|F] [--scale 1] [--fast-capacity 64M]
        [--compute-scale 0.05] [--runs 3] [--slow-tier-mbps N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from hycache_control.runner import Runner
from hycache_harness import (
    Agent,
    ControlPlane,
    HarnessError,
    cluster_secret,
    create_token,
    redis_seeds,
    start_redis_cluster,
    wait_for,
    write_secret,
)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "core" / "data" / "wfformat-1.5-tiny.json"
#: (label, solver, plans, when the next job's prefetches are released); the fourth is the
#: release rule before the reads-done event, for an A/B (``--ways 2,3``)
WAYS = [("round-robin + LRU", "round-robin", False, "reads"), ("layer 1 only", "local", False, "reads"),
        ("full 2LS", "local", True, "reads"), ("full 2LS, release at start", "local", True, "start")]


def pipeline(mib: int = 8) -> dict:
    """A WfFormat 1.5 instance whose working set (42 × ``mib`` MiB: 336 MiB by default)
    is far larger than two 64 MiB fast tiers while every job fits one: 8 ``align`` jobs
    each read their own input (2 units) and one of 4 references (4 units; align 2k and 2k+1
    share reference k, which merge k reads too) and write
    1 unit; 4 ``merge`` jobs each read two alignments and a reference and write half a
    unit; one ``report`` reads the merges."""
    M = mib << 20
    files = {f"ref{k}": 4 * M for k in range(4)}
    tasks, runtimes = [], {}

    def task(tid, ins, outs, parents, runtime):
        tasks.append({"name": tid, "id": tid, "parents": parents, "children": [], "inputFiles": ins,
                      "outputFiles": outs})
        runtimes[tid] = runtime
    for i in range(8):
        files[f"in{i}"], files[f"aln{i}"] = 2 * M, M
        task(f"align_{i}", [f"in{i}", f"ref{i // 2}"], [f"aln{i}"], [], 10.0)
    for k in range(4):
        files[f"m{k}"] = M // 2
        task(f"merge_{k}", [f"aln{2 * k}", f"aln{2 * k + 1}", f"ref{k}"], [f"m{k}"],
             [f"align_{2 * k}", f"align_{2 * k + 1}"], 8.0)
    files["report"] = M // 8
    task("report_0", [f"m{k}" for k in range(4)], ["report"], [f"merge_{k}" for k in range(4)], 4.0)
    return {"name": "pipeline", "schemaVersion": "1.5", "workflow": {
        "specification": {"tasks": tasks, "files": [{"id": f, "sizeInBytes": n} for f, n in files.items()]},
        "execution": {"makespanInSeconds": 0, "executedAt": "2026-11-25T00:00:00Z",
                      "tasks": [{"id": t, "runtimeInSeconds": r, "command": {"program": t.split("_")[0]}}
                                for t, r in runtimes.items()]}}}


def wait(cond, timeout: float, what: str) -> None:
    wait_for(cond, timeout, what, error=SystemExit)


def settle(slow, quiet: float = 1.0, timeout: float = 120.0) -> None:
    """Until the throttled device has written nothing for ``quiet`` s (the agents' demotions
    of the inputs are done), then its file system's cache is dropped."""
    deadline = time.monotonic() + timeout
    w = slow.write_bytes()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        w, w0 = slow.write_bytes(), w
        if w == w0:
            break
    slow.drop_cache()


def run_way(base: Path, seeds: str, doc: dict, args, solver: str, plans: bool, slow=None,
            release: str = "reads") -> dict:
    base.mkdir(parents=True)
    ns = "bench-" + uuid.uuid4().hex[:8]
    db = f"sqlite:///{base / 'control.db'}"
    admin = create_token(db, "admin")
    control = ControlPlane("--redis", seeds, "--dht-namespace", ns, "--heartbeat-interval", "0.5", db=db,
                           state_dir=base, log=base / "control.log", ready_path="/healthz")
    url = control.url
    agents: list[Agent] = []
    try:
        try:
            control.start()
        except HarnessError as e:
            raise SystemExit(f"twolayer_bench: {e}") from None
        secret = cluster_secret(base / "cluster.secret")
        mounts = {}
        for name in ("a", "b"):
            d = base / name
            slow_args: list[str] = []
            if slow is not None:
                sd = slow.mnt / base.name / name
                sd.mkdir(parents=True)
                slow_args = ["--slow", str(sd)]
            tf = write_secret(base / f"{name}.token", create_token(db, "node", node_id=name))
            agent = Agent(d / "root", name, "--fast-capacity", args.fast_capacity, "--control-plane", url,
                          "--control-token-file", str(tf), *slow_args, mountpoint=d / "mnt", log=d / "agent.log",
                          redis=seeds, secret=secret, namespace=ns, log_level=None, append_log=True)
            agents.append(agent)
            try:
                agent.start(60)
            except HarnessError as e:
                raise SystemExit(f"twolayer_bench: agent {name}: {e}") from None
            mounts[name] = agent.mnt
        h = {"Authorization": f"Bearer {admin}"}
        wait(lambda: {n["id"] for n in httpx.get(url + "/api/v1/nodes", headers=h).json()["items"]
                      if n["state"] == "up" and n["tiers"]} >= {"a", "b"}, 60, "both agents up")
        dev: dict[str, int] = {}

        def before_submit() -> None:
            if slow is not None:
                settle(slow)
                dev["read"], dev["write"] = slow.read_bytes(), slow.write_bytes()
        res = Runner(url, admin, mounts, scale=args.scale, solver=solver, plans=plans, plan_wait=60,
                     compute_scale=args.compute_scale, log=lambda m: None, before_submit=before_submit,
                     release=release).run(doc)
        if slow is not None:
            dev["read"], dev["write"] = slow.read_bytes() - dev["read"], slow.write_bytes() - dev["write"]
    finally:
        for agent in reversed(agents):
            agent.stop()
        control.stop()
        if slow is not None:
            shutil.rmtree(slow.mnt / base.name, ignore_errors=True)
    c = res["counters"]

    def delta(n, *keys):
        a, b = c[n]["after"], c[n]["before"]
        for k in keys:
            a, b = a.get(k, {}) if isinstance(a, dict) else 0, b.get(k, {}) if isinstance(b, dict) else 0
        return int(a or 0) - int(b or 0)
    hits = sum(delta(n, "fast", "hits") for n in c)
    misses = sum(delta(n, "misses") for n in c)
    return {"moved_bytes": sum(delta(n, "remote", "fetch_bytes") for n in c),
            "planned_transfer_bytes": res["transfer_bytes"]["placed"],
            "hit_ratio": hits / (hits + misses) if hits + misses else None, "hits": hits, "misses": misses,
            "slow_read_bytes": sum(delta(n, "slow", "read_bytes") for n in c),
            # opens served by a node's own slow tier (with kernel passthrough their bytes
            # bypass the agent, so slow read bytes stay 0 while these count)
            "slow_opens": sum(delta(n, "slow", "hits") for n in c),
            "makespan": res["makespan"], "failed_steps": len(res["failed_steps"]),
            "no_room_steps": sum("no room" in (f["detail"] or "") for f in res["failed_steps"]),
            "failed_details": [f"{f['node']} {f['job']} {f['plan_action']} {f['path']}: {f['detail']}"
                               for f in res["failed_steps"][:5]],
            "prefetch_wait": sum(j["prefetch_wait"] for j in res["jobs"].values()),
            "skipped_steps": sum(c.get("skipped", 0) for c in res["steps"].values()),
            # what the throttled device served while the jobs ran (None without --slow-tier-mbps)
            "slow_device_read_bytes": dev.get("read"), "slow_device_write_bytes": dev.get("write"),
            "jobs": {j: {k: r[k] for k in ("node", "started", "seconds", "prefetch_wait", "plan_steps", "read_seconds",
                                           "open_seconds", "write_seconds", "publish_seconds", "finished",
                                           "start_call_seconds", "finish_call_seconds")}
                     for j, r in res["jobs"].items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default="pipeline",
                    help="a manifest file, or 'pipeline' (default: the generated instance above, 336 MiB), "
                         f"e.g. {TINY.relative_to(REPO)} (328 MB; needs --fast-capacity 200M)")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor (default 1)")
    ap.add_argument("--fast-capacity", default="64M", help="each agent's fast tier (default 64M)")
    ap.add_argument("--compute-scale", type=float, default=0.05,
                    help="each job computes (sleeps) this × its runtime (default 0.05)")
    ap.add_argument("--runs", type=int, default=3, help="runs per way (default 3)")
    ap.add_argument("--ways", default="0,1,2", help="which ways (indices into: round-robin + LRU, "
                                                   "layer 1 only, full 2LS, full 2LS with prefetches released "
                                                   "at the job before's start; default 0,1,2)")
    ap.add_argument("--slow-tier-mbps", type=float, default=0,
                    help="put the agents' slow tiers on a loop device throttled to this many MB/s "
                         "(bench/slowtier.py; root; default 0: off, the slow tier is a plain directory)")
    ap.add_argument("--slow-tier-size", default="4G", help="that device's size (default 4G, a sparse file)")
    ap.add_argument("--logs", type=Path, help="keep each run's agent and control-plane logs under this directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the finally blocks below
    doc = pipeline() if args.manifest == "pipeline" else json.loads(Path(args.manifest).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="twolayer-bench-"))
    os.chmod(tmp, 0o755)
    ways = [WAYS[int(i)] for i in args.ways.split(",")]
    out: dict[str, list[dict]] = {label: [] for label, _, _, _ in ways}
    slow = cluster = None
    try:
        if args.slow_tier_mbps > 0:
            from slowtier import SlowTier
            slow = SlowTier(args.slow_tier_mbps, size=args.slow_tier_size)
        cluster = start_redis_cluster(tmp / "redis")
        seeds = redis_seeds(cluster.nodes)
        for r in range(args.runs):
            for k in range(len(ways)):
                label, solver, plans, release = ways[(r + k) % len(ways)]
                res = run_way(tmp / f"run{r}-{k}", seeds, doc, args, solver, plans, slow, release)
                res["run"], res["position"] = r, k
                out[label].append(res)
                print(f"run {r} #{k} {label}: {res} (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
                if args.logs is not None:
                    keep = args.logs / f"run{r}-{k}-{label.split(',')[0].split()[0]}{'-start' if release == 'start' else ''}"
                    keep.mkdir(parents=True, exist_ok=True)
                    for log in (tmp / f"run{r}-{k}").glob("**/*.log"):
                        shutil.copy(log, keep / str(log.relative_to(tmp / f"run{r}-{k}")).replace("/", "-"))
                shutil.rmtree(tmp / f"run{r}-{k}", ignore_errors=True)
    finally:
        if cluster is not None:
            cluster.stop()
        if slow is not None:
            slow.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_table(out)
    return 0


def print_table(out: dict[str, list[dict]]) -> None:
    from rich.console import Console
    from rich.table import Table

    med = statistics.median
    t = Table("way", "bytes moved between nodes", "fast-tier hit ratio", "slow-tier opens",
              "waited for prefetches s", "failed steps (no room)", "slow device read MiB", "makespan s median (min–max)",
              "runs")
    for label, rs in out.items():
        hr = [r["hit_ratio"] for r in rs if r["hit_ratio"] is not None]
        ms = [r["makespan"] for r in rs]
        t.add_row(label, f"{med(r['moved_bytes'] for r in rs):,.0f}", f"{med(hr):.2f}" if hr else "-",
                  f"{med(r['slow_opens'] for r in rs):.0f}", f"{med(r['prefetch_wait'] for r in rs):.2f}",
                  " ".join(f"{r['failed_steps']}({r['no_room_steps']})" for r in rs),
                  " ".join("-" if r["slow_device_read_bytes"] is None else f"{r['slow_device_read_bytes'] / 2**20:.0f}"
                           for r in rs),
                  f"{med(ms):.2f} ({min(ms):.2f}–{max(ms):.2f})", " ".join(f"{m:.2f}" for m in ms))
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())

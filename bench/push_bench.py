"""Release → agent-receipt latency of plan steps: the push channel against the heartbeat.

    .venv/bin/python bench/push_bench.py [--releases 100] [--interval 0.5]

A real ``hycache-control serve`` (SQLite, a temporary directory) and one node whose link is
the agent's own ``ControlLink`` (heartbeats, the ``GET /nodes/{id}/plan`` long-poll, the
early heartbeat after a result); only its engine is a stand-in that records when each
action arrives and reports it done at once (the file system is not what is measured).
A manifest of ``--releases + 1`` jobs on that node, each reading a file of its own, gives
every job one prefetch step, released when the job before it has read its inputs.  For
each job the bench posts the previous job's start, then its reads done (the release), and
waits until the job's step reached the link; latency = receipt − the moment the reads-done
request was sent (so it includes that request; the column says "start request" as before
issue 21's reads-done event, when the start was the release).  Three ways in one run, rotating per release: the link with the push channel;
the same with the poll loop before the change that re-polls at once after a quick answer
(``push, before``: a 20 ms pause after every answer that came back within 20 ms); and the
link without the channel (heartbeats every ``--interval`` s, as before issue 21).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import trio
from hycache_agent.control.link import ControlLink
from hycache_harness import ControlPlane, HarnessError, create_token, pct


class Receipts:
    """The stand-in engine: what ControlLink calls, recording each action's arrival."""

    policy_version = 0

    def __init__(self) -> None:
        self.at: dict[str, float] = {}  # job -> monotonic receipt
        self.cond = threading.Condition()

    async def status(self, max_age: float = 0) -> dict:
        return {"counters": {}, "tiers": {"fast": {"capacity": 1 << 40, "used": 0},
                                          "slow": {"capacity": 1 << 40, "used": 0}}}

    def record(self, job: str) -> None:
        with self.cond:
            self.at.setdefault(job, time.monotonic())
            self.cond.notify_all()


class BenchLink(ControlLink):
    async def apply_action(self, action: dict) -> dict:
        self.engine.record(action.get("job"))
        return {"id": action["id"], "state": "done", "detail": "bench", "tier": "fast",
                **{k: action[k] for k in ("manifest_id", "job", "step") if k in action}}


class PausingLink(BenchLink):
    """The link's poll loop before the change (A/B): a 20 ms pause after *every* answer
    that came back within 20 ms, not only after two in a row."""

    async def poll_plans(self, client) -> None:
        while True:
            t0 = trio.current_time()
            try:
                await self.poll_one(client)
            except Exception:
                self.push_version = None
                await trio.sleep(1.0)
                continue
            await trio.sleep_until(t0 + 0.02)


def run_link(link: ControlLink, stop: threading.Event) -> None:
    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(link.run)
            while not stop.is_set():
                await trio.sleep(0.05)
            n.cancel_scope.cancel()
    trio.run(main)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", type=int, default=100, help="releases per way (default 100)")
    ap.add_argument("--interval", type=float, default=0.5, help="heartbeat interval, s (default 0.5)")
    ap.add_argument("--timeout", type=float, default=10.0, help="give up on one release after this many s")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="push-bench-"))
    db = f"sqlite:///{tmp / 'control.db'}"
    admin = create_token(db, "admin")
    srv = ControlPlane("--heartbeat-interval", str(args.interval), db=db, state_dir=tmp, log=tmp / "control.log",
                       ready_path="/healthz")
    url = srv.url
    stops, threads = [], []
    out: dict[str, list[float]] = {}
    req: dict[str, list[float]] = {}  # the releasing request's own round trip
    try:
        http = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {admin}"}, timeout=30)
        try:
            srv.start(60)
        except HarnessError as e:
            raise SystemExit(f"push_bench: the control plane did not start: {e}") from None
        ways = {"push": True, "push, before": True, "heartbeat only": False}
        engines: dict[str, Receipts] = {}
        for i, (way, push) in enumerate(ways.items()):
            node = f"n{i}"
            eng = engines[way] = Receipts()
            cls = PausingLink if way == "push, before" else BenchLink
            link = cls(eng, url, create_token(db, "node", node_id=node), node_id=node, address=None,
                       interval=args.interval, push=push)
            stop = threading.Event()
            t = threading.Thread(target=run_link, args=(link, stop), daemon=True)
            t.start()
            stops.append(stop)
            threads.append(t)
        deadline = time.monotonic() + 30
        want = {f"n{i}" for i in range(len(ways))}
        while {n["id"] for n in http.get("/nodes").json()["items"] if n["state"] == "up"} != want:
            if time.monotonic() > deadline:
                raise SystemExit("push_bench: the simulated nodes did not come up")
            time.sleep(0.1)
        jobs = [f"j{k:04d}" for k in range(args.releases + 1)]
        mids = {}
        for i, way in enumerate(ways):
            doc = {"version": 1, "name": f"push-bench-{way}",
                   "jobs": [{"name": j, "accesses": [{"path": f"w{i}/{j}.in", "size": 4096}]} for j in jobs]}
            r = http.post("/manifests", json=doc, params={"nodes": f"n{i}", "solver": "greedy"})
            r.raise_for_status()
            mids[way] = r.json()["id"]
            out[way], req[way] = [], []
        for k in range(1, len(jobs)):
            names = list(ways)
            for way in names[k % len(names):] + names[:k % len(names)]:  # rotate which way goes first
                eng, mid = engines[way], mids[way]
                http.post(f"/manifests/{mid}/jobs/{jobs[k - 1]}/start").raise_for_status()
                t_sent = time.monotonic()
                http.post(f"/manifests/{mid}/jobs/{jobs[k - 1]}/reads-done").raise_for_status()
                req[way].append(time.monotonic() - t_sent)
                with eng.cond:
                    if not eng.cond.wait_for(lambda: jobs[k] in eng.at, args.timeout):
                        raise SystemExit(f"push_bench: {way}: the step of {jobs[k]} never arrived")
                out[way].append(eng.at[jobs[k]] - t_sent)
                http.post(f"/manifests/{mid}/jobs/{jobs[k - 1]}/finish").raise_for_status()
    finally:
        for s in stops:
            s.set()
        for t in threads:
            t.join(10)
        srv.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"release -> agent receipt of a plan step, {args.releases} releases per way, heartbeat interval "
          f"{args.interval} s (load average {os.getloadavg()[0]:.2f})")
    print(f"{'way':<16}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'mean ms':>10}{'start request p50 ms':>22}")
    for way, xs in out.items():
        print(f"{way:<16}{pct(xs, .5) * 1e3:>10.1f}{pct(xs, .99) * 1e3:>10.1f}{max(xs) * 1e3:>10.1f}"
              f"{statistics.mean(xs) * 1e3:>10.1f}{pct(req[way], .5) * 1e3:>22.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

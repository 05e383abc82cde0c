"""``hycache-control run``: the workflow runner.

Submits a manifest to the control plane, then runs each job on its placed node as real
reads and writes of the manifest's sizes (times ``--scale``) through that node's mount (the
mounts are on this machine), in dependency order, reporting start and finish, and prints a
summary.

What it does, exactly:
- The document is submitted with every size multiplied by ``--scale`` (rounded, at least 1
  byte for a non-empty file), so the placement and the plans are made for the bytes that
  are really written (fast-tier capacities are real too).
- Input files that no job writes are created first: each is written through the mount of a
  node chosen round-robin over ``--mount`` (in the order the files are first read), so the
  DHT records that node as its primary before the manifest is submitted and placement
  sees where it is.  Files already present with the scaled size are kept.
- A manifest file name ``x`` is the path ``/x`` in the namespace (``MOUNT/x``).
- Each node runs its jobs one at a time in plan order (the order its plan assumes); a job
  waits for its parents (on any node) and then reports start at once (the control plane
  skips its prefetch/evict steps that have not reached the node: the job never waits for
  those).  It reads each input whole — first those with no prefetch under way, then,
  each after its prefetch ended (at most ``--plan-wait`` seconds), those whose prefetch
  the node is carrying out: a prefetch under way started before the read would and
  moves the same bytes, so it ends before a read of the file started now would, and
  reading alongside it would move the bytes twice (docs/scheduling.md, "When a job
  starts"); which prefetches are under way it takes from the start's answer (``steps``),
  and while it waits it polls the job alone (``GET /manifests/{id}/jobs/{job}``) — then
  reports that it has read its inputs (``…/reads-done``: the next job's prefetches on the
  node are released now, to overlap this job's compute) while it computes for
  ``--compute-scale`` × the job's runtime (a sleep; 0 by default: jobs are their I/O
  only), writes each output, and reports finish.  Nodes run in parallel.  With
  ``--release start`` the manifest releases prefetches at the job before's start instead,
  and no reads done are reported.
- A job's outputs that a job on another node reads are published (the namespace shows
  them on its node) before it reports finish, so that job's prefetch and open find them
  there.  An output read only on its own node is not waited for (the node's own jobs
  open it through the same mount, and its publication lingers tens of ms in the agent).
- Counters (hits, misses, remote fetch bytes …) are read from ``GET /nodes/{id}`` after
  the inputs were created (before submitting) and after the last job, each time once every
  node has sent a heartbeat newer than that moment.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from hycache_core.workflow import HYCACHE, WFFORMAT_14, Workflow, WorkflowJob, detect_format, parse_workflow

CHUNK = 1 << 20
FINAL = ("done", "failed", "skipped", "cancelled")


class RunError(Exception):
    pass


def _scaled(size: Any, scale: float) -> Any:
    if not isinstance(size, (int, float)) or isinstance(size, bool) or size <= 0:
        return size
    return max(1, round(size * scale))


def scale_document(doc: Any, scale: float) -> Any:
    """The document with every file size multiplied by ``scale`` (any of the three formats)."""
    if scale == 1:
        return doc
    out = copy.deepcopy(doc)
    fmt = detect_format(out)
    if fmt == HYCACHE:
        for job in out.get("jobs", []):
            for a in job.get("accesses", []):
                a["size"] = _scaled(a.get("size"), scale)
    elif fmt == WFFORMAT_14:
        for t in out["workflow"].get("tasks", []):
            for f in t.get("files", []) or []:
                f["sizeInBytes"] = _scaled(f.get("sizeInBytes"), scale)
    else:
        for f in out["workflow"].get("specification", {}).get("files", []) or []:
            f["sizeInBytes"] = _scaled(f.get("sizeInBytes"), scale)
    return out


def _write(path: Path, size: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = b"h" * min(CHUNK, max(size, 1))
    left = size
    with open(path, "wb") as f:
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return size


def _open_retrying(path: Path, timeout: float = 5.0, waited: list[float] | None = None):
    """A file another node just published may still be a cached negative entry in this
    mount's kernel (the entry timeout is 1 s): retry ENOENT for a few seconds (the time
    spent so is added to ``waited[0]``)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        if waited is not None:
            waited[0] += time.monotonic() - t0
        return f


def _read(path: Path, waited: list[float] | None = None) -> int:
    n = 0
    with _open_retrying(path, waited=waited) as f:
        while chunk := f.read(CHUNK):
            n += len(chunk)
    return n


class Runner:
    def __init__(self, api: str, token: str, mounts: dict[str, Path], *, scale: float = 1.0, solver: str = "local",
                 slack: float = 0.1, plan_wait: float = 60.0, plans: bool = True, compute_scale: float = 0.0,
                 log=None, before_submit=None, release: str = "reads") -> None:
        self.plans = plans
        self.release = release  # when the next job's prefetches are released: "reads" (done) | "start"
        # called once the inputs are created and published, before the counters are read
        # and the manifest is submitted (a benchmark drops a slow tier's cache there)
        self.before_submit = before_submit
        self.compute_scale = compute_scale
        self.http = httpx.Client(base_url=api.rstrip("/") + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                 timeout=60.0)
        self.mounts = mounts
        self.scale = scale
        self.solver = solver
        self.slack = slack
        self.plan_wait = plan_wait
        self.log = log or (lambda msg: print(msg, file=sys.stderr))

    def _call(self, method: str, url: str, **kw) -> Any:
        r = self.http.request(method, url, **kw)
        if r.status_code >= 400:
            raise RunError(f"{method} {url}: {r.status_code} {r.text[:2000]}")
        return r.json()

    def counters(self) -> dict[str, dict]:
        out = {}
        for n in self.mounts:
            v = self._call("GET", f"/nodes/{n}")
            out[n] = {"counters": v.get("counters") or {}, "last_heartbeat": v.get("last_heartbeat")}
        return out

    def _wait_heartbeats_after(self, t: float, timeout: float = 30.0) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            c = self.counters()
            if all((v["last_heartbeat"] or 0) > t for v in c.values()) or time.monotonic() > deadline:
                return c
            time.sleep(0.2)

    def wait_published(self, files: dict[str, int], node: str, timeout: float = 60.0) -> None:
        """Until the namespace (the DHT, through the API) shows each file on ``node`` with its
        size: the agents publish their metadata asynchronously."""
        deadline = time.monotonic() + timeout
        left = dict(files)
        pause = 0.005  # the agent publishes within ~50-70 ms (its publisher lingers 50 ms): look often
        while left:
            for f, size in list(left.items()):
                r = self.http.get("/files/info", params={"path": "/" + f.lstrip("/")})
                if r.status_code == 200 and r.json().get("size") == size and r.json().get("primary") == node:
                    del left[f]
            if left:
                if time.monotonic() > deadline:
                    raise RunError(f"not published by node {node} within {timeout:.0f} s: {', '.join(sorted(left))}")
                time.sleep(pause)
                pause = min(0.02, pause * 2)

    def run(self, document: Any) -> dict[str, Any]:
        doc = scale_document(document, self.scale)
        wf = parse_workflow(doc, source="manifest")
        nodes = list(self.mounts)
        created = self._create_inputs(wf, nodes)
        if self.before_submit is not None:
            self.before_submit()
        before = self._wait_heartbeats_after(time.time())
        m = self._call("POST", "/manifests", json=doc,
                       params={"nodes": ",".join(nodes), "solver": self.solver, "slack": self.slack,
                               "plans": "true" if self.plans else "false",
                               **({"release": "start"} if self.release == "start" else {})})
        self.log(f"manifest {m['id']}: {len(wf.jobs)} jobs placed ({self.solver}); "
                 f"{m['transfer_bytes']['placed']} bytes to move between nodes")
        jobs = _JobsRun(self, wf, m)
        t0 = time.monotonic()
        threads = [threading.Thread(target=jobs.node_worker, args=(n,), name=f"run-{n}")
                   for n in nodes if jobs.order[n]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        makespan = time.monotonic() - t0
        if jobs.errors:
            raise RunError("; ".join(jobs.errors))
        final = self._wait_steps_final(m["id"])
        after = self._wait_heartbeats_after(time.time())
        return {"manifest_id": m["id"], "name": m["name"], "format": m["format"], "scale": self.scale,
                "solver": self.solver, "compute_scale": self.compute_scale, "placement": m["placement"],
                "transfer_bytes": m["transfer_bytes"],
                "slow_tier_bytes": m["slow_tier_bytes"], "inputs_created": created, "makespan": makespan,
                "jobs": {j.id: jobs.results[j.id] for j in wf.jobs}, "steps": final["steps"],
                "failed_steps": [{k: i[k] for k in ("node", "job", "step", "plan_action", "path", "detail")}
                                 for i in final["step_items"] if i["state"] == "failed"],
                "counters": {n: {"before": before[n]["counters"], "after": after[n]["counters"]} for n in nodes}}

    def _create_inputs(self, wf: Workflow, nodes: list[str]) -> dict[str, str]:
        """The inputs no job writes, each written through a round-robin node's mount and
        published; file → node."""
        written = {f for j in wf.jobs for f in j.outputs}
        created: dict[str, str] = {}
        k = 0
        for job in wf.jobs:
            for f, size in job.inputs.items():
                if f in written or f in created:
                    continue
                node = nodes[k % len(nodes)]
                k += 1
                p = self.mounts[node] / f.lstrip("/")
                if not (p.exists() and p.stat().st_size == size):
                    _write(p, size)
                created[f] = node
        for node in nodes:
            self.wait_published({f: wf.sizes[f] for f, n in created.items() if n == node}, node)
        return created

    def _wait_steps_final(self, mid: int) -> dict[str, Any]:
        """The manifest once its last after-steps (pin/unpin once a job finished) are carried
        out too (or --plan-wait has passed)."""
        deadline = time.monotonic() + self.plan_wait
        while True:
            final = self._call("GET", f"/manifests/{mid}")
            if all(i["state"] in FINAL for i in final["step_items"]) or time.monotonic() > deadline:
                return final
            time.sleep(0.1)


def _prefetches(steps: list[dict]) -> dict[str, str]:
    """The job's prefetch steps (from a start's or a job's answer): path → state."""
    return {i["path"]: i["state"] for i in steps if i["plan_action"] == "prefetch"}


class _JobsRun:
    """One manifest's jobs run as its placement says: a thread per node runs that node's
    jobs in plan order, each once its parents are done, reporting start, reads done and
    finish."""

    def __init__(self, runner: Runner, wf: Workflow, m: dict[str, Any]) -> None:
        self.r = runner
        self.wf = wf
        self.mid = m["id"]
        # the files a job on another node than their writer's reads: published before the finish
        self.read_on: dict[str, set[str]] = {}
        for j in wf.jobs:
            for f in j.inputs:
                self.read_on.setdefault(f, set()).add(m["placement"][j.id])
        self.order: dict[str, list[str]] = {n: [] for n in runner.mounts}
        for j in sorted(m["jobs"], key=lambda j: (j["node"], j["position"])):
            self.order[j["node"]].append(j["id"])
        self.done: dict[str, threading.Event] = {j.id: threading.Event() for j in wf.jobs}
        self.results: dict[str, dict] = {}
        self.errors: list[str] = []
        self.t0 = time.monotonic()

    def wait_prefetch(self, job: str, path: str) -> str:
        deadline = time.monotonic() + self.r.plan_wait
        while True:
            # the job and its steps only, not the whole manifest
            state = _prefetches(self.r._call("GET", f"/manifests/{self.mid}/jobs/{job}")["steps"]).get(path, "done")
            if state in FINAL or time.monotonic() > deadline:
                return state
            time.sleep(0.02)

    def node_worker(self, node: str) -> None:
        try:
            for jid in self.order[node]:
                job = self.wf.job(jid)
                for p in job.parents:
                    while not self.done[p].wait(0.5):
                        if self.errors:
                            return
                self.results[jid] = self.run_job(node, job)
                self.done[jid].set()
        except Exception as e:  # reported, and the other workers stop
            self.errors.append(f"node {node}: {e}")

    def _read_inputs(self, node: str, job: WorkflowJob, steps: dict[str, str]) -> tuple[int, float, float, float]:
        """Read the job's inputs, the ones whose prefetch is under way last, each after its
        prefetch ended: (bytes, seconds waiting for prefetches, seconds reading, of them opening)."""
        under_way = {f for f in job.inputs if steps.get("/" + f.lstrip("/")) in ("pending", "delivered")}
        rd, waited, t_read, opening = 0, 0.0, time.monotonic(), [0.0]
        for f in sorted(job.inputs, key=lambda f: f in under_way):  # stable: no prefetch under way first
            if f in under_way:
                w0 = time.monotonic()
                self.wait_prefetch(job.id, "/" + f.lstrip("/"))
                waited += time.monotonic() - w0
            rd += _read(self.r.mounts[node] / f.lstrip("/"), opening)
        return rd, waited, time.monotonic() - t_read - waited, opening[0]

    def run_job(self, node: str, job: WorkflowJob) -> dict[str, Any]:
        r, url = self.r, f"/manifests/{self.mid}/jobs/{job.id}"
        t_start = time.monotonic()
        started = r._call("POST", f"{url}/start")
        start = time.monotonic()
        t_start = start - t_start
        # the job's steps as of its start, from the start's answer: a delivery marks a
        # step delivered only while it is still pending (one conditional UPDATE), so a
        # step the start skipped is never sent, and one it saw delivered is under way
        steps = _prefetches(started.get("steps") or []) if r.plans else {}
        plan: dict[str, int] = {}
        for st in steps.values():
            plan[st] = plan.get(st, 0) + 1
        rd, waited, t_read, t_open = self._read_inputs(node, job, steps)
        # the compute starts now; meanwhile the job reports that it has read its
        # inputs, which releases the next job's prefetches on this node (they
        # overlap this compute, not these reads)
        compute_end = time.monotonic() + (job.runtime * r.compute_scale
                                          if r.compute_scale > 0 and job.runtime else 0.0)
        if r.plans and r.release == "reads":
            r._call("POST", f"{url}/reads-done")
        if (left := compute_end - time.monotonic()) > 0:
            time.sleep(left)
        t_write = time.monotonic()
        wr = sum(_write(r.mounts[node] / f.lstrip("/"), s) for f, s in job.outputs.items())
        t_write = time.monotonic() - t_write
        secs = time.monotonic() - start
        t_pub = time.monotonic()
        r.wait_published({f: s for f, s in job.outputs.items() if self.read_on.get(f, set()) - {node}}, node)
        t_pub = time.monotonic() - t_pub
        t_finish = time.monotonic()
        r._call("POST", f"{url}/finish")
        t_finish = time.monotonic() - t_finish
        return {"node": node, "seconds": secs, "bytes_read": rd, "bytes_written": wr,
                "started": start - self.t0, "plan_steps": plan, "prefetch_wait": waited,
                # after ``seconds``: until its outputs were published, and its finish
                "publish_seconds": t_pub, "finished": time.monotonic() - self.t0,
                # the start's and the finish's requests (round trips)
                "start_call_seconds": t_start, "finish_call_seconds": t_finish,
                # where the job's time went: reading (its opens included, and
                # of that the retries of a name not yet visible), writing
                "read_seconds": t_read, "open_seconds": t_open, "write_seconds": t_write}


def _c(counters: dict, *keys: str) -> int:
    v: Any = counters
    for k in keys:
        v = (v or {}).get(k) if isinstance(v, dict) else None
    return int(v or 0)


def print_summary(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]manifest {res['manifest_id']}[/] {res['name'] or ''} ({res['format']}, scale {res['scale']}, "
              f"solver {res['solver']}): makespan {res['makespan']:.2f} s; planned transfer "
              f"{res['transfer_bytes']['placed']} B (round-robin {res['transfer_bytes']['round_robin']} B)")
    t = Table("job", "node", "seconds", "read B", "written B", "prefetches at start", "waited s")
    for jid, j in res["jobs"].items():
        t.add_row(jid, j["node"], f"{j['seconds']:.3f}", str(j["bytes_read"]), str(j["bytes_written"]),
                  ", ".join(f"{k} {v}" for k, v in sorted(j["plan_steps"].items())) or "-",
                  f"{j['prefetch_wait']:.3f}")
    con.print(t)
    n = Table("node", "hits", "misses", "remote fetch B", "slow read B", "steps done/failed/skipped/total")
    for node, c in res["counters"].items():
        b, a = c["before"], c["after"]
        s = res["steps"].get(node, {})
        n.add_row(node, f"{_c(b, 'fast', 'hits')} → {_c(a, 'fast', 'hits')}",
                  f"{_c(b, 'misses')} → {_c(a, 'misses')}",
                  f"{_c(b, 'remote', 'fetch_bytes')} → {_c(a, 'remote', 'fetch_bytes')}",
                  f"{_c(b, 'slow', 'read_bytes')} → {_c(a, 'slow', 'read_bytes')}",
                  f"{s.get('done', 0)}/{s.get('failed', 0)}/{s.get('skipped', 0)}/{s.get('total', 0)}")
    con.print(n)


def main(args) -> int:
    mounts: dict[str, Path] = {}
    for spec in args.mount:
        node, sep, mnt = spec.partition("=")
        if not sep or not node or not mnt:
            print(f"hycache-control run: error: --mount: expected NODE=MOUNTPOINT, got {spec!r}", file=sys.stderr)
            return 2
        if node in mounts:
            print(f"hycache-control run: error: --mount: node {node} given twice", file=sys.stderr)
            return 2
        if not os.path.isdir(mnt):
            print(f"hycache-control run: error: --mount: {mnt} is not a directory", file=sys.stderr)
            return 2
        mounts[node] = Path(mnt)
    if args.compute_scale < 0:
        print("hycache-control run: error: --compute-scale: must be >= 0", file=sys.stderr)
        return 2
    if args.scale <= 0:
        print("hycache-control run: error: --scale: must be > 0", file=sys.stderr)
        return 2
    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as e:
        print(f"hycache-control run: error: --token-file: {e}", file=sys.stderr)
        return 2
    try:
        document = json.loads(Path(args.manifest).read_text())
    except (OSError, ValueError) as e:
        print(f"hycache-control run: error: MANIFEST: {e}", file=sys.stderr)
        return 2
    runner = Runner(args.api, token, mounts, scale=args.scale, solver=args.solver, slack=args.slack,
                    plan_wait=args.plan_wait, plans=not args.no_plans, compute_scale=args.compute_scale,
                    release=args.release)
    try:
        res = runner.run(document)
    except RunError as e:
        print(f"hycache-control run: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a WorkflowError names the field
        print(f"hycache-control run: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_summary(res)
    return 0

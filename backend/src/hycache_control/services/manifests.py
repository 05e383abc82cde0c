"""Workflow manifests and 2-Layer Scheduling on the live cluster.

A manifest (the project's format or a WfCommons WfFormat 1.4/1.5 instance) is parsed by
``hycache_core.workflow``, placed by ``hycache_core.scheduling.place`` on the live nodes with
the files' current locations (their primary node in the DHT) and each node's fast-tier
capacity, and stored with its placement and per-node plans.  Every plan step becomes an
action item of one ``plan`` action (the actions machinery delivers it in heartbeat answers
and takes its result back); ``evict`` is sent as ``demote``.

When a step is released to its node.  A job's steps are of two kinds (see
``plan_node``): *before* the job — ``prefetch`` and ``evict`` (its inputs staged, room
made) — and *after* it — ``pin`` of an output the job wrote, ``unpin`` of files with no
later reference on the node.
- before-steps of job J are released once every earlier job of J's node (in plan order)
  has *finished reading* its inputs (reported ``…/reads-done``, or finished): J's turn
  has come (it is the next job to start there); a prefetch of a file that a job of the
  manifest writes waits until that writer has finished (the file exists), each on its
  own (``after_job``); the node's first job's steps wait for all its parents.
  A before-step still undelivered when its job starts is ``skipped``: the job never
  waits for it and reads that file where it is.
  Releasing when the job before it has read its inputs lets J's prefetches overlap that
  job's compute and writes (the point of planning ahead) without sharing a slow device
  with its reads, while the evictions of a job two or more places ahead cannot throw
  out files that the jobs before it still need on the fast tier.  A manifest submitted
  with ``release=start`` releases them when the job before it *starts* instead (the
  rule before the reads-done event; a runner that never reports reads done should use
  it).  A before-step whose job finished before the step was delivered is ``skipped``.
- after-steps of J are released when J has finished (the output exists; the job no longer
  needs the file).
- a prefetch of a parent's output whose release would come when its job can start (that
  parent was the last thing the job waited for, and the job before it on the node has
  finished) is ``skipped`` instead: a prefetch then could only race the job's read.
- a prefetch that fails for room on its node (the job before it still had files open
  there) is not dropped: it goes back to pending once and is released again when the job
  before it has ended — or skipped if its own job starts first (``retry``).
- the before-steps are *planned at that release* (:meth:`ManifestService.plan_at_release`,
  ``hycache_core.scheduling.plan_release``): when J's turn comes, layer 2 computes its
  prefetch/evict steps again from the node's contents at that moment (the DHT's census
  of the workflow's files, the node's last heartbeat, the remote copies its steps and
  reads left, the steps delivered and not done), and they replace the steps planned at
  submission if they differ; J's steps are held until then (``planned_at``).  The plan
  stored at submission stays as the forecast the job views show.
``DELETE`` cancels every step not yet delivered.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from typing import Any

from hycache_core.scheduling import PlacementError, choose_node, node_state, place, plan_release, prefetch_sources
from hycache_core.workflow import Workflow, WorkflowError, parse_workflow
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, selectinload

from ..db import Database
from ..models import Action, ActionItem, Manifest, ManifestJob
from .actions import RETRY, ActionService, item_view
from .errors import Invalid, NotFound, ServiceError
from .events import EventService
from .namespace import NamespaceService
from .nodes import NodeService

#: the agent action that carries out each planned step
AGENT_ACTION = {"prefetch": "prefetch", "evict": "demote", "pin": "pin", "unpin": "unpin"}
BEFORE = ("prefetch", "evict")  # steps before their job; pin/unpin come after it
STEP_STATES = ("done", "failed", "skipped", "cancelled", "pending")

_stdout_lock = threading.Lock()
log = logging.getLogger(__name__)
#: a plan made at a release looks this many of the node's jobs ahead (and back, for the
#: files the node may still hold): bounds its DHT lookups on instances of thousands of jobs
RELEASE_HORIZON = 64


class Conflict(ServiceError):
    status = 409
    type = "conflict"


class ManifestInvalid(ServiceError):
    """422 with the parser's errors (loc prefixed with "body") and the detected format."""

    status = 422
    type = "value_error"

    def __init__(self, fmt: str, errors: list[dict]) -> None:
        super().__init__(("body",), "invalid manifest")
        self.format = fmt
        self.errors = errors

    def detail(self) -> list[dict]:
        return [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": "value_error", "format": self.format}
                for e in self.errors]


@contextlib.contextmanager
def _stdout_to_stderr():
    """HiGHS writes to fd 1 from C: point fd 1 at stderr while it runs (the server's stdout
    stays clean; logs go to stderr anyway)."""
    with _stdout_lock:
        saved = os.dup(1)
        try:
            os.dup2(2, 1)
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def ns_path(name: str) -> str:
    """A manifest's file name → its path in the namespace (relative names are under /)."""
    return name if name.startswith("/") else "/" + name


class ManifestService:
    def __init__(self, db: Database, namespace: NamespaceService, nodes: NodeService, actions: ActionService,
                 events: EventService) -> None:
        self.db = db
        self.namespace = namespace
        self.nodes = nodes
        self.actions = actions
        self.events = events
        actions.gate = self.gate
        actions.retry = self.retry
        self._online: collections.deque[tuple[float, str]] = collections.deque()
        self._online_lock = threading.Lock()
        self._wf_cache: collections.OrderedDict[int, Workflow] = collections.OrderedDict()
        self.bus = actions.bus
        if self.bus is not None:  # the jobs other control-plane processes placed (PostgreSQL)
            self.bus.on("j", self._placed_elsewhere)

    def _placed_elsewhere(self, node: Any) -> None:
        if isinstance(node, str):
            with self._online_lock:
                self._online.append((time.monotonic(), node))

    # -- submit ---------------------------------------------------------------------------------

    def _live_nodes(self) -> list[str]:
        return [n.id for n in self.nodes.snapshot() if n.state in ("up", "degraded")]

    def _capacity(self, nodes: list[str]) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for n in nodes:
            live = self.nodes.get(n)
            fast = ((live.status or {}).get("tiers") or {}).get("fast") if live is not None else None
            cap = (fast or {}).get("capacity")
            out[n] = int(cap) if isinstance(cap, (int, float)) and cap > 0 else None
        return out

    def _locations(self, files) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The files' primary nodes (file → node), and the census of those that exist
        (file → ``{"node", "tier", "size", "pinned"}``, the DHT's entries): where each
        one is, on which tier, for layer 2's starting state."""
        out: dict[str, str] = {}
        census: dict[str, dict[str, Any]] = {}
        if not self.namespace.configured:
            return out, census
        names = list(files)
        metas: list = []
        for k in range(0, len(names), 1024):  # pipelined, a bounded batch at a time
            metas.extend(self.namespace.get_many([ns_path(f) for f in names[k:k + 1024]]))
        for f, meta in zip(names, metas):
            if meta is not None and meta.kind == "file" and meta.primary:
                out[f] = meta.primary
                census[f] = {"node": meta.primary, "tier": meta.tier, "size": meta.size, "pinned": bool(meta.pinned)}
        return out, census

    def _fast_status(self, nodes: list[str]) -> dict[str, dict[str, Any] | None]:
        """Each node's fast-tier census from its last heartbeat (``tiers.fast``)."""
        out: dict[str, dict[str, Any] | None] = {}
        for n in nodes:
            live = self.nodes.get(n)
            out[n] = ((live.status or {}).get("tiers") or {}).get("fast") if live is not None else None
        return out

    def create(self, document: Any, *, nodes: list[str] | None, solver: str, slack: float,
               actor: str | None, plans: bool = True, prefetch_first: bool = False,
               release: str = "reads") -> dict[str, Any]:
        try:
            wf = parse_workflow(document, source="body")
        except WorkflowError as e:
            raise ManifestInvalid(e.format, e.errors) from None
        if nodes is None:
            nodes = self._live_nodes()
            if not nodes:
                raise Invalid(("query", "nodes"), "no live nodes to place the manifest on (and none given)")
        else:
            unknown = [n for n in nodes if not self.nodes.known(n)]
            if unknown:
                raise Invalid(("query", "nodes"), f"unknown node(s): {', '.join(unknown)}")
        capacity = self._capacity(nodes)
        locations, census = self._locations(wf.sizes)
        # layer 2 starts from each node's real fast tier: the workflow's files already there
        # (the DHT's tier and pin) and the pinned bytes the heartbeat reports
        kw = dict(solver=solver, slack=slack, capacity=capacity, locations=locations, plans=plans,
                  census=census, fast_status=self._fast_status(nodes), first_reads_in_place=not prefetch_first,
                  release=release)
        try:
            if solver == "exact":
                with _stdout_to_stderr():
                    result = place(wf, nodes, **kw)
            else:
                result = place(wf, nodes, **kw)
        except PlacementError as e:
            raise Invalid(("body",), str(e)) from None
        result["locations"] = locations
        result["capacity"] = capacity
        result["tasks"] = {j.id: j.task for j in wf.jobs if j.task}  # the instance's task types
        # what each job reads (namespace paths): the job view asks POST /placements with it
        result["inputs"] = {j.id: [ns_path(f) for f in j.inputs] for j in wf.jobs}
        now = time.time()
        with self.db.session() as s:
            m = Manifest(name=wf.name, format=wf.format, state="planned", actor=actor, document=document,
                         options={"nodes": nodes, "solver": solver, "slack": slack, "plans": plans,
                                  **({"prefetch_first": True} if prefetch_first else {}),
                                  **({"release": "start"} if release == "start" else {})}, result=result,
                         created_at=now, updated_at=now)
            position: dict[str, int] = {}
            # a job whose turn has come at submission has its steps planned now; the others'
            # are planned again at their release, from the node's contents then (needs the DHT)
            replan = plans and self.namespace.configured
            for job in wf.jobs:  # topological order: each node's jobs in the order its plan assumes
                node = result["placement"][job.id]
                due = position.get(node, 0) == 0 and not job.parents
                m.jobs.append(ManifestJob(job=job.id, node=node, position=position.get(node, 0), state="pending",
                                          parents=list(job.parents),
                                          planned_at=None if replan and not due else now))
                position[node] = position.get(node, 0) + 1
            s.add(m)
            s.flush()
            # where each file's primary copy is: its current location, or its writer's node
            owner = dict(locations)
            for job in wf.jobs:
                for f in job.outputs:
                    owner[f] = result["placement"][job.id]
            items = []
            writer = self._writers(wf)
            for node, steps in result["plans"].items():
                for st in steps:
                    state, detail = "pending", None
                    if st["action"] == "unpin" and owner.get(st["path"]) not in (None, node):
                        # a copy of another node's file in this node's remote cache is never
                        # pinned (pin/unpin act on files whose primary copy is on the node);
                        # its evict is sent (a demote of it drops the copy, as the plan assumes)
                        state = "skipped"
                        detail = f"a remote copy (primary on {owner[st['path']]}): never pinned here"
                    items.append(ActionItem(path=ns_path(st["path"]), node=node, state=state, detail=detail,
                                            updated_at=now,
                                            kind=AGENT_ACTION[st["action"]], plan_action=st["action"], job=st["job"],
                                            step=st["step"], size=st.get("size"),
                                            source=None if st.get("source") is None else str(st["source"]),
                                            after_job=self._after(writer, st)))
            s.add(Action(action="plan", actor=actor, created_at=now, updated_at=now, manifest_id=m.id, items=items))
            s.flush()
            mid = m.id
        self.actions.wake(result["plans"].keys())
        self.events.record("audit", f"manifest {mid} submitted", "ok", actor=actor,
                           detail=f"{len(wf.jobs)} jobs on {len(nodes)} nodes ({solver}); "
                                  f"{result['transfer_bytes']['placed']} bytes to move")
        return self.get(mid)

    # -- online placement: one ready job -------------------------------------------------------

    ONLINE_WINDOW_S = 60.0

    def place_job(self, inputs: list[str], *, footprint: int | None = None,
                  nodes: list[str] | None = None) -> dict[str, Any]:
        """Where a ready job that reads ``inputs`` (namespace paths) should run now
        (:func:`hycache_core.scheduling.choose_node`): sizes and locations from the DHT,
        capacities from the nodes' heartbeats; ties go to the node the control plane sent
        the fewest jobs to in the last minute (kept in memory; with several processes on
        PostgreSQL each tells the others through the bus's ``j`` notification)."""
        if nodes is None:
            nodes = self._live_nodes()
            if not nodes:
                raise Invalid(("body", "nodes"), "no live nodes to place the job on (and none given)")
        else:
            unknown = [n for n in nodes if not self.nodes.known(n)]
            if unknown:
                raise Invalid(("body", "nodes"), f"unknown node(s): {', '.join(unknown)}")
        sizes: dict[str, int] = {}
        locations: dict[str, str] = {}
        for path in dict.fromkeys(ns_path(p) for p in inputs):
            meta = self.namespace.get(path) if self.namespace.configured else None
            sizes[path] = int(meta.size) if meta is not None and meta.kind == "file" else 0
            if meta is not None and meta.kind == "file" and meta.primary:
                locations[path] = meta.primary
        now = time.monotonic()
        with self._online_lock:
            while self._online and self._online[0][0] < now - self.ONLINE_WINDOW_S:
                self._online.popleft()
            running: dict[str, int] = {}
            for _, n in self._online:
                running[n] = running.get(n, 0) + 1
            try:
                r = choose_node(sizes, nodes, locations=locations, capacity=self._capacity(nodes),
                                footprint=footprint, running=running)
            except PlacementError as e:
                raise Invalid(("body", "inputs"), str(e)) from None
            self._online.append((now, r["node"]))
        if self.bus is not None and self.bus.enabled:  # the other processes count it too
            self.bus.notify_now("j", r["node"])
        return r

    # -- views --------------------------------------------------------------------------------

    def _view(self, s: Session, m: Manifest, *, full: bool = True) -> dict[str, Any]:
        r = m.result
        tasks = r.get("tasks") or {}
        items = list(s.scalars(select(ActionItem).join(Action).where(Action.manifest_id == m.id)
                               .options(selectinload(ActionItem.parent)).order_by(ActionItem.node, ActionItem.step)))
        summary: dict[str, dict[str, int]] = {n: {"total": 0, **{k: 0 for k in STEP_STATES}} for n in r["plans"]}
        for it in items:
            c = summary.setdefault(it.node, {"total": 0, **{k: 0 for k in STEP_STATES}})
            c["total"] += 1
            c["pending" if it.state in ("pending", "delivered") else it.state] += 1
        v = {"id": m.id, "name": m.name, "format": m.format, "state": m.state, "actor": m.actor,
             "placement": r["placement"], "transfer_bytes": r["transfer_bytes"],
             "slow_tier_bytes": r["slow_tier_bytes"], "load": r["load"], "load_bound": r.get("load_bound"),
             "load_bound_requested": r.get("load_bound_requested"), "load_bound_reason": r.get("load_bound_reason"),
             "makespan": r.get("makespan"), "makespan_unit": r.get("makespan_unit"),
             "solver": r.get("solver"), "optimal": r.get("optimal"), "options": m.options,
             "jobs": [{"id": j.job, "task": tasks.get(j.job), "node": j.node, "position": j.position,
                       "state": j.state, "started_at": j.started_at, "reads_done_at": j.reads_done_at,
                       "finished_at": j.finished_at, "parents": list(j.parents or [])}
                      for j in m.jobs],
             "steps": summary, "created_at": m.created_at, "updated_at": m.updated_at}
        if full:
            inputs = r.get("inputs") or {}
            for j in v["jobs"]:
                j["inputs"] = inputs.get(j["id"], [])
            v["plans"] = r["plans"]
            v["step_items"] = [item_view(i) for i in items]
            v["locations"] = r.get("locations", {})
        return v

    def get(self, manifest_id: int) -> dict[str, Any]:
        with self.db.session() as s:
            m = s.scalar(select(Manifest).where(Manifest.id == manifest_id).options(selectinload(Manifest.jobs)))
            if m is None:
                raise NotFound(("path", "manifest_id"), f"no manifest {manifest_id}")
            return self._view(s, m)

    def list(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        with self.db.session() as s:
            total = s.scalar(select(func.count()).select_from(Manifest)) or 0
            rows = s.scalars(select(Manifest).options(selectinload(Manifest.jobs)).order_by(Manifest.id.desc())
                             .limit(limit).offset(offset))
            return [self._view(s, m, full=False) for m in rows], total

    # -- cancel -------------------------------------------------------------------------------

    def cancel(self, manifest_id: int, actor: str | None) -> dict[str, Any]:
        now = time.time()
        with self.db.session() as s:
            m = s.get(Manifest, manifest_id)
            if m is None:
                raise NotFound(("path", "manifest_id"), f"no manifest {manifest_id}")
            items = list(s.scalars(select(ActionItem).join(Action).options(selectinload(ActionItem.parent))
                                   .where(Action.manifest_id == manifest_id, ActionItem.state == "pending")))
            for it in items:
                it.state, it.detail, it.updated_at = "cancelled", "the manifest was cancelled", now
            if m.state != "done":
                m.state = "cancelled"
            m.updated_at = now
            changed = [item_view(i) for i in items]
        self.actions._publish(changed)
        self.events.record("audit", f"manifest {manifest_id} cancelled", "ok", actor=actor,
                           detail=f"{len(changed)} steps cancelled before delivery")
        return self.get(manifest_id)

    # -- jobs ---------------------------------------------------------------------------------

    @staticmethod
    def _job_row(s: Session, manifest_id: int, job: str) -> ManifestJob:
        """The job's row, or NotFound naming the manifest or the job that is missing."""
        j = s.scalar(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id, ManifestJob.job == job))
        if j is None:
            if s.get(Manifest, manifest_id) is None:
                raise NotFound(("path", "manifest_id"), f"no manifest {manifest_id}")
            raise NotFound(("path", "job"), f"manifest {manifest_id} has no job {job!r}")
        return j

    def job_node(self, manifest_id: int, job: str) -> str:
        with self.db.session() as s:
            j = self._job_row(s, manifest_id, job)
            return j.node

    @staticmethod
    def _before_steps(s: Session, manifest_id: int, job: str) -> list[dict[str, Any]]:
        return [{"step": i.step, "plan_action": i.plan_action, "path": i.path, "state": i.state}
                for i in s.scalars(select(ActionItem).join(Action)
                                   .where(Action.manifest_id == manifest_id, ActionItem.job == job,
                                          ActionItem.plan_action.in_(BEFORE))
                                   .order_by(ActionItem.step))]

    def job(self, manifest_id: int, job: str) -> dict[str, Any]:
        """One job and its before-steps' states (what a runner polls while a prefetch is
        under way, instead of the whole manifest)."""
        with self.db.session() as s:
            j = self._job_row(s, manifest_id, job)
            return {"id": j.job, "node": j.node, "position": j.position, "state": j.state,
                    "started_at": j.started_at, "reads_done_at": j.reads_done_at, "finished_at": j.finished_at,
                    "parents": list(j.parents or []), "steps": self._before_steps(s, manifest_id, job)}

    def job_event(self, manifest_id: int, job: str, what: str, actor: str | None) -> dict[str, Any]:
        """``what``: start | reads-done | finish."""
        now = time.time()
        skipped: list[dict] = []
        mine: list[dict] | None = None
        with self.db.session() as s:
            j = self._job_row(s, manifest_id, job)
            m = j.manifest
            if m.state == "cancelled":
                raise Conflict(("path", "manifest_id"), f"manifest {manifest_id} was cancelled")
            if what == "start":
                if j.state == "done":
                    raise Conflict(("path", "job"), f"job {job!r} already finished")
                if j.state == "pending":
                    j.state, j.started_at = "running", now
                    # a job never waits for a step that has not reached its node: the job
                    # reads those files where they are (docs/scheduling.md, "When a job starts")
                    items = list(s.scalars(select(ActionItem).join(Action).options(selectinload(ActionItem.parent))
                                           .where(Action.manifest_id == manifest_id, ActionItem.job == job,
                                                  ActionItem.state == "pending",
                                                  ActionItem.plan_action.in_(BEFORE))))
                    for it in items:
                        it.state, it.detail, it.updated_at = "skipped", f"job {job} started before delivery", now
                    skipped = [item_view(i) for i in items]
                # the job's before-steps as of its start, so that a runner knows which
                # prefetches are under way without reading the whole manifest
                mine = self._before_steps(s, manifest_id, job)
            elif what == "reads-done":
                # the job has read its inputs (it computes and writes now): the next job's
                # before-steps on this node are released (see the module docstring)
                if j.state == "pending":
                    raise Conflict(("path", "job"), f"job {job!r} has not started (POST …/start first)")
                if j.reads_done_at is None:
                    j.reads_done_at = now
            else:
                if j.state == "pending":
                    raise Conflict(("path", "job"), f"job {job!r} has not started (POST …/start first)")
                if j.state == "running":
                    j.state, j.finished_at = "done", now
                    items = list(s.scalars(select(ActionItem).join(Action).options(selectinload(ActionItem.parent))
                                           .where(Action.manifest_id == manifest_id, ActionItem.job == job,
                                                  ActionItem.state == "pending",
                                                  ActionItem.plan_action.in_(BEFORE))))
                    for it in items:
                        it.state, it.detail, it.updated_at = "skipped", f"job {job} finished before delivery", now
                    skipped = [item_view(i) for i in items]
            states = set(s.scalars(select(ManifestJob.state).where(ManifestJob.manifest_id == manifest_id)))
            m.state = "done" if states == {"done"} else ("running" if states - {"pending"} else "planned")
            m.updated_at = now
            # a reads-done (or, with release=start, a start) releases the next job's steps on
            # this node; a finish those of the job's children wherever they run: wake every
            # node of the manifest.  A start with the reads-done release releases nothing (its
            # skipped steps go to the stream): no node is woken, no delivery competes with it
            at_start = (m.options or {}).get("release") == "start"
            if what == "finish":
                woken = set((m.options or {}).get("nodes") or ()) | {j.node}
            elif what == "reads-done" or at_start:
                woken = {j.node}
            else:
                woken = set()
            out = {"id": j.job, "node": j.node, "position": j.position, "state": j.state,
                   "started_at": j.started_at, "reads_done_at": j.reads_done_at, "finished_at": j.finished_at,
                   "parents": list(j.parents or [])}
            if mine is not None:
                out["steps"] = mine
            due = self._due(s, manifest_id, at_start, woken) if woken else []
        self.actions._publish(skipped)
        for name in due:  # their turn came with this event: plan their steps from the node's contents now
            self.plan_at_release(manifest_id, name, wake=False)  # the event's wake below delivers them
        self.actions.wake(woken)
        return out

    # -- layer 2 at each release ------------------------------------------------------------------

    @staticmethod
    def _writers(wf: Workflow) -> dict[str, str]:
        """Each file the workflow writes → its first writer."""
        out: dict[str, str] = {}
        for job in wf.jobs:
            for f in job.outputs:
                out.setdefault(f, job.id)
        return out

    @staticmethod
    def _after(writer: dict[str, str], st: dict[str, Any]) -> str | None:
        """The job a prefetch step waits for: its file's writer (the file exists once it has
        finished), if another job of the manifest."""
        w = writer.get(st["path"]) if st["action"] == "prefetch" else None
        return w if w != st["job"] else None

    @staticmethod
    def _due(s: Session, manifest_id: int, at_start: bool, nodes) -> list[str]:
        """The jobs on ``nodes`` whose before-steps' turn has come (the gate's release rule)
        and that have not been planned at their release yet."""
        jobs = list(s.scalars(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id)))
        state = {j.job: j.state for j in jobs}
        first_unread: dict[str, int] = {}
        for j in jobs:
            if j.state == "pending" or (j.state == "running" and j.reads_done_at is None and not at_start):
                first_unread[j.node] = min(first_unread.get(j.node, 1 << 30), j.position)
        return [j.job for j in jobs
                if j.node in nodes and j.state == "pending" and j.planned_at is None
                and j.position == first_unread.get(j.node)
                and (j.position > 0 or all(state.get(p, "done") == "done" for p in j.parents or ()))]

    def _workflow(self, manifest_id: int, document: Any) -> Workflow:
        """The manifest's parsed workflow (the last few kept: a release plans from it)."""
        cache = self._wf_cache
        with self._online_lock:
            wf = cache.get(manifest_id)
            if wf is not None:
                cache.move_to_end(manifest_id)
                return wf
        wf = parse_workflow(document, source="body")
        with self._online_lock:
            cache[manifest_id] = wf
            while len(cache) > 8:
                cache.popitem(last=False)
        return wf

    def plan_at_release(self, manifest_id: int, job: str, *, wake: bool = True) -> list[dict[str, Any]] | None:
        """Plan ``job``'s prefetch/evict steps now that its turn has come, from its node's
        contents at this moment (``hycache_core.scheduling.plan_release``), and put them in
        place of its pending steps if they differ.  Returns the steps, or None when the job
        was planned already (another request or process) or is no longer pending.  Any
        failure keeps the steps planned at submission (logged)."""
        t0 = time.perf_counter()
        try:
            steps = self._plan_job_now(manifest_id, job)
        except Exception:  # the plan made at submission stays; the job is never held forever
            log.exception("manifest %s: planning job %s at its release failed", manifest_id, job)
            steps = None
        now = time.time()
        with self.db.session() as s:
            won = s.scalars(update(ManifestJob).where(ManifestJob.manifest_id == manifest_id, ManifestJob.job == job,
                                                      ManifestJob.planned_at.is_(None))
                            .values(planned_at=now).returning(ManifestJob.id)
                            .execution_options(synchronize_session=False)).first()
            if won is None or steps is None:
                return None
            log.info("manifest %s: job %s planned at its release in %.1f ms: %s", manifest_id, job,
                     1e3 * (time.perf_counter() - t0),
                     ", ".join(f"{st['action']} {st['path']}" for st in steps) or "no step")
            action = s.scalar(select(Action).where(Action.manifest_id == manifest_id))
            mine = list(s.scalars(select(ActionItem).where(ActionItem.action_id == action.id,
                                                           ActionItem.job == job,
                                                           ActionItem.plan_action.in_(BEFORE))
                                  .order_by(ActionItem.step)))
            if any(i.state != "pending" for i in mine):
                return None  # (a start skipped them meanwhile, or a delivery raced): as they are
            m = s.get(Manifest, manifest_id)
            writer = self._writers(self._workflow(manifest_id, m.document))
            node = s.scalar(select(ManifestJob.node).where(ManifestJob.manifest_id == manifest_id,
                                                           ManifestJob.job == job))
            if [(i.plan_action, i.path) for i in mine] == [(st["action"], ns_path(st["path"])) for st in steps]:
                return steps
            numbers = [i.step for i in mine]
            top = s.scalar(select(func.max(ActionItem.step)).where(ActionItem.action_id == action.id,
                                                                   ActionItem.node == node)) or 0
            while len(numbers) < len(steps):
                top += 1
                numbers.append(top)
            for i in mine:
                s.delete(i)
            for k, st in enumerate(steps):
                s.add(ActionItem(action_id=action.id, path=ns_path(st["path"]), node=node, state="pending",
                                 detail=None, updated_at=now, kind=AGENT_ACTION[st["action"]],
                                 plan_action=st["action"], job=job, step=numbers[k], size=st.get("size"),
                                 source=None if st.get("source") is None else str(st["source"]),
                                 after_job=self._after(writer, st)))
            action.updated_at = now
        if wake:
            self.actions.wake([node])
        return steps

    def _plan_job_now(self, manifest_id: int, job: str) -> list[dict[str, Any]] | None:
        """``job``'s before-steps from its node's contents now (reads the database, then the
        DHT and the node's last heartbeat outside any transaction)."""
        with self.db.session() as s:
            j = self._job_row(s, manifest_id, job)
            if j.state != "pending" or j.planned_at is not None:
                return None
            m = j.manifest
            node, pos = j.node, j.position
            options = dict(m.options or {})
            placement = dict(m.result["placement"])
            located = dict(m.result.get("locations") or {})
            wf = self._workflow(manifest_id, m.document)
            rows = {r.job: (r.node, r.position, r.state, r.reads_done_at)
                    for r in s.scalars(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id))}
            items = [(i.job, i.plan_action, i.path, i.state) for i in s.scalars(
                select(ActionItem).join(Action).where(Action.manifest_id == manifest_id, ActionItem.node == node,
                                                      ActionItem.plan_action.in_(BEFORE),
                                                      ActionItem.state.in_(("delivered", "done"))))]
        release = "start" if options.get("release") == "start" else "reads"
        index = {wj.id: wj for wj in wf.jobs}
        mine = sorted((p, index[name]) for name, (n, p, _, _) in rows.items() if n == node)
        ahead = [wj for p, wj in mine if pos <= p < pos + RELEASE_HORIZON]
        behind = [(p, wj) for p, wj in mine if pos - RELEASE_HORIZON <= p < pos]
        files = dict.fromkeys(f for _, wj in behind for f in (*wj.inputs, *wj.outputs))
        files.update(dict.fromkeys(f for wj in ahead for f in (*wj.inputs, *wj.outputs)))
        locations, census = self._locations(files)  # the DHT now: where each file is, on which tier
        status = self._fast_status([node])
        capacity = self._capacity([node])[node]
        resident_all, held_all, pins = node_state(census, [node], status)
        resident, held = resident_all[node], held_all[node]
        # what the DHT does not show: the copies of other nodes' files this node holds (its
        # prefetches and its jobs' reads fetched them; an evict dropped one), and the local
        # moves its delivered steps have under way
        position = {name: p for name, (n, p, _, _) in rows.items() if n == node}
        last: dict[str, tuple[int, int, bool]] = {}

        def seen(f: str, key: tuple[int, int], present: bool) -> None:
            if f not in last or last[f][:2] <= key:
                last[f] = (*key, present)

        for name, action, path, state in items:
            f = path[1:] if path.startswith("/") and path[1:] in wf.sizes else path
            if f not in wf.sizes:
                continue
            local = locations.get(f) == node
            if local and state == "done":
                continue  # the DHT shows where it is now
            seen(f, (position.get(name, 0), 1 if action == "prefetch" else 0), action == "prefetch")
        for p, wj in behind:  # every job before this one here has started (its turn came after their reads)
            for f in wj.inputs:
                if locations.get(f) not in (None, node):
                    seen(f, (p, 2), True)  # the read fetched a copy
            for f in wj.outputs:
                if f not in census:  # written here and not published yet: new data goes to the fast tier
                    resident.setdefault(f, wf.sizes[f])
        copies = 0
        for f, (_, _, present) in last.items():
            if present and f not in resident:
                resident[f] = wf.sizes[f]
                if locations.get(f) != node:
                    copies += wf.sizes[f]
            elif not present and f in resident and f not in pins[node]:
                del resident[f]
        rc = (status.get(node) or {}).get("remote_cache_bytes")
        if isinstance(rc, (int, float)):  # copies of files this plan does not know: their room is taken
            held += max(0, int(rc) - copies)
        source = prefetch_sources(wf, placement, {**located, **locations}).get(node, {})
        before = None
        if behind and behind[-1][0] == pos - 1 and rows[behind[-1][1].id][2] != "done":
            before = behind[-1][1]
        in_place: set[str] = set()
        if not options.get("prefetch_first") and mine:
            first = mine[0][1]
            in_place = {f for f in first.inputs if f not in resident and source.get(f, "slow") in (node, "slow")}
        ahead_refs = {f for wj in ahead for f in (*wj.inputs, *wj.outputs)}
        elsewhere: dict[str, int] = {}
        for name, (n, _, st, _) in rows.items():
            if n != node and st != "done":
                for f in index[name].inputs:
                    if f in resident and f not in ahead_refs:
                        elsewhere[f] = elsewhere.get(f, 0) + 1
        return plan_release(node, ahead, capacity, source, {*wf.pinned, *pins[node]}, resident=resident,
                            held=held, before=before, in_place=in_place, read_elsewhere=elsewhere,
                            release=release)

    # -- delivery gate (called by ActionService.deliver inside its session) ---------------------

    def retry(self, s: Session, item: ActionItem, detail: str) -> bool:
        """A plan step failed on its node (ActionService.report): a prefetch that found no
        room — the fast tier held files the job before it still had open — goes back to
        pending once, to be released again when that job has ended (its files are then
        closed and evictable; see :meth:`gate`), unless its own job starts first (then it
        is skipped, like any step that has not reached its node)."""
        if item.plan_action != "prefetch" or "no room" not in detail or (item.detail or "").startswith(RETRY):
            return False
        j = s.scalar(select(ManifestJob).where(ManifestJob.manifest_id == item.parent.manifest_id,
                                               ManifestJob.job == item.job))
        if j is None or j.state != "pending":
            return False
        item.detail = RETRY + detail
        return True

    @staticmethod
    def _inputs_ready(mid: int, j: ManifestJob, it: ActionItem,
                      jobs: dict[tuple[int, str], ManifestJob]) -> bool:
        """May a before-step of ``j`` go now that its turn has come?  A node's first job's
        steps wait for all its parents (nothing runs before it there: they are planned
        when its parents have finished); a later job's go at its turn, each prefetch of a
        file the manifest writes once that file's writer has finished (``after_job``), so
        a job reading several parents' outputs gets each one as soon as it exists.
        (Manifests submitted before ``after_job``, ``planned_at`` 0: all parents.)"""
        if j.position == 0 or not j.planned_at:
            return all(jobs[(mid, p)].state == "done" for p in j.parents if (mid, p) in jobs)
        w = jobs.get((mid, it.after_job)) if it.after_job else None
        return w is None or w.state == "done"

    def gate(self, s: Session, items: list[ActionItem]) -> dict[int, str]:
        """release | hold | skip for each plan step (the module docstring says when)."""
        mids = {i.parent.manifest_id for i in items}
        jobs: dict[tuple[int, str], ManifestJob] = {}
        first_unread: dict[tuple[int, str], int] = {}  # the first job that has not read its inputs yet
        first_unfinished: dict[tuple[int, str], int] = {}
        cancelled: set[int] = set()
        at_start: set[int] = set()  # manifests submitted with release=start
        for mid, state, options in s.execute(select(Manifest.id, Manifest.state, Manifest.options)
                                             .where(Manifest.id.in_(mids))):
            if state == "cancelled":
                cancelled.add(mid)
            if (options or {}).get("release") == "start":
                at_start.add(mid)
        for j in s.scalars(select(ManifestJob).where(ManifestJob.manifest_id.in_(mids))):
            jobs[(j.manifest_id, j.job)] = j
            key = (j.manifest_id, j.node)
            if j.state == "pending" or (j.state == "running" and j.reads_done_at is None
                                        and j.manifest_id not in at_start):
                first_unread[key] = min(first_unread.get(key, 1 << 30), j.position)
            if j.state != "done":
                first_unfinished[key] = min(first_unfinished.get(key, 1 << 30), j.position)
        out = {}
        for it in items:
            mid = it.parent.manifest_id
            j = jobs.get((mid, it.job))
            if mid in cancelled and it.state == "pending":
                out[it.id] = "hold"
            elif j is None:
                out[it.id] = "release"
            elif it.plan_action not in BEFORE:
                out[it.id] = "release" if j.state == "done" else "hold"
            elif j.state == "done":
                out[it.id] = "skip"
            elif j.planned_at is None and j.state == "pending":
                out[it.id] = "hold"  # its turn has come only once they are planned from the node's contents
            elif (it.after_job and j.position > 0 and j.planned_at and it.state == "pending"
                  and first_unfinished.get((mid, j.node)) == j.position
                  and all(jobs[(mid, p)].state == "done" for p in j.parents if (mid, p) in jobs)):
                # its writer's finish was the last thing the job waited for: it starts now, and
                # a prefetch released at this moment could only race its read (the job would
                # wait for it); it reads the file where it is, the same bytes
                out[it.id] = "skip-ready"
            elif (j.position <= (first_unfinished if (it.detail or "").startswith(RETRY)
                                 else first_unread).get((mid, j.node), 1 << 30)
                  and self._inputs_ready(mid, j, it, jobs)):
                out[it.id] = "release"
            else:
                out[it.id] = "hold"
        return out

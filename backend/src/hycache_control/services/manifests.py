"""Workflow manifests and 2-Layer Scheduling on the live cluster.

A manifest (the project's format or a WfCommons WfFormat 1.4/1.5 instance) is parsed by
``hycache_core.workflow``, placed by ``hycache_core.scheduling.place`` on the live nodes with
the files' current locations (their primary node in the DHT) and each node's fast-tier
capacity, and stored with its placement and per-node plans.  Every plan step becomes an
action item of one ``plan`` action (the actions machinery delivers it in heartbeat answers
and takes its result back); ``evict`` is sent as ``demote``.  When each step goes to its
node: services/release.py; its job's events: services/jobs.py; its steps planned again at
their release: services/replan.py.  ``DELETE`` cancels every step not yet delivered.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from typing import Any

from hycache_core.scheduling import PlacementError, choose_node, place
from hycache_core.workflow import Workflow, WorkflowError, parse_workflow
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from ..db import Database
from ..models import Action, ActionItem, Manifest, ManifestJob, SlurmJob
from .actions import ActionService, item_view
from .bus import Bus
from .cluster_state import ClusterState
from .errors import Invalid, NotFound, ServiceError
from .events import EventService
from .paths import check_name
from .steps import STEP_STATES, ns_path, step_item, writers

_stdout_lock = threading.Lock()


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


def _bad_names(wf: Workflow) -> list[dict[str, Any]]:
    """The parser's kind of errors for the file names no namespace path can hold."""
    out = []
    for job in wf.jobs:
        for kind in ("inputs", "outputs"):
            for k, name in enumerate(getattr(job, kind)):
                try:
                    check_name(name)
                except ValueError as e:
                    out.append({"loc": ["jobs", job.id, kind, k], "msg": str(e)})
    return out


def slurm_of(s: Session, manifest_id: int) -> dict[str, dict[str, Any]]:
    """Where Slurm ran the manifest's jobs (docs/slurm.md): {job: {job_id, node, state}},
    the latest Slurm job of each."""
    return {sj.job: {"job_id": sj.id, "node": sj.ran_on, "state": sj.state}
            for sj in s.scalars(select(SlurmJob).where(SlurmJob.manifest_id == manifest_id).order_by(SlurmJob.id))
            if sj.job is not None}


class ManifestService:
    def __init__(self, db: Database, cluster: ClusterState, actions: ActionService, events: EventService,
                 bus: Bus | None = None) -> None:
        self.db = db
        self.cluster = cluster
        self.actions = actions
        self.events = events
        self.bus = bus
        self._online: collections.deque[tuple[float, str]] = collections.deque()
        self._online_lock = threading.Lock()
        if bus is not None:  # the jobs other control-plane processes placed (PostgreSQL)
            bus.on("j", self._placed_elsewhere)

    def _placed_elsewhere(self, node: Any) -> None:
        if isinstance(node, str):
            with self._online_lock:
                self._online.append((time.monotonic(), node))

    # -- submit ---------------------------------------------------------------------------------

    def create(self, document: Any, *, nodes: list[str] | None, solver: str, slack: float,
               actor: str | None, plans: bool = True, prefetch_first: bool = False,
               release: str = "reads") -> dict[str, Any]:
        try:
            wf = parse_workflow(document, source="body")
        except WorkflowError as e:
            raise ManifestInvalid(e.format, e.errors) from None
        bad = _bad_names(wf)
        if bad:
            raise ManifestInvalid(wf.format, bad)
        nodes = self.cluster.target_nodes(nodes, ("query", "nodes"), "the manifest")
        result = self._place(wf, nodes, solver=solver, slack=slack, plans=plans, prefetch_first=prefetch_first,
                             release=release)
        options = {"nodes": nodes, "solver": solver, "slack": slack, "plans": plans,
                   **({"prefetch_first": True} if prefetch_first else {}),
                   **({"release": "start"} if release == "start" else {})}
        mid = self._store(wf, document, result, options, actor, plans)
        self.actions.wake(result["plans"].keys())
        self.events.record("audit", f"manifest {mid} submitted", "ok", actor=actor,
                           detail=f"{len(wf.jobs)} jobs on {len(nodes)} nodes ({solver}); "
                                  f"{result['transfer_bytes']['placed']} bytes to move")
        return self.get(mid)

    def _place(self, wf: Workflow, nodes: list[str], *, solver: str, slack: float, plans: bool,
               prefetch_first: bool, release: str) -> dict[str, Any]:
        """Layers 1 and 2 on ``nodes`` as they are now; the result as stored."""
        capacity = self.cluster.capacity(nodes)
        locations, census = self.cluster.locations(wf.sizes)
        # layer 2 starts from each node's real fast tier: the workflow's files already there
        # (the DHT's tier and pin) and the pinned bytes the heartbeat reports
        kw: dict[str, Any] = dict(solver=solver, slack=slack, capacity=capacity, locations=locations, plans=plans,
                                  census=census, fast_status=self.cluster.fast_status(nodes),
                                  first_reads_in_place=not prefetch_first, release=release)
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
        return result

    def _store(self, wf: Workflow, document: Any, result: dict[str, Any], options: dict[str, Any],
               actor: str | None, plans: bool) -> int:
        """The manifest, its jobs and its plan's action stored; its id."""
        now = time.time()
        with self.db.session() as s:
            m = Manifest(name=wf.name, format=wf.format, state="planned", actor=actor, document=document,
                         options=options, result=result, created_at=now, updated_at=now)
            position: dict[str, int] = {}
            # a job whose turn has come at submission has its steps planned now; the others'
            # are planned again at their release, from the node's contents then (needs the DHT)
            replan = plans and self.cluster.namespace.configured
            for job in wf.jobs:  # topological order: each node's jobs in the order its plan assumes
                node = result["placement"][job.id]
                due = position.get(node, 0) == 0 and not job.parents
                m.jobs.append(ManifestJob(job=job.id, node=node, position=position.get(node, 0), state="pending",
                                          parents=list(job.parents),
                                          planned_at=None if replan and not due else now))
                position[node] = position.get(node, 0) + 1
            s.add(m)
            s.flush()
            s.add(Action(action="plan", actor=actor, created_at=now, updated_at=now, manifest_id=m.id,
                         items=self._plan_items(wf, result, now)))
            s.flush()
            return m.id

    @staticmethod
    def _plan_items(wf: Workflow, result: dict[str, Any], now: float) -> list[ActionItem]:
        """Every step of the plan as an action item."""
        # where each file's primary copy is: its current location, or its writer's node
        owner = dict(result["locations"])
        for job in wf.jobs:
            for f in job.outputs:
                owner[f] = result["placement"][job.id]
        items = []
        writer = writers(wf)
        for node, steps in result["plans"].items():
            for st in steps:
                state, detail = "pending", None
                if st["action"] == "unpin" and owner.get(st["path"]) not in (None, node):
                    # a copy of another node's file in this node's remote cache is never
                    # pinned (pin/unpin act on files whose primary copy is on the node);
                    # its evict is sent (a demote of it drops the copy, as the plan assumes)
                    state = "skipped"
                    detail = f"a remote copy (primary on {owner[st['path']]}): never pinned here"
                items.append(step_item(st, node=node, step=st["step"], writer=writer, now=now, state=state,
                                       detail=detail))
        return items

    # -- online placement: one ready job -------------------------------------------------------

    ONLINE_WINDOW_S = 60.0

    def place_job(self, inputs: list[str], *, footprint: int | None = None,
                  nodes: list[str] | None = None) -> dict[str, Any]:
        """Where a ready job that reads ``inputs`` (namespace paths) should run now
        (:func:`hycache_core.scheduling.choose_node`): sizes and locations from the DHT,
        capacities from the nodes' heartbeats; ties go to the node the control plane sent
        the fewest jobs to in the last minute (kept in memory; with several processes on
        PostgreSQL each tells the others through the bus's ``j`` notification)."""
        nodes = self.cluster.target_nodes(nodes, ("body", "nodes"), "the job")
        sizes, locations = self.cluster.sizes_and_primaries(dict.fromkeys(ns_path(p) for p in inputs))
        now = time.monotonic()
        with self._online_lock:
            while self._online and self._online[0][0] < now - self.ONLINE_WINDOW_S:
                self._online.popleft()
            running: dict[str, int] = {}
            for _, n in self._online:
                running[n] = running.get(n, 0) + 1
            try:
                r = choose_node(sizes, nodes, locations=locations, capacity=self.cluster.capacity(nodes),
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
        slurm = slurm_of(s, m.id)
        summary: dict[str, dict[str, int]] = {n: {"total": 0, **{k: 0 for k in STEP_STATES}} for n in r["plans"]}
        for it in items:
            if it.node is None:
                raise ValueError(f"plan step {it.id} of manifest {m.id} names no node")
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
                       "finished_at": j.finished_at, "parents": list(j.parents or []),
                       "slurm": slurm.get(j.job)}
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
        self.actions.publish(changed)
        self.events.record("audit", f"manifest {manifest_id} cancelled", "ok", actor=actor,
                           detail=f"{len(changed)} steps cancelled before delivery")
        return self.get(manifest_id)


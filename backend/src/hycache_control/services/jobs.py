"""A manifest's jobs as a runner reports them: pending → running (``start``) → reads done
(``reads-done``) → done (``finish``).  Each event skips the job's steps it overtook, moves
the manifest's state, plans the jobs whose turn came with it (services/replan.py) and
wakes the nodes whose steps it may have released (services/release.py)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from ..db import Database
from ..models import Action, ActionItem, Manifest, ManifestJob
from .actions import ActionService, item_view
from .errors import Conflict
from .manifests import slurm_of
from .replan import ReleasePlanner
from .steps import BEFORE, job_row

#: a position past any job's
_NONE = 1 << 30


def _job_view(j: ManifestJob) -> dict[str, Any]:
    return {"id": j.job, "node": j.node, "position": j.position, "state": j.state,
            "started_at": j.started_at, "reads_done_at": j.reads_done_at, "finished_at": j.finished_at,
            "parents": list(j.parents or [])}


class JobService:
    def __init__(self, db: Database, actions: ActionService, planner: ReleasePlanner) -> None:
        self.db = db
        self.actions = actions
        self.planner = planner

    def job_node(self, manifest_id: int, job: str) -> str:
        with self.db.session() as s:
            return job_row(s, manifest_id, job).node

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
            j = job_row(s, manifest_id, job)
            return {**_job_view(j), "steps": self._before_steps(s, manifest_id, job),
                    "slurm": slurm_of(s, manifest_id).get(job)}

    def job_event(self, manifest_id: int, job: str, what: str, actor: str | None) -> dict[str, Any]:
        """``what``: start | reads-done | finish."""
        now = time.time()
        skipped: list[dict] = []
        with self.db.session() as s:
            j = job_row(s, manifest_id, job)
            m = j.manifest
            if m.state == "cancelled":
                raise Conflict(("path", "manifest_id"), f"manifest {manifest_id} was cancelled")
            if what != "start" and j.state == "pending":
                raise Conflict(("path", "job"), f"job {job!r} has not started (POST …/start first)")
            if what == "start":
                if j.state == "done":
                    raise Conflict(("path", "job"), f"job {job!r} already finished")
                if j.state == "pending":
                    j.state, j.started_at = "running", now
                    # a job never waits for a step that has not reached its node: the job
                    # reads those files where they are (docs/scheduling.md, "When a job starts")
                    skipped = self._skip_pending(s, manifest_id, job, f"job {job} started before delivery", now)
            elif what == "reads-done":
                # the job has read its inputs (it computes and writes now): the next job's
                # before-steps on this node are released (services/release.py)
                if j.reads_done_at is None:
                    j.reads_done_at = now
            elif j.state == "running":
                j.state, j.finished_at = "done", now
                skipped = self._skip_pending(s, manifest_id, job, f"job {job} finished before delivery", now)
            states = set(s.scalars(select(ManifestJob.state).where(ManifestJob.manifest_id == manifest_id)))
            m.state = "done" if states == {"done"} else ("running" if states - {"pending"} else "planned")
            m.updated_at = now
            woken = self._woken(m, j, what)
            out = _job_view(j)
            if what == "start":
                # the job's before-steps as of its start, so that a runner knows which
                # prefetches are under way without reading the whole manifest
                out["steps"] = self._before_steps(s, manifest_id, job)
            at_start = (m.options or {}).get("release") == "start"
            due = self._due(s, manifest_id, at_start, woken) if woken else []
        self.actions.publish(skipped)
        for name in due:  # their turn came with this event: plan their steps from the node's contents now
            self.planner.plan_at_release(manifest_id, name, wake=False)  # the event's wake below delivers them
        self.actions.wake(woken)
        return out

    @staticmethod
    def _skip_pending(s: Session, manifest_id: int, job: str, detail: str, now: float) -> list[dict]:
        """Skip the job's before-steps not delivered yet; their views."""
        items = list(s.scalars(select(ActionItem).join(Action).options(selectinload(ActionItem.parent))
                               .where(Action.manifest_id == manifest_id, ActionItem.job == job,
                                      ActionItem.state == "pending", ActionItem.plan_action.in_(BEFORE))))
        for it in items:
            it.state, it.detail, it.updated_at = "skipped", detail, now
        return [item_view(i) for i in items]

    @staticmethod
    def _woken(m: Manifest, j: ManifestJob, what: str) -> set[str]:
        """The nodes whose steps the event may release: a reads-done (or, with
        release=start, a start) releases the next job's steps on this node; a finish those
        of the job's children wherever they run (every node of the manifest).  A start with
        the reads-done release releases nothing (its skipped steps go to the stream): no
        node is woken, no delivery competes with it."""
        if what == "finish":
            return set((m.options or {}).get("nodes") or ()) | {j.node}
        if what == "reads-done" or (m.options or {}).get("release") == "start":
            return {j.node}
        return set()

    @staticmethod
    def _due(s: Session, manifest_id: int, at_start: bool, nodes) -> list[str]:
        """The jobs on ``nodes`` whose before-steps' turn has come (the gate's release rule)
        and that have not been planned at their release yet."""
        jobs = list(s.scalars(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id)))
        state = {j.job: j.state for j in jobs}
        first_unread: dict[str, int] = {}
        for j in jobs:
            if j.state == "pending" or (j.state == "running" and j.reads_done_at is None and not at_start):
                first_unread[j.node] = min(first_unread.get(j.node, _NONE), j.position)
        return [j.job for j in jobs
                if j.node in nodes and j.state == "pending" and j.planned_at is None
                and j.position == first_unread.get(j.node)
                and (j.position > 0 or all(state.get(p, "done") == "done" for p in j.parents or ()))]

"""Layer 2 at each release: when a job's turn comes on its node, its prefetch/evict steps
are planned again (``hycache_core.scheduling.plan_release``) from the node's contents at
that moment — the DHT's census of the workflow's files, the node's last heartbeat, the
remote copies its steps and reads left, the steps delivered and not done — and replace
the steps planned at submission if they differ.  The plan stored at submission stays as
the forecast the job views show."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from hycache_core.scheduling import node_state, plan_release, prefetch_sources
from hycache_core.workflow import Workflow, WorkflowJob, parse_workflow
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..db import Database
from ..models import Action, ActionItem, ManifestJob
from .actions import ActionService
from .cluster_state import ClusterState
from .steps import BEFORE, job_row, ns_path, step_item, step_of, writers

log = logging.getLogger(__name__)
#: a plan made at a release looks this many of the node's jobs ahead (and back, for the
#: files the node may still hold): bounds its DHT lookups on instances of thousands of jobs
RELEASE_HORIZON = 64
#: parsed workflows kept (a release plans from its manifest's)
WORKFLOWS_KEPT = 8


@dataclass
class _Snapshot:
    """What the database says of a job's node when its turn comes."""

    node: str
    pos: int
    options: dict[str, Any]
    placement: dict[str, str]
    located: dict[str, str]
    wf: Workflow
    rows: dict[str, tuple[str, int, str, float | None]]  # job → (node, position, state, reads_done_at)
    #: the node's before-steps delivered or done: (job, action, path, state)
    items: list[tuple[str | None, str | None, str, str]]


class ReleasePlanner:
    def __init__(self, db: Database, cluster: ClusterState, actions: ActionService) -> None:
        self.db = db
        self.cluster = cluster
        self.actions = actions
        self._lock = threading.Lock()
        self._wf_cache: collections.OrderedDict[int, Workflow] = collections.OrderedDict()

    def _workflow(self, manifest_id: int, document: Any) -> Workflow:
        """The manifest's parsed workflow (the last few kept: a release plans from it)."""
        cache = self._wf_cache
        with self._lock:
            wf = cache.get(manifest_id)
            if wf is not None:
                cache.move_to_end(manifest_id)
                return wf
        wf = parse_workflow(document, source="body")
        with self._lock:
            cache[manifest_id] = wf
            while len(cache) > WORKFLOWS_KEPT:
                cache.popitem(last=False)
        return wf

    def plan_at_release(self, manifest_id: int, job: str, *, wake: bool = True) -> list[dict[str, Any]] | None:
        """Plan ``job``'s prefetch/evict steps now that its turn has come, from its node's
        contents at this moment, and put them in place of its pending steps if they differ.
        Returns the steps, or None when the job was planned already (another request or
        process) or is no longer pending.  Any failure keeps the steps planned at
        submission (logged)."""
        t0 = time.perf_counter()
        try:
            steps = self._plan_job_now(manifest_id, job)
        except Exception:  # the plan made at submission stays; the job is never held forever
            log.exception("manifest %s: planning job %s at its release failed", manifest_id, job)
            steps = None
        with self.db.session() as s:
            won = s.scalars(update(ManifestJob).where(ManifestJob.manifest_id == manifest_id, ManifestJob.job == job,
                                                      ManifestJob.planned_at.is_(None))
                            .values(planned_at=time.time()).returning(ManifestJob.id)
                            .execution_options(synchronize_session=False)).first()
            if won is None or steps is None:
                return None
            log.info("manifest %s: job %s planned at its release in %.1f ms: %s", manifest_id, job,
                     1e3 * (time.perf_counter() - t0),
                     ", ".join(f"{st['action']} {st['path']}" for st in steps) or "no step")
            node = self._replace_steps(s, manifest_id, job, steps)
            if node is None:
                return None
        if wake:
            self.actions.wake([node])
        return steps

    def _replace_steps(self, s: Session, manifest_id: int, job: str, steps: list[dict[str, Any]]) -> str | None:
        """Put ``steps`` in place of the job's pending before-steps if they differ; the
        job's node, or None when they were no longer all pending (as they are)."""
        now = time.time()
        action = s.scalar(select(Action).where(Action.manifest_id == manifest_id))
        if action is None:
            raise RuntimeError(f"manifest {manifest_id} has no plan steps")
        mine = list(s.scalars(select(ActionItem).where(ActionItem.action_id == action.id, ActionItem.job == job,
                                                       ActionItem.plan_action.in_(BEFORE))
                              .order_by(ActionItem.step)))
        if any(i.state != "pending" for i in mine):
            return None  # (a start skipped them meanwhile, or a delivery raced): as they are
        j = job_row(s, manifest_id, job)
        writer = writers(self._workflow(manifest_id, j.manifest.document))
        node = j.node
        if [(i.plan_action, i.path) for i in mine] == [(st["action"], ns_path(st["path"])) for st in steps]:
            return node
        numbers = [step_of(i) for i in mine]
        top = s.scalar(select(func.max(ActionItem.step)).where(ActionItem.action_id == action.id,
                                                               ActionItem.node == node)) or 0
        while len(numbers) < len(steps):
            top += 1
            numbers.append(top)
        for i in mine:
            s.delete(i)
        for k, st in enumerate(steps):
            s.add(step_item(st, node=node, step=numbers[k], writer=writer, now=now, job=job, action_id=action.id))
        action.updated_at = now
        return node

    def _snapshot(self, manifest_id: int, job: str) -> _Snapshot | None:
        """The database's side of a job's release (None when it is no longer due)."""
        with self.db.session() as s:
            j = job_row(s, manifest_id, job)
            if j.state != "pending" or j.planned_at is not None:
                return None
            m = j.manifest
            rows = {r.job: (r.node, r.position, r.state, r.reads_done_at)
                    for r in s.scalars(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id))}
            items = [(i.job, i.plan_action, i.path, i.state) for i in s.scalars(
                select(ActionItem).join(Action).where(Action.manifest_id == manifest_id, ActionItem.node == j.node,
                                                      ActionItem.plan_action.in_(BEFORE),
                                                      ActionItem.state.in_(("delivered", "done"))))]
            return _Snapshot(node=j.node, pos=j.position, options=dict(m.options or {}),
                             placement=dict(m.result["placement"]), located=dict(m.result.get("locations") or {}),
                             wf=self._workflow(manifest_id, m.document), rows=rows, items=items)

    def _plan_job_now(self, manifest_id: int, job: str) -> list[dict[str, Any]] | None:
        """``job``'s before-steps from its node's contents now (reads the database, then the
        DHT and the node's last heartbeat outside any transaction)."""
        snap = self._snapshot(manifest_id, job)
        if snap is None:
            return None
        wf, node, pos, rows = snap.wf, snap.node, snap.pos, snap.rows
        index = {wj.id: wj for wj in wf.jobs}
        mine = sorted((p, index[name]) for name, (n, p, _, _) in rows.items() if n == node)
        ahead = [wj for p, wj in mine if pos <= p < pos + RELEASE_HORIZON]
        behind = [(p, wj) for p, wj in mine if pos - RELEASE_HORIZON <= p < pos]
        files = dict.fromkeys(f for _, wj in behind for f in (*wj.inputs, *wj.outputs))
        files.update(dict.fromkeys(f for wj in ahead for f in (*wj.inputs, *wj.outputs)))
        locations, census = self.cluster.locations(files)  # the DHT now: where each file is, on which tier
        status = self.cluster.fast_status([node])
        resident_all, held_all, pins = node_state(census, [node], status)
        resident = resident_all[node]
        copies = self._node_contents(snap, behind, locations, census, resident, pins[node])
        held = held_all[node]
        rc = (status.get(node) or {}).get("remote_cache_bytes")
        if isinstance(rc, (int, float)):  # copies of files this plan does not know: their room is taken
            held += max(0, int(rc) - copies)
        source = prefetch_sources(wf, snap.placement, {**snap.located, **locations}).get(node, {})
        before = None
        if behind and behind[-1][0] == pos - 1 and rows[behind[-1][1].id][2] != "done":
            before = behind[-1][1]
        in_place: set[str] = set()
        if not snap.options.get("prefetch_first") and mine:
            first = mine[0][1]
            in_place = {f for f in first.inputs if f not in resident and source.get(f, "slow") in (node, "slow")}
        release = "start" if snap.options.get("release") == "start" else "reads"
        return plan_release(node, ahead, self.cluster.capacity([node])[node], source, {*wf.pinned, *pins[node]},
                            resident=resident, held=held, before=before, in_place=in_place,
                            read_elsewhere=_read_elsewhere(snap, index, ahead, resident), release=release)

    @staticmethod
    def _node_contents(snap: _Snapshot, behind: list[tuple[int, WorkflowJob]], locations: dict[str, str],
                       census: dict[str, dict[str, Any]], resident: dict[str, int], pins: set[str]) -> int:
        """Add to ``resident`` what the DHT does not show: the copies of other nodes' files
        the node holds (its prefetches and its jobs' reads fetched them; an evict dropped
        one), the local moves its delivered steps have under way, and the outputs its jobs
        wrote and have not published yet.  Returns the bytes of those remote copies."""
        wf, node = snap.wf, snap.node
        position: dict[str | None, int] = {name: p for name, (n, p, _, _) in snap.rows.items() if n == node}
        last: dict[str, tuple[int, int, bool]] = {}

        def seen(f: str, key: tuple[int, int], present: bool) -> None:
            if f not in last or last[f][:2] <= key:
                last[f] = (*key, present)

        for name, action, path, state in snap.items:
            f = path[1:] if path.startswith("/") and path[1:] in wf.sizes else path
            if f not in wf.sizes:
                continue
            if locations.get(f) == node and state == "done":
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
            elif not present and f in resident and f not in pins:
                del resident[f]
        return copies


def _read_elsewhere(snap: _Snapshot, index: dict[str, WorkflowJob], ahead: list[WorkflowJob],
                    resident: dict[str, int]) -> dict[str, int]:
    """Files on the node that unfinished jobs of other nodes still read (and no job ahead
    here refers to): how many such jobs each."""
    ahead_refs = {f for wj in ahead for f in (*wj.inputs, *wj.outputs)}
    elsewhere: dict[str, int] = {}
    for name, (n, _, st, _) in snap.rows.items():
        if n != snap.node and st != "done":
            for f in index[name].inputs:
                if f in resident and f not in ahead_refs:
                    elsewhere[f] = elsewhere.get(f, 0) + 1
    return elsewhere

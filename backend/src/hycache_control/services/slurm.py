"""Slurm runs the jobs, HyCache places and stages their data (docs/slurm.md).

Slurm's ``job_submit.lua`` asks :meth:`SlurmService.choose` where a job that declares its
data should run (a manifest's job: its node in the manifest's placement, 2LS layer 1;
otherwise the online placement of :meth:`ManifestService.place_job`, one implementation
in ``hycache_core.scheduling``).  Slurm's ``burst_buffer.lua`` hooks then report the
job's life by its Slurm job id:

- stage-in: the job's inputs are prefetched onto the node it will run on (one ``stage``
  action whose items are ``prefetch`` steps delivered to that node like plan steps);
  ``staging`` is ``staged`` once every one is done, ``failed`` when one failed;
- pre-run: where the job really runs (a node other than the staged one is staged again),
  its inputs on that node pinned while it runs; a manifest's job is started;
- post-run: those inputs unpinned, its outputs published (their node and size in the
  namespace now); a manifest's job is finished;
- teardown: the steps not delivered yet are cancelled.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from ..db import Database
from ..models import Action, ActionItem, SlurmJob
from .actions import ActionService, item_view
from .errors import Conflict, Invalid, NotFound, ServiceError
from .events import EventService
from .jobs import JobService
from .manifests import ManifestService
from .namespace import NamespaceService
from .steps import job_row, ns_path

#: the hooks the burst buffer reports, in the order a job passes them
HOOKS = ("stage-in", "pre-run", "post-run", "teardown")
#: the jobs ``scontrol show bbstat`` lists without a job id (the latest first)
STATUS_JOBS = 50


NOT_PUBLISHED = "no such file"  # a staged input that no node holds (yet)


def staging_state(items: list[ActionItem]) -> tuple[str, list[str]]:
    """(``none`` | ``staging`` | ``staged`` | ``failed``, the failed steps' details) of a
    job's prefetch steps."""
    if not items:
        return "none", []
    failed = [f"{i.path}: {i.detail or 'failed'}" for i in items if i.state == "failed"]
    if failed:
        return "failed", failed
    if all(i.state in ("done", "skipped", "cancelled") for i in items):
        return "staged", []
    return "staging", []


class SlurmService:
    def __init__(self, db: Database, manifests: ManifestService, jobs: JobService, actions: ActionService,
                 namespace: NamespaceService, events: EventService) -> None:
        self.db = db
        self.manifests = manifests
        self.jobs = jobs
        self.actions = actions
        self.namespace = namespace
        self.events = events

    # -- layer 1: the node a job should run on ---------------------------------------------------

    def choose(self, *, manifest_id: int | None, job: str | None, inputs: list[str],
               nodes: list[str] | None) -> dict[str, Any]:
        """Where the job should run: its manifest's placement, else the online placement.
        ``nodes`` are Slurm's candidates: the ones HyCache does not know are left out (a
        partition may hold nodes without an agent); none known is an error."""
        if nodes is not None:
            known = [n for n in nodes if self.manifests.cluster.nodes.known(n)]
            if not known:
                raise Invalid(("body", "nodes"), f"none of these nodes is a HyCache node: {', '.join(nodes[:20])}")
            nodes = known
        if manifest_id is not None:
            with self.db.session() as s:
                j = job_row(s, manifest_id, job or "", "body")
                planned = (j.manifest.result.get("inputs") or {}).get(j.job, [])
                if nodes is None or j.node in nodes:
                    return {"node": j.node, "source": "manifest", "inputs": planned}
            inputs = inputs or planned  # the manifest's node is not among Slurm's candidates
        r = self.manifests.place_job(inputs, nodes=nodes)
        return {"node": r["node"], "source": "placement", "inputs": [ns_path(p) for p in inputs]}

    # -- the burst buffer's hooks ------------------------------------------------------------

    def stage_in(self, slurm_id: int, *, node: str | None, manifest_id: int | None, job: str | None,
                 inputs: list[str], outputs: list[str], actor: str | None, stage: bool = True) -> dict[str, Any]:
        """Record the job and send its inputs' prefetches to ``node`` (chosen here when
        Slurm has not said); again with the same node it only reports the staging.
        ``stage=False`` records the job and its node only: a job that was never staged
        (no stage action) is not staged at pre-run either, nor are its inputs pinned."""
        if (manifest_id is None) != (job is None):
            raise Invalid(("body", "job" if job is None else "manifest_id"),
                          "manifest_id and job go together (the manifest's job this Slurm job runs)")
        if node is None or (manifest_id is not None and not inputs):
            chosen = self.choose(manifest_id=manifest_id, job=job, inputs=inputs,
                                 nodes=[node] if node is not None else None)
            node, inputs = node or chosen["node"], inputs or chosen["inputs"]
        inputs = [ns_path(p) for p in inputs]
        outputs = [ns_path(p) for p in outputs]
        now = time.time()
        with self.db.session() as s:
            sj = s.get(SlurmJob, slurm_id)
            if sj is None:
                sj = SlurmJob(id=slurm_id, manifest_id=manifest_id, job=job, inputs=inputs, outputs=outputs,
                              state="pending", hooks=[], created_at=now, updated_at=now)
                s.add(sj)
            elif sj.state in ("finished", "done"):
                raise Conflict(("path", "slurm_job_id"), f"Slurm job {slurm_id} has already run")
            self._hook(sj, "stage-in", node if stage else f"{node} (no staging)", now)
            if not stage and sj.stage_action_id is None:
                sj.staged_on = node
            again = sj.staged_on == node and self._waits_for_publication(s, sj.stage_action_id)
        if stage and (sj.staged_on != node or again):
            self._stage(slurm_id, node, actor)
        return self.get(slurm_id)

    @staticmethod
    def _waits_for_publication(s: Session, action_id: int | None) -> bool:
        """Whether a staging failed only for inputs no node held yet: a parent job's output
        reaches the namespace a moment after Slurm saw the parent end, so the hook asks
        again (bounded by its ``publish_wait``) and the staging is made anew."""
        action = s.get(Action, action_id) if action_id is not None else None
        failed = [i for i in action.items if i.state == "failed"] if action is not None else []
        return bool(failed) and all((i.detail or "").startswith(NOT_PUBLISHED) for i in failed)

    def _stage(self, slurm_id: int, node: str, actor: str | None) -> None:
        """One prefetch step per input onto ``node``; an input no node holds fails at once."""
        now = time.time()
        with self.db.session() as s:
            sj = self._row(s, slurm_id)
            metas = self.namespace.get_many(sj.inputs) if (sj.inputs and self.namespace.configured) else None
            items = []
            for k, path in enumerate(sj.inputs):
                meta = metas[k] if metas is not None else None
                state, detail = "pending", None
                if metas is not None and meta is None:
                    state, detail = "failed", f"{NOT_PUBLISHED}: {path}"
                items.append(ActionItem(path=path, node=node, state=state, detail=detail, kind="prefetch",
                                        size=meta.size if meta is not None else None, updated_at=now))
            self._cancel_open(s, sj.stage_action_id, f"Slurm job {slurm_id} staged on {node} instead", now)
            a = Action(action="stage", actor=actor, created_at=now, updated_at=now, items=items)
            s.add(a)
            s.flush()
            sj.stage_action_id, sj.staged_on, sj.updated_at = a.id, node, now
            if sj.state == "pending":
                sj.state = "staging"
            failed = [i for i in items if i.state == "failed"]
        self.actions.wake([node])
        for it in failed:
            self.events.record("action", f"stage {it.path} for Slurm job {slurm_id}", "failed", node=node,
                               actor=actor, detail=it.detail)

    def pre_run(self, slurm_id: int, node: str, actor: str | None) -> dict[str, Any]:
        """The job runs on ``node`` now: staged again there if it was staged elsewhere;
        its inputs pinned while it runs (where their primary copy is).  A job recorded
        without staging (no stage action) is only recorded."""
        now = time.time()
        with self.db.session() as s:
            sj = self._row(s, slurm_id)
            self._hook(sj, "pre-run", node, now)
            sj.ran_on, sj.state = node, "running"
            staged_on, inputs, manifest = sj.staged_on, list(sj.inputs), (sj.manifest_id, sj.job)
            staged = sj.stage_action_id is not None
        if staged and staged_on != node:
            self._stage(slurm_id, node, actor)
        pin = self._file_action("pin", inputs, actor, on=node) if staged else None
        with self.db.session() as s:
            self._row(s, slurm_id).pin_action_id = pin
        self._manifest_event(slurm_id, manifest, "start", actor)
        return self.get(slurm_id)

    def post_run(self, slurm_id: int, exit_code: int | None, actor: str | None) -> dict[str, Any]:
        """The job ended: its inputs unpinned, its outputs published (where each is now).
        Again after that: the outputs looked up again (an agent publishes a file it wrote
        to the namespace a moment after its close)."""
        now = time.time()
        with self.db.session() as s:
            sj = self._row(s, slurm_id)
            again = sj.state in ("finished", "done")
            if not again:
                self._hook(sj, "post-run", f"exit {exit_code}" if exit_code is not None else None, now)
                sj.state, sj.exit_code = "finished", exit_code
            outputs, pinned = list(sj.outputs), sj.pin_action_id
            manifest = (sj.manifest_id, sj.job)
        if again:  # the hook asks again while outputs are not in the namespace yet: only publish
            published = self._publish(outputs)
            with self.db.session() as s:
                self._row(s, slurm_id).published = published
            return self.get(slurm_id)
        if pinned is not None:
            self._file_action("unpin", self._action_paths(pinned), actor)
        published = self._publish(outputs)
        with self.db.session() as s:
            self._row(s, slurm_id).published = published
        if exit_code in (None, 0):
            self._manifest_event(slurm_id, manifest, "finish", actor)
        return self.get(slurm_id)

    def teardown(self, slurm_id: int, hurry: bool, actor: str | None) -> dict[str, Any]:
        """Slurm is done with the job (run, failed or cancelled): steps not delivered yet
        are cancelled."""
        now = time.time()
        with self.db.session() as s:
            sj = self._row(s, slurm_id)
            self._hook(sj, "teardown", "hurry" if hurry else None, now)
            changed = self._cancel_open(s, sj.stage_action_id, f"Slurm job {slurm_id} was torn down", now)
            sj.state = "done"
        self.actions.publish(changed)
        return self.get(slurm_id)

    # -- views --------------------------------------------------------------------------------

    def get(self, slurm_id: int) -> dict[str, Any]:
        with self.db.session() as s:
            return self._view(s, self._row(s, slurm_id))

    def of_manifest(self, manifest_id: int) -> dict[str, dict[str, Any]]:
        """The manifest's jobs Slurm ran: {job: {job_id, node, state, staging}} (the last
        Slurm job of each)."""
        with self.db.session() as s:
            out = {}
            for sj in s.scalars(select(SlurmJob).where(SlurmJob.manifest_id == manifest_id).order_by(SlurmJob.id)):
                v = self._view(s, sj)
                out[sj.job or ""] = {"job_id": sj.id, "node": sj.ran_on, "state": sj.state,
                                     "staging": v["staging"]}
            return out

    def status(self, slurm_id: int | None) -> dict[str, Any]:
        """What ``scontrol show bbstat`` prints: one job, or the latest STATUS_JOBS jobs."""
        with self.db.session() as s:
            if slurm_id is not None:
                rows = [self._row(s, slurm_id)]
            else:
                rows = list(s.scalars(select(SlurmJob).order_by(SlurmJob.id.desc()).limit(STATUS_JOBS)))
            jobs = [self._view(s, r) for r in rows]
        lines = [f"HyCache burst buffer: {len(jobs)} job(s)"]
        for j in jobs:
            st = j["steps"]
            lines.append(f"JobId={j['id']} State={j['state']} Staging={j['staging']} "
                         f"StagedOn={j['staged_on'] or '-'} RanOn={j['ran_on'] or '-'} "
                         f"Staged={st['done']}/{st['total']} Failed={st['failed']}")
        return {"text": "\n".join(lines) + "\n", "jobs": jobs}

    @staticmethod
    def _row(s: Session, slurm_id: int) -> SlurmJob:
        sj = s.get(SlurmJob, slurm_id)
        if sj is None:
            raise NotFound(("path", "slurm_job_id"), f"no Slurm job {slurm_id} (no stage-in reported)")
        return sj

    @staticmethod
    def _hook(sj: SlurmJob, hook: str, detail: str | None, now: float) -> None:
        sj.hooks = [*sj.hooks, [hook, now, detail]]
        sj.updated_at = now

    def _view(self, s: Session, sj: SlurmJob) -> dict[str, Any]:
        items = list(s.scalars(select(ActionItem).where(ActionItem.action_id == sj.stage_action_id)
                               .options(selectinload(ActionItem.parent)).order_by(ActionItem.id))) \
            if sj.stage_action_id is not None else []
        staging, failures = staging_state(items)
        counts = {k: sum(1 for i in items if i.state == k) for k in ("done", "failed", "pending", "delivered")}
        return {"id": sj.id, "manifest_id": sj.manifest_id, "job": sj.job, "inputs": list(sj.inputs),
                "outputs": list(sj.outputs), "state": sj.state, "staged_on": sj.staged_on, "ran_on": sj.ran_on,
                "staging": staging, "failures": failures,
                "steps": {"total": len(items), **counts},
                "step_items": [{**item_view(i), "updated_at": i.updated_at} for i in items],
                "hooks": [{"hook": h[0], "at": h[1], "detail": h[2]} for h in sj.hooks],
                "published": sj.published,
                "outputs_missing": sum(1 for v in (sj.published or {}).values() if v is None),
                "exit_code": sj.exit_code,
                "created_at": sj.created_at, "updated_at": sj.updated_at}

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _cancel_open(s: Session, action_id: int | None, detail: str, now: float) -> list[dict[str, Any]]:
        if action_id is None:
            return []
        items = list(s.scalars(select(ActionItem).options(selectinload(ActionItem.parent))
                               .where(ActionItem.action_id == action_id, ActionItem.state == "pending")))
        for it in items:
            it.state, it.detail, it.updated_at = "cancelled", detail, now
        return [item_view(i) for i in items]

    def _file_action(self, action: str, paths: list[str], actor: str | None, on: str | None = None) -> int | None:
        """pin/unpin the files that exist (on their primary node; with ``on``, only those
        whose primary is that node: a job's staged copy of another node's file is in its
        node's remote cache, which pinning the primary does not keep);
        None when there are none or no DHT is configured."""
        if not paths or not self.namespace.configured:
            return None
        present = [p for p, m in zip(paths, self.namespace.get_many(paths), strict=True)
                   if m is not None and (on is None or m.primary == on)]
        return self.actions.create(action, present, actor)["id"] if present else None

    def _action_paths(self, action_id: int) -> list[str]:
        with self.db.session() as s:
            return list(s.scalars(select(ActionItem.path).where(ActionItem.action_id == action_id)))

    def _publish(self, outputs: list[str]) -> dict[str, Any]:
        if not outputs or not self.namespace.configured:
            return {}
        return {p: ({"node": m.primary, "size": m.size} if m is not None else None)
                for p, m in zip(outputs, self.namespace.get_many(outputs), strict=True)}

    def _manifest_event(self, slurm_id: int, manifest: tuple[int | None, str | None], what: str,
                        actor: str | None) -> None:
        """The manifest's job follows the Slurm job (its release gate moves with it); a job
        the manifest cannot take the event for is logged, not failed."""
        mid, job = manifest
        if mid is None or job is None:
            return
        try:
            self.jobs.job_event(mid, job, what, actor)
        except ServiceError as e:
            self.events.record("action", f"Slurm job {slurm_id}: manifest {mid} job {job} {what}", "failed",
                               actor=actor, detail=e.msg)

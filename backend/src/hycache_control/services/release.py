"""When a manifest's plan step is released to its node (the gate ActionService.deliver
asks inside its session, and the retry ActionService.report asks of a failed step).

A job's steps are of two kinds (see ``plan_node``): *before* the job — ``prefetch`` and
``evict`` (its inputs staged, room made) — and *after* it — ``pin`` of an output the job
wrote, ``unpin`` of files with no later reference on the node.
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
  with ``release=start`` releases them when the job before it *starts* instead (a runner
  that never reports reads done should use it).  A before-step whose job finished before
  the step was delivered is ``skipped``.
- after-steps of J are released when J has finished (the output exists; the job no longer
  needs the file).
- a prefetch of a parent's output whose release would come when its job can start (that
  parent was the last thing the job waited for, and the job before it on the node has
  finished) is ``skipped`` instead: a prefetch then could only race the job's read.
- a prefetch that fails for room on its node (the job before it still had files open
  there) is not dropped: it goes back to pending once and is released again when the job
  before it has ended — or skipped if its own job starts first (``retry``).
- the before-steps are planned again when J's turn comes (services/replan.py): J's steps
  are held until then (``planned_at``).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import ActionItem, Manifest, ManifestJob
from .actions import RETRY
from .steps import BEFORE, manifest_of

#: a position past any job's
_NONE = 1 << 30


class ReleaseGate:
    """The release rules above, over the rows of one session (it keeps no state)."""

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
        """release | hold | skip | skip-ready for each plan step (the module docstring says
        when; "skip-ready": its job can start now, it reads the file where it is)."""
        view = _Turns(s, {manifest_of(i) for i in items})
        return {it.id: self._verdict(view, it) for it in items}

    def _verdict(self, t: _Turns, it: ActionItem) -> str:
        mid = manifest_of(it)
        j = t.jobs.get((mid, it.job)) if it.job is not None else None
        if mid in t.cancelled and it.state == "pending":
            return "hold"
        if j is None:
            return "release"
        if it.plan_action not in BEFORE:
            return "release" if j.state == "done" else "hold"
        if j.state == "done":
            return "skip"
        if j.planned_at is None and j.state == "pending":
            return "hold"  # its turn has come only once they are planned from the node's contents
        if (it.after_job and j.position > 0 and j.planned_at and it.state == "pending"
                and t.first_unfinished.get((mid, j.node)) == j.position
                and all(t.jobs[(mid, p)].state == "done" for p in j.parents if (mid, p) in t.jobs)):
            # its writer's finish was the last thing the job waited for: it starts now, and
            # a prefetch released at this moment could only race its read (the job would
            # wait for it); it reads the file where it is, the same bytes
            return "skip-ready"
        turn = t.first_unfinished if (it.detail or "").startswith(RETRY) else t.first_unread
        if j.position <= turn.get((mid, j.node), _NONE) and self._inputs_ready(mid, j, it, t.jobs):
            return "release"
        return "hold"


class _Turns:
    """The jobs of some manifests, and whose turn it is on each of their nodes."""

    def __init__(self, s: Session, mids: set[int]) -> None:
        self.jobs: dict[tuple[int, str], ManifestJob] = {}
        self.first_unread: dict[tuple[int, str], int] = {}  # the first job that has not read its inputs yet
        self.first_unfinished: dict[tuple[int, str], int] = {}
        self.cancelled: set[int] = set()
        at_start: set[int] = set()  # manifests submitted with release=start
        for mid, state, options in s.execute(select(Manifest.id, Manifest.state, Manifest.options)
                                             .where(Manifest.id.in_(mids))):
            if state == "cancelled":
                self.cancelled.add(mid)
            if (options or {}).get("release") == "start":
                at_start.add(mid)
        for j in s.scalars(select(ManifestJob).where(ManifestJob.manifest_id.in_(mids))):
            self.jobs[(j.manifest_id, j.job)] = j
            key = (j.manifest_id, j.node)
            if j.state == "pending" or (j.state == "running" and j.reads_done_at is None
                                        and j.manifest_id not in at_start):
                self.first_unread[key] = min(self.first_unread.get(key, _NONE), j.position)
            if j.state != "done":
                self.first_unfinished[key] = min(self.first_unfinished.get(key, _NONE), j.position)

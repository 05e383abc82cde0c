"""A manifest's plan steps as action items: which agent action carries each one, which
job a prefetch waits for, where a manifest's file lives in the namespace, and a job's row."""

from __future__ import annotations

from typing import Any

from hycache_core.workflow import Workflow
from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import ActionItem, Manifest, ManifestJob
from .errors import NotFound

#: the agent action that carries out each planned step
AGENT_ACTION = {"prefetch": "prefetch", "evict": "demote", "pin": "pin", "unpin": "unpin"}
BEFORE = ("prefetch", "evict")  # steps before their job; pin/unpin come after it
STEP_STATES = ("done", "failed", "skipped", "cancelled", "pending")


def ns_path(name: str) -> str:
    """A manifest's file name → its path in the namespace (relative names are under /)."""
    return name if name.startswith("/") else "/" + name


def writers(wf: Workflow) -> dict[str, str]:
    """Each file the workflow writes → its first writer."""
    out: dict[str, str] = {}
    for job in wf.jobs:
        for f in job.outputs:
            out.setdefault(f, job.id)
    return out


def after_job(writer: dict[str, str], st: dict[str, Any]) -> str | None:
    """The job a prefetch step waits for: its file's writer (the file exists once it has
    finished), if another job of the manifest."""
    w = writer.get(st["path"]) if st["action"] == "prefetch" else None
    return w if w != st["job"] else None


def manifest_of(it: ActionItem) -> int:
    """The manifest whose plan step ``it`` is (a plan step's action always names one)."""
    mid = it.parent.manifest_id
    if mid is None:
        raise ValueError(f"action item {it.id} is not a manifest's plan step")
    return mid


def step_of(it: ActionItem) -> int:
    """The number of plan step ``it`` on its node (a plan step always has one)."""
    if it.step is None:
        raise ValueError(f"action item {it.id} is not a manifest's plan step")
    return it.step


def step_item(st: dict[str, Any], *, node: str, step: int, writer: dict[str, str], now: float,
              state: str = "pending", detail: str | None = None, job: str | None = None,
              **kw: Any) -> ActionItem:
    """The action item that carries plan step ``st`` (of ``job``, by default its own) to ``node``."""
    return ActionItem(path=ns_path(st["path"]), node=node, state=state, detail=detail, updated_at=now,
                      kind=AGENT_ACTION[st["action"]], plan_action=st["action"], job=st["job"] if job is None else job, step=step,
                      size=st.get("size"), source=None if st.get("source") is None else str(st["source"]),
                      after_job=after_job(writer, st), **kw)


def job_row(s: Session, manifest_id: int, job: str, where: str = "path") -> ManifestJob:
    """The job's row, or NotFound naming the manifest or the job that is missing (as fields
    of ``where``: the request's path, or its body)."""
    j = s.scalar(select(ManifestJob).where(ManifestJob.manifest_id == manifest_id, ManifestJob.job == job))
    if j is None:
        if s.get(Manifest, manifest_id) is None:
            raise NotFound((where, "manifest_id"), f"no manifest {manifest_id}")
        raise NotFound((where, "job"), f"manifest {manifest_id} has no job {job!r}")
    return j

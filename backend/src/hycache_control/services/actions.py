"""File actions (pin, unpin, promote, demote): one item per path, routed to the node that
holds the file's primary copy (from the DHT), delivered in that node's heartbeat answer
until it reports a result."""

from __future__ import annotations

import builtins
import collections
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, selectinload

from ..db import Database
from ..models import Action, ActionItem
from .bus import Bus
from .errors import NotFound
from .events import EventService
from .namespace import NamespaceService
from .nodes import NodeService

#: items delivered per heartbeat answer at most
MAX_DELIVERY = 500
#: items read per query while looking for deliverable ones
PAGE = 2000
FINAL = ("done", "failed", "skipped", "cancelled")
#: ``gate(session, items) -> {item id: "release" | "hold" | "skip" | "skip-ready"}``
Gate = Callable[[Session, list[ActionItem]], dict[int, str]]
#: ``retry(session, item, detail) -> bool``: True when the failed step goes back to pending
Retry = Callable[[Session, ActionItem, str], bool]
#: the detail of a plan step that failed for room and waits to be delivered again (its
#: second delivery carries ``attempt: 1``, which the agent applies although it saw the id)
RETRY = "retry when the job before it has ended: "


#: the actions /actions lists: not a manifest's plan steps, not a Slurm job's stage-in
LISTED = (Action.manifest_id.is_(None), Action.action != "stage")


def action_state(items: list[ActionItem]) -> str:
    """running while an item is with its node, pending while one waits for delivery, then
    done (every item done) or failed (some item failed)."""
    states = {i.state for i in items}
    if "delivered" in states:
        return "running"
    if "pending" in states:
        return "pending"
    return "done" if states <= {"done"} else "failed"


def action_view(a: Action) -> dict[str, Any]:
    return {"id": a.id, "action": a.action, "state": action_state(a.items), "actor": a.actor,
            "created_at": a.created_at, "updated_at": a.updated_at,
            "items": [item_view(i) for i in a.items]}


def item_view(i: ActionItem) -> dict[str, Any]:
    v = {"id": i.id, "path": i.path, "node": i.node, "state": i.state, "detail": i.detail, "tier": i.tier}
    if i.job is not None:
        v.update(action=i.kind, plan_action=i.plan_action, job=i.job, step=i.step, size=i.size, source=i.source,
                 manifest_id=i.parent.manifest_id if i.parent is not None else None)
    return v


class ActionService:
    def __init__(self, db: Database, namespace: NamespaceService, nodes: NodeService, events: EventService,
                 bus: Bus | None = None, *, gate: Gate | None = None, retry: Retry | None = None) -> None:
        self.db = db
        self.bus = bus
        self.namespace = namespace
        self.nodes = nodes
        self.events = events
        self._lock = threading.Lock()
        #: item updates for the stream: (seq, item view)
        self.updates: collections.deque[tuple[int, dict]] = collections.deque(maxlen=10_000)
        self._seq = itertools.count(1)
        self.last_update = 0
        #: plan steps (items of a manifest's action) are released by this hook
        #: (services/release.py; "skip-ready": its job can start now, it reads the file where it is)
        self.gate = gate
        #: a plan step that failed may go back to pending, to be released again later
        self.retry = retry
        self._pending_nodes: set[str] = set()
        #: the push channel (GET /nodes/{id}/plan): a version per node, bumped by every wake,
        #: and the callbacks of the long-polls waiting for it (called from any thread)
        self._origin = bus.origin if bus is not None else uuid.uuid4().hex[:12]
        self._versions: dict[str, int] = {}
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self.resync()
        if bus is not None:  # other processes' item changes and new work (services/bus.py)
            bus.on("a", self._publish_local)
            bus.on("w", self._wake_local)
            bus.on("resync", lambda _: self.resync())

    def resync(self) -> None:
        """Which nodes have open items (from the database)."""
        with self.db.session() as s:
            nodes = set(s.scalars(select(ActionItem.node).where(ActionItem.state.in_(("pending", "delivered")))
                                  .distinct()))
        with self._lock:
            self._pending_nodes.update(n for n in nodes if n)

    def publish(self, items: list[dict]) -> None:
        self._publish_local(items)
        if self.bus is not None and self.bus.enabled and items:
            chunk: list[dict] = []
            size = 0
            for it in items:  # several notifications when the views would not fit in one
                n = len(json.dumps(it, default=str)) + 1
                if chunk and size + n > 6000:
                    self.bus.notify_now("a", chunk)
                    chunk, size = [], 0
                chunk.append(it)
                size += n
            self.bus.notify_now("a", chunk)

    def _publish_local(self, items: list[dict]) -> None:
        with self._lock:
            for it in items:
                self.last_update = next(self._seq)
                self.updates.append((self.last_update, it))

    def _wake_local(self, nodes) -> None:
        fire: list[Callable[[], None]] = []
        with self._lock:
            for n in nodes:
                if isinstance(n, str):
                    self._pending_nodes.add(n)
                    self._versions[n] = self._versions.get(n, 0) + 1
                    fire.extend(self._watchers.pop(n, ()))
        for cb in fire:
            cb()

    # -- the push channel (GET /nodes/{id}/plan) ------------------------------------------------

    def push_version(self, node: str) -> str:
        """The node's version on this process (opaque: the process and a counter bumped by
        every wake of the node, here or, through the bus, in another process)."""
        with self._lock:
            return f"{self._origin}.{self._versions.get(node, 0)}"

    def watch(self, node: str, after: str | None, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (once, from whichever thread wakes the node) at the node's next
        wake; False (and no callback) when its version already differs from ``after``."""
        with self._lock:
            if after != f"{self._origin}.{self._versions.get(node, 0)}":
                return False
            self._watchers.setdefault(node, []).append(callback)
            return True

    def unwatch(self, node: str, callback: Callable[[], None]) -> None:
        with self._lock:
            cbs = self._watchers.get(node)
            if cbs and callback in cbs:
                cbs.remove(callback)
                if not cbs:
                    del self._watchers[node]

    def updates_after(self, seq: int) -> list[tuple[int, dict]]:
        with self._lock:
            return [u for u in self.updates if u[0] > seq]

    def create(self, action: str, paths: list[str], actor: str | None) -> dict[str, Any]:
        now = time.time()
        items = []
        for path in paths:
            node, state, detail = None, "pending", None
            meta = self.namespace.get(path)
            if meta is None:
                state, detail = "failed", f"no such file: {path}"
            elif meta.kind != "file":
                state, detail = "failed", f"not a regular file ({meta.kind}): {path}"
            elif not meta.primary:
                state, detail = "failed", f"no node holds {path}"
            elif not self.nodes.is_live(meta.primary):
                node, state = meta.primary, "failed"
                detail = f"{path} is held by node {meta.primary}, which is not live (down or unknown)"
            else:
                node = meta.primary
            items.append(ActionItem(path=path, node=node, state=state, detail=detail, updated_at=now))
        a = Action(action=action, actor=actor, created_at=now, updated_at=now, items=items)
        with self.db.session() as s:
            s.add(a)
            s.flush()
            view = action_view(a)
        woken = {i.node for i in items if i.state == "pending" and i.node}
        self.wake(woken)
        for it in view["items"]:
            if it["state"] == "failed":
                self.events.record("action", f"{action} {it['path']}", "failed", node=it["node"], actor=actor,
                                   detail=it["detail"])
        self.publish(view["items"])
        return view

    def wake(self, nodes) -> None:
        """Items may now be deliverable to ``nodes`` (new plan steps, a job started): here,
        and in every other process (blocking on PostgreSQL: one notification)."""
        nodes = sorted({n for n in nodes if n})
        self._wake_local(nodes)
        if self.bus is not None and self.bus.enabled and nodes:
            for k in range(0, len(nodes), 200):
                self.bus.notify_now("w", nodes[k:k + 200])

    def get(self, action_id: int) -> dict[str, Any]:
        with self.db.session() as s:
            a = s.scalar(select(Action).where(Action.id == action_id, *LISTED)
                         .options(selectinload(Action.items)))
            if a is None:
                raise NotFound(("path", "action_id"), f"no action {action_id}")
            return action_view(a)

    def list(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        with self.db.session() as s:
            total = s.scalar(select(func.count()).select_from(Action).where(*LISTED)) or 0
            rows = s.scalars(select(Action).where(*LISTED)
                             .options(selectinload(Action.items)).order_by(Action.id.desc())
                             .limit(limit).offset(offset))
            return [action_view(a) for a in rows], total

    # -- the heartbeat side -------------------------------------------------------------------

    def has_work(self, node: str) -> bool:
        """May :meth:`deliver` find items for ``node`` (else it answers [] without a query)?"""
        with self._lock:
            return node in self._pending_nodes

    def deliver(self, node: str) -> builtins.list[dict[str, Any]]:
        """Items for ``node`` (pending or delivered without a result yet: re-sent until the
        agent reports, so a restart of either side loses none)."""
        with self._lock:
            if node not in self._pending_nodes:
                return []
        now = time.time()
        with self.db.session() as s:
            rows, verdict, seen = self._open_items(s, node)
            if not seen:
                with self._lock:
                    self._pending_nodes.discard(node)
                return []
            # The pages were read before this transaction wrote anything: a job's start
            # (another request) may have marked a step ``skipped`` since. A step goes from
            # pending to delivered only where it is still pending, in the statement that
            # takes the write lock (SQLite) or the row lock (PostgreSQL); one another
            # request changed meanwhile is left for the next delivery to judge.
            sendable = [item.id for item, _ in rows if verdict.get(item.id, "release") == "release"][:MAX_DELIVERY]
            still = set(s.scalars(update(ActionItem).where(ActionItem.id.in_(sendable), ActionItem.state == "pending")
                                  .values(state="delivered", updated_at=now).returning(ActionItem.id)
                                  .execution_options(synchronize_session=False))) if sendable else set()
            changed: builtins.list[dict[str, Any]] = []
            out: builtins.list[dict[str, Any]] = []
            for item, action in rows:
                if len(out) >= MAX_DELIVERY:
                    break
                v = verdict.get(item.id, "release")
                if v in ("skip", "skip-ready") and item.state == "pending":
                    item.state, item.updated_at = "skipped", now
                    item.detail = (f"job {item.job} finished before delivery" if v == "skip" else
                                   f"job {item.job} can start now: it reads the file where it is")
                    item.parent.updated_at = now
                    changed.append(item_view(item))
                    continue
                if v == "hold":
                    continue
                if item.state == "pending":
                    if item.id not in still:
                        continue
                    item.state, item.updated_at = "delivered", now
                    item.parent.updated_at = now
                    changed.append(item_view(item))
                d = {"id": item.id, "action": item.kind or action, "path": item.path}
                if item.job is not None:
                    d.update(manifest_id=item.parent.manifest_id, job=item.job, step=item.step)
                    if (item.detail or "").startswith(RETRY):
                        d["attempt"] = 1
                out.append(d)
        self.publish(changed)
        return out

    def _open_items(self, s: Session, node: str) -> tuple[builtins.list[tuple[ActionItem, str]], dict[int, str], int]:
        """The node's open items in id order, a page at a time, until MAX_DELIVERY are
        deliverable (plan steps held for their job's turn do not block the ones after
        them): (rows not held, the gate's verdict of each plan step, items read)."""
        rows: builtins.list[tuple[ActionItem, str]] = []
        verdict: dict[int, str] = {}
        after_id, seen = 0, 0
        while len(rows) < MAX_DELIVERY:
            page = list(s.execute(select(ActionItem, Action.action).join(Action)
                                  .where(ActionItem.node == node, ActionItem.state.in_(("pending", "delivered")),
                                         ActionItem.id > after_id)
                                  .order_by(ActionItem.id).limit(PAGE)))
            if not page:
                break
            seen += len(page)
            after_id = page[-1][0].id
            plan_items = [item for item, _ in page if item.job is not None]
            v = self.gate(s, plan_items) if (plan_items and self.gate is not None) else {}
            verdict.update(v)
            rows.extend(r for r in page if v.get(r[0].id) != "hold")
        return rows, verdict, seen

    def report(self, node: str, results: builtins.list) -> builtins.list[int]:
        """Take the results a node reports; the ids it may stop reporting."""
        if not results:
            return []
        now = time.time()
        acked, changed, failed, again = [], [], [], set()
        with self.db.session() as s:
            items = {i.id: i for i in s.scalars(select(ActionItem).options(selectinload(ActionItem.parent))
                                                .where(ActionItem.id.in_([r.id for r in results])))}
            for r in results:
                item = items.get(r.id)
                if item is None:
                    acked.append(r.id)  # unknown here (e.g. a database restored from backup): drop it
                    continue
                if item.node != node:
                    continue
                acked.append(r.id)
                if item.state in FINAL:
                    continue
                if (r.state == "failed" and item.job is not None and self.retry is not None
                        and self.retry(s, item, r.detail or "")):
                    item.state, item.tier, item.updated_at = "pending", r.tier, now  # detail set by retry
                    item.parent.updated_at = now
                    changed.append(item_view(item))
                    again.add(node)
                    continue
                item.state, item.detail, item.tier, item.updated_at = r.state, r.detail, r.tier, now
                item.parent.updated_at = now
                changed.append(item_view(item))
                if r.state == "failed":
                    failed.append((item.parent.action, item.path, r.detail))
        for action, path, detail in failed:
            self.events.record("action", f"{action} {path}", "failed", node=node, detail=detail)
        self.publish(changed)
        if again:
            self.wake(again)
        return acked

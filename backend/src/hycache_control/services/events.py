"""The event log: audit entries (who did what) and cluster events (node transitions,
action failures, policies applied).  Inserts are serialised, so ids grow in commit order
and a stream reader resuming after id N misses nothing — across processes too: on
PostgreSQL every insert takes a transaction-level advisory lock first, and announces its
ids on the bus (services/bus.py) so every process's stream sees them at once."""

from __future__ import annotations

import builtins
import threading
import time

from sqlalchemy import func, select, text

from ..db import Database
from ..models import Event
from .bus import EVENTS_LOCK, Bus


class EventService:
    def __init__(self, db: Database, bus: Bus | None = None) -> None:
        self.db = db
        self.bus = bus
        if bus is not None:
            bus.on("e", self._seen)
            bus.on("resync", lambda _: self.resync())
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._plock = threading.Lock()
        with db.session() as s:
            self.last_id: int = s.scalar(select(func.max(Event.id))) or 0

    def record(self, kind: str, action: str, result: str, *, node: str | None = None,
               actor: str | None = None, detail: str | None = None, ts: float | None = None) -> int:
        row = Event(ts=time.time() if ts is None else ts, kind=kind, node=node, actor=actor,
                    action=action[:200], result=result[:200], detail=detail)
        with self._lock:
            with self.db.session() as s:
                self._serialise(s)
                s.add(row)
                s.flush()
                eid = row.id
                if self.bus is not None:
                    self.bus.notify(s, "e", eid)
            self.last_id = max(self.last_id, eid)
        return eid

    def _serialise(self, s) -> None:
        if self.db.dialect == "postgresql":
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": EVENTS_LOCK})

    def _seen(self, eid) -> None:
        """(bus) another process committed event ``eid``"""
        if isinstance(eid, int):
            with self._lock:
                self.last_id = max(self.last_id, eid)

    def resync(self) -> None:
        with self.db.session() as s:
            top = s.scalar(select(func.max(Event.id))) or 0
        self._seen(top)

    def record_later(self, kind: str, action: str, result: str, *, node: str | None = None,
                     actor: str | None = None, detail: str | None = None) -> None:
        """Queue an event for the next ``flush`` (the writer thread's): the hot paths (a
        heartbeat that brings a node up) must not wait for a commit each."""
        row = Event(ts=time.time(), kind=kind, node=node, actor=actor, action=action[:200], result=result[:200],
                    detail=detail)
        with self._plock:
            self._pending.append(row)

    def flush(self) -> None:
        """Insert the queued events in one transaction, in order (ids keep commit order)."""
        with self._plock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            with self._lock:
                with self.db.session() as s:
                    self._serialise(s)
                    s.add_all(batch)
                    s.flush()
                    top = max(e.id for e in batch)
                    if self.bus is not None:
                        self.bus.notify(s, "e", top)
                self.last_id = max(self.last_id, top)
        except Exception:
            with self._plock:
                self._pending[:0] = [Event(ts=e.ts, kind=e.kind, node=e.node, actor=e.actor, action=e.action,
                                           result=e.result, detail=e.detail) for e in batch]
            raise

    def list(self, kind: str | None = None, node: str | None = None, since_id: int | None = None,
             limit: int = 100, offset: int = 0) -> tuple[list[Event], int]:
        q = select(Event)
        if kind:
            q = q.where(Event.kind == kind)
        if node:
            q = q.where(Event.node == node)
        if since_id is not None:
            q = q.where(Event.id > since_id)
        with self.db.session() as s:
            total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = list(s.scalars(q.order_by(Event.id.desc() if since_id is None else Event.id)
                                  .limit(limit).offset(offset)))
        return rows, total

    def after(self, event_id: int, limit: int = 500) -> builtins.list[Event]:
        """Events with an id above ``event_id``, oldest first (the stream's replay)."""
        with self.db.session() as s:
            return list(s.scalars(select(Event).where(Event.id > event_id).order_by(Event.id).limit(limit)))

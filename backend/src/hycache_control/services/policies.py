"""Per-node eviction policy and watermarks: versioned, delivered in the heartbeat answer,
``applied_version`` from the agent's heartbeats."""

from __future__ import annotations

import threading
import time
from typing import Any

from hycache_core.policies import available_policies
from sqlalchemy import select

from ..db import Database
from ..models import Policy
from .bus import Bus
from .errors import Invalid
from .events import EventService


class PolicyService:
    def __init__(self, db: Database, events: EventService, bus: Bus | None = None) -> None:
        self.db = db
        self.events = events
        self.bus = bus
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self.resync()
        if bus is not None:  # another process changed a node's policy row
            bus.on("p", self._reload)
            bus.on("resync", lambda _: self.resync())

    def resync(self) -> None:
        with self.db.session() as s:
            cache = {p.node_id: self._view(p) for p in s.scalars(select(Policy))}
        with self._lock:
            self._cache = cache

    def _reload(self, node_id) -> None:
        if not isinstance(node_id, str):
            return
        with self.db.session() as s:
            row = s.get(Policy, node_id)
            view = self._view(row) if row is not None else None
        with self._lock:
            if view is None:
                self._cache.pop(node_id, None)
            else:
                self._cache[node_id] = view

    @staticmethod
    def _view(p: Policy) -> dict[str, Any]:
        return {"node_id": p.node_id, "policy": p.policy, "high_watermark": p.high_watermark,
                "low_watermark": p.low_watermark, "version": p.version, "applied_version": p.applied_version,
                "updated_at": p.updated_at}

    def get(self, node_id: str, status: dict | None = None) -> dict[str, Any]:
        """The node's control-plane policy; without one, what the agent reports it runs
        (version 0)."""
        with self._lock:
            p = self._cache.get(node_id)
        if p is not None:
            return dict(p)
        wm = (status or {}).get("watermarks") or {}
        return {"node_id": node_id, "policy": (status or {}).get("policy"), "high_watermark": wm.get("high"),
                "low_watermark": wm.get("low"), "version": 0, "applied_version": 0, "updated_at": None}

    def put(self, node_id: str, policy: str, high: float, low: float, actor: str | None) -> dict[str, Any]:
        known = available_policies()
        if policy not in known:
            raise Invalid(("body", "policy"), f"unknown policy {policy!r}; known: {', '.join(known)}")
        now = time.time()
        with self._lock, self.db.session() as s:
            row = s.get(Policy, node_id, with_for_update=True)  # two processes: versions never repeat
            if row is None:
                row = Policy(node_id=node_id, version=0, applied_version=0)
                s.add(row)
            row.policy, row.high_watermark, row.low_watermark = policy, high, low
            row.version += 1
            row.updated_at = now
            s.flush()
            view = self._cache[node_id] = self._view(row)
            if self.bus is not None:
                self.bus.notify(s, "p", node_id)
        self.events.record("policy", "policy set", f"version {view['version']}", node=node_id, actor=actor,
                           detail=f"{policy} high={high} low={low}")
        return dict(view)

    def delivery(self, node_id: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._cache.get(node_id)
        if p is None:
            return None
        return {"version": p["version"], "policy": p["policy"], "high_watermark": p["high_watermark"],
                "low_watermark": p["low_watermark"]}

    def needs_write(self, node_id: str, version: int) -> bool:
        """Would :meth:`applied` write (the node reports a version not yet recorded)?"""
        with self._lock:
            p = self._cache.get(node_id)
            return p is not None and p["applied_version"] != version

    def applied(self, node_id: str, version: int) -> None:
        """The node's heartbeat says it runs ``version`` (cheap when nothing changed)."""
        with self._lock:
            p = self._cache.get(node_id)
            if p is None or p["applied_version"] == version:
                return
        now = time.time()
        with self._lock, self.db.session() as s:
            row = s.get(Policy, node_id)
            if row is None or row.applied_version == version:
                return
            row.applied_version = version
            self._cache[node_id] = self._view(row)
            if self.bus is not None:
                self.bus.notify(s, "p", node_id)
        if version == self._cache[node_id]["version"]:
            self.events.record("policy", "policy applied", f"version {version}", node=node_id, ts=now)

"""The stream's node messages (GET /api/v1/stream): a snapshot of every node's view when a
client connects, then once a period a delta with what changed — for each node whose view
changed, its id and the top-level fields of ``NodeOut`` that differ from the previous
delta; a node new since then comes whole; ``removed`` lists nodes gone (none yet: the
control plane keeps every node it heard).

Built once per period for every client (``NodeFeed.advance``, in a worker thread); a
client that fell behind the deltas kept (``KEEP`` periods) gets a snapshot again.  At
1,000 nodes that beat every second every node changes each second (its heartbeat time,
counters and rates), but a delta carries only those fields; nodes that are quiet
(a long interval, down nodes) cost nothing after the snapshot (docs/scaling.md)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .jsonfast import dumps

#: deltas kept for clients that are a little behind (periods)
KEEP = 30


class NodeFeed:
    """``source()`` yields ``(node_id, change_key, build)`` for the nodes that may have
    changed since the last call: ``build()`` makes its view, called only when
    ``change_key`` differs from the last one (None: always build)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, Any, Callable[[], dict]]]]) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._views: dict[str, dict] = {}
        self._keys: dict[str, Any] = {}
        self._seq = 0
        self._at = float("-inf")
        self._deltas: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=KEEP)
        self._snapshot: tuple[int, bytes] | None = None
        self._dropped = 0  # the newest sequence number whose delta is no longer kept

    def advance(self, max_age: float) -> int:
        """(blocking) Build the next delta unless the last one is younger than ``max_age``;
        the current sequence number."""
        with self._lock:
            now = time.monotonic()
            if now - self._at < max_age:
                return self._seq
            self._at = now
            changed = []
            for node_id, key, build in self.source():
                if key is not None and self._keys.get(node_id) == key:
                    continue
                self._keys[node_id] = key
                v = build()
                old = self._views.get(node_id)
                self._views[node_id] = v
                if old is None:
                    changed.append(v)
                else:
                    d = {k: x for k, x in v.items() if old.get(k) != x}
                    if d:
                        d["id"] = node_id
                        changed.append(d)
            removed: list[str] = []  # (the control plane never forgets a node)
            self._seq += 1
            if changed or removed:
                if len(self._deltas) == KEEP:
                    self._dropped = self._deltas[0][0]
                self._deltas.append((self._seq, b"event: nodes-delta\r\ndata: " + dumps(
                    {"seq": self._seq, "changed": changed, "removed": removed}) + b"\r\n\r\n"))
            return self._seq

    def snapshot(self, max_age: float) -> tuple[int, bytes]:
        """(blocking) ``(seq, the nodes message)``: every node's view as of delta ``seq``
        (a JSON array in id order), encoded once per sequence number."""
        self.advance(max_age)
        with self._lock:
            if self._snapshot is None or self._snapshot[0] != self._seq:
                views = [self._views[k] for k in sorted(self._views)]
                self._snapshot = (self._seq, b"event: nodes\r\ndata: " + dumps(views) + b"\r\n\r\n")
            return self._snapshot

    def after(self, seq: int, max_age: float) -> tuple[int, list[bytes]] | None:
        """(blocking) ``(new seq, the delta messages after seq)``; None when some were
        dropped since (the client needs a snapshot)."""
        cur = self.advance(max_age)
        with self._lock:
            if cur == seq:
                return cur, []
            if seq < self._dropped or seq > cur:  # missed some (or from another process)
                return None
            return cur, [m for s, m in self._deltas if s > seq]

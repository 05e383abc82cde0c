"""Nodes: the DHT registry merged with each node's latest heartbeat, and their states.

States (evaluated at every heartbeat, and by the monitor when a node's deadline passes —
a heap of when each node's heartbeats would be missed or its registry entry ages out —
with every node looked at again each ``FULL_PASS_PERIOD``):

* a node that has sent heartbeats: ``up`` while they arrive (the last one less than
  ``down_after_missed x interval + down_grace`` old, with the interval that node was handed
  in its last answer) and its agent reports its DHT link
  ``ok``/``connecting``; ``degraded`` while they arrive but the agent reports its DHT link
  degraded, or when they stopped but the DHT registry still sees the node alive (it serves
  files but cannot reach us); ``down`` when they stopped and the registry does not see it.
* a node known only from the DHT registry (an agent without a control-plane link):
  ``up`` while its registry entry is fresh, else ``down``.

After a control-plane start every node gets one down window of grace before its old
heartbeat counts as missed (the agents need a beat to notice we are back).

The interval (Nomad's rule): ``max(heartbeat_interval, live nodes / max_heartbeats_per_second)``,
rounded up to 0.1 s, the count following each node's deadline (exact again at each full
pass) and stretched at once by a node that starts beating, handed to each node in its answer;
the node's down window follows the interval it was handed, so a stretched interval never
marks a node down and a shrinking one waits for the node to pick it up.  A heartbeat another
process heard (``merge_shared``) stretches the window to this process's interval: the other
process handed the node the cluster's interval, which this one computes too.
"""

from __future__ import annotations

import copy
import heapq
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ..db import Database
from ..models import Node, table_of
from .accounting import Totals, contribution
from .events import EventService
from .metrics import MetricsQueue, gauges, rates
from .status import dig

log = logging.getLogger(__name__)

#: a node's row (its last heartbeat, counters, state) is written at a state change and at
#: most this often otherwise: the row is what a restarted control plane starts from, not
#: what anyone reads live, so a heartbeat costs no row write.
NODE_ROW_PERIOD = 10.0
#: ... and, for a node on a stretched interval, at most every this many of its intervals
#: (10,000 nodes on 10 s: a row every 3rd heartbeat, not every one)
NODE_ROW_INTERVALS = 3
#: the monitor re-evaluates the nodes whose deadline passed (a heap) each tick, and every
#: node this often (a safety net; the summary's float sums are rebuilt then too)
FULL_PASS_PERIOD = 30.0

NODE_COLUMNS = ("id", "address", "version", "boot_id", "seq", "sent_at", "first_seen", "last_heartbeat",
                "heartbeats", "state", "state_since", "status", "counters", "updated_at")


@dataclass
class LiveNode:
    id: str
    first_seen: float
    state: str = "down"
    state_since: float = 0.0
    address: str | None = None
    version: str | None = None
    boot_id: str | None = None
    seq: int = 0
    sent_at: float | None = None
    last_heartbeat: float | None = None
    heartbeats: int = 0
    status: dict[str, Any] | None = None
    counters: dict[str, Any] | None = None
    rates: dict[str, Any] | None = None
    registry: dict[str, Any] | None = None  # the DHT registry's entry (addr, load, last_beat)
    updated_at: float = 0.0
    persisted: bool = field(default=False, repr=False)
    saved_at: float = field(default=0.0, repr=False)  # when its row last went to the writer
    interval: float | None = field(default=None, repr=False)  # the interval its last answer carried
    beating: bool = field(default=False, repr=False, compare=False)  # counted in the adaptive interval
    contrib: tuple | None = field(default=None, repr=False, compare=False)  # what it adds to the summary

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in NODE_COLUMNS}

    def baseline(self, boot_id: str) -> tuple[dict[str, Any], float] | None:
        """The counters of boot ``boot_id`` last heard and when they were sent, or None
        (another boot, or none heard yet)."""
        if self.boot_id != boot_id or self.counters is None or self.sent_at is None:
            return None
        return self.counters, self.sent_at


class NodeService:
    def __init__(self, db: Database, events: EventService, *, interval: float, down_after_missed: int = 3,
                 down_grace: float = 2.0, max_rate: float = 1000.0, registry_reader=None,
                 writer: MetricsQueue | None = None, leader: Callable[[], bool] | None = None,
                 shared: Callable[[], bool] | None = None) -> None:
        self.db = db
        self.events = events
        self.base_interval = interval
        self.interval = interval  # what new answers carry (adaptive)
        self.down_after_missed = down_after_missed
        self.down_grace = down_grace
        self.max_rate = max_rate
        self._beating = 0
        #: does this process record the cluster's transitions? (its Leader's view, services/bus.py)
        self.leader = leader or (lambda: True)
        #: do other processes take this cluster's heartbeats? (its Bus)
        self.shared = shared or (lambda: False)
        self._beaten: dict[str, float] = {}  # node -> last heartbeat, not yet shared
        self._seen_shared = 0.0
        self.registry_reader = registry_reader  # () -> {node_id: list_nodes entry}; raises if unreachable
        self.started = time.time()
        self.live: dict[str, LiveNode] = {}
        self.changed: set[str] = set()  # nodes whose view may have changed, for the stream (take_changed)
        self.lock = threading.Lock()
        self.heartbeats_received = 0
        self.dht_reachable: bool | None = None
        self.dht_error: str | None = None
        self.writer = writer  # samples and node rows for the metrics writer
        self.totals = Totals()  # the summary over every node, kept as nodes change (_account)
        self._due: list[tuple[float, str]] = []  # (when a node's state may change, node): the monitor's heap
        self._full_at = 0.0
        with db.session() as s:
            for r in s.scalars(select(Node)):
                self.live[r.id] = LiveNode(
                    id=r.id, first_seen=r.first_seen, state=r.state, state_since=r.state_since, address=r.address,
                    version=r.version, boot_id=r.boot_id, seq=r.seq, sent_at=r.sent_at,
                    last_heartbeat=r.last_heartbeat, heartbeats=r.heartbeats, status=r.status, counters=r.counters,
                    updated_at=r.updated_at, persisted=True)
        # the agents that were beating keep the interval they were handed: start from the
        # interval their number implies, so the restart grace covers their next beat
        self.changed = set(self.live)  # the stream's first snapshot has the stored nodes too
        beating = [n for n in self.live.values() if n.last_heartbeat is not None and n.state != "down"]
        self._beating = len(beating)
        self._set_interval()
        for n in beating:
            n.interval = self.interval
            n.beating = True
        for n in self.live.values():
            self._account(n)
            self._schedule(n)

    # -- persistence (called by the metrics writer inside its transaction) ---------------------

    def sink(self, s: Session, rows: list[dict]) -> None:
        t = table_of(Node)  # Core, not the ORM's bulk path
        ins = (postgresql.insert if self.db.dialect == "postgresql" else sqlite.insert)(t)
        stmt = ins.on_conflict_do_update(index_elements=[t.c.id],
                                         set_={c: ins.excluded[c] for c in NODE_COLUMNS if c != "id"})
        s.execute(stmt, rows)

    # -- heartbeats ---------------------------------------------------------------------------

    def adapt_interval(self, now: float) -> float:
        """(lock held) The interval for the number of nodes whose heartbeats arrive now
        (every node counted again; between these passes the count follows each node's
        ``beating``, set at its heartbeat and cleared when its deadline passes)."""
        k = 0
        for n in self.live.values():
            n.beating = self._fresh(n, now)
            k += n.beating
        self._beating = k
        return self._set_interval()

    def _fresh(self, n: LiveNode, now: float) -> bool:
        return n.last_heartbeat is not None and now - n.last_heartbeat <= self.down_after(n)

    def _schedule(self, n: LiveNode, at: float | None = None) -> None:
        """(lock held) Have the monitor look at ``n`` when its heartbeats would be missed
        (or at ``at``)."""
        if at is None:
            if n.last_heartbeat is None:
                return
            at = max(n.last_heartbeat, self.started) + self.down_after(n)
        heapq.heappush(self._due, (at, n.id))

    def _account(self, n: LiveNode) -> None:
        """(lock held) Bring the summary's totals up to date with ``n``."""
        c = contribution(n)
        if c != n.contrib:
            self.totals.add(n.contrib, -1)
            self.totals.add(c)
            n.contrib = c

    def _set_interval(self) -> float:
        self.interval = max(self.base_interval, math.ceil(self._beating / self.max_rate * 10) / 10)
        return self.interval

    def down_after(self, n: LiveNode) -> float:
        return self.down_after_missed * max(n.interval or self.base_interval, self.base_interval) + self.down_grace

    def heartbeat(self, hb, now: float | None = None) -> float:
        """Take one heartbeat (a validated ``schemas.Heartbeat``): rates, state, persistence.
        Returns the interval to hand the node."""
        now = time.time() if now is None else now
        counters = hb.counters.model_dump()
        transition = None
        with self.lock:
            self.heartbeats_received += 1
            n = self.live.get(hb.node_id)
            if n is None:
                n = self.live[hb.node_id] = LiveNode(id=hb.node_id, first_seen=now, state_since=now)
            sample = None
            # a new boot (a node's first heartbeat, or its agent restarted): the row goes out
            # at once, so that the other processes show the boot the node runs now
            new_boot = n.boot_id != hb.boot_id
            restarted = (n.boot_id, hb.boot_id) if new_boot and n.boot_id is not None else None
            baseline = n.baseline(hb.boot_id)
            if not (baseline is not None and hb.seq <= n.seq):  # else: a replayed heartbeat, keep the baseline
                if baseline is not None:
                    r = rates(*baseline, counters, hb.sent_at)
                    if r is not None:
                        sample = {"node_id": n.id, "ts": now, "resolution": 1, **r, **gauges(hb.status)}
                n.counters, n.sent_at, n.seq, n.boot_id = counters, hb.sent_at, hb.seq, hb.boot_id
            n.address = hb.address or n.address
            n.version = hb.version
            n.status = hb.status
            n.last_heartbeat = now
            n.heartbeats += 1
            if sample is not None:
                n.rates = sample
            n.updated_at = now
            if not n.beating:  # counted at once, so a burst of new nodes stretches the interval
                n.beating = True
                self._beating += 1
                self._set_interval()
            n.interval = self.interval
            if self.shared():
                self._beaten[n.id] = now
            transition = self._evaluate(n, now)
            self._account(n)
            self._schedule(n)
            self.changed.add(n.id)
            row = None
            if transition or new_boot or now - n.saved_at >= max(NODE_ROW_PERIOD, NODE_ROW_INTERVALS * n.interval):
                row, n.saved_at = n.row(), now
        if self.writer is not None:
            if sample is not None:
                self.writer.sample(sample)
            if row is not None:
                self.writer.node(row)
        if transition:
            self._announce(*transition)
        if restarted is not None:
            self._restarted(n.id, *restarted)
        return n.interval

    # -- states -------------------------------------------------------------------------------

    def _link_degraded(self, n: LiveNode) -> bool:
        return dig(n.status, "cluster", "state", default=None) == "degraded"

    def _registry_alive(self, n: LiveNode, now: float) -> bool:
        from hycache_dht.registry import NODE_TTL_SECONDS
        return n.registry is not None and now - n.registry["last_beat"] < NODE_TTL_SECONDS

    def state_of(self, n: LiveNode, now: float) -> str:
        if n.last_heartbeat is None:
            return "up" if self._registry_alive(n, now) else "down"
        fresh = now - max(n.last_heartbeat, self.started) <= self.down_after(n)
        if fresh:
            return "degraded" if self._link_degraded(n) else "up"
        return "degraded" if self._registry_alive(n, now) else "down"

    def _evaluate(self, n: LiveNode, now: float) -> tuple[str, str, str] | None:
        """(lock held) Update ``n.state``; the transition (node, old, new) if it changed."""
        new = self.state_of(n, now)
        if new == n.state:
            return None
        old, n.state, n.state_since, n.updated_at = n.state, new, now, now
        self.changed.add(n.id)
        self._account(n)
        return n.id, old, new

    def _restarted(self, node: str, old_boot: str, new_boot: str) -> None:
        """A node's agent runs a new boot: recorded by the process that heard it first (an
        agent back within the down bound never shows as down, so this is its only trace)."""
        try:
            self.events.record_later("node", "restarted", "up", node=node, detail=f"boot {old_boot} -> {new_boot}")
        except Exception as e:
            log.warning("could not record the restart of %s: %s", node, e)

    def _announce(self, node: str, old: str, new: str) -> None:
        if not self.leader():  # several processes: one records the cluster's transitions
            return
        try:
            self.events.record_later("node", f"state {new}", new, node=node, detail=f"{old} -> {new}")
        except Exception as e:
            log.warning("could not record the transition of %s to %s: %s", node, new, e)

    def refresh_registry(self) -> None:
        """Read the DHT registry (blocking); an unreachable DHT leaves the last view, which
        ages out by its own timestamps."""
        if self.registry_reader is None:
            return
        try:
            reg = self.registry_reader()
            self.dht_reachable, self.dht_error = True, None
        except Exception as e:
            self.dht_reachable, self.dht_error = False, str(e)
            return
        from hycache_dht.registry import NODE_TTL_SECONDS
        now = time.time()
        with self.lock:
            for node_id, info in reg.items():
                n = self.live.get(node_id)
                if n is None:
                    n = self.live[node_id] = LiveNode(id=node_id, first_seen=now, state_since=now, updated_at=now)
                if n.registry is None or n.registry.get("last_beat") != info.get("last_beat"):
                    n.registry = {"addr": info.get("addr"), "load": info.get("load"), "last_beat": info["last_beat"]}
                    self.changed.add(node_id)
                    if n.address is None:
                        n.address = info.get("addr")
                    self._schedule(n, now)  # its state now, and when the entry ages out
                    self._schedule(n, float(info["last_beat"]) + NODE_TTL_SECONDS)
                    self._account(n)

    def tick(self, now: float | None = None) -> None:
        """Re-evaluate the states of the nodes whose deadline passed (the monitor calls this
        twice a second): O(nodes due), not O(nodes); every node each ``FULL_PASS_PERIOD``."""
        now = time.time() if now is None else now
        changes = []
        with self.lock:
            if now >= self._full_at:
                self._full_at = now + FULL_PASS_PERIOD
                self.adapt_interval(now)
                self._due = [d for d in self._due if d[0] > now]
                heapq.heapify(self._due)
                due = list(self.live.values())
                self.totals.rebuild_rates(n.contrib for n in due)
            else:
                ids = set()
                while self._due and self._due[0][0] <= now:
                    ids.add(heapq.heappop(self._due)[1])
                due = [self.live[i] for i in ids if i in self.live]
                k = self._beating
                for n in due:
                    fresh = self._fresh(n, now)
                    if fresh != n.beating:
                        n.beating = fresh
                        k += 1 if fresh else -1
                if k != self._beating:
                    self._beating = k
                    self._set_interval()
            for n in due:
                t = self._evaluate(n, now)
                if t:
                    changes.append(t)
                    if n.persisted or n.last_heartbeat is not None:
                        n.saved_at = now
                        if self.writer is not None:
                            self.writer.node(n.row())
        for t in changes:
            self._announce(*t)

    # -- several processes: liveness through the database ----------------------------------

    def share(self) -> None:
        """(writer, after the node rows) Publish the last heartbeat of every node this
        process heard since the last flush: one narrow batched UPDATE."""
        with self.lock:
            beaten, self._beaten = self._beaten, {}
        if not beaten:
            return
        from sqlalchemy import bindparam, update
        t = table_of(Node)
        try:
            with self.db.session() as s:
                s.execute(update(t).where(t.c.id == bindparam("b_id")).where(t.c.last_heartbeat < bindparam("b_lh"))
                          .values(last_heartbeat=bindparam("b_lh")),
                          [{"b_id": k, "b_lh": v} for k, v in beaten.items()])
        except Exception:
            with self.lock:
                for k, v in beaten.items():
                    self._beaten[k] = max(v, self._beaten.get(k, 0.0))
            raise

    def merge_shared(self) -> int:
        """(monitor) Take the heartbeats other processes heard (blocking: one query, and one
        more for the nodes new here or restarted); the number of nodes whose last heartbeat
        moved.  A node's boot (its agent restarted) comes with its row, which the process that
        heard the new boot writes at once: every process then shows the boot the node runs,
        whichever one the node's heartbeats reach (before, a process kept the boot id of the
        last heartbeat it heard itself, and the API's answer depended on which one served it)."""
        if not self.shared():
            return 0
        with self.db.session() as s:
            rows = s.execute(select(Node.id, Node.last_heartbeat, Node.boot_id)
                             .where(Node.last_heartbeat > self._seen_shared - 2.0)).all()
            with self.lock:  # the whole rows of nodes new here or on another boot than here
                wanted = [k for k, _, boot in rows
                          if k not in self.live or (boot is not None and boot != self.live[k].boot_id)]
            full = list(s.scalars(select(Node).where(Node.id.in_(wanted)))) if wanted else []
        moved = 0
        now = time.time()
        with self.lock:
            for n in full:
                known = self.live.get(n.id)
                if known is not None:  # a newer boot than this process heard (the agent's own clock)
                    if n.sent_at is not None and (known.sent_at is None or n.sent_at > known.sent_at):
                        known.boot_id, known.seq, known.sent_at, known.counters = n.boot_id, n.seq, n.sent_at, n.counters
                        known.version, known.status, known.address = n.version, n.status, n.address or known.address
                        self.changed.add(n.id)
                        self._account(known)
                    continue
                # a node only the other processes heard so far
                self.changed.add(n.id)
                ln = self.live[n.id] = LiveNode(
                    id=n.id, first_seen=n.first_seen, state=n.state, state_since=n.state_since, address=n.address,
                    version=n.version, boot_id=n.boot_id, seq=n.seq, sent_at=n.sent_at,
                    last_heartbeat=n.last_heartbeat, heartbeats=n.heartbeats, status=n.status, counters=n.counters,
                    updated_at=n.updated_at, persisted=True, interval=self.interval)
                self._account(ln)
                if self._fresh(ln, now):
                    ln.beating = True
                    self._beating += 1
                self._schedule(ln)
            for node_id, lh, _ in rows:
                if lh is None:  # never: NULL fails the query's comparison
                    continue
                self._seen_shared = max(self._seen_shared, lh)
                live = self.live.get(node_id)
                if live is not None and (live.last_heartbeat is None or lh > live.last_heartbeat):
                    live.last_heartbeat = lh
                    self.changed.add(node_id)
                    # the other process handed the node its interval (both count the same
                    # cluster): the window follows it, never an older, shorter one handed here
                    live.interval = max(live.interval or 0.0, self.interval)
                    if not live.beating and self._fresh(live, now):
                        live.beating = True
                        self._beating += 1
                    self._schedule(live)
                    if live.state != "up":  # back (or still degraded): its state at the next tick
                        self._schedule(live, now)
                    moved += 1
        return moved

    def save_all(self) -> None:
        """Hand every node's row to the writer (at a clean stop)."""
        if self.writer is None:
            return
        now = time.time()
        with self.lock:
            for n in self.live.values():
                if n.persisted or n.last_heartbeat is not None:
                    n.saved_at = now
                    self.writer.node(n.row())

    # -- views --------------------------------------------------------------------------------

    def refs(self) -> list[LiveNode]:
        """Every node, not copied and in no order (a reader that only sums fields: each
        field is replaced whole under the lock, never changed in place)."""
        with self.lock:
            return list(self.live.values())

    def summary(self) -> dict[str, Any]:
        """The summary over every node (accounting.Totals, kept as nodes change): O(1)."""
        with self.lock:
            return self.totals.summary(self.interval)

    def mark_changed(self, node_id: str) -> None:
        with self.lock:
            self.changed.add(node_id)

    def take_changed(self) -> list[LiveNode]:
        """Copies of the nodes marked changed since the last call (the stream's feed)."""
        with self.lock:
            ids, self.changed = self.changed, set()
            return [copy.copy(self.live[i]) for i in sorted(ids) if i in self.live]

    def snapshot(self) -> list[LiveNode]:
        with self.lock:
            return [copy.copy(n) for n in sorted(self.live.values(), key=lambda n: n.id)]

    def get(self, node_id: str) -> LiveNode | None:
        with self.lock:
            n = self.live.get(node_id)
            return copy.copy(n) if n is not None else None

    def known(self, node_id: str) -> bool:
        with self.lock:
            return node_id in self.live

    def is_live(self, node_id: str) -> bool:
        with self.lock:
            n = self.live.get(node_id)
            return n is not None and n.state in ("up", "degraded")

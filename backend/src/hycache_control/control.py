"""The control plane's parts wired together (one per process), and its background threads:
the metrics writer, the monitor (node states, DHT registry, downsampling)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .db import Database
from .jsonfast import dumps
from .nodefeed import NodeFeed
from .services.accounting import summary_point
from .services.actions import ActionService
from .services.bus import Bus, Leader
from .services.cluster_state import ClusterState
from .services.events import EventService
from .services.jobs import JobService
from .services.manifests import ManifestService
from .services.metrics import MetricsQueue, MetricsService, MetricsWriter
from .services.namespace import NamespaceService
from .services.nodes import NodeService
from .services.policies import PolicyService
from .services.release import ReleaseGate
from .services.replan import ReleasePlanner
from .services.slurm import SlurmService
from .services.tokens import TokenService
from .settings import Settings
from .views import SORT_KEYS, node_view

if TYPE_CHECKING:
    from collections.abc import Callable

    from hycache_dht.redis_store import RedisClusterStore

log = logging.getLogger(__name__)

REGISTRY_PERIOD = 2.0
DOWNSAMPLE_PERIOD = 60.0
RESYNC_PERIOD = 5.0
#: a point of the cluster's history (GET /summary/history) this often, kept an hour
HISTORY_PERIOD = 2.0
HISTORY_KEEP = 1800


class Control:
    def __init__(self, settings: Settings, *, migrate: bool = True) -> None:
        self.settings = settings
        self.db = Database(settings.db_url)
        if migrate:
            self.db.upgrade()
        self.tokens = TokenService(self.db, settings.token_cache_seconds)
        # several processes on one PostgreSQL database: what they tell each other, who leads
        self.bus = Bus(self.db)
        self.leader = Leader(self.db)
        self.events = EventService(self.db, self.bus)
        store_factory: Callable[[], RedisClusterStore] | None = None
        if settings.redis_seeds:
            redis_user, redis_password = settings.redis_user, settings.redis_password

            def redis_store() -> RedisClusterStore:
                from hycache_dht.redis_store import RedisClusterStore
                return RedisClusterStore(settings.redis_seeds, namespace=settings.dht_namespace, op_timeout=5.0,
                                         username=redis_user, password=redis_password)
            store_factory = redis_store
        self.namespace = NamespaceService(store_factory)
        rows = MetricsQueue()
        self.nodes = NodeService(self.db, self.events, interval=settings.heartbeat_interval,
                                 down_after_missed=settings.down_after_missed, down_grace=settings.down_grace,
                                 max_rate=settings.max_heartbeats_per_second,
                                 registry_reader=self.namespace.nodes if store_factory else None,
                                 writer=rows, leader=lambda: self.leader.is_leader, shared=self.bus.others)
        self.metrics = MetricsService(self.db, settings.raw_retention_s, settings.minute_retention_s)
        self.writer = MetricsWriter(self.db, settings.flush_interval, self.nodes.sink,
                                    also=[self.events.flush, self.tokens.flush], after=[self.nodes.share], rows=rows)
        self.policies = PolicyService(self.db, self.events, self.bus)
        gate = ReleaseGate()
        self.actions = ActionService(self.db, self.namespace, self.nodes, self.events, self.bus,
                                     gate=gate.gate, retry=gate.retry)
        cluster = ClusterState(self.namespace, self.nodes)
        self.manifests = ManifestService(self.db, cluster, self.actions, self.events, self.bus)
        self.jobs = JobService(self.db, self.actions, ReleasePlanner(self.db, cluster, self.actions))
        self.slurm = SlurmService(self.db, self.manifests, self.jobs, self.actions, self.namespace, self.events)
        self.feed = NodeFeed(self._feed_source)
        self._summary_sse: tuple[float, bytes] | None = None
        self._summary: tuple[float, dict[str, Any]] | None = None
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY_KEEP)
        self._summary_sse_lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="monitor", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        if s.admin_token and self.tokens.ensure(s.admin_token, "configured-admin"):
            log.info("installed the configured admin token (admin_token)")
        if self.tokens.active_admins() == 0:
            log.warning("no admin token yet: create the first one with\n  hycache-control token create --db '%s' "
                        "--scope admin --name admin", s.db_url)
        self.tokens.refresh(force=True)
        self.leader.check()
        self.bus.start()
        self.writer.start()
        self._monitor.start()

    def stop(self) -> None:
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=10)
        self.nodes.save_all()
        self.writer.stop()
        self.bus.stop()
        self.leader.close()
        self.namespace.close()
        self.db.close()

    def _monitor_loop(self) -> None:
        next_registry = next_downsample = next_resync = next_history = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                leader = self.leader.check()
                if now >= next_registry:
                    next_registry = now + REGISTRY_PERIOD
                    self.nodes.refresh_registry()
                self.nodes.merge_shared()  # heartbeats the other processes heard (PostgreSQL)
                self.nodes.tick()
                self.tokens.refresh()
                if self.bus.enabled and now >= next_resync:  # a notification lost in a race costs <= 5 s
                    next_resync = now + RESYNC_PERIOD
                    self.actions.resync()
                if now >= next_history:
                    next_history = now + HISTORY_PERIOD
                    self.history.append(summary_point(self.summary_cached(HISTORY_PERIOD / 2)))
                if leader and now >= next_downsample:
                    next_downsample = now + DOWNSAMPLE_PERIOD
                    self.metrics.downsample()
            except Exception:
                log.exception("monitor tick failed")
            self._stop.wait(0.5)

    # -- node views ---------------------------------------------------------------------------

    def node_views(self) -> list[dict[str, Any]]:
        return [node_view(n, self.policies.get(n.id, n.status)) for n in self.nodes.snapshot()]

    def node_page(self, state: str | None, offset: int, limit: int, *, sort: str = "id", desc: bool = False,
                  q: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """(views of one page of nodes, how many match): filtered by state and by a
        substring of the id, sorted (then by id); only the page's views are built."""
        nodes = self.nodes.snapshot()  # in id order
        if state:
            nodes = [n for n in nodes if n.state == state]
        if q:
            q = q.lower()
            nodes = [n for n in nodes if q in n.id.lower()]
        if sort != "id" or desc:
            key = SORT_KEYS[sort]
            present = [n for n in nodes if key(n) is not None]  # nodes without the value go last either way
            present.sort(key=key, reverse=desc)
            nodes = present + [n for n in nodes if key(n) is None]
        return [node_view(n, self.policies.get(n.id, n.status)) for n in nodes[offset:offset + limit]], len(nodes)

    def summary(self) -> dict[str, Any]:
        """Every node summed: states, capacity and use per tier, throughput, hit ratio."""
        return self.nodes.summary()

    def summary_cached(self, max_age: float) -> dict[str, Any]:
        """:meth:`summary`, computed at most once per ``max_age`` (the stream's clients and
        the history share it)."""
        with self._summary_sse_lock:
            now = time.monotonic()
            if self._summary is None or now - self._summary[0] >= max_age:
                self._summary = (now, self.summary())
            return self._summary[1]

    def summary_sse(self, max_age: float) -> bytes:
        """The stream's ``summary`` message, built once per ``max_age`` for every client."""
        s = self.summary_cached(max_age)
        with self._summary_sse_lock:
            if self._summary_sse is None or self._summary_sse[0] != s["ts"]:
                self._summary_sse = (s["ts"], b"event: summary\r\ndata: " + dumps(s) + b"\r\n\r\n")
            return self._summary_sse[1]

    def summary_history(self, seconds: float) -> dict[str, Any]:
        """The cluster's summary points of the last ``seconds`` (this process's: every
        node, each heard directly or through the other processes)."""
        since = time.time() - seconds
        return {"period": HISTORY_PERIOD, "points": [p for p in list(self.history) if p["ts"] >= since]}

    def _feed_source(self):
        """The stream's nodes (nodefeed.py): the nodes marked changed since the last delta
        (a heartbeat, a state change, a new DHT registry entry, a policy): O(changed), not
        O(nodes), each period."""
        for n in self.nodes.take_changed():
            policy = self.policies.get(n.id, n.status)
            yield n.id, None, lambda n=n, policy=policy: node_view(n, policy)

    def node_view(self, node_id: str) -> dict[str, Any] | None:
        n = self.nodes.get(node_id)
        return None if n is None else node_view(n, self.policies.get(n.id, n.status))

    # -- the heartbeat ------------------------------------------------------------------------

    def heartbeat_in_memory(self, hb) -> bool:
        """True when :meth:`heartbeat` needs no database for ``hb`` (no results to store, no
        policy version to record, nothing pending for the node): the event loop may run it."""
        return not hb.action_results and not self.policies.needs_write(hb.node_id, hb.policy_version) \
            and not self.actions.has_work(hb.node_id)

    def heartbeat(self, hb, *, db: bool = True) -> dict[str, Any]:
        """One agent heartbeat in, what the node must do out (docs/control-plane.md).
        ``db=False`` (on the event loop, after :meth:`heartbeat_in_memory`): touch no
        database; whatever became pending since that check goes out in the next answer."""
        interval = self.nodes.heartbeat(hb)
        if db:
            self.policies.applied(hb.node_id, hb.policy_version)
            acked = self.actions.report(hb.node_id, hb.action_results)
            actions = self.actions.deliver(hb.node_id)
        else:
            acked, actions = [], []
        return {"interval": interval, "policy": self.policies.delivery(hb.node_id),
                "actions": actions, "acked_results": acked, "plans": []}

    # -- readiness ----------------------------------------------------------------------------

    def readiness(self) -> dict[str, str]:
        out = {"database": "ok", "redis": "ok"}
        try:
            self.db.ping()
        except Exception as e:
            out["database"] = f"unreachable: {e}"
        if not self.namespace.configured:
            out["redis"] = "not configured"
        else:
            try:
                if not self.namespace.ping():
                    out["redis"] = "unreachable: no answer"
            except Exception as e:
                out["redis"] = f"unreachable: {getattr(e, 'msg', e)}"
        return out

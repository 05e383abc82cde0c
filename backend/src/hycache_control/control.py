"""The control plane's parts wired together (one per process), and its background threads:
the metrics writer, the monitor (node states, DHT registry, downsampling)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .db import Database
from .services.actions import ActionService
from .services.events import EventService
from .services.manifests import ManifestService
from .services.metrics import MetricsService, MetricsWriter
from .services.namespace import NamespaceService
from .services.nodes import NodeService
from .services.policies import PolicyService
from .services.tokens import TokenService
from .settings import Settings
from .views import node_view

log = logging.getLogger(__name__)

REGISTRY_PERIOD = 2.0
DOWNSAMPLE_PERIOD = 60.0


class Control:
    def __init__(self, settings: Settings, *, migrate: bool = True) -> None:
        self.settings = settings
        self.db = Database(settings.db_url)
        if migrate:
            self.db.upgrade()
        self.tokens = TokenService(self.db, settings.token_cache_seconds)
        self.events = EventService(self.db)
        store_factory = None
        if settings.redis_seeds:
            redis_user, redis_password = settings.redis_user, settings.redis_password

            def store_factory():
                from hycache_dht.redis_store import RedisClusterStore
                return RedisClusterStore(settings.redis_seeds, namespace=settings.dht_namespace, op_timeout=5.0,
                                         username=redis_user, password=redis_password)
        self.namespace = NamespaceService(store_factory)
        self.nodes = NodeService(self.db, self.events, interval=settings.heartbeat_interval,
                                 down_after=settings.down_after,
                                 registry_reader=self.namespace.nodes if store_factory else None)
        self.metrics = MetricsService(self.db, settings.raw_retention_s, settings.minute_retention_s)
        self.writer = MetricsWriter(self.db, settings.flush_interval, self.nodes.sink,
                                    also=[self.events.flush, self.tokens.flush])
        self.nodes.writer = self.writer
        self.policies = PolicyService(self.db, self.events)
        self.actions = ActionService(self.db, self.namespace, self.nodes, self.events)
        self.manifests = ManifestService(self.db, self.namespace, self.nodes, self.actions, self.events)
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
        self.writer.start()
        self._monitor.start()

    def stop(self) -> None:
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=10)
        self.writer.stop()
        self.namespace.close()
        self.db.close()

    def _monitor_loop(self) -> None:
        next_registry = next_downsample = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_registry:
                    next_registry = now + REGISTRY_PERIOD
                    self.nodes.refresh_registry()
                self.nodes.tick()
                if now >= next_downsample:
                    next_downsample = now + DOWNSAMPLE_PERIOD
                    self.metrics.downsample()
            except Exception:
                log.exception("monitor tick failed")
            self._stop.wait(0.5)

    # -- node views ---------------------------------------------------------------------------

    def node_views(self) -> list[dict[str, Any]]:
        return [node_view(n, self.policies.get(n.id, n.status)) for n in self.nodes.snapshot()]

    def node_view(self, node_id: str) -> dict[str, Any] | None:
        n = self.nodes.get(node_id)
        return None if n is None else node_view(n, self.policies.get(n.id, n.status))

    # -- the heartbeat ------------------------------------------------------------------------

    def heartbeat(self, hb) -> dict[str, Any]:
        """One agent heartbeat in, what the node must do out (docs/control-plane.md)."""
        self.nodes.heartbeat(hb)
        self.policies.applied(hb.node_id, hb.policy_version)
        acked = self.actions.report(hb.node_id, hb.action_results)
        return {"interval": self.settings.heartbeat_interval, "policy": self.policies.delivery(hb.node_id),
                "actions": self.actions.deliver(hb.node_id), "acked_results": acked, "plans": []}

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

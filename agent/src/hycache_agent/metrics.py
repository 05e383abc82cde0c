"""Prometheus ``/metrics`` for one agent (prometheus-client's text format).

A custom collector turns one snapshot of the engine's status and counters (taken on the
event loop thread by :func:`render`) into metric families; the text is rendered in a
worker thread.  The peer service answers ``GET /metrics`` with it; an agent without a
peer service (standalone) can serve it on ``--metrics-listen HOST:PORT``
(:class:`MetricsServer`).  Example queries are in docs/agent.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
SCRAPE_MAX_AGE = 5.0  # seconds the file counts may lag behind (the counters never do)
LINK_STATES = ("connecting", "ok", "unreachable", "unauthorized")
DHT_STATES = ("connecting", "ok", "degraded")


class SnapshotCollector:
    """Metric families from one status dict (the agent's status, vfs/status.py)."""

    def __init__(self, status: dict[str, Any], node_id: str | None) -> None:
        self.status = status
        self.node_id = node_id or ""

    def collect(self):
        st = self.status
        yield from _io_families(st["counters"])
        yield from _migration_families(st["migrations"])
        yield from _space_families(st)
        info = InfoMetricFamily("hycache_agent", "The agent's node id and eviction policy")
        info.add_metric([], {"node": self.node_id, "policy": st["policy"]})
        yield info
        yield from _link_families(st.get("cluster"), st.get("control"))
        hc = st.get("hccache")
        if hc:  # the memory cache of remote reads (docs/hccache.md)
            yield from _hccache_families(hc)


def _per_tier(cls, name: str, doc: str, key: str, source: dict[str, Any]):
    fam = cls(name, doc, labels=["tier"])
    for t in ("fast", "slow"):
        fam.add_metric([t], source[t][key])
    return fam


def _io_families(c: dict[str, Any]):
    """The cumulative counters (the heartbeat's ``counters``)."""
    yield _per_tier(CounterMetricFamily, "hycache_read_bytes", "Bytes read by the tier that served them",
                    "read_bytes", c)
    yield _per_tier(CounterMetricFamily, "hycache_write_bytes", "Bytes written to each tier", "write_bytes", c)
    yield _per_tier(CounterMetricFamily, "hycache_kernel_read_bytes",
                    "Bytes the kernel read from each tier's files for passthrough opens (traced; part of "
                    "hycache_read_bytes)", "kernel_read_bytes", c)
    yield _per_tier(CounterMetricFamily, "hycache_grown_bytes",
                    "Bytes files on each tier grew by through passthrough writes, seen at fstat (part of "
                    "hycache_write_bytes)", "grown_bytes", c)
    yield _per_tier(CounterMetricFamily, "hycache_reads", "Read requests served by each tier", "reads", c)
    yield _per_tier(CounterMetricFamily, "hycache_writes", "Write requests to each tier", "writes", c)
    yield _per_tier(CounterMetricFamily, "hycache_tier_opens",
                    "Opens for reading whose bytes were on each tier", "hits", c)
    yield CounterMetricFamily("hycache_hits", "Opens for reading whose bytes were on the fast tier",
                              value=c["fast"]["hits"])
    yield CounterMetricFamily("hycache_misses",
                              "Opens for reading whose bytes were on the slow tier or another node",
                              value=c["misses"])
    yield CounterMetricFamily("hycache_remote_read_bytes", "Bytes read from files held by other nodes",
                              value=c["remote"]["read_bytes"])
    yield CounterMetricFamily("hycache_remote_fetches", "Files fetched from other nodes",
                              value=c["remote"]["fetches"])
    yield CounterMetricFamily("hycache_remote_fetch_bytes", "Bytes fetched from other nodes",
                              value=c["remote"]["fetch_bytes"])
    yield CounterMetricFamily("hycache_metadata_ops", "FUSE metadata operations", value=c["metadata_ops"])
    yield CounterMetricFamily("hycache_migrations", "Migrations between tiers completed", value=c["migrations"])
    yield CounterMetricFamily("hycache_migration_bytes", "Bytes moved by completed migrations",
                              value=c["migration_bytes"])
    yield CounterMetricFamily("hycache_promoted_bytes", "Bytes moved to the fast tier by promotions",
                              value=c["promoted_bytes"])
    yield CounterMetricFamily("hycache_evicted_bytes", "Bytes moved to the slow tier by evictions",
                              value=c["evicted_bytes"])


def _migration_families(mig: dict[str, Any]):
    for key, doc in (("evictions", "Evictions to the slow tier"), ("promotions", "Promotions to the fast tier"),
                     ("promotions_declined", "Promotions on open the admission rule turned down"),
                     ("promotions_for_write", "Opens for writing that waited for their file's promotion"),
                     ("promotions_past_ceiling", "Promotions for a writer past the write ceiling (every "
                      "fast-tier file held open)"),
                     ("evictions_taken_back", "Evictions an open of the file cancelled before its switch"),
                     ("spills", "Files spilled to the slow tier while written"),
                     ("migrations_failed", "Migrations that failed"),
                     ("migrations_abandoned", "Migrations abandoned (file changed or deleted)")):
        name = key if key.startswith("migrations_") else f"migration_{key}"
        yield CounterMetricFamily(f"hycache_{name}", doc, value=mig[key])
    yield GaugeMetricFamily("hycache_migrations_in_flight", "Migrations running now", value=len(mig["active"]))


def _space_families(st: dict[str, Any]):
    """The tiers' room, the watermarks and the agent's gauges."""
    tiers = st["tiers"]
    yield _per_tier(GaugeMetricFamily, "hycache_capacity_bytes", "Bytes of the tier the agent may use",
                    "capacity", tiers)
    yield _per_tier(GaugeMetricFamily, "hycache_device_capacity_bytes", "Size of the tier's file system",
                    "device_capacity", tiers)
    yield _per_tier(GaugeMetricFamily, "hycache_device_free_bytes", "Free bytes of the tier's file system",
                    "device_free", tiers)
    yield _per_tier(GaugeMetricFamily, "hycache_used_bytes", "Bytes of files on the tier", "used", tiers)
    yield _per_tier(GaugeMetricFamily, "hycache_files", "Files on the tier", "files", tiers)
    wm = GaugeMetricFamily("hycache_watermark_ratio", "Eviction watermarks (fraction of capacity)",
                           labels=["mark"])
    wm.add_metric(["high"], st["watermarks"]["high"])
    wm.add_metric(["low"], st["watermarks"]["low"])
    yield wm
    yield GaugeMetricFamily("hycache_policy_version", "Control-plane policy version applied (0: none)",
                            value=st.get("policy_version", 0))
    yield GaugeMetricFamily("hycache_open_handles", "Open file handles", value=st["open_handles"])
    yield GaugeMetricFamily("hycache_uptime_seconds", "Seconds since the agent started",
                            value=st["uptime_seconds"])


def _link_families(cluster: dict[str, Any] | None, control: dict[str, Any] | None):
    """The links to the global namespace and to the control plane."""
    yield GaugeMetricFamily("hycache_dht_backlog", "Metadata changes not yet published to the DHT",
                            value=cluster["backlog"] if cluster else 0)
    if cluster:
        state = GaugeMetricFamily("hycache_dht_state", "Link to the global namespace (1 = current state)",
                                  labels=["state"])
        for s in DHT_STATES:
            state.add_metric([s], 1.0 if cluster["state"] == s else 0.0)
        yield state
    if control:
        state = GaugeMetricFamily("hycache_control_link_state", "Link to the control plane (1 = current state)",
                                  labels=["state"])
        for s in LINK_STATES:
            state.add_metric([s], 1.0 if control["state"] == s else 0.0)
        yield state
        yield CounterMetricFamily("hycache_control_heartbeats", "Heartbeats sent to the control plane",
                                  value=control["heartbeats_sent"])


def _hccache_families(hc: dict[str, Any]):
    yield CounterMetricFamily("hycache_hccache_lookups", "HCCache lookups", value=hc["lookups"])
    yield CounterMetricFamily("hycache_hccache_hits", "HCCache lookups answered from memory", value=hc["hits"])
    yield CounterMetricFamily("hycache_hccache_requested_bytes", "Bytes asked of HCCache",
                              value=hc["bytes_requested"])
    yield CounterMetricFamily("hycache_hccache_hit_bytes", "Bytes HCCache answered from memory",
                              value=hc["bytes_hit"])
    yield CounterMetricFamily("hycache_hccache_evictions", "HCCache entries evicted", value=hc["evictions"])
    yield GaugeMetricFamily("hycache_hccache_memory_bytes", "Bytes HCCache holds", value=hc["memory_bytes"])
    yield GaugeMetricFamily("hycache_hccache_limit_bytes", "HCCache's memory bound", value=hc["limit_bytes"])
    yield GaugeMetricFamily("hycache_hccache_dedup_saved_bytes", "Bytes content addressing saved",
                            value=hc["dedup_saved_bytes"])
    for key, doc in (("abd", "Average block distance (paper 002)"),
                     ("ecdal", "Efficiency of cache data access latency, ECDAL (paper 002)"),
                     ("ecdab", "Efficiency of cache data access bandwidth, ECDAB (paper 002)")):
        if hc.get(key) is not None:
            yield GaugeMetricFamily(f"hycache_hccache_{key}", doc, value=hc[key])


def render_snapshot(status: dict[str, Any], node_id: str | None) -> bytes:
    """(any thread) The exposition text of one status snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(status, node_id))
    return generate_latest(registry)


async def render(status: Callable[[float], Awaitable[dict[str, Any]]], node_id: str | None) -> bytes:
    """The agent's metrics: the snapshot of ``await status(max_age)`` (the agent's
    status, hycache_agent.vfs.status) on the loop thread, the text in a worker thread."""
    snapshot = await status(SCRAPE_MAX_AGE)
    if node_id is None:
        import socket

        node_id = socket.gethostname()
    return await trio.to_thread.run_sync(render_snapshot, snapshot, node_id)


class MetricsServer:
    """A minimal HTTP/1.1 server for ``GET /metrics`` only (standalone agents)."""

    def __init__(self, status: Callable[[float], Awaitable[dict[str, Any]]], node_id: str | None) -> None:
        self.status = status
        self.node_id = node_id
        self.address: tuple[str, int] | None = None

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.address = listeners[0].socket.getsockname()[:2]
        log.info("metrics on http://%s:%d/metrics", *self.address)
        task_status.started(self.address)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16 << 10)
        try:
            while True:
                event = ev = None
                with trio.move_on_after(30):  # idle or stalled clients are dropped
                    event = await self._next(conn, stream)
                    ev = event
                    while isinstance(ev, (h11.Request, h11.Data)):  # skip any request body
                        ev = await self._next(conn, stream)
                if not isinstance(event, h11.Request) or not isinstance(ev, h11.EndOfMessage):
                    return
                path = event.target.partition(b"?")[0]
                if event.method not in (b"GET", b"HEAD"):
                    status, body, ctype = 405, b"method not allowed\n", "text/plain"
                elif path != b"/metrics":
                    status, body, ctype = 404, b"not found: try /metrics\n", "text/plain"
                else:
                    status, body, ctype = 200, await render(self.status, self.node_id), CONTENT_TYPE
                head = h11.Response(status_code=status, headers=[("content-type", ctype),
                                                                  ("content-length", str(len(body)))])
                out = conn.send(head)
                if event.method != b"HEAD":
                    out += conn.send(h11.Data(data=body))
                out += conn.send(h11.EndOfMessage())
                await stream.send_all(out)
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _next(conn: h11.Connection, stream: trio.SocketStream):
        while (event := conn.next_event()) is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        return event

"""GET /metrics: cluster-wide gauges for Prometheus (prometheus-client), computed from the
live node states at scrape time (labels: node, tier, state; never a path)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .control import Control
from .loopwatch import LoopWatch


class ClusterCollector(Collector):
    def __init__(self, control: Control, watch: LoopWatch | None = None) -> None:
        self.control = control
        self.watch = watch

    def collect(self):
        c = self.control
        views = c.node_views()
        yield from _node_metrics(views)
        hb = CounterMetricFamily("hycache_control_heartbeats_received", "heartbeats received by this process")
        hb.add_metric([], c.nodes.heartbeats_received)
        yield hb
        dht = GaugeMetricFamily("hycache_control_dht_reachable", "1 when the DHT (Redis Cluster) answered last time")
        dht.add_metric([], 1.0 if c.nodes.dht_reachable else 0.0)
        yield dht
        ev = GaugeMetricFamily("hycache_control_last_event_id", "id of the newest event")
        ev.add_metric([], c.events.last_id)
        yield ev
        if self.watch is not None:
            yield from _loop_metrics(self.watch)


def _node_metrics(views: list[dict]):
    """The nodes by state, and each node's gauges (its tiers, hit ratio, rates, DHT
    backlog, heartbeat age)."""
    states = GaugeMetricFamily("hycache_nodes", "nodes by state", labels=["state"])
    counts = {"up": 0, "degraded": 0, "down": 0}
    for v in views:
        counts[v["state"]] += 1
    for st, k in counts.items():
        states.add_metric([st], k)
    yield states
    up = GaugeMetricFamily("hycache_node_up", "1 when the node is up, 0.5 degraded, 0 down", labels=["node"])
    used = GaugeMetricFamily("hycache_node_tier_used_bytes", "bytes used per tier", labels=["node", "tier"])
    cap = GaugeMetricFamily("hycache_node_tier_capacity_bytes", "usable capacity per tier", labels=["node", "tier"])
    files = GaugeMetricFamily("hycache_node_tier_files", "files per tier", labels=["node", "tier"])
    hr = GaugeMetricFamily("hycache_node_hit_ratio", "fast-tier hit ratio of the last interval", labels=["node"])
    rd = GaugeMetricFamily("hycache_node_read_bytes_per_second", "read throughput", labels=["node", "tier"])
    wr = GaugeMetricFamily("hycache_node_write_bytes_per_second", "write throughput", labels=["node", "tier"])
    backlog = GaugeMetricFamily("hycache_node_dht_backlog", "metadata updates not yet in the DHT", labels=["node"])
    hbage = GaugeMetricFamily("hycache_node_heartbeat_age_seconds", "seconds since the last heartbeat",
                              labels=["node"])
    now = time.time()
    for v in views:
        node = v["id"]
        up.add_metric([node], {"up": 1.0, "degraded": 0.5, "down": 0.0}[v["state"]])
        for tier, t in (v.get("tiers") or {}).items():
            if t.get("used") is not None:
                used.add_metric([node, tier], t["used"])
            if t.get("capacity") is not None:
                cap.add_metric([node, tier], t["capacity"])
            if t.get("files") is not None:
                files.add_metric([node, tier], t["files"])
        if v.get("hit_ratio") is not None:
            hr.add_metric([node], v["hit_ratio"])
        r = v.get("rates") or {}
        for tier in ("fast", "slow", "remote"):
            if f"{tier}_read_bps" in r:
                rd.add_metric([node, tier], r[f"{tier}_read_bps"])
            if f"{tier}_write_bps" in r:
                wr.add_metric([node, tier], r[f"{tier}_write_bps"])
        if v["dht"].get("backlog") is not None:
            backlog.add_metric([node], v["dht"]["backlog"])
        if v.get("last_heartbeat"):
            hbage.add_metric([node], max(0.0, now - v["last_heartbeat"]))
    yield from (up, used, cap, files, hr, rd, wr, backlog, hbage)


def _loop_metrics(w: LoopWatch):
    """The event loop's lag and stalls, and the garbage collector's pauses (loopwatch.py)."""
    lag = HistogramMetricFamily("hycache_control_loop_lag_seconds",
                                "how late the event loop ran a task due every 10 ms (loopwatch.py)")
    lag.add_metric([], w.lag.cumulative(), w.lag.total)
    yield lag
    mx = GaugeMetricFamily("hycache_control_loop_lag_max_seconds", "the largest loop lag since the start")
    mx.add_metric([], w.lag.max)
    yield mx
    st = CounterMetricFamily("hycache_control_loop_stalls", "loop lags above 20 ms by cause: busy (the "
                             "process used >= half a core meanwhile) or starved (it waited for a CPU)",
                             labels=["cause"])
    for cause, k in w.stalls.items():
        st.add_metric([cause], k)
    yield st
    gcp = HistogramMetricFamily("hycache_control_gc_pause_seconds", "garbage collections by generation",
                                labels=["generation"])
    for g, h in w.gc.items():
        gcp.add_metric([str(g)], h.cumulative(), h.total)
    yield gcp


def make_registry(control: Control, watch: LoopWatch | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ClusterCollector(control, watch))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)

"""A node as the API shows it (``NodeOut``), built from the live state.

The views are JSON-ready and conform to ``schemas.NodeOut`` as built (whatever an agent put
in its status: numbers are coerced, anything else becomes null), so the routes serialise
them directly: validating 1,000 views through pydantic on every read cost more than the
heartbeats themselves (docs/scaling.md).  ``tests/control/test_scale.py`` holds the
conformance."""

from __future__ import annotations

from typing import Any

from .services.metrics import _get
from .services.nodes import LiveNode


def _int(x: Any) -> int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return None
    return int(x)


def _float(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return None
    return float(x)


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _dict(x: Any) -> dict | None:
    return x if isinstance(x, dict) else None


def tier_view(status: dict | None, tier: str) -> dict[str, Any]:
    t = _dict(_get(status, "tiers", tier, default={})) or {}
    wm = _dict(_get(status, "watermarks", default={})) or {}
    cap = _int(t.get("capacity"))
    # the agent reports the capacity it may use; the device's size is capacity for the
    # slow tier and used + free for the fast one when the agent does not report it
    device_capacity = _int(t.get("device_capacity"))
    device_free = _int(t.get("device_free"))
    if device_capacity is None and device_free is not None:
        device_capacity = cap if tier == "slow" else None
    out = {"capacity": cap, "device_capacity": device_capacity, "device_free": device_free,
           "used": _int(t.get("used")), "files": _int(t.get("files")), "high_watermark_bytes": None,
           "low_watermark_bytes": None}
    if tier == "fast" and cap is not None:
        if _float(wm.get("high")) is not None:
            out["high_watermark_bytes"] = int(wm["high"] * cap)
        if _float(wm.get("low")) is not None:
            out["low_watermark_bytes"] = int(wm["low"] * cap)
    return out


def node_view(n: LiveNode, policy: dict[str, Any]) -> dict[str, Any]:
    st = _dict(n.status)
    cluster = _dict(_get(st, "cluster", default=None))
    mig = _dict(_get(st, "migrations", default={})) or {}
    reg = n.registry
    active = []
    for m in mig.get("active", []) if isinstance(mig.get("active"), list) else []:
        if isinstance(m, dict):
            active.append({"path": _str(m.get("path")), "from": _str(m.get("from") or m.get("src")),
                           "to": _str(m.get("to") or m.get("dst")), "copied": _int(m.get("copied")),
                           "total": _int(m.get("total"))})
    rates = None
    if n.rates is not None:
        rates = {k: v for k, v in n.rates.items() if k not in ("node_id", "resolution")}
    return {
        "id": n.id, "address": n.address, "state": n.state, "state_since": n.state_since, "version": n.version,
        "boot_id": n.boot_id, "last_heartbeat": n.last_heartbeat, "heartbeats": n.heartbeats,
        "dht": {"state": _str(cluster.get("state")) if cluster else None,
                "backlog": _int(cluster.get("backlog")) if cluster else None,
                "registry_alive": None if reg is None else _alive(reg),
                "registry_age": None if reg is None else _age(reg)},
        "policy": {"policy": _str(policy.get("policy")), "high_watermark": _float(policy.get("high_watermark")),
                   "low_watermark": _float(policy.get("low_watermark")), "version": _int(policy.get("version")) or 0,
                   "applied_version": _int(policy.get("applied_version")) or 0},
        "tiers": {t: tier_view(st, t) for t in ("fast", "slow")} if st else {},
        "hit_ratio": rates.get("hit_ratio") if rates else None,
        "rates": rates,
        "counters": n.counters,
        "hccache": _dict(_get(st, "hccache", default=None)) if st else None,
        "passthrough": _dict(_get(st, "passthrough", default=None)) if st else None,
        "migrations": {"active": active, "done": _int(mig.get("migrations_done")) or 0,
                       "bytes": (_int(mig.get("bytes_promoted")) or 0) + (_int(mig.get("bytes_demoted")) or 0)},
        "updated_at": n.updated_at,
    }


def _age(reg: dict) -> float:
    import time
    return round(time.time() - reg["last_beat"], 1)


def _alive(reg: dict) -> bool:
    from hycache_dht.registry import NODE_TTL_SECONDS
    return _age(reg) < NODE_TTL_SECONDS


def _num(x: Any) -> float:
    v = _float(x)
    return 0.0 if v is None else v


def _used(tier: str):
    def key(n: LiveNode) -> int | None:
        return _int(_get(n.status, "tiers", tier, "used", default=None)) if isinstance(n.status, dict) else None
    return key


#: the sort keys of GET /nodes (None: no value, listed last)
SORT_KEYS = {
    "id": lambda n: n.id,
    "state": lambda n: n.state,
    "last_heartbeat": lambda n: n.last_heartbeat,
    "heartbeats": lambda n: n.heartbeats,
    "fast_used": _used("fast"),
    "slow_used": _used("slow"),
    "hit_ratio": lambda n: _float((n.rates or {}).get("hit_ratio")),
}

SUMMED_RATES = ("fast_read_bps", "fast_write_bps", "slow_read_bps", "slow_write_bps", "remote_read_bps",
                "metadata_ops_per_s", "migration_bps", "hits", "misses")


def summarise(nodes: list[LiveNode], interval: float) -> dict[str, Any]:
    """GET /nodes/summary (and the stream's ``summary``): counts by state, tiers and rates
    summed over every node (a down node's last sample does not count toward the rates)."""
    import time
    states = {"up": 0, "degraded": 0, "down": 0}
    tiers = {t: {"capacity": 0, "used": 0, "files": 0} for t in ("fast", "slow")}
    rates = dict.fromkeys(SUMMED_RATES, 0.0)
    for n in nodes:
        states[n.state] = states.get(n.state, 0) + 1
        st = _dict(n.status)
        if st is not None:
            for t in tiers:
                tv = _dict(_get(st, "tiers", t, default=None)) or {}
                for f in ("capacity", "used", "files"):
                    tiers[t][f] += _int(tv.get(f)) or 0
        if n.rates and n.state != "down":
            for f in SUMMED_RATES:
                rates[f] += _num(n.rates.get(f))
    total = rates["hits"] + rates["misses"]
    return {"nodes": len(nodes), **states, "interval": interval, "tiers": tiers, "rates": rates,
            "hit_ratio": rates["hits"] / total if total > 0 else None, "ts": time.time()}


def summary_point(s: dict[str, Any]) -> dict[str, Any]:
    """A point of GET /summary/history (``SummaryPoint``) from a summary (``summarise``)."""
    r, t = s["rates"], s["tiers"]

    def pct(tier: str) -> float | None:
        cap = t[tier]["capacity"]
        return round(100.0 * t[tier]["used"] / cap, 3) if cap > 0 else None
    return {"ts": s["ts"], "nodes": s["nodes"], "up": s["up"], "degraded": s["degraded"], "down": s["down"],
            "fast_capacity": t["fast"]["capacity"], "fast_used": t["fast"]["used"], "fast_used_pct": pct("fast"),
            "slow_capacity": t["slow"]["capacity"], "slow_used": t["slow"]["used"], "slow_used_pct": pct("slow"),
            "read_bps": r["fast_read_bps"] + r["slow_read_bps"], "write_bps": r["fast_write_bps"] + r["slow_write_bps"],
            "remote_read_bps": r["remote_read_bps"], "hit_ratio": s["hit_ratio"]}

"""A node as the API shows it (``NodeOut``), built from the live state."""

from __future__ import annotations

from typing import Any

from .services.metrics import _get
from .services.nodes import LiveNode


def tier_view(status: dict | None, tier: str) -> dict[str, Any]:
    t = _get(status, "tiers", tier, default={}) or {}
    wm = _get(status, "watermarks", default={}) or {}
    cap = t.get("capacity")
    # the agent reports the capacity it may use; the device's size is capacity for the
    # slow tier and used + free for the fast one when the agent does not report it
    device_capacity = t.get("device_capacity")
    if device_capacity is None and t.get("device_free") is not None:
        device_capacity = cap if tier == "slow" else None
    out = {"capacity": cap, "device_capacity": device_capacity, "device_free": t.get("device_free"),
           "used": t.get("used"), "files": t.get("files"), "high_watermark_bytes": None, "low_watermark_bytes": None}
    if tier == "fast" and cap is not None:
        if wm.get("high") is not None:
            out["high_watermark_bytes"] = int(wm["high"] * cap)
        if wm.get("low") is not None:
            out["low_watermark_bytes"] = int(wm["low"] * cap)
    return out


def node_view(n: LiveNode, policy: dict[str, Any]) -> dict[str, Any]:
    st = n.status
    cluster = _get(st, "cluster", default=None)
    mig = _get(st, "migrations", default={}) or {}
    reg = n.registry
    active = []
    for m in mig.get("active", []) or []:
        if isinstance(m, dict):
            active.append({"path": m.get("path"), "from": m.get("from") or m.get("src"),
                           "to": m.get("to") or m.get("dst"), "copied": m.get("copied"), "total": m.get("total")})
    rates = None
    if n.rates is not None:
        rates = {k: v for k, v in n.rates.items() if k not in ("node_id", "resolution")}
    return {
        "id": n.id, "address": n.address, "state": n.state, "state_since": n.state_since, "version": n.version,
        "boot_id": n.boot_id, "last_heartbeat": n.last_heartbeat, "heartbeats": n.heartbeats,
        "dht": {"state": cluster.get("state") if isinstance(cluster, dict) else None,
                "backlog": cluster.get("backlog") if isinstance(cluster, dict) else None,
                "registry_alive": None if reg is None else _alive(reg),
                "registry_age": None if reg is None else _age(reg)},
        "policy": {k: policy.get(k) for k in ("policy", "high_watermark", "low_watermark", "version",
                                               "applied_version")},
        "tiers": {t: tier_view(st, t) for t in ("fast", "slow")} if st else {},
        "hit_ratio": rates.get("hit_ratio") if rates else None,
        "rates": rates,
        "counters": n.counters,
        "hccache": _get(st, "hccache", default=None) if st else None,
        "passthrough": _get(st, "passthrough", default=None) if st else None,
        "migrations": {"active": active, "done": int(mig.get("migrations_done", 0) or 0),
                       "bytes": int(mig.get("bytes_promoted", 0) or 0) + int(mig.get("bytes_demoted", 0) or 0)},
        "updated_at": n.updated_at,
    }


def _age(reg: dict) -> float:
    import time
    return round(time.time() - reg["last_beat"], 1)


def _alive(reg: dict) -> bool:
    from hycache_dht.registry import NODE_TTL_SECONDS
    return _age(reg) < NODE_TTL_SECONDS

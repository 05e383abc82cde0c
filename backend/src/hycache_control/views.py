"""A node as the API shows it (``NodeOut``), built from the live state.

The views are JSON-ready and conform to ``schemas.NodeOut`` as built (whatever an agent put
in its status: numbers are coerced, anything else becomes null), so the routes serialise
them directly: validating 1,000 views through pydantic on every read cost more than the
heartbeats themselves (docs/scaling.md).  ``tests/control/test_scale.py`` holds the
conformance."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .services.accounting import counting_mode, tiering_ints, tiering_view
from .services.status import as_dict, as_float, as_int, as_str, dig

if TYPE_CHECKING:
    from .services.nodes import LiveNode


def tier_view(status: dict | None, tier: str) -> dict[str, Any]:
    t = as_dict(dig(status, "tiers", tier, default={})) or {}
    wm = as_dict(dig(status, "watermarks", default={})) or {}
    cap = as_int(t.get("capacity"))
    # the agent reports the capacity it may use; the device's size is capacity for the
    # slow tier and used + free for the fast one when the agent does not report it
    device_capacity = as_int(t.get("device_capacity"))
    device_free = as_int(t.get("device_free"))
    if device_capacity is None and device_free is not None:
        device_capacity = cap if tier == "slow" else None
    out = {"capacity": cap, "device_capacity": device_capacity, "device_free": device_free,
           "used": as_int(t.get("used")), "files": as_int(t.get("files")), "high_watermark_bytes": None,
           "low_watermark_bytes": None, "write_ceiling": None, "remote_cache_bytes": None}
    if tier == "fast":
        out["write_ceiling"] = as_int(t.get("write_ceiling"))
        out["remote_cache_bytes"] = as_int(t.get("remote_cache_bytes"))
    if tier == "fast" and cap is not None:
        if as_float(wm.get("high")) is not None:
            out["high_watermark_bytes"] = int(wm["high"] * cap)
        if as_float(wm.get("low")) is not None:
            out["low_watermark_bytes"] = int(wm["low"] * cap)
    return out


def node_view(n: LiveNode, policy: dict[str, Any]) -> dict[str, Any]:
    st = as_dict(n.status)
    cluster = as_dict(dig(st, "cluster", default=None))
    mig = as_dict(dig(st, "migrations", default={})) or {}
    reg = n.registry
    active = []
    for m in mig.get("active", []) if isinstance(mig.get("active"), list) else []:
        if isinstance(m, dict):
            active.append({"path": as_str(m.get("path")), "from": as_str(m.get("from") or m.get("src")),
                           "to": as_str(m.get("to") or m.get("dst")), "copied": as_int(m.get("copied")),
                           "total": as_int(m.get("total"))})
    rates = None
    if n.rates is not None:
        rates = {k: v for k, v in n.rates.items() if k not in ("node_id", "resolution")}
    return {
        "id": n.id, "address": n.address, "state": n.state, "state_since": n.state_since, "version": n.version,
        "boot_id": n.boot_id, "last_heartbeat": n.last_heartbeat, "heartbeats": n.heartbeats,
        "dht": {"state": as_str(cluster.get("state")) if cluster else None,
                "backlog": as_int(cluster.get("backlog")) if cluster else None,
                "registry_alive": None if reg is None else _alive(reg),
                "registry_age": None if reg is None else _age(reg)},
        "policy": {"policy": as_str(policy.get("policy")), "high_watermark": as_float(policy.get("high_watermark")),
                   "low_watermark": as_float(policy.get("low_watermark")), "version": as_int(policy.get("version")) or 0,
                   "applied_version": as_int(policy.get("applied_version")) or 0},
        "tiers": {t: tier_view(st, t) for t in ("fast", "slow")} if st else {},
        "hit_ratio": rates.get("hit_ratio") if rates else None,
        "rates": rates,
        "counters": n.counters,
        "tiering": tiering_view(tiering_ints(n.counters), {counting_mode(n.counters): 1}),
        "hccache": as_dict(dig(st, "hccache", default=None)) if st else None,
        "passthrough": as_dict(dig(st, "passthrough", default=None)) if st else None,
        "migrations": migrations_view(mig, active),
        "copies_kept": copies_kept_view(cluster),
        "updated_at": n.updated_at,
    }


#: MigrationsView's counts, by the agent's ``migrations`` key of each
MIGRATION_COUNTS = {"done": "migrations_done", "evictions": "evictions", "promotions": "promotions",
                    "evictions_taken_back": "evictions_taken_back", "promotions_declined": "promotions_declined",
                    "spills": "spills", "failed": "migrations_failed", "abandoned": "migrations_abandoned"}


def migrations_view(mig: dict[str, Any], active: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: as_int(mig.get(src)) or 0 for k, src in MIGRATION_COUNTS.items()}
    out["active"] = active
    out["bytes"] = (as_int(mig.get("bytes_promoted")) or 0) + (as_int(mig.get("bytes_demoted")) or 0)
    return out


def copies_kept_view(cluster: dict[str, Any] | None) -> dict[str, int] | None:
    """The cluster link's ``copies_kept`` (null: standalone, or an agent without them)."""
    kept = as_dict(cluster.get("copies_kept")) if cluster else None
    if kept is None:
        return None
    return {k: as_int(kept.get(k)) or 0 for k in ("files", "bytes", "adopted")}


def _age(reg: dict) -> float:
    return round(time.time() - reg["last_beat"], 1)


def _alive(reg: dict) -> bool:
    from hycache_dht.registry import NODE_TTL_SECONDS
    return _age(reg) < NODE_TTL_SECONDS


def _used(tier: str):
    def key(n: LiveNode) -> int | None:
        return as_int(dig(n.status, "tiers", tier, "used", default=None)) if isinstance(n.status, dict) else None
    return key


#: the sort keys of GET /nodes (None: no value, listed last)
SORT_KEYS = {
    "id": lambda n: n.id,
    "state": lambda n: n.state,
    "last_heartbeat": lambda n: n.last_heartbeat,
    "heartbeats": lambda n: n.heartbeats,
    "fast_used": _used("fast"),
    "slow_used": _used("slow"),
    "hit_ratio": lambda n: as_float((n.rates or {}).get("hit_ratio")),
}

"""A node as the API shows it (``NodeOut``), built from the live state.

The views are JSON-ready and conform to ``schemas.NodeOut`` as built (whatever an agent put
in its status: numbers are coerced, anything else becomes null), so the routes serialise
them directly: validating 1,000 views through pydantic on every read cost more than the
heartbeats themselves (docs/scaling.md).  ``tests/control/test_scale.py`` holds the
conformance."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .services.metrics import _get

if TYPE_CHECKING:  # (services/nodes.py keeps its summary with contribution and Totals)
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


TIERS = ("fast", "slow")
TIER_FIELDS = ("capacity", "used", "files")
STATES = ("up", "degraded", "down")


def contribution(n: LiveNode) -> tuple[str, tuple[int, ...], tuple[float, ...] | None]:
    """What one node adds to the summary: its state, its tiers' capacity, use and files
    (``TIERS`` x ``TIER_FIELDS``), and its rates (``SUMMED_RATES``; None for a down node or
    one without a sample: a down node's last sample does not count)."""
    st = _dict(n.status)
    tiers = []
    for t in TIERS:
        tv = (_dict(_get(st, "tiers", t, default=None)) or {}) if st is not None else {}
        tiers.extend(_int(tv.get(f)) or 0 for f in TIER_FIELDS)
    rates = tuple(_num(n.rates.get(f)) for f in SUMMED_RATES) if n.rates and n.state != "down" else None
    return n.state, tuple(tiers), rates


class Totals:
    """The summary's sums over every node, kept by adding and taking away each node's
    :func:`contribution` when it changes (NodeService): reading the summary costs nothing
    per node.  Integers are exact; the rates' float sums are rebuilt from scratch now and
    then by the owner (:func:`summarise` is the same fold over a list)."""

    __slots__ = ("nodes", "states", "tiers", "rates", "rated")

    def __init__(self) -> None:
        self.nodes = 0
        self.states = dict.fromkeys(STATES, 0)
        self.tiers = [0] * (len(TIERS) * len(TIER_FIELDS))
        self.rates = [0.0] * len(SUMMED_RATES)
        self.rated = 0  # nodes whose rates count

    def add(self, c: tuple | None, sign: int = 1) -> None:
        if c is None:
            return
        state, tiers, rates = c
        self.nodes += sign
        self.states[state] = self.states.get(state, 0) + sign
        for i, v in enumerate(tiers):
            self.tiers[i] += sign * v
        if rates is not None:
            self.rated += sign
            if self.rated == 0:  # nothing counts: no float residue of the additions and removals
                self.rates = [0.0] * len(SUMMED_RATES)
            else:
                for i, v in enumerate(rates):
                    self.rates[i] += sign * v

    def rebuild_rates(self, contribs) -> None:
        """The rates' sums again from every node's contribution (no float residue)."""
        rates = [0.0] * len(SUMMED_RATES)
        rated = 0
        for c in contribs:
            if c is not None and c[2] is not None:
                rated += 1
                for i, v in enumerate(c[2]):
                    rates[i] += v
        self.rates, self.rated = rates, rated

    def summary(self, interval: float) -> dict[str, Any]:
        k = len(TIER_FIELDS)
        tiers = {t: dict(zip(TIER_FIELDS, self.tiers[j * k:(j + 1) * k], strict=True)) for j, t in enumerate(TIERS)}
        # every contribution is >= 0, so a negative sum is only the float residue of adding
        # and taking away (e.g. -3.6e-12 B/s once a node's rate went back to 0)
        rates = {f: max(0.0, v) for f, v in zip(SUMMED_RATES, self.rates, strict=True)}
        total = rates["hits"] + rates["misses"]
        states = {s: self.states.get(s, 0) for s in STATES}
        return {"nodes": self.nodes, **states, "interval": interval, "tiers": tiers, "rates": rates,
                "hit_ratio": rates["hits"] / total if total > 0 else None, "ts": time.time()}


def summarise(nodes: list[LiveNode], interval: float) -> dict[str, Any]:
    """GET /nodes/summary (and the stream's ``summary``): counts by state, tiers and rates
    summed over every node (a down node's last sample does not count toward the rates)."""
    t = Totals()
    for n in nodes:
        t.add(contribution(n))
    return t.summary(interval)


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

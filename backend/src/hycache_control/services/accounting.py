"""The cluster's summary (GET /nodes/summary, the stream's ``summary``, the history's
points): what each node adds to it (:func:`contribution`) and the sums over every node
(:class:`Totals`, kept by NodeService as nodes change)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .status import as_dict, as_int, as_num, dig

if TYPE_CHECKING:
    from .nodes import LiveNode

SUMMED_RATES = ("fast_read_bps", "fast_write_bps", "slow_read_bps", "slow_write_bps", "remote_read_bps",
                "metadata_ops_per_s", "migration_bps", "hits", "misses")


TIERS = ("fast", "slow")
TIER_FIELDS = ("capacity", "used", "files")
STATES = ("up", "degraded", "down")
#: what each node's cumulative counters (of its current boot) add to ``tiering``: (field
#: of the view, path in the heartbeat's counters)
TIERING_FIELDS = (
    ("hits", ("fast", "hits")), ("misses", ("misses",)),
    ("fast_read_bytes", ("fast", "read_bytes")), ("slow_read_bytes", ("slow", "read_bytes")),
    ("remote_read_bytes", ("remote", "read_bytes")),
    ("fast_write_bytes", ("fast", "write_bytes")), ("slow_write_bytes", ("slow", "write_bytes")),
    ("fast_kernel_read_bytes", ("fast", "kernel_read_bytes")), ("slow_kernel_read_bytes", ("slow", "kernel_read_bytes")),
    ("fast_grown_bytes", ("fast", "grown_bytes")), ("slow_grown_bytes", ("slow", "grown_bytes")),
    ("promoted_bytes", ("promoted_bytes",)), ("evicted_bytes", ("evicted_bytes",)),
    ("kernel_read_events_lost", ("counting", "kernel_reads", "lost_events")),
)


def counting_mode(counters: dict | None) -> str:
    """How a node's byte counts were made: "agent" (passthrough off: the agent served
    every byte), "traced" (passthrough on, the kernel's reads traced), "untraced"
    (passthrough on, its reads not counted), "unknown" (an agent that does not say)."""
    c = as_dict(dig(counters, "counting", default=None))
    if c is None:
        return "unknown"
    if not c.get("passthrough"):
        return "agent"
    return "traced" if c.get("reads") == "traced" else "untraced"


def tiering_ints(counters: dict | None) -> tuple[int, ...]:
    return tuple(max(0, as_int(dig(counters, *path)) or 0) for _f, path in TIERING_FIELDS)


def tiering_view(ints: tuple[int, ...] | list[int], modes: dict[str, int]) -> dict[str, Any]:
    """``TieringView``: cumulative sums (since each agent started) and how they were counted
    (``modes``: nodes per :func:`counting_mode`)."""
    v: dict[str, Any] = {f: n for (f, _p), n in zip(TIERING_FIELDS, ints, strict=True)}
    opens = v["hits"] + v["misses"]
    v["hit_ratio"] = v["hits"] / opens if opens > 0 else None
    v["counting"] = {m: n for m, n in sorted(modes.items()) if n > 0}
    return v


def contribution(n: LiveNode) -> tuple[str, tuple[int, ...], tuple[float, ...] | None, tuple[int, ...], str]:
    """What one node adds to the summary: its state, its tiers' capacity, use and files
    (``TIERS`` x ``TIER_FIELDS``), its rates (``SUMMED_RATES``; None for a down node or
    one without a sample: a down node's last sample does not count), its cumulative
    tiering counters (``TIERING_FIELDS``) and how they were counted."""
    st = as_dict(n.status)
    tiers: list[int] = []
    for t in TIERS:
        tv = (as_dict(dig(st, "tiers", t, default=None)) or {}) if st is not None else {}
        tiers.extend(as_int(tv.get(f)) or 0 for f in TIER_FIELDS)
    rates = tuple(as_num(n.rates.get(f)) for f in SUMMED_RATES) if n.rates and n.state != "down" else None
    return n.state, tuple(tiers), rates, tiering_ints(n.counters), counting_mode(n.counters)


class Totals:
    """The summary's sums over every node, kept by adding and taking away each node's
    :func:`contribution` when it changes (NodeService): reading the summary costs nothing
    per node.  Integers are exact; the rates' float sums are rebuilt from scratch now and
    then by the owner (:func:`summarise` is the same fold over a list)."""

    __slots__ = ("nodes", "states", "tiers", "rates", "rated", "tiering", "modes")

    def __init__(self) -> None:
        self.nodes = 0
        self.states = dict.fromkeys(STATES, 0)
        self.tiers = [0] * (len(TIERS) * len(TIER_FIELDS))
        self.rates = [0.0] * len(SUMMED_RATES)
        self.rated = 0  # nodes whose rates count
        self.tiering = [0] * len(TIERING_FIELDS)
        self.modes: dict[str, int] = {}

    def add(self, c: tuple | None, sign: int = 1) -> None:
        if c is None:
            return
        state, tiers, rates, tiering, mode = c
        self.nodes += sign
        self.states[state] = self.states.get(state, 0) + sign
        for i, v in enumerate(tiers):
            self.tiers[i] += sign * v
        for i, v in enumerate(tiering):
            self.tiering[i] += sign * v
        self.modes[mode] = self.modes.get(mode, 0) + sign
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
                "hit_ratio": rates["hits"] / total if total > 0 else None, "ts": time.time(),
                "tiering": tiering_view(self.tiering, self.modes)}


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
            "remote_read_bps": r["remote_read_bps"], "hit_ratio": s["hit_ratio"],
            "fast_read_bps": r["fast_read_bps"], "slow_read_bps": r["slow_read_bps"],
            "migration_bps": r["migration_bps"]}

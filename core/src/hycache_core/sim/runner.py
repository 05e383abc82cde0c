"""Run policies over a trace and collect comparable results.

Policy names: the online policies registered in the ``hycache.policies`` entry-point
group (``lru``, ``lfu``, ``gdsf``, ``arc``, plug-ins) see only the past; the planned
ones see the whole trace as the future:

An online policy admits a read miss as the agent does (``SimOptions.admission``
``"agent"``: :meth:`~hycache_core.policies.OnlinePolicy.admits`) or, with ``"all"``, as
the papers' Algorithm 1 (every miss that fits): see :class:`OnlineStrategy`.

* ``heuristic`` — Algorithms 4–5 (:mod:`hycache_core.policies.heuristic`);
* ``belady`` — Belady's furthest-next-use rule with bypass (MIN for equal sizes);
* ``optimal`` — the offline reference: the best schedule (fewest slow-tier bytes
  read) found among Belady, the rounded fractional optimum, the heuristic, and — on
  small instances — the exact ILP, together with a lower bound on the slow-tier bytes any policy must read
  (:mod:`hycache_core.policies.offline`).  With files of one size, or when the ILP
  is solved, the reference is exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from ..policies import available_policies, load_policy
from ..policies.heuristic import HeuristicPolicy
from ..policies.offline import fractional_bound, ilp_size, next_reads, solve_ilp
from .driver import CacheDriver, CostModel, RunResult, Stats, Strategy
from .strategies import BeladyStrategy, HeuristicStrategy, OnlineStrategy, ScheduleStrategy
from .trace import Trace

PLANNED = ("heuristic", "belady", "optimal")

ProgressFactory = Callable[[str, int], Callable[[int], None] | None]


@dataclass
class SimOptions:
    fallback: str = "lru"          # the heuristic's online fallback (unused on traces)
    ilp_max_intervals: int = 3000   # solve the exact ILP up to this many variables
    ilp_time_limit: float = 20.0    # seconds
    record: bool = False            # keep each driver's admit/evict event log
    # the online policies' admission of a read miss: "agent" (the agent's promotion on
    # open: OnlinePolicy.admits) or "all" (the papers' Algorithm 1: every miss that fits)
    admission: str = "agent"
    # the files' usage before the trace, key -> (hits, last access): see OnlineStrategy
    usage: Mapping[Hashable, tuple[int, int]] | None = None


@dataclass
class Simulation:
    trace: Trace
    capacity: int
    model: CostModel = field(default_factory=CostModel)
    results: dict[str, RunResult] = field(default_factory=dict)

    def as_json(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        opt = self.results.get("optimal")
        for name, r in self.results.items():
            d: dict[str, object] = dict(r.stats.as_dict(self.model))
            d["wall_seconds"] = r.seconds
            if opt is not None and name != "optimal":
                d["slow_bytes_read_vs_optimal"] = _ratio(r.stats.slow_bytes_read, opt.stats.slow_bytes_read)
                d["modelled_seconds_vs_optimal"] = _ratio(
                    r.stats.modelled_seconds(self.model), opt.stats.modelled_seconds(self.model)
                )
            d.update(r.extra)
            out[name] = d
        return out


def _ratio(a: float, b: float) -> float | None:
    if b == 0:
        return None if a else 1.0
    return a / b


def known_policies() -> list[str]:
    return sorted(set(available_policies()) | set(PLANNED))


def _run(driver: CacheDriver, trace: Trace, strategy: Strategy, progress: Callable[[int], None] | None) -> Stats:
    return driver.run(trace.keys, trace.sizes, trace.writes, strategy, progress)


def simulate(
    trace: Trace,
    capacity: int,
    policies: Sequence[str],
    model: CostModel | None = None,
    options: SimOptions | None = None,
    progress: ProgressFactory | None = None,
) -> Simulation:
    """Replay ``trace`` once per policy through a fresh :class:`CacheDriver`."""
    model = model or CostModel()
    options = options or SimOptions()
    unknown = [p for p in policies if p not in PLANNED and p not in available_policies()]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; available: {', '.join(known_policies())}")
    sim = Simulation(trace, capacity, model)
    nxt: list[int] | None = None

    def tick(name: str) -> Callable[[int], None] | None:
        return progress(name, len(trace)) if progress else None

    def driver() -> CacheDriver:
        return CacheDriver(capacity, trace.pinned, record=options.record)

    # The optimum reuses the heuristic's and Belady's runs: run them first.
    order = sorted(policies, key=lambda p: (p == "optimal", p not in ("heuristic", "belady")))
    for name in order:
        if name in sim.results:
            continue
        t0 = time.perf_counter()
        if name == "optimal":
            nxt = nxt or next_reads(trace.keys, trace.sizes, trace.writes)
            sim.results[name] = _optimal(trace, capacity, nxt, sim, options, tick, driver)
            sim.results[name].seconds = time.perf_counter() - t0
            continue
        d = driver()
        if name == "heuristic":
            policy = HeuristicPolicy(trace.keys, fallback=load_policy(options.fallback, capacity=capacity))
            _run(d, trace, HeuristicStrategy(d, policy), tick(name))
        elif name == "belady":
            nxt = nxt or next_reads(trace.keys, trace.sizes, trace.writes)
            _run(d, trace, BeladyStrategy(d, nxt), tick(name))
        else:
            online = load_policy(name, capacity=capacity)
            strategy = OnlineStrategy(d, online, options.admission, options.usage)
            _run(d, trace, strategy, tick(name))
            sim.results[name] = _result(name, d, time.perf_counter() - t0,
                                        {"admission": options.admission, "declined": strategy.declined})
            continue
        sim.results[name] = _result(name, d, time.perf_counter() - t0)
    sim.results = {p: sim.results[p] for p in dict.fromkeys(policies)}
    return sim


def _result(name: str, d: CacheDriver, seconds: float, extra: dict[str, object] | None = None) -> RunResult:
    r = RunResult(name, d.stats, seconds, dict(extra or {}))
    if d.events is not None:
        r.extra["events"] = d.events
    return r


def _optimal(
    trace: Trace,
    capacity: int,
    nxt: list[int],
    sim: Simulation,
    options: SimOptions,
    tick: Callable[[str], Callable[[int], None] | None],
    new_driver: Callable[[], CacheDriver],
) -> RunResult:
    """The best offline schedule found, and how good any schedule could be."""
    bound = fractional_bound(trace.keys, trace.sizes, nxt, capacity)
    read_bytes = sum(s for s, w in zip(trace.sizes, trace.writes) if not w)
    lower = read_bytes - int(bound.read_hit_bytes)  # no policy reads fewer slow bytes
    candidates: dict[str, RunResult] = {}

    if "belady" in sim.results:
        candidates["belady"] = sim.results["belady"]
    else:
        d = new_driver()
        _run(d, trace, BeladyStrategy(d, nxt), tick("optimal"))
        candidates["belady"] = _result("belady", d, 0.0)
    if "heuristic" in sim.results:
        candidates["heuristic"] = sim.results["heuristic"]
    else:
        d = new_driver()
        policy = HeuristicPolicy(trace.keys, fallback=load_policy(options.fallback, capacity=capacity))
        _run(d, trace, HeuristicStrategy(d, policy), None)
        candidates["heuristic"] = _result("heuristic", d, 0.0)
    if not trace.pinned:
        d = new_driver()
        _run(d, trace, ScheduleStrategy(d, bound.whole), None)
        candidates["rounded-fractional"] = _result("rounded-fractional", d, 0.0)

    extra: dict[str, object] = {}
    ilp_vars = ilp_size(trace.sizes, nxt, capacity)
    if trace.pinned:
        extra["ilp"] = "skipped: pinned files"
    elif ilp_vars > options.ilp_max_intervals:
        extra["ilp"] = f"skipped: {ilp_vars} intervals > {options.ilp_max_intervals}"
    else:
        res = solve_ilp(trace.sizes, nxt, capacity, "bytes", options.ilp_time_limit)
        extra["ilp"] = f"{res.status} ({res.intervals} intervals, {res.rows} rows, {res.seconds:.2f} s)"
        if res.keep is not None:
            d = new_driver()
            _run(d, trace, ScheduleStrategy(d, res.keep), None)
            candidates["ilp"] = _result("ilp", d, 0.0)
        if res.status == "optimal":
            lower = read_bytes - int(round(res.objective))
        elif res.status == "time-limit" and math.isfinite(res.bound):
            lower = max(lower, read_bytes - math.ceil(res.bound))

    best_name = min(
        candidates,
        key=lambda c: (candidates[c].stats.slow_bytes_read, candidates[c].stats.modelled_seconds(sim.model)),
    )
    best = candidates[best_name]
    extra.update(
        {
            "method": best_name,
            "exact": best.stats.slow_bytes_read == lower,
            "bound_slow_bytes_read": lower,
            "candidates_slow_bytes_read": {c: v.stats.slow_bytes_read for c, v in candidates.items()},
        }
    )
    if "events" in best.extra:
        extra["events"] = best.extra["events"]
    return RunResult("optimal", best.stats, 0.0, extra)

"""The cost/gain heuristic (Algorithms 4–5 of 000_…, 2–3 of 003_…)."""

from __future__ import annotations

import pytest
from hycache_core.policies import LRUPolicy, plan_heuristic
from hycache_core.policies.heuristic import BYPASS, HIT, HeuristicPolicy
from hycache_core.sim import CacheDriver, Trace
from hycache_core.sim.strategies import HeuristicStrategy
from hypothesis import given, settings
from hypothesis import strategies as st

# The papers' worked example: R = F1 F2 F3 F4 F3 F1 F2 F4 F3, sizes 20/40/9/40, C = 100.
PAPER_REFS = ["F1", "F2", "F3", "F4", "F3", "F1", "F2", "F4", "F3"]
PAPER_SIZES = {"F1": 20, "F2": 40, "F3": 9, "F4": 40}


class View:
    def __init__(self, capacity: int, used: int = 0, pinned: frozenset = frozenset()) -> None:
        self.capacity, self.used, self.pinned = capacity, used, pinned

    def is_pinned(self, key):
        return key in self.pinned


def run_heuristic(refs, sizes, capacity, pinned=()):
    trace = Trace.from_refs([(f, sizes[f]) for f in refs])
    driver = CacheDriver(capacity, {trace._index[p] for p in pinned}, record=True)
    policy = HeuristicPolicy(trace.keys)
    driver.run(trace.keys, trace.sizes, trace.writes, HeuristicStrategy(driver, policy))
    names = trace.names
    return [(kind, pos, names[k]) for kind, pos, k in driver.events], driver


def test_paper_example_costs_and_gain():
    """At r4 the cache holds F1, F2, F3: Cost(F1)=20, Cost(F2)=40, Cost(F3)=18, gain of F4 = 40."""
    policy = HeuristicPolicy(PAPER_REFS)
    view = View(100)
    for f in PAPER_REFS[:3]:
        d = policy.access(f, PAPER_SIZES[f], view)
        assert d.admit and not d.victims  # Rule 1: fetched while there is room
        view.used += PAPER_SIZES[f]
    assert {f: policy.cost(f) for f in ("F1", "F2", "F3")} == {"F1": 20, "F2": 40, "F3": 18}
    assert [k for k, _ in policy.cost_order()] == ["F3", "F1", "F2"]  # Rule 3's order
    assert policy.remaining("F4") == 2
    gain = PAPER_SIZES["F4"] * (policy.remaining("F4") - 1)
    assert gain == 40
    assert policy.files_to_discard(40, gain, view) == ["F3"]


def test_paper_example_evicts_f3_and_fetches_f4():
    events, driver = run_heuristic(PAPER_REFS, PAPER_SIZES, 100)
    assert events[:5] == [
        ("admit", 0, "F1"),
        ("admit", 1, "F2"),
        ("admit", 2, "F3"),
        ("evict", 3, "F3"),
        ("admit", 3, "F4"),
    ]
    # Afterwards: F3 (gain 9 × 1) cannot displace F1 (cost 20) -> bypass; the last F3
    # is never referenced again -> never cached.  F1, F2, F4 hit.
    assert events[5:] == []
    assert driver.stats.hits == 3
    assert driver.resident == {0: 20, 1: 40, 3: 40}


def test_plan_heuristic_paper_example():
    steps = plan_heuristic([(f, PAPER_SIZES[f]) for f in PAPER_REFS], 100)
    assert [(s.action, s.evict) for s in steps[:4]] == [("fetch", ()), ("fetch", ()), ("fetch", ()), ("fetch", ("F3",))]
    assert [s.action for s in steps[4:]] == ["bypass", "hit", "hit", "hit", "bypass"]


def test_rule2_rejects_when_cost_reaches_gain():
    # A (size 50) referenced 3 more times fills the cache; B (size 60) is referenced
    # once more: gain 60 <= cost of A (50 × 2 = 100) -> B is not cached.
    events, _ = run_heuristic(["A", "B", "A", "B", "A"], {"A": 50, "B": 60}, 100)
    assert events == [("admit", 0, "A")]


def test_cost_equal_to_gain_is_rejected():
    # "if cost < gain" is strict: cost 40 (A: 40 × 1) vs gain 40 (B: 40 × 1).
    policy = HeuristicPolicy(["A", "B", "A", "B"])
    view = View(60)
    assert policy.access("A", 40, view).admit
    view.used = 40
    assert policy.access("B", 40, view) is BYPASS


def test_never_caches_a_file_without_future_reference():
    policy = HeuristicPolicy(["A", "B", "A"])
    view = View(1000)
    assert policy.access("A", 10, view).admit
    view.used = 10
    assert policy.access("B", 10, view) is BYPASS  # room to spare, but no future use
    assert policy.access("A", 10, view) is HIT


def test_file_larger_than_cache_is_not_cached():
    policy = HeuristicPolicy(["A", "A"])
    assert policy.access("A", 101, View(100)) is BYPASS


def test_tie_break_larger_first_then_least_recent():
    # C, B, A all cost 10: A (size 10, 1 ref), B (size 5, 2 refs), C (size 5, 2 refs).
    refs = ["B", "C", "A", "B", "C", "A", "B", "C", "D", "D"]
    policy = HeuristicPolicy(refs)
    view = View(1000)
    for f, s in zip(refs[:6], [5, 5, 10, 5, 5, 10]):
        policy.access(f, s, view)
    assert [(k, c) for k, c in policy.cost_order()] == [("A", 0), ("B", 5), ("C", 5)]
    policy2 = HeuristicPolicy(["B", "C", "A", "A", "B", "B", "C", "C"])
    for f, s in [("B", 5), ("C", 5), ("A", 10)]:
        policy2.access(f, s, view)
    # costs: A = 10 × 1, B = 5 × 2, C = 5 × 2: A is larger -> first; then B (older) before C.
    assert [k for k, _ in policy2.cost_order()] == ["A", "B", "C"]


def test_pinned_files_are_skipped():
    policy = HeuristicPolicy(["A", "B", "C", "C", "A", "B"])
    view = View(20, pinned=frozenset({"A"}))
    for f in ("A", "B"):
        policy.access(f, 10, view)
        view.used += 10
    # C (gain 10 × 1) must evict B (cost 10) - not strictly less -> bypass; A is pinned
    # and would never be considered even though its cost is equal.
    d = policy.access("C", 10, view)
    assert d is BYPASS
    policy3 = HeuristicPolicy(["A", "B", "C", "C", "C", "A", "B"])
    view3 = View(20, pinned=frozenset({"A"}))
    for f in ("A", "B"):
        assert policy3.access(f, 10, view3).admit
        view3.used += 10
    d = policy3.access("C", 10, view3)  # gain 20 > cost(B) = 10; A (older, same cost) is pinned
    assert d.admit and d.victims == ("B",)


# -- unplanned accesses: the online fallback ------------------------------------------


def test_unplanned_access_uses_fallback_and_spares_planned_files():
    policy = HeuristicPolicy(["P", "P"], fallback=LRUPolicy())
    view = View(30)
    assert policy.access("P", 10, view).admit  # planned, referenced again
    view.used = 10
    for k in ("u1", "u2"):  # unplanned: cached by the fallback while there is room
        assert policy.access(k, 10, view).admit
        view.used += 10
    d = policy.access("u3", 10, view)
    assert d.admit and d.victims == ("u1",)  # LRU among unplanned files; P is needed again
    d = policy.access("u4", 25, view)  # would need P's room too -> refused
    assert d is BYPASS
    assert "P" in policy


def test_planned_fetch_evicts_unplanned_files_first():
    policy = HeuristicPolicy(["P", "Q", "Q"])
    view = View(20)
    assert policy.access("u", 10, view).admit
    view.used = 10
    assert policy.access("P", 10, view) is BYPASS  # P not referenced again
    d = policy.access("Q", 20, view)  # gain 20 > cost of u (0)
    assert d.admit and d.victims == ("u",)


def test_plan_extends_the_future():
    policy = HeuristicPolicy(["A"])
    view = View(100)
    assert policy.access("A", 10, view) is BYPASS
    policy.plan(["A", "A"])
    assert policy.access("A", 10, view).admit


# -- the implementation matches a literal transcription of the algorithms --------------


def literal_algorithms_4_5(refs: list[tuple[str, int]], capacity: int) -> list[tuple[str, int, str]]:
    """Algorithms 4-5 as printed: occurrence counts by scanning the reference string, a
    full sort of the cached files at every decision (O(m·n log n) — a test oracle)."""
    cache: dict[str, int] = {}
    last: dict[str, int] = {}
    events = []
    for i, (f, size) in enumerate(refs):  # the fetch position j = i; "current" = i - 1
        if f in cache:
            last[f] = i
            continue
        future = [g for g, _ in refs[i + 1 :]]
        if f not in future:  # Algorithm 4 line 2
            continue
        used = sum(cache.values())
        if used + size <= capacity:  # Algorithm 5 lines 2-4
            victims, ok = [], True
        elif size > capacity:
            victims, ok = [], False
        else:
            gain = future.count(f) * size  # lines 5-6
            count = {F: [g for g, _ in refs[i:]].count(F) for F in cache}  # line 11
            order = sorted(cache, key=lambda F: (cache[F] * count[F], -cache[F], last[F]))  # line 9
            cost, victims, ok = 0, [], False
            for F in order:  # lines 10-22
                cost += cache[F] * count[F]
                if cost < gain:
                    victims.append(F)
                else:
                    victims = []
                    break
                if used - sum(cache[v] for v in victims) + size <= capacity:
                    ok = True
                    break
        if ok:
            for v in victims:
                del cache[v]
                events.append(("evict", i, v))
            cache[f] = size
            last[f] = i
            events.append(("admit", i, f))
    return events


@st.composite
def small_workloads(draw):
    n_files = draw(st.integers(1, 7))
    sizes = {f"f{i}": draw(st.integers(1, 60)) for i in range(n_files)}
    refs = draw(st.lists(st.sampled_from(sorted(sizes)), min_size=1, max_size=40))
    capacity = draw(st.integers(1, 150))
    return refs, sizes, capacity


@settings(max_examples=300, deadline=None)
@given(small_workloads())
def test_matches_literal_transcription(workload):
    refs, sizes, capacity = workload
    events, _ = run_heuristic(refs, sizes, capacity)
    assert events == literal_algorithms_4_5([(f, sizes[f]) for f in refs], capacity)


@pytest.mark.parametrize("capacity", [50, 100, 150])
def test_plan_and_driver_agree(capacity):
    refs = PAPER_REFS * 3 + ["F5", "F1", "F5"]
    sizes = {**PAPER_SIZES, "F5": 70}
    events, _ = run_heuristic(refs, sizes, capacity)
    steps = plan_heuristic([(f, sizes[f]) for f in refs], capacity)
    from_plan = []
    for s in steps:
        if s.action == "fetch":
            from_plan += [("evict", s.position, v) for v in s.evict] + [("admit", s.position, s.key)]
    assert from_plan == events

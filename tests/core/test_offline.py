"""Offline references: next-use, the fractional bound, the ILP, Belady."""

from __future__ import annotations

import itertools

from hycache_core.policies.offline import effective_capacity, fractional_bound, next_reads, solve_ilp
from hycache_core.sim import Trace, simulate
from hypothesis import given, settings
from hypothesis import strategies as st


def test_next_reads_stop_at_writes_and_new_versions():
    #          0    1    2    3    4    5
    keys = [1, 2, 1, 1, 2, 1]
    sizes = [5, 7, 5, 5, 8, 5]
    writes = [0, 0, 0, 1, 0, 0]
    n = len(keys)
    # 0 -> 2 (read, same size); 2 -> 3 is a write: no interval; 3 (write) -> 5 read.
    # 1 -> 4 has a different size: a new version, no interval.
    assert next_reads(keys, sizes, writes) == [2, n, n, 5, n, n]


def brute_force_optimum(sizes, nxt, capacity):
    """Max bytes served from cache over every subset of intervals (tiny inputs only)."""
    n = len(nxt)
    intervals = [i for i in range(n) if nxt[i] < n and sizes[i] <= capacity]
    best = 0
    for r in range(len(intervals) + 1):
        for chosen in itertools.combinations(intervals, r):
            ok = all(sum(sizes[i] for i in chosen if i <= t < nxt[i]) <= capacity for t in range(n))
            if ok:
                best = max(best, sum(sizes[i] for i in chosen))
    return best


@st.composite
def tiny(draw, max_refs=12):
    n_files = draw(st.integers(1, 5))
    fsize = [draw(st.integers(1, 40)) for _ in range(n_files)]
    keys = draw(st.lists(st.integers(0, n_files - 1), min_size=1, max_size=max_refs))
    capacity = draw(st.integers(1, 80))
    return keys, [fsize[k] for k in keys], capacity


@settings(max_examples=80, deadline=None)
@given(tiny())
def test_ilp_is_exact_and_fractional_bound_is_above_it(case):
    keys, sizes, capacity = case
    nxt = next_reads(keys, sizes, [0] * len(keys))
    best = brute_force_optimum(sizes, nxt, capacity)
    res = solve_ilp(sizes, nxt, capacity)
    assert res.status == "optimal"
    assert res.objective == best
    # the ILP's schedule is feasible and worth what it claims
    kept = [i for i in range(len(keys)) if res.keep[i]]
    assert sum(sizes[i] for i in kept) == best
    for t in range(len(keys)):
        assert sum(sizes[i] for i in kept if i <= t < nxt[i]) <= capacity
    bound = fractional_bound(keys, sizes, nxt, capacity)
    assert bound.read_hit_bytes >= best
    # the intervals the greedy kept whole are a feasible schedule too
    whole = [i for i in range(len(keys)) if bound.whole[i] and nxt[i] < len(keys)]
    for t in range(len(keys)):
        assert sum(sizes[i] for i in whole if i <= t < nxt[i]) <= capacity


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 5))
def test_equal_sizes_belady_is_exact(keys, slots):
    """With one file size, Belady (MIN) = the fractional bound = the ILP optimum."""
    size = 10
    capacity = slots * size + 3  # the +3 must not help: the bound rounds it away
    trace = Trace.from_refs([(f"f{k}", size) for k in keys])
    sim = simulate(trace, capacity, ["belady", "optimal"])
    belady = sim.results["belady"].stats
    opt = sim.results["optimal"]
    assert opt.extra["exact"] is True
    assert belady.slow_bytes_read == opt.extra["bound_slow_bytes_read"]
    nxt = next_reads(trace.keys, trace.sizes, trace.writes)
    assert effective_capacity(trace.sizes, nxt, capacity) in (slots * size, capacity)
    res = solve_ilp(trace.sizes, nxt, capacity)
    assert belady.read_bytes - belady.slow_bytes_read == res.objective


def test_fractional_bound_can_beat_every_integral_schedule():
    # Two 60-byte files alternating in a 100-byte cache: integrally only one fits
    # (hits 60 per round), fractionally 100 bytes of the pair stay.
    keys = [0, 1] * 4
    sizes = [60] * 8
    sizes[1::2] = [61] * 4
    nxt = next_reads(keys, sizes, [0] * 8)
    bound = fractional_bound(keys, sizes, nxt, 100)
    ilp = solve_ilp(sizes, nxt, 100)
    assert ilp.status == "optimal"
    assert bound.read_hit_bytes > ilp.objective

"""Online policies: the OnlinePolicy contract for every registered policy, and each
policy's own ordering."""

from __future__ import annotations

import pytest
from hycache_core.policies import (
    ARCPolicy,
    GDSFPolicy,
    LFUPolicy,
    LRUPolicy,
    OnlinePolicy,
    available_policies,
    load_policy,
)
from hycache_core.policies._heap import iter_sorted
from hycache_core.policies.gdsf import fetch_time_cost
from hypothesis import given, settings
from hypothesis import strategies as st

ONLINE = available_policies()


def test_registered_online_policies():
    assert {"lru", "lfu", "gdsf", "arc"} <= set(ONLINE)
    for name in ONLINE:
        policy = load_policy(name)
        assert isinstance(policy, OnlinePolicy)
        assert policy.name == name


def test_load_policy_passes_only_accepted_options():
    arc = load_policy("arc", capacity=1000)
    assert isinstance(arc, ARCPolicy) and arc._c == 1000
    assert isinstance(load_policy("lru", capacity=1000), LRUPolicy)  # ignored, no error
    with pytest.raises(ValueError, match="unknown policy"):
        load_policy("nope")


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "touch", "remove", "evict"]), st.integers(0, 12), st.integers(0, 50)),
    max_size=80,
)


@pytest.mark.parametrize("name", ONLINE)
@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_contract(name, ops):
    """eviction_order yields every resident key exactly once; contains/len/hits agree."""
    policy = load_policy(name)
    resident: set[int] = set()
    for op, key, size in ops:
        if op == "admit":
            policy.will_admit(key, size)
            policy.admit(key, size)
            resident.add(key)
        elif op == "touch":
            policy.touch(key, size)
            resident.add(key)
        elif op == "remove":
            policy.remove(key)
            resident.discard(key)
        elif resident:  # evict the first victim, as a driver would
            victim = next(policy.eviction_order())
            policy.remove(victim)
            resident.discard(victim)
        order = list(policy.eviction_order())
        assert sorted(order) == sorted(resident)
        assert len(policy) == len(resident)
        for k in range(13):
            assert (k in policy) == (k in resident)
        assert all(policy.hits(k) >= 1 for k in resident)


def test_lru_order():
    p = LRUPolicy()
    for k in "abc":
        p.admit(k, 1)
    p.touch("a", 1)
    assert list(p.eviction_order()) == ["b", "c", "a"]


def test_lfu_order_and_tie_break():
    p = LFUPolicy()
    for k in "abcd":
        p.admit(k, 1)
    p.touch("a", 1)
    p.touch("a", 1)
    p.touch("c", 1)
    p.touch("b", 1)
    # d: 1 hit; c, b: 2 hits (c touched before b, so c is older); a: 3 hits.
    assert list(p.eviction_order()) == ["d", "c", "b", "a"]
    assert [p.hits(k) for k in "abcd"] == [3, 2, 2, 1]
    p.admit("e", 1, hits=2)  # a restore with a hit count goes to that bucket, newest
    assert list(p.eviction_order()) == ["d", "c", "b", "e", "a"]
    p.remove("d")
    p.remove("a")
    assert list(p.eviction_order()) == ["c", "b", "e"]


def test_gdsf_prefers_keeping_small_and_frequent_files():
    p = GDSFPolicy()
    p.admit("big", 1000)
    p.admit("small", 10)
    p.admit("hot-big", 1000)
    for _ in range(20):
        p.touch("hot-big", 1000)
    assert list(p.eviction_order()) == ["big", "hot-big", "small"]


def test_gdsf_inflation_ages_old_entries():
    p = GDSFPolicy()
    p.admit("old", 10)
    for _ in range(3):
        p.touch("old", 10)  # H = 4/10
    p.admit("x", 1)  # H = 1
    victim = next(p.eviction_order())
    assert victim == "old"
    p.remove(victim)
    assert p.inflation == pytest.approx(0.4)  # L rose to the victim's priority
    p.admit("new", 10)  # H = 0.4 + 0.1: now above a fresh entry without aging
    assert list(p.eviction_order()) == ["new", "x"]


def test_gdsf_fetch_time_cost():
    cost = fetch_time_cost(0.01, 100e6)
    assert cost(0) == pytest.approx(0.01)
    assert cost(100_000_000) == pytest.approx(1.01)
    p = GDSFPolicy(cost=cost)
    p.admit("tiny", 1)  # latency-dominated: very valuable per byte
    p.admit("large", 10**9)
    assert next(p.eviction_order()) == "large"


def test_arc_keeps_frequent_files_through_a_scan():
    p = ARCPolicy(capacity=4)
    for k in "ab":
        p.admit(k, 1)
        p.touch(k, 1)  # a, b are frequent (T2)
    resident = {"a", "b"}
    for k in "cdefghij":  # a one-time scan
        p.will_admit(k, 1)
        while len(resident) + 1 > 4:
            victim = next(p.eviction_order())
            p.remove(victim)
            resident.discard(victim)
        p.admit(k, 1)
        resident.add(k)
    assert {"a", "b"} <= resident


def test_arc_ghost_hit_adapts_target():
    p = ARCPolicy(capacity=2)
    p.admit("a", 1)
    p.admit("b", 1)
    p.remove("a")  # evicted from T1 -> ghost in B1
    assert p.target_t1 == 0
    p.will_admit("a", 1)
    assert p.target_t1 > 0  # a B1 ghost hit grows T1's target
    p.admit("a", 1)
    assert p.hits("a") == 1 and "a" in p


def test_iter_sorted_is_lazy_and_ordered():
    import heapq
    import random

    rng = random.Random(7)
    heap: list[int] = []
    for _ in range(200):
        heapq.heappush(heap, rng.randrange(1000))
    snapshot = list(heap)
    assert list(iter_sorted(heap)) == sorted(heap)
    assert heap == snapshot
    it = iter_sorted(heap)
    assert [next(it) for _ in range(3)] == sorted(heap)[:3]

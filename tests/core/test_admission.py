"""OnlinePolicy.admits: a miss is admitted only if it ranks above every victim its room
displaces, by the policy's own ranking (LRU: recency; LFU: hits, then recency)."""

from __future__ import annotations

from hycache_core.policies import LFUPolicy, LRUPolicy, Usage, load_policy
from hycache_core.sim import SimOptions, Trace, simulate
from hypothesis import given, settings
from hypothesis import strategies as st


def test_lru_admits_only_a_candidate_used_more_recently_than_every_victim():
    lru = LRUPolicy()
    victims = [Usage(hits=1, last=10), Usage(hits=1, last=12)]
    assert lru.admits(Usage(hits=1, last=13), victims)
    assert not lru.admits(Usage(hits=9, last=11), victims)  # LRU ignores the count
    assert lru.admits(Usage(hits=0, last=0), [])  # nothing displaced


def test_lfu_ranks_by_hits_then_recency():
    lfu = LFUPolicy()
    victims = [Usage(hits=2, last=10)]
    assert lfu.admits(Usage(hits=3, last=1), victims)
    assert not lfu.admits(Usage(hits=1, last=99), victims)
    assert lfu.admits(Usage(hits=2, last=11), victims) and not lfu.admits(Usage(hits=2, last=9), victims)


def test_a_cyclic_scan_twice_the_cache_admits_nothing_once_the_cache_is_full():
    """The rule driven as the agent drives it: 20 unit files through a 10-file LRU cache,
    scanned three times; a miss is admitted only past the policy's admission."""
    lru = load_policy("lru")
    last: dict[int, int] = {}
    seq = admitted = 0
    for key in range(10):  # the cache's first tenants
        seq += 1
        last[key] = seq
        lru.admit(key, 1)
    for _ in range(3):
        for key in range(20):
            prior = Usage(1, last.get(key, 0))
            seq += 1
            last[key] = seq
            if key in lru:
                lru.touch(key, 1)
                continue
            victim = next(lru.eviction_order())
            if lru.admits(prior, [Usage(1, last[victim])]):
                lru.remove(victim)
                lru.admit(key, 1)
                admitted += 1
    assert admitted == 0 and sorted(lru.eviction_order()) == list(range(10))


# -- the simulator runs the same rule (SimOptions.admission "agent", the default) ----------

ONLINE = ["lru", "lfu", "gdsf", "arc"]
refs = st.lists(st.tuples(st.integers(0, 11), st.sampled_from([10, 20, 40])), min_size=1, max_size=120)


def _trace(rs: list[tuple[int, int]]) -> Trace:
    return Trace.from_refs([(f"f{k}-{s}", s) for k, s in rs])


def test_the_simulator_declines_a_scan_as_the_agent_does():
    """Round-robin over 20 unit files in a 10-unit cache: Algorithm 1 misses every time;
    with the agent's rule the first ten stay (LRU: recency; each is used again before
    the newcomers) and every later pass hits them."""
    trace = Trace.from_refs([(f"f{k}", 1) for _ in range(3) for k in range(20)])
    agent = simulate(trace, 10, ["lru"]).results["lru"]
    papers = simulate(trace, 10, ["lru"], options=SimOptions(admission="all")).results["lru"]
    assert papers.stats.hits == 0 and papers.extra["declined"] == 0
    assert agent.stats.hits == 20 and agent.extra["declined"] == 10 + 20
    assert agent.stats.admissions == 10


@settings(max_examples=60, deadline=None)
@given(refs, st.sampled_from(ONLINE))
def test_every_read_miss_is_admitted_declined_or_too_large(rs, policy):
    trace = _trace(rs)
    r = simulate(trace, 60, [policy]).results[policy]
    s = r.stats
    too_large = sum(1 for _k, size in rs if size > 60)
    assert s.hits + s.misses == len(rs)
    assert s.admissions + r.extra["declined"] + too_large == s.misses
    assert s.peak_used <= 60


@settings(max_examples=60, deadline=None)
@given(refs, st.sampled_from(ONLINE))
def test_with_room_for_everything_the_rule_never_decides(rs, policy):
    """Nothing is displaced, so nothing is declined: the agent's way and Algorithm 1 agree."""
    trace = _trace(rs)
    room = sum({(k, s): s for k, s in rs}.values())
    agent = simulate(trace, room, [policy]).results[policy]
    papers = simulate(trace, room, [policy], options=SimOptions(admission="all")).results[policy]
    assert agent.extra["declined"] == 0
    assert agent.stats.hits == papers.stats.hits == len(rs) - len(set(rs))


@settings(max_examples=60, deadline=None)
@given(refs)
def test_lru_declines_exactly_the_misses_older_than_a_victim(rs):
    """An independent model of the agent's LRU with admission: a miss comes in only if
    its last use is more recent than that of every file its room displaces."""
    trace = _trace(rs)
    cap = 60
    resident: dict[str, int] = {}  # name -> size, least recently used first
    last: dict[str, int] = {}
    seq = hits = 0
    for k, size in rs:
        name = f"f{k}-{size}"
        if name in resident:
            hits += 1
            resident[name] = resident.pop(name)
        else:
            need, victims = sum(resident.values()) + size - cap, []
            for v in resident:
                if need <= 0:
                    break
                victims.append(v)
                need -= resident[v]
            if all(last.get(name, 0) > last[v] for v in victims):
                for v in victims:
                    del resident[v]
                seq += 1  # the promotion takes a sequence number of its own
                resident[name] = size
        seq += 1
        last[name] = seq
    assert simulate(trace, cap, ["lru"]).results["lru"].stats.hits == hits

"""OnlinePolicy.admits: a miss is admitted only if it ranks above every victim its room
displaces, by the policy's own ranking (LRU: recency; LFU: hits, then recency)."""

from __future__ import annotations

from hycache_core.policies import LFUPolicy, LRUPolicy, Usage, load_policy


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

"""Properties every policy must have when run through the one cache driver."""

from __future__ import annotations

import pytest
from hycache_core.sim import CacheDriver, CacheInvariantError, CostModel, SimOptions, Trace, known_policies, simulate
from hypothesis import given, settings
from hypothesis import strategies as st

ALL = known_policies()


@st.composite
def workloads(draw):
    """Small traces with writes, files that change size (new versions) and pins."""
    n_files = draw(st.integers(1, 8))
    base = [draw(st.integers(0, 50)) for _ in range(n_files)]
    refs = []
    for _ in range(draw(st.integers(1, 60))):
        f = draw(st.integers(0, n_files - 1))
        write = draw(st.booleans()) and draw(st.booleans())  # ~25 % writes
        if write and draw(st.booleans()):
            base[f] = draw(st.integers(0, 50))  # a rewrite with a new size
        refs.append((f"f{f}", base[f], write))
    trace = Trace.from_refs(refs)
    pins = draw(st.sets(st.sampled_from(sorted(trace.names)), max_size=2))
    trace.pin(pins)
    capacity = draw(st.integers(0, 120))
    return trace, capacity


def replay_events(trace, capacity, events, sizes_at):
    """Rebuild residency from the driver's event log and check capacity at every step."""
    resident: dict[int, int] = {}
    for kind, pos, key in events:
        if kind == "admit":
            resident[key] = sizes_at[pos]
            assert sum(resident.values()) <= capacity, f"over capacity after admitting {key} at {pos}"
        else:
            del resident[key]
        if kind == "evict":
            assert key not in trace.pinned, f"pinned file {key} evicted at {pos}"


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_policy_respects_capacity_and_pins(case):
    trace, capacity = case
    sim = simulate(trace, capacity, ALL, options=SimOptions(record=True, ilp_time_limit=5))
    opt = sim.results["optimal"]
    bound = opt.extra["bound_slow_bytes_read"]
    for name, r in sim.results.items():
        st_ = r.stats
        assert st_.peak_used <= capacity
        assert st_.hits + st_.misses == st_.refs == len(trace)
        replay_events(trace, capacity, r.extra["events"], trace.sizes)
        # accounting identities of the model
        read_miss_bytes = st_.read_bytes - sum(
            s for s, w, in_hit in _hit_flags(trace, r.extra["events"]) if not w and in_hit
        )
        assert st_.slow_bytes_read == read_miss_bytes, name
        # nobody beats the offline lower bound
        assert st_.slow_bytes_read >= bound, name
    assert opt.stats.slow_bytes_read <= sim.results["heuristic"].stats.slow_bytes_read
    assert opt.stats.slow_bytes_read <= sim.results["belady"].stats.slow_bytes_read


def _hit_flags(trace, events):
    """(size, write, was resident) per reference, recomputed from the event log."""
    admits_at: dict[int, list] = {}
    gone_at: dict[int, list] = {}
    for kind, pos, key in events:
        (admits_at if kind == "admit" else gone_at).setdefault(pos, []).append((kind, key))
    resident: dict[int, int] = {}
    out = []
    for i, k in enumerate(trace.keys):
        for kind, key in gone_at.get(i, []):
            if kind == "drop":  # a new version drops the stale copy before the access
                resident.pop(key, None)
        was = k in resident
        out.append((trace.sizes[i], trace.writes[i], was))
        for kind, key in gone_at.get(i, []):
            if kind == "evict":
                resident.pop(key, None)
        for _kind, key in admits_at.get(i, []):
            resident[key] = trace.sizes[i]
    return out


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_heuristic_never_caches_a_file_without_future_reference(case):
    trace, capacity = case
    sim = simulate(trace, capacity, ["heuristic"], options=SimOptions(record=True))
    for kind, pos, key in sim.results["heuristic"].extra["events"]:
        if kind == "admit":
            assert key in trace.keys[pos + 1 :], f"file {key} cached at {pos} but never referenced again"


def test_driver_rejects_invalid_actions():
    from hycache_core.sim.driver import Strategy

    class Greedy(Strategy):
        def __init__(self, d):
            self.d = d

        def hit(self, pos, key, size):
            pass

        def miss(self, pos, key, size):
            self.d.admit(key, size)

    d = CacheDriver(10)
    with pytest.raises(CacheInvariantError, match="capacity"):
        d.run([0, 1], [6, 6], bytearray(2), Greedy(d))

    class EvictPinned(Greedy):
        def miss(self, pos, key, size):
            if self.d.resident:
                self.d.evict(next(iter(self.d.resident)))
            self.d.admit(key, size)

    d = CacheDriver(10, pinned={0})
    with pytest.raises(CacheInvariantError, match="pinned"):
        d.run([0, 1], [6, 6], bytearray(2), EvictPinned(d))

    d = CacheDriver(10)
    with pytest.raises(CacheInvariantError, match="outside the miss"):
        d.run([0, 1], [1, 1], bytearray(2), _AdmitOther(d))


class _AdmitOther:
    def __init__(self, d):
        self.d = d

    def hit(self, pos, key, size):
        pass

    def miss(self, pos, key, size):
        self.d.admit(key + 100, size)

    def dropped(self, key):
        pass


def test_write_back_and_model_accounting():
    """W miss cached -> dirty; evicting it writes it back to the slow tier."""
    trace = Trace.from_refs([("a", 60, True), ("a", 60), ("b", 60), ("b", 60)])
    model = CostModel(fast_read_bw=100, fast_write_bw=50, slow_read_bw=10, slow_write_bw=5,
                      fast_latency=0.5, slow_latency=2)
    sim = simulate(trace, 100, ["lru"], model, SimOptions(admission="all"))
    s = sim.results["lru"].stats
    # Algorithm 1 (every miss admitted); a: write-allocated (fast write 60), read hit (fast read 60);
    # b: miss (slow read 60 + fast write 60) evicts dirty a (fast read 60 + slow write 60); b hit.
    assert (s.hits, s.misses) == (2, 2)
    assert (s.slow_bytes_read, s.slow_bytes_written) == (60, 60)
    assert (s.fast_bytes_read, s.fast_bytes_written) == (180, 120)
    assert s.writebacks == 1 and s.dirty_bytes_at_end == 0
    expected = (1 * 2 + 60 / 10) + (1 * 2 + 60 / 5) + (3 * 0.5 + 180 / 100) + (2 * 0.5 + 120 / 50)
    assert s.modelled_seconds(model) == pytest.approx(expected)
    assert s.slow_seconds(model) == pytest.approx((2 + 6) + (2 + 12))


def test_new_version_is_a_miss():
    trace = Trace.from_refs([("a", 10), ("a", 10), ("a", 20, True), ("a", 20)])
    s = simulate(trace, 100, ["lru"]).results["lru"].stats
    assert (s.hits, s.misses) == (2, 2)  # the rewrite with a new size misses, its read hits
    assert s.slow_bytes_written == 0 and s.dirty_bytes_at_end == 20


def test_json_fields_and_ratios():
    trace = Trace.from_refs([("a", 10), ("b", 30), ("a", 10), ("b", 30), ("c", 50), ("a", 10)])
    sim = simulate(trace, 45, ["lru", "lfu", "heuristic", "optimal"])
    out = sim.as_json()
    assert list(out) == ["lru", "lfu", "heuristic", "optimal"]
    for d in out.values():
        for key in ("hits", "misses", "hit_ratio", "byte_hit_ratio", "slow_bytes_read",
                    "slow_bytes_written", "modelled_seconds"):
            assert key in d
        assert d["hit_ratio"] == d["hits"] / 6
        assert d["byte_hit_ratio"] == d["hit_bytes"] / 140
    assert out["lru"]["modelled_seconds_vs_optimal"] >= 1.0


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        simulate(Trace.from_refs([("a", 1)]), 10, ["mru"])

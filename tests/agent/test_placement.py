"""fs/placement.py through the harness (a real engine on temporary tiers, no kernel):
victim order, room on the fast tier, the watermarks, the policy's settings and their
persistence, and ENOSPC only for what can never fit.  The spill itself (a write that does
not fit moves to the slow tier) is in test_engine.py (test_spill_never_enospc)."""

from __future__ import annotations

import errno as E
import json
import os

import pytest
import trio
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError
from hycache_agent.fs.placement import POLICY_FILE, PolicyError, load_saved_policy, validate_policy

from .harness import engine_config, run_engine
from .invariants import settle

K = 1 << 10
M = 1 << 20


def test_victims_come_in_policy_order_and_skip_pinned_open_and_locked_files(tmp_path):
    async def body(h):
        p = h.engine.placement
        inos = [await h.write_file(b"f%d" % i, b"x" * (10 * K)) for i in range(5)]
        assert [i.ino for i in p.eviction_candidates()] == inos  # LRU: oldest first
        await h.read_file(inos[0])  # now the most recently used
        assert [i.ino for i in p.eviction_candidates()] == inos[1:] + inos[:1]
        await h.setxattr(inos[1], b"user.hycache.pinned", b"1")
        fh = await h.open(inos[2], os.O_RDONLY)
        lock = h.engine.lock(h.ns.get(inos[3]))
        async with lock:  # a writer holds it
            assert [i.ino for i in p.eviction_candidates()] == [inos[4], inos[0]]
            assert not p.evictable(h.ns.get(inos[3]))
        assert [i.ino for i in p.eviction_candidates(exclude=h.ns.get(inos[4]))] == [inos[3], inos[0]]
        await h.close(fh)
        assert p.evictable(h.ns.get(inos[2])) and not p.evictable(None)

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)


def test_room_for_evicts_only_what_it_needs_and_never_more_than_the_capacity(tmp_path):
    async def body(h):
        e, p = h.engine, h.engine.placement
        inos = [await h.write_file(b"f%d" % i, b"x" * (200 * K)) for i in range(4)]  # 800 KiB
        assert await p.room_for(200 * K, None) and e.counters.evictions == 0  # fits as is
        assert await p.room_for(300 * K, None)  # 1100 KiB > 1 MiB: the oldest one goes
        assert [h.tier(i) for i in inos] == [T.SLOW, T.FAST, T.FAST, T.FAST]
        assert e.counters.evictions == 1 and e.fast_used == 600 * K
        assert not await p.room_for(M + 1, None)  # larger than the tier: nothing is evicted
        assert e.counters.evictions == 1
        for i in inos[1:]:
            await h.setxattr(i, b"user.hycache.pinned", b"1")
        assert not await p.room_for(500 * K, None)  # only pinned files left to evict
        assert e.fast_used == 600 * K

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)


def test_room_for_evicts_its_victims_at_once(tmp_path):
    """On a slow device each move waits for its fsyncs: the victims of one call are moved
    together (their syncs share the device's journal commits), not one after another."""
    async def body(h):
        e, p = h.engine, h.engine.placement
        inos = [await h.write_file(b"f%d" % i, b"x" * (200 * K)) for i in range(5)]  # 1000 KiB
        assert e.counters.evictions == 0
        in_flight: list[int] = []
        done = trio.Event()

        async def watch() -> None:
            while not done.is_set():
                in_flight.append(len(e.migrations.active))
                await trio.sleep(0)

        async def make_room() -> None:
            assert await p.room_for(500 * K, None)  # 1500 KiB > 1 MiB: three victims
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            nursery.start_soon(make_room)
        assert [h.tier(i) for i in inos] == [T.SLOW] * 3 + [T.FAST] * 2  # the oldest, as before
        assert max(in_flight) == 3 and e.counters.evictions == 3
        assert len(e.migrations.active) == 0

    # watermarks above the 1000 KiB written: the evictor stays out of it
    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, high_watermark=1.0, low_watermark=0.95)


def test_the_evictor_runs_above_the_high_watermark_down_to_the_low_one(tmp_path):
    async def body(h):
        e, p = h.engine, h.engine.placement
        inos = [await h.write_file(b"f%d" % i, b"x" * (100 * K)) for i in range(8)]  # 800 KiB
        assert not p.eviction_pending() and e.counters.evictions == 0
        e.capacity = 850 * K  # now above 0.9 × capacity
        p.check_watermark()
        assert p.eviction_pending()
        await settle(e)
        assert e.fast_used <= 0.5 * e.capacity  # low watermark
        assert [h.tier(i) for i in inos] == [T.SLOW] * 4 + [T.FAST] * 4  # oldest first
        e.capacity = M

    run_engine(tmp_path, body, fast_capacity=M, high_watermark=0.9, low_watermark=0.5,
               promote_on_open=False)


def test_policy_settings_are_validated_applied_saved_and_loaded(tmp_path):
    for bad in [("nope", 0.9, 0.7), ("lru", 1.5, 0.7), ("lru", 0.9, -0.1), ("lru", 0.5, 0.5)]:
        with pytest.raises(PolicyError):
            validate_policy(*bad)
    validate_policy("lfu", 1.0, 0.0)

    async def body(h):
        e, p = h.engine, h.engine.placement
        inos = [await h.write_file(b"f%d" % i, b"x" * (10 * K)) for i in range(3)]
        with pytest.raises(PolicyError):
            p.apply_policy("lfu", 0.5, 0.6)
        assert e.policy.name == "lru" and e.config.high_watermark == 0.9  # nothing changed
        p.apply_policy("lfu", 0.8, 0.6, version=4)
        assert e.policy.name == "lfu" and e.policy_version == 4
        assert sorted(e.policy.eviction_order()) == sorted(inos)  # the fast tier re-admitted
        assert (e.config.high_watermark, e.config.low_watermark) == (0.8, 0.6)
        p.save_policy()

    run_engine(tmp_path, body, fast_capacity=M)
    saved = json.loads((tmp_path / "state" / POLICY_FILE).read_text())
    assert saved == {"version": 4, "policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.6}
    state_dir = engine_config(tmp_path).state_dir
    assert load_saved_policy(state_dir) == saved
    (tmp_path / "state" / POLICY_FILE).write_text('{"version": 5, "policy": "nope"}')
    assert load_saved_policy(state_dir) is None  # a broken file is ignored (logged), not fatal


def test_moves_refuse_what_can_never_fit_and_pins_persist(tmp_path):
    async def body(h):
        _e, p = h.engine, h.engine.placement
        small = h.ns.get(await h.write_file(b"small", b"s" * (100 * K)))
        big = h.ns.get(await h.write_file(b"big", b"b" * (2 * M)))  # spilled: larger than the tier
        assert big.tier == T.SLOW
        with pytest.raises(FsError) as exc:
            p.request_move(big, T.FAST)
        assert exc.value.errno == E.ENOSPC
        with pytest.raises(FsError) as exc:
            p.request_move(small, "tape")
        assert exc.value.errno == E.EINVAL
        with pytest.raises(FsError) as exc:
            await p.move(h.ns.get(1), T.SLOW)  # the root directory
        assert exc.value.errno == E.EINVAL
        assert await p.move(small, T.SLOW) is None and small.tier == T.SLOW
        assert await p.prefetch("/small") == T.FAST and small.tier == T.FAST
        assert await p.prefetch("/small") == "already fast"
        with pytest.raises(FsError) as exc:
            await p.prefetch("/missing")
        assert exc.value.errno == E.ENOENT
        await p.set_pinned(small, True)
        return small.ino

    ino = run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)

    async def after_restart(h):
        assert h.ns.get(ino).pinned is True

    run_engine(tmp_path, after_restart, fast_capacity=M)


def test_a_scan_larger_than_the_fast_tier_is_read_through_not_cycled(tmp_path):
    """Admission (Placement.admits): a slow-tier file opened once in a scan twice the
    tier's size ranks below every resident (LRU) and is read where it is, so scanning the
    set twice promotes and evicts nothing; a file opened again while it would still have
    been resident comes in, displacing the least recently used."""
    async def body(h):
        e = h.engine
        inos = [await h.write_file(b"f%d" % i, b"x" * (100 * K)) for i in range(20)]  # 2000 KiB
        await settle(e)
        assert [h.tier(i) for i in inos] == [T.SLOW] * 10 + [T.FAST] * 10
        assert e.counters.evictions == 10 and e.counters.promotions == 0
        for _ in range(2):
            for ino in inos:
                assert await h.read_file(ino) == b"x" * (100 * K)
            await settle(e)
        assert e.counters.promotions == 0 and e.counters.promotions_declined == 20
        assert e.counters.evictions == 10
        assert [h.tier(i) for i in inos] == [T.SLOW] * 10 + [T.FAST] * 10
        await h.read_file(inos[0])  # still colder than every resident: read through
        await h.read_file(inos[0])  # used again at once: hotter than the LRU resident
        await settle(e)
        assert e.counters.promotions_declined == 21
        assert e.counters.promotions == 1 and e.counters.evictions == 11
        assert h.tier(inos[0]) == T.FAST and h.tier(inos[10]) == T.SLOW

    # the watermarks at the top: room is made by the writes' room_for, not the evictor
    run_engine(tmp_path, body, fast_capacity=1000 * K, high_watermark=1.0, low_watermark=0.95)


def test_a_before_open_refusal_is_counted_once_per_open(tmp_path):
    """promote_mode before-open asks the admission rule before the open and again after
    it (a passthrough open promotes once released): each declined open counts once."""
    async def body(h):
        e = h.engine
        inos = [await h.write_file(b"f%d" % i, b"x" * (100 * K)) for i in range(20)]  # 2000 KiB
        await settle(e)
        for ino in inos[:10]:  # the ten evicted by the writes: colder than every resident
            assert await h.read_file(ino) == b"x" * (100 * K)
        await settle(e)
        assert e.counters.promotions == 0 and e.counters.promotions_declined == 10

    run_engine(tmp_path, body, fast_capacity=1000 * K, high_watermark=1.0, low_watermark=0.95,
               promote_mode="before-open")

"""fs/blobpool.py alone, on real tier directories in a temporary root: the pool of ready
fast-tier blobs fills and refills, its low watermark follows the create rate, freed
inodes' blobs are reaped, shutdown leaves nothing, and a crash leaves only orphans that
the engine's recovery pass removes."""

from __future__ import annotations

import itertools
import os
import resource
import time

import trio
import trio.testing
from hycache_agent.fs import tiers as T
from hycache_agent.fs.blobpool import (
    BLOB_POOL_BATCH_MAX,
    BLOB_POOL_LOW,
    BLOB_POOL_MAX,
    RESERVE_MEMORY,
    BlobPool,
    max_low,
    next_low,
)
from hycache_agent.fs.engine import TieringEngine

from .harness import engine_config, run_engine

FULL = 2 * BLOB_POOL_LOW  # what an idle agent keeps ready


def _tiers(root) -> dict[str, T.Tier]:
    config = engine_config(root)
    tiers = {T.FAST: T.Tier(T.FAST, config.fast_dir), T.SLOW: T.Tier(T.SLOW, config.slow_dir)}
    for tier in tiers.values():
        tier.path.mkdir(parents=True, exist_ok=True)
        tier.prepare()
    return tiers


async def until(cond) -> None:
    """Wait for the background task's thread hop to have done ``cond`` (bounded)."""
    with trio.fail_after(60):
        while not cond():
            await trio.sleep(0.01)
    await trio.testing.wait_all_tasks_blocked()


def _blobs_on(tier: T.Tier) -> set[int]:
    return {ino for _path, ino, temp in tier.scan() if not temp}


def test_the_pool_fills_with_empty_fast_blobs_and_refills_when_low(tmp_path):
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False})
    next_ino = itertools.count(100).__next__
    taken: list[int] = []

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.filler, next_ino)
            await until(lambda: len(pool.ready) == FULL)
            ready = list(pool.ready)
            assert ready == list(range(100, 100 + FULL)) and not pool.pool_filling
            assert _blobs_on(tiers[T.FAST]) == set(ready) and not _blobs_on(tiers[T.SLOW])
            assert all(os.stat(tiers[T.FAST].blob(i)).st_size == 0 for i in ready)
            assert not pool.pooled_backings  # no passthrough: nothing registered ahead
            # creates take blobs; the filler is woken below the low mark and fills to 2 x low
            taken.extend(pool.ready.pop() for _ in range(FULL - BLOB_POOL_LOW + 1))
            pool.refill_soon()
            await until(lambda: len(pool.ready) >= FULL)
            assert len(pool.ready) == FULL and pool.low == BLOB_POOL_LOW and pool.refills == 2
            assert not set(taken) & set(pool.ready)
            nursery.cancel_scope.cancel()

    trio.run(main)
    pool.close()  # unused blobs go; the taken ones (now files' blobs) stay
    assert _blobs_on(tiers[T.FAST]) == set(taken) and not pool.ready


def test_new_blob_is_an_empty_file_on_the_fast_tier(tmp_path):
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False})
    assert trio.run(pool.new_blob, 7) == T.FAST
    assert os.stat(tiers[T.FAST].blob(7)).st_size == 0


def test_doomed_blobs_are_removed_by_the_reaper_on_every_tier(tmp_path):
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False})
    for ino in (1, 2):
        T.create_blob(tiers[T.FAST].blob(ino))
    T.create_blob(tiers[T.SLOW].blob(3))

    async def main():
        assert not await pool.reap_now()  # nothing to remove
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.reaper)
            pool.doom(1)
            pool.doom(3)
            await until(lambda: not os.path.exists(tiers[T.SLOW].blob(3)))
            assert _blobs_on(tiers[T.FAST]) == {2} and not _blobs_on(tiers[T.SLOW])
            nursery.cancel_scope.cancel()
        pool.doom(2)
        assert await pool.reap_now()  # what a write does before it gives up with ENOSPC
        assert not _blobs_on(tiers[T.FAST])

    trio.run(main)


def test_a_crash_leaves_only_orphans_that_recovery_removes(tmp_path):
    """Pool blobs and doomed blobs of a killed agent have no inode: the next start's
    recovery pass removes them and the pool starts afresh."""
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False})
    next_ino = itertools.count(1000).__next__
    T.create_blob(tiers[T.SLOW].blob(5000))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.filler, next_ino)
            await until(lambda: len(pool.ready) == FULL)
            pool.doom(5000)  # never reaped: the agent dies first
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(_blobs_on(tiers[T.FAST])) == FULL  # no close(): as after SIGKILL
    engine = TieringEngine(engine_config(tmp_path))
    report = engine.start()
    try:
        assert report["orphan_blobs_removed"] == FULL + 1
        assert not _blobs_on(engine.tiers[T.FAST]) and not _blobs_on(engine.tiers[T.SLOW])
    finally:
        engine.close()


def test_the_low_watermark_follows_the_creates_a_refill_served():
    """Twice the creates that took (or missed) a blob while one refill job ran, within
    [BLOB_POOL_LOW, BLOB_POOL_MAX], lowered by at most 1/16 per job."""
    assert next_low(BLOB_POOL_LOW, 0) == BLOB_POOL_LOW
    assert next_low(BLOB_POOL_LOW, 100) == 200  # a burst: the next refill starts earlier
    assert next_low(200, 10) == 188  # quiet again: down by 1/16 a job
    assert next_low(188, 300) == 600
    assert next_low(600, 10**6) == BLOB_POOL_MAX
    low = BLOB_POOL_MAX
    for _ in range(100):
        low = next_low(low, 0)
    assert low == BLOB_POOL_LOW
    assert next_low(BLOB_POOL_LOW, 10**6, 128) == 128  # a low descriptor limit caps it


def test_the_watermark_stays_within_a_quarter_of_the_descriptor_limit():
    """With passthrough each ready blob holds a descriptor (up to 2 x the watermark)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert max_low() == 128
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))
        assert max_low() == BLOB_POOL_LOW
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert max_low() == min(BLOB_POOL_MAX, max(BLOB_POOL_LOW, soft // 8))


def test_a_burst_of_creates_raises_the_watermark_and_the_pool_refills_to_it(tmp_path):
    """Creates that find the pool empty while a refill job runs raise the low watermark;
    the pool is then filled in several jobs, every blob an empty fast file, until a job
    during which no create came: the burst is over, the refill stops at the watermark and
    leaves the rest (to twice it) for creates to come (its cores go to what follows)."""
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False})
    next_ino = itertools.count(100).__next__
    taken: list[int] = []

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.filler, next_ino)
            await until(lambda: len(pool.ready) == FULL)
            # a burst: the pool is emptied (the filler is woken), and 100 more creates come
            # (and find none) while the refill job runs
            refills = pool.refills
            taken.extend(pool.ready.pop() for _ in range(FULL))
            pool.refill_soon()
            with trio.fail_after(60):
                while not pool.pool_filling:  # the job has started
                    await trio.sleep(0)
            pool.misses += 100  # what create_file counts when it finds none
            await until(lambda: not pool.pool_filling and len(pool.ready) >= pool.low)
            # twice what the job had to serve (200), lowered by 1/16 by the job that served
            # nothing; without the burst it stays at 64
            assert 180 <= pool.low <= 200 and pool.low <= len(pool.ready) < 2 * pool.low
            assert pool.refills >= refills + pool.low // BLOB_POOL_BATCH_MAX
            done = pool.refills
            await trio.sleep(0.5)  # the refill has stopped
            assert pool.refills == done and len(pool.ready) < 2 * pool.low and not pool.pool_filling
            # the next create below the watermark starts it again
            taken.extend(pool.ready.pop() for _ in range(len(pool.ready) - pool.low + 1))
            pool.refill_soon()
            await until(lambda: pool.refills > done and not pool.pool_filling)
            assert len(pool.ready) >= pool.low
            assert not set(taken) & set(pool.ready)
            assert all(os.stat(tiers[T.FAST].blob(i)).st_size == 0 for i in pool.ready)
            nursery.cancel_scope.cancel()

    trio.run(main)
    pool.close()
    assert _blobs_on(tiers[T.FAST]) == set(taken) and not pool.ready


def test_the_pool_keeps_its_reserve_and_a_burst_raises_it_for_a_while(tmp_path):
    """Between bursts the pool holds its reserve (made on the reserve's own thread, beyond
    the refill's 2 x low); a burst of creates larger than it (blobs taken and creates that
    found none) raises it to the burst's size for RESERVE_MEMORY seconds; the descriptor
    budget caps it."""
    tiers = _tiers(tmp_path)
    pool = BlobPool(tiers, {"enabled": False}, reserve=300)
    next_ino = itertools.count(100).__next__
    taken: list[int] = []

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.filler, next_ino)
            await until(lambda: len(pool.ready) >= 300 and not pool.pool_filling)
            assert len(pool.ready) == 300 and pool.reserve() == 300 and pool.reserve_fills >= 1
            assert _blobs_on(tiers[T.FAST]) == set(pool.ready)
            # a burst: every ready blob taken, 200 more creates find none
            pool.misses += 200
            taken.extend(pool.ready.pop() for _ in range(300))
            pool.refill_soon()
            await until(lambda: len(pool.ready) >= 500 and not pool.pool_filling)
            assert len(pool.ready) == 500 and pool.status()["reserve"] == 500
            assert not set(taken) & set(pool.ready)
            assert all(os.stat(tiers[T.FAST].blob(i)).st_size == 0 for i in pool.ready)
            # a smaller burst later does not lower it ...
            taken.extend(pool.ready.pop() for _ in range(450))
            pool.refill_soon()
            await until(lambda: len(pool.ready) >= 500 and not pool.pool_filling)
            assert pool.reserve() == 500
            nursery.cancel_scope.cancel()
        # ... until the larger one is older than RESERVE_MEMORY: the floor again
        assert pool.reserve(now=time.monotonic() + RESERVE_MEMORY + 1) == 300
        pool.reserve_floor = 10**6
        assert pool.reserve() == pool.budget() == 2 * max_low()

    trio.run(main)
    pool.close()
    assert _blobs_on(tiers[T.FAST]) == set(taken) and not pool.ready


class _SlowPool(BlobPool):
    """Each job's blobs take a while to make (real files, made after a pause): a shutdown
    can come while the reserve's thread is making them."""

    def _make(self, inos, pool, register):
        time.sleep(0.3)
        return super()._make(inos, pool, register)


def test_a_shutdown_while_the_reserve_is_being_made_leaves_no_blob(tmp_path):
    """The agent stops while the reserve's job is making blobs on its thread: the job ends,
    and its blobs go with the unused ones at close (a CI run found 128 orphans for the next
    start's recovery, a clean shutdown's restart must find none)."""
    tiers = _tiers(tmp_path)
    pool = _SlowPool(tiers, {"enabled": False}, reserve=FULL + 2 * BLOB_POOL_BATCH_MAX)
    next_ino = itertools.count(100).__next__

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.filler, next_ino)
            # the refill's 2 x low are ready; the reserve's first job is on its thread
            await until(lambda: len(pool.ready) >= FULL and pool.pool_filling)
            assert pool.reserve_fills == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    made = _blobs_on(tiers[T.FAST])
    assert len(made) == FULL + BLOB_POOL_BATCH_MAX  # the job ended, its blobs are in the pool
    assert set(pool.ready) == made
    pool.close()
    assert not _blobs_on(tiers[T.FAST]) and not pool.ready


def test_a_create_that_finds_the_pool_empty_is_counted_and_still_made(tmp_path):
    """The slow path (a thread hop for its blob) works and shows in ``status``."""

    async def body(h):
        pool = h.engine.blobs
        await until(lambda: len(pool.ready) >= FULL)
        misses = pool.misses
        for spare in pool.ready:  # as if a burst had taken every ready blob
            T.remove_blob(h.engine.tiers[T.FAST].blob(spare))
        pool.ready.clear()
        fh, ino = await h.create(b"missed")
        await h.write(fh, 0, b"bytes")
        await h.close(fh)
        assert h.tier(ino) == T.FAST and pool.misses == misses + 1
        assert (await h.engine.status())["blob_pool"]["misses"] == misses + 1
        assert await h.read_file(ino) == b"bytes"
        await until(lambda: len(pool.ready) >= FULL)  # and the pool is refilled

    run_engine(tmp_path, body)

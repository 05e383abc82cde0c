"""fs/blobpool.py alone, on real tier directories in a temporary root: the pool of ready
fast-tier blobs fills and refills, freed inodes' blobs are reaped, shutdown leaves
nothing, and a crash leaves only orphans that the engine's recovery pass removes."""

from __future__ import annotations

import itertools
import os

import trio
import trio.testing
from hycache_agent.fs import tiers as T
from hycache_agent.fs.blobpool import BLOB_POOL_BATCH, BLOB_POOL_LOW, BlobPool
from hycache_agent.fs.engine import TieringEngine

from .harness import engine_config


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
            await until(lambda: len(pool.ready) == BLOB_POOL_BATCH)
            ready = list(pool.ready)
            assert ready == list(range(100, 100 + BLOB_POOL_BATCH)) and not pool.pool_filling
            assert _blobs_on(tiers[T.FAST]) == set(ready) and not _blobs_on(tiers[T.SLOW])
            assert all(os.stat(tiers[T.FAST].blob(i)).st_size == 0 for i in ready)
            assert not pool.pooled_backings  # no passthrough: nothing registered ahead
            # creates take blobs; the filler is woken below the low mark and adds a batch
            taken.extend(pool.ready.pop() for _ in range(BLOB_POOL_BATCH - BLOB_POOL_LOW + 1))
            pool.refill_soon()
            await until(lambda: len(pool.ready) >= BLOB_POOL_BATCH)
            assert len(pool.ready) == BLOB_POOL_LOW - 1 + BLOB_POOL_BATCH
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
            await until(lambda: len(pool.ready) == BLOB_POOL_BATCH)
            pool.doom(5000)  # never reaped: the agent dies first
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(_blobs_on(tiers[T.FAST])) == BLOB_POOL_BATCH  # no close(): as after SIGKILL
    engine = TieringEngine(engine_config(tmp_path))
    report = engine.start()
    try:
        assert report["orphan_blobs_removed"] == BLOB_POOL_BATCH + 1
        assert not _blobs_on(engine.tiers[T.FAST]) and not _blobs_on(engine.tiers[T.SLOW])
    finally:
        engine.close()

"""fs/migrations.py through the harness (a real engine on temporary tiers, no kernel):
copy → fsync → switch → remove, and what happens when something gets in the way — a
write during the copy, a failing copy, a migration already in flight.  Faults are put
at an exact point by wrapping the copy (a real copy on real files, held or failed there).
More cases through the FUSE operations are in test_engine.py (unlink during the copy or
the switch, spill during a demotion, a handle across round trips) and
test_read_during_migration.py."""

from __future__ import annotations

import errno as E
import os
import threading

import pytest
import trio
import trio.testing
from hycache_agent.fs import tiers as T

from .harness import run_engine
from .invariants import check_invariants, settle
from .test_engine import K, M, data


def _temps(h) -> list[str]:
    return [p for tier in h.engine.tiers.values() for p, _ino, temp in tier.scan() if temp]


def test_a_migration_copies_switches_and_removes_both_ways(tmp_path):
    async def body(h):
        e, m = h.engine, h.engine.migrations
        payload = data(300 * K, 1)
        ino = await h.write_file(b"f", payload)
        inode = h.ns.get(ino)
        assert m.blob_gen(ino) == 0 and e.fast_used == 300 * K and ino in e.policy
        assert await m.migrate(inode, T.SLOW, reason="demote")
        assert inode.tier == T.SLOW and m.blob_gen(ino) == 1 and ino not in m.active
        assert not os.path.exists(e.tiers[T.FAST].blob(ino)) and os.path.exists(e.tiers[T.SLOW].blob(ino))
        assert e.fast_used == 0 and ino not in e.policy
        assert e.counters.bytes_demoted == 300 * K and e.counters.migrations_done == 1
        assert not await m.migrate(inode, T.SLOW, reason="demote")  # already there: nothing to do
        assert await e.placement.move_now(inode, T.FAST, "promote") is None
        assert inode.tier == T.FAST and m.blob_gen(ino) == 2 and ino in e.policy
        assert e.fast_used == 300 * K and e.counters.promotions == 1 and e.counters.bytes_promoted == 300 * K
        assert await h.read_file(ino) == payload and not _temps(h)

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)


def test_a_write_during_the_copy_abandons_the_switch(tmp_path, monkeypatch):
    copied, go = threading.Event(), threading.Event()
    real_copy = T.copy_blob

    def held_copy(*args, **kwargs):
        n = real_copy(*args, **kwargs)
        copied.set()  # the staged copy is complete and durable: now the file changes
        go.wait(30)
        return n

    monkeypatch.setattr(T, "copy_blob", held_copy)

    async def body(h):
        e, m = h.engine, h.engine.migrations
        ino = await h.write_file(b"f", data(200 * K, 1))
        inode = h.ns.get(ino)
        result = []

        async def demote():
            result.append(await m.migrate(inode, T.SLOW, reason="demote"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(demote)
            await trio.to_thread.run_sync(copied.wait, 30)
            assert ino in m.active and inode.migration is not None
            fi = await h.ops.open(ino, os.O_RDWR, h.ctx)  # (the harness's own calls would
            await h.ops.write(fi.fh, 0, b"CHANGED")  # wait for the migration: not these)
            await h.ops.flush(fi.fh)
            await h.ops.release(fi.fh)
            go.set()
        assert result == [False] and e.counters.migrations_abandoned == 1
        assert inode.tier == T.FAST and m.blob_gen(ino) == 0 and not _temps(h)
        assert not os.path.exists(e.tiers[T.SLOW].blob(ino))
        assert (await h.read_file(ino))[:8] == b"CHANGED" + data(200 * K, 1)[7:8]

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)


@pytest.mark.parametrize("err", [E.ENOSPC, E.EIO])
def test_a_failed_copy_leaves_the_file_where_it_was(tmp_path, monkeypatch, err):
    real_copy = T.copy_blob

    def failing_copy(src, dst, *args, **kwargs):
        with open(dst, "xb") as f:  # the staged copy got this far
            f.write(b"partial")
        raise OSError(err, os.strerror(err))

    async def body(h):
        e, m = h.engine, h.engine.migrations
        payload = data(100 * K, 2)
        ino = await h.write_file(b"f", payload)
        inode = h.ns.get(ino)
        monkeypatch.setattr(T, "copy_blob", failing_copy)
        if err == E.ENOSPC:  # a full destination: not moved, not an error
            assert not await m.migrate(inode, T.SLOW, reason="demote")
        else:
            with pytest.raises(OSError):
                await m.migrate(inode, T.SLOW, reason="demote")
        assert e.counters.migrations_failed == 1
        why = await e.placement.move_now(inode, T.SLOW, "demote")  # a requested move says why
        assert why is not None and (err == E.ENOSPC or why.startswith("migration failed"))
        monkeypatch.setattr(T, "copy_blob", real_copy)
        assert inode.tier == T.FAST and not _temps(h) and ino not in m.active
        assert e.fast_used == 100 * K and await h.read_file(ino) == payload

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)


def test_move_now_waits_for_a_migration_in_flight_the_other_way(tmp_path, monkeypatch):
    started, go = threading.Event(), threading.Event()
    real_copy = T.copy_blob

    def held_copy(*args, **kwargs):
        started.set()
        go.wait(30)
        return real_copy(*args, **kwargs)

    async def body(h):
        e, m = h.engine, h.engine.migrations
        ino = await h.write_file(b"f", data(100 * K, 3))
        inode = h.ns.get(ino)
        monkeypatch.setattr(T, "copy_blob", held_copy)
        assert e.placement.start_migration(inode, T.SLOW, "demote")
        await trio.to_thread.run_sync(started.wait, 30)
        assert e.placement.start_migration(inode, T.SLOW, "demote")  # already on its way: no second one
        back = []

        async def promote():
            back.append(await e.placement.move_now(inode, T.FAST, "promote"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(promote)
            await trio.testing.wait_all_tasks_blocked()
            assert back == [] and inode.migration is not None and inode.migration.dst == T.SLOW
            go.set()
        monkeypatch.setattr(T, "copy_blob", real_copy)
        await settle(e)
        check_invariants(e)
        assert back == [None] and inode.tier == T.FAST and m.blob_gen(ino) == 2
        assert e.counters.migrations_done == 2

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)

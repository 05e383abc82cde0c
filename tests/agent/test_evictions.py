"""Evictions under write load, through the harness (a real engine on temporary tiers, no
kernel): a batch of victims moves with one group commit (staged copies, one ``syncfs`` of
the slow tier, one metadata commit), a crash anywhere inside it loses nothing, and writes
go on above the capacity up to the write slack while the evictor catches up, then wait;
a fast file system that really fills still spills.  The SIGKILL of a real mount in the
middle of group commits on a slow device is in test_crash.py."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
import trio
import trio.testing
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import ROOT_INO
from hycache_agent.fs.space import FAST_RESERVE, Space
from hycache_core.policies import Usage, load_policy

from .harness import Ctx, run_engine
from .invariants import settle
from .test_engine import K, M, data


def _temps(e) -> list[str]:
    return [p for tier in e.tiers.values() for p, _ino, temp in tier.scan() if temp]


async def _write_raw(h, name: bytes, payload: bytes) -> int:
    """create, write, close through the FUSE operations without the harness's settle
    (which waits for evictions: the tests below hold them)."""
    ops, ctx = h.ops, Ctx()
    fi, attrs = await ops.create(ROOT_INO, name, stat.S_IFREG | 0o644, os.O_RDWR | os.O_CREAT, ctx)
    off = 0
    while off < len(payload):
        off += await ops.write(fi.fh, off, payload[off:off + (128 << 10)])
    await ops.flush(fi.fh)
    await ops.release(fi.fh)
    await ops.forget([(attrs.st_ino, 1)])
    return attrs.st_ino


class Gate:
    """Holds every group commit (``tiers.commit_blobs``) until ``open()``: evictions start,
    stage their copies, and cannot finish."""

    def __init__(self, monkeypatch) -> None:
        self.go = threading.Event()
        self.waiting = 0
        real = T.commit_blobs

        def held(renames, tier):
            self.waiting += 1
            self.go.wait(60)
            return real(renames, tier)

        monkeypatch.setattr(T, "commit_blobs", held)

    def open(self) -> None:
        self.go.set()


def test_a_batch_of_evictions_is_one_group_commit(tmp_path, monkeypatch):
    syncs: list[Path] = []
    real_sync = T.sync_fs

    def counted(path):
        syncs.append(path)
        real_sync(path)

    monkeypatch.setattr(T, "sync_fs", counted)

    async def body(h):
        e, p = h.engine, h.engine.placement
        files = {await h.write_file(b"f%d" % i, data(100 * K, i)): data(100 * K, i) for i in range(8)}
        assert e.counters.evictions == 0 and not syncs
        victims = list(p.eviction_candidates())[:6]
        assert await p._evict_batch(victims) == 6
        assert syncs == [e.tiers[T.SLOW].path]  # six files, one syncfs of the slow tier
        assert e.counters.evictions == 6 and e.counters.bytes_demoted == 600 * K
        assert e.fast_used == 200 * K and not e.active
        for v in victims:
            assert v.tier == T.SLOW and v.migration is None
            assert os.path.exists(e.tiers[T.SLOW].blob(v.ino)) and not os.path.exists(e.tiers[T.FAST].blob(v.ino))
        assert not _temps(e)
        for ino, payload in files.items():
            assert await h.read_file(ino) == payload

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0)


@pytest.mark.parametrize("crash_at", ["syncfs", "removal"])
def test_a_crash_inside_a_group_commit_loses_nothing(tmp_path, monkeypatch, crash_at):
    """The disk as a power cut would leave it, taken inside the group commit: at its
    ``syncfs`` (the final names may be on the disk and the copies' bytes not: they are cut
    to nothing here, the worst case) or after its metadata commit, as the fast copies are
    being removed.  An engine started on that disk finds every byte, on one tier."""
    root, crashed = tmp_path / "root", tmp_path / "crashed"
    taken: list[str] = []

    def snapshot(cut: list[str]) -> None:
        shutil.copytree(root, crashed, ignore=shutil.ignore_patterns("mnt"))
        for final in cut:
            with open(crashed / Path(final).relative_to(root), "r+b") as f:
                f.truncate(0)
        taken.append(crash_at)

    real_commit, real_remove = T.commit_blobs, T.remove_blobs

    def commit_then_crash(renames, tier):
        for temp, final in renames:
            os.rename(temp, final)
        if crash_at == "syncfs" and not taken:
            snapshot([final for _temp, final in renames])
        return real_commit([], tier)  # (the renames are done: the syncfs)

    def remove_then_crash(paths):
        if crash_at == "removal" and not taken and all(str(root / "fast") in p for p in paths):
            snapshot([])
        return real_remove(paths)

    monkeypatch.setattr(T, "commit_blobs", commit_then_crash)
    monkeypatch.setattr(T, "remove_blobs", remove_then_crash)
    files = {b"f%d" % i: data(50 * K + 1000 * i, i) for i in range(10)}

    async def write_and_evict(h):
        for name, payload in files.items():
            await h.write_file(name, payload)
        await settle(h.engine)
        victims = list(h.engine.placement.eviction_candidates())[:7]
        assert await h.engine.placement._evict_batch(victims) == 7

    opts = dict(fast_capacity=M, promote_on_open=False, write_slack=0)
    run_engine(root, write_and_evict, **opts)
    assert taken == [crash_at]

    async def check(h):
        e = h.engine
        tiers = [h.tier(h.ns.dir(ROOT_INO)[name]) for name in files]
        # the metadata's copy, whole: the batch not switched yet, or switched
        assert tiers.count(T.SLOW) == (0 if crash_at == "syncfs" else 7), tiers
        assert h.report["duplicates_removed"] == 7 and h.report["missing_blobs"] == 0, h.report
        for name, payload in files.items():
            ino = h.ns.dir(ROOT_INO)[name]
            assert await h.read_file(ino) == payload, name
            other = T.SLOW if h.tier(ino) == T.FAST else T.FAST
            assert not os.path.exists(e.tiers[other].blob(ino))
        assert not _temps(e)

    monkeypatch.undo()
    run_engine(crashed, check, **opts)


def test_writes_take_the_slack_while_evictions_lag_then_wait(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)

    async def body(h):
        e = h.engine
        assert e.space.write_ceiling == M + M // 2  # capacity 1 MiB, slack 0.5, a roomy disk
        files = {}
        for i in range(14):  # 1400 KiB: above the capacity, under the ceiling
            files[await _write_raw(h, b"f%d" % i, data(100 * K, i))] = data(100 * K, i)
        with trio.fail_after(10):
            while not gate.waiting:  # the evictor's group commit is under way, and held
                await trio.sleep(0.01)
        assert e.counters.evictions == 0 and e.fast_used == 1400 * K  # nobody waited for it
        last = data(200 * K, 99)
        done = trio.Event()

        async def past_the_ceiling() -> None:
            files[await _write_raw(h, b"last", last)] = last
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(past_the_ceiling)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert not done.is_set() and e.fast_used <= e.space.write_ceiling  # it waits
            gate.open()
        assert done.is_set()
        await settle(e)
        assert e.counters.evictions > 0 and e.fast_used <= 0.7 * M  # the evictor caught up
        for ino, payload in files.items():
            assert await h.read_file(ino) == payload

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0.5)


def test_the_last_close_of_a_file_that_filled_the_slack_wakes_the_evictor(tmp_path):
    """Open, the file is no victim: the evictor finds nothing to move and sleeps.  Its last
    close (passthrough off too) wakes it, with no other write to do it."""
    async def body(h):
        e, ops = h.engine, h.ops
        fi, attrs = await ops.create(ROOT_INO, b"held", stat.S_IFREG | 0o644, os.O_RDWR | os.O_CREAT, Ctx())
        payload = data(1400 * K, 3)  # above the capacity, under the ceiling
        off = 0
        while off < len(payload):
            off += await ops.write(fi.fh, off, payload[off:off + (128 << 10)])
        await settle(e)
        assert e.fast_used == 1400 * K and e.counters.evictions == 0  # held open: in the slack
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        await ops.forget([(attrs.st_ino, 1)])
        await settle(e)
        assert e.counters.evictions == 1 and e.fast_used == 0 and h.tier(attrs.st_ino) == T.SLOW
        assert await h.read_file(attrs.st_ino) == payload

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0.5, passthrough="off")


def test_no_slack_means_a_hard_capacity(tmp_path):
    async def body(h):
        e = h.engine
        assert e.space.write_ceiling == M
        for i in range(14):
            await _write_raw(h, b"f%d" % i, data(100 * K, i))
            assert e.fast_used <= M
        await settle(e)
        assert e.counters.evictions >= 4

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0)


def _vfs(blocks: int, avail: int, frsize: int = 4096) -> os.statvfs_result:
    return os.statvfs_result((frsize, frsize, blocks, avail, avail, 1000, 1000, 1000, 0, 255))


def test_the_write_ceiling_is_bounded_by_the_fast_disk():
    s = Space(load_policy("lru"))
    s.capacity, s.used = 100 * M, 90 * M
    blocks = (10 << 30) // 4096  # a 10 GiB disk: its reserve is FAST_RESERVE of it
    reserve = int(FAST_RESERVE * (10 << 30))
    s.set_write_ceiling(0.5, _vfs(blocks, (8 << 30) // 4096))  # roomy: the slack
    assert s.write_ceiling == 150 * M
    free = reserve + 20 * M  # 20 MiB beyond the reserve: the ceiling is what fits
    s.set_write_ceiling(0.5, _vfs(blocks, free // 4096))
    assert s.write_ceiling == 110 * M and s.write_room(20 * M) and not s.write_room(20 * M + 1)
    s.set_write_ceiling(0.5, _vfs(blocks, reserve // 8192))  # into the reserve: no slack at all
    assert s.write_ceiling == 100 * M
    s.set_write_ceiling(0.0, _vfs(blocks, (8 << 30) // 4096))
    assert s.write_ceiling == 100 * M


def test_a_fast_disk_that_fills_under_the_slack_still_spills(tmp_path, tmpfs_dir, monkeypatch):
    """The ceiling is measured now and then; another tenant fills the fast file system in
    between: the write that meets ENOSPC there moves to the slow tier and goes on."""
    gate = Gate(monkeypatch)
    fast = tmpfs_dir / "fast"

    async def body(h):
        e = h.engine
        ceiling = e.space.write_ceiling
        assert 6 * M < ceiling < 8 * M  # 6 MiB + the slack, bounded by the 8 MiB tmpfs
        first = data(5 * M + M // 2, 1)
        a = await _write_raw(h, b"a", first)  # above the high watermark: the evictor starts
        await trio.testing.wait_all_tasks_blocked(cushion=0.02)
        free = os.statvfs(tmpfs_dir).f_bavail * os.statvfs(tmpfs_dir).f_frsize
        (tmpfs_dir / "someone-else").write_bytes(b"\0" * (free - 256 * K))  # the disk fills
        second = data(M, 2)
        b = await _write_raw(h, b"b", second)  # the disk is full: it spills
        assert h.tier(b) == T.SLOW and e.counters.spills == 1
        gate.open()
        await settle(e)
        assert await h.read_file(a) == first and await h.read_file(b) == second
        (tmpfs_dir / "someone-else").unlink()

    run_engine(tmp_path, body, fast=fast, fast_capacity=6 * M, promote_on_open=False, write_slack=0.5)


@pytest.mark.parametrize("taker", ["open", "pin"])
def test_an_open_or_a_pin_takes_back_a_file_its_eviction_has_not_switched(tmp_path, monkeypatch, taker):
    """With passthrough an open waits for a migration of its file; an eviction not switched
    yet is cancelled instead (the file is in use again): the open goes on at once, the
    batch leaves that file on the fast tier and moves the others.  A pin does the same (a
    file pinned while its eviction copied it stayed on the slow tier, pinned)."""
    gate = Gate(monkeypatch)

    async def body(h):
        e, p = h.engine, h.engine.placement
        files = {await h.write_file(b"f%d" % i, data(100 * K, i)): data(100 * K, i) for i in range(6)}
        victims = list(p.eviction_candidates())[:4]
        moved: list[int] = []

        async def evict() -> None:
            moved.append(await p._evict_batch(victims))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(evict)
            with trio.fail_after(10):
                while not gate.waiting:  # staged, held before its renames and syncfs
                    await trio.sleep(0.01)
            wanted = victims[1]
            assert wanted.migration is not None
            with trio.fail_after(1):  # no wait for the batch
                if taker == "open":
                    assert await p.before_open(wanted, True) is False
                else:
                    await e.set_pinned(wanted, True)
            assert wanted.migration.cancelled and e.counters.evictions_taken_back == 1
            gate.open()
        assert moved == [3] and wanted.tier == T.FAST and wanted.pinned == (taker == "pin")
        assert [v.tier for v in victims if v is not wanted] == [T.SLOW] * 3
        assert not os.path.exists(e.tiers[T.SLOW].blob(wanted.ino)) and not _temps(e)
        for ino, payload in files.items():
            assert await h.read_file(ino) == payload

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0)


def test_promotions_wait_for_the_evictor_while_writes_use_the_slack(tmp_path, monkeypatch):
    """Above the capacity an on-open promotion is declined, and a promotion already on its
    way waits for the evictor instead of evicting the writes' overage itself."""
    gate = Gate(monkeypatch)

    async def body(h):
        e, p = h.engine, h.engine.placement
        cold = await h.write_file(b"cold", data(100 * K, 50))
        assert await p.move(h.ns.get(cold), T.SLOW) is None  # (one move: no group commit)
        for i in range(14):
            await _write_raw(h, b"f%d" % i, data(100 * K, i))
        with trio.fail_after(10):
            while not gate.waiting:
                await trio.sleep(0.01)
        assert e.fast_used == 1400 * K > e.capacity
        declined = e.counters.promotions_declined
        assert not p.admits(h.ns.get(cold), Usage(99, 10**9))  # hotter than any: still no
        assert e.counters.promotions_declined == declined + 1
        in_flight = set(e.active)
        got: list[bool] = []

        async def promotion_room() -> None:
            got.append(await p.room_for(100 * K, h.ns.get(cold), wait_leaving=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(promotion_room)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert not got and set(e.active) == in_flight  # waiting, and no batch of its own
            gate.open()
        assert got == [True] and e.fast_used + 100 * K <= e.capacity

    run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False, write_slack=0.5)

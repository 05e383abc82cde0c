"""Moving a file's bytes between the tiers (evictions, promotions, spills, requested moves).

A migration is stage (O_EXCL temp) → copy → fsync file and dir → atomic switch (rename +
metadata commit) → remove the old copy.  The copy runs without the file's lock, so reads
and writes go on; writes during the copy bump the inode's data generation and the switch
is abandoned, so an open file is never corrupted.  The engine's recovery pass
(``TieringEngine.recover``) resolves whatever a crash left behind.

Each switch bumps the inode's *blob generation* (:attr:`Migrations.blob_gens`): a handle's
descriptor opened on another generation is stale, even if the tier's name matches again
(slow→fast→slow).  The engine's read and write path reads that dict directly.

What to move, and when, is decided by :mod:`hycache_agent.fs.placement`; this module
moves.  It works on the files' state (:mod:`~hycache_agent.fs.files`) and the fast tier's
accounting and policy queue (:mod:`~hycache_agent.fs.space`), given to its constructor.
"""

from __future__ import annotations

import errno
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from hycache_core.sizes import format_size

from hycache_agent.fs import tiers as T
from hycache_agent.fs.blobpool import BlobPool
from hycache_agent.fs.counters import Counters
from hycache_agent.fs.files import Files
from hycache_agent.fs.namespace import FsError, Inode
from hycache_agent.fs.space import Space

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Migration:
    ino: int
    src: str
    dst: str
    total: int
    reason: str
    started: float = field(default_factory=time.monotonic)
    copied: int = 0
    cancelled: bool = False
    last_log: float = 0.0
    done: trio.Event = field(default_factory=trio.Event)

    def progress(self, copied: int) -> None:  # called from the copying thread
        self.copied = copied
        t = time.monotonic()
        if self.total >= (256 << 20) and t - self.last_log >= 2.0:
            self.last_log = t
            log.info("migrating inode %d %s→%s: %s of %s (%.0f%%)", self.ino, self.src, self.dst,
                     format_size(copied), format_size(self.total), 100.0 * copied / max(1, self.total))

    def as_dict(self) -> dict[str, Any]:
        return {"ino": self.ino, "from": self.src, "to": self.dst, "reason": self.reason,
                "copied": self.copied, "total": self.total,
                "seconds": round(time.monotonic() - self.started, 3)}


class Migrations:
    def __init__(self, tiers: dict[str, T.Tier], files: Files, space: Space, blobs: BlobPool,
                 counters: Counters, passthrough: dict[str, Any]) -> None:
        self.tiers = tiers
        self.files = files
        self.space = space
        self.blobs = blobs
        self.counters = counters
        self.passthrough = passthrough
        self.backed = files.backed
        self.active: dict[int, Migration] = {}
        # bumped by every tier switch: a handle's fd is stale when its generation differs,
        # even if the tier *name* matches again (slow→fast→slow)
        self.blob_gens: dict[int, int] = {}

    def blob_gen(self, ino: int) -> int:
        """Bumped by every tier switch of the inode: its blob is another file then."""
        return self.blob_gens.get(ino, 0)

    def blob_leaving(self, ino: int) -> None:
        """The inode's blob is about to move or go: the FUSE layer drops the registration
        it may have kept for it after the last release (passthrough.Backings.parked)."""
        backings = self.blobs.backing_pool
        if backings is not None:
            backings.forget_parked(ino)

    # ------------------------------------------------------------------ migration
    async def migrate(self, inode: Inode, dst: str, *, reason: str, locked: bool = False) -> bool:
        """Move a regular file's bytes to tier ``dst``.  Returns True if it moved.

        ``locked``: the caller holds the inode's lock (a spill from inside a write).  An
        eviction's caller checks, right before the call, that the file is still evictable."""
        if not self._may_move(inode, dst, reason):
            return False
        mig = self._begin(inode, dst, reason)
        src_tier, dst_tier = self.tiers[mig.src], self.tiers[dst]
        reserved = 0
        if dst == T.FAST:
            reserved = inode.size
            self.space.used += reserved
        gen = inode.data_gen
        temp = dst_tier.temp_blob(inode.ino)
        moved = False
        try:
            try:
                await trio.to_thread.run_sync(T.copy_blob, src_tier.blob(inode.ino), temp, mig.progress,
                                              lambda: mig.cancelled, abandon_on_cancel=False)
            except InterruptedError:
                self.counters.migrations_abandoned += 1
                return False
            if locked:
                moved = await self._switch(inode, mig, gen, temp)
            elif (lock := await self._acquire_for_switch(inode, mig)) is not None:
                try:
                    moved = await self._switch(inode, mig, gen, temp)
                finally:
                    lock.release()
            if not moved:
                self.counters.migrations_abandoned += 1
            return moved
        except OSError as exc:
            if mig.cancelled or not self.files.live(inode):
                # deleted under the copy (maybe_free removed its blobs): nothing to move
                self.counters.migrations_abandoned += 1
                return False
            self.counters.migrations_failed += 1
            log.error("migration of inode %d %s→%s failed: %s", inode.ino, mig.src, dst, exc)
            if exc.errno == errno.ENOSPC:
                return False
            raise
        finally:
            if not moved:
                # before the migration counts as over: a spill waiting on ``done`` stages
                # its own copy under the same temp name (O_EXCL) right after
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(T.remove_blob, temp)
            self._end(inode, mig)
            self.space.used -= reserved

    def _may_move(self, inode: Inode, dst: str, reason: str) -> bool:
        if (not inode.is_reg or inode.tier == dst or inode.migration is not None
                or not self.files.live(inode)):  # deleted since it was chosen
            return False
        # passthrough: the kernel writes the blob itself, so it must not move under an open
        return not (self.passthrough["enabled"]
                    and (inode.open_count and reason != "spill" or inode.ino in self.backed))

    def _begin(self, inode: Inode, dst: str, reason: str) -> Migration:
        self.blob_leaving(inode.ino)
        assert inode.tier is not None, "a regular file's bytes are on a tier"
        mig = Migration(inode.ino, inode.tier, dst, inode.size, reason)
        inode.migration = mig
        self.active[inode.ino] = mig
        return mig

    def _end(self, inode: Inode, mig: Migration) -> None:
        inode.migration = None
        self.active.pop(inode.ino, None)
        mig.done.set()

    async def _acquire_for_switch(self, inode: Inode, mig: Migration) -> trio.Lock | None:
        """Take the file's lock for the switch.  An eviction never waits for a writer;
        other migrations wait, but give up when cancelled (a spill of the same file
        cancels a promotion while it holds the lock, so a blocking wait could deadlock)."""
        lock = self.files.lock(inode)
        while True:
            try:
                lock.acquire_nowait()
                return lock
            except trio.WouldBlock:
                if mig.reason == "evict" or mig.cancelled:
                    return None
                await trio.sleep(0.005)

    async def _switch(self, inode: Inode, mig: Migration, gen: int, temp: str) -> bool:
        """The atomic switch: called with the inode lock held."""
        if inode.data_gen != gen or mig.cancelled or not self.files.live(inode):
            return False
        src_blob = self.tiers[mig.src].blob(inode.ino)
        dst_blob = self.tiers[mig.dst].blob(inode.ino)
        await trio.to_thread.run_sync(T.commit_blob, temp, dst_blob)
        if mig.cancelled or not self.files.live(inode):
            # deleted during the rename: maybe_free() may have run before the new name existed
            await trio.to_thread.run_sync(T.remove_blob, dst_blob)
            return False
        self._switched(inode, mig)
        # from here the metadata (or, if the commit fails, the recovery pass, which keeps
        # the copy the metadata names) decides; both copies are complete
        await self.files.ns.journal.sync()
        await trio.to_thread.run_sync(T.remove_blob, src_blob)
        self._count_done(inode, mig)
        return True

    def _switched(self, inode: Inode, mig: Migration) -> None:
        """The tier, the accounting and the policy switched together, before the commit
        awaits: a deletion (maybe_free) running during the commit must find them agreeing."""
        inode.tier = mig.dst
        self.blob_gens[inode.ino] = self.blob_gens.get(inode.ino, 0) + 1  # open fds are stale
        if mig.dst == T.FAST:
            self.space.used += inode.size
            # admitted as the most recently used: persist that, so a restart (which
            # re-admits in last-access order) rebuilds the same queue
            self.files.ns.access_seq += 1
            inode.last_access = self.files.ns.access_seq
            self.space.policy.admit(inode.ino, inode.size, max(1, inode.hits))
            self.counters.bytes_promoted += inode.size
        else:
            self.space.used -= inode.size
            self.space.policy.remove(inode.ino)
            self.counters.bytes_demoted += inode.size
        self.files.ns.journal.inode(inode.ino)

    def _count_done(self, inode: Inode, mig: Migration) -> None:
        self.counters.migrations_done += 1
        if mig.reason == "evict":
            self.counters.evictions += 1
        elif mig.reason == "spill":
            self.counters.spills += 1
        elif mig.dst == T.FAST:
            self.counters.promotions += 1
        log.debug("migrated inode %d %s→%s (%s, %s)", inode.ino, mig.src, mig.dst, mig.reason,
                  format_size(inode.size))

    # ------------------------------------------------------------------ group commit
    async def evict_batch(self, victims: list[Inode]) -> int:
        """Evict ``victims`` to the slow tier with one group commit; returns how many moved.

        The copies are staged at once and without an fsync; the files unchanged since
        (checked under their locks, taken without waiting: an eviction never waits for a
        writer) take their final names and are made durable by one ``syncfs`` of the slow
        tier (:func:`~hycache_agent.fs.tiers.commit_blobs`); then their tiers switch with
        one metadata commit, then their fast copies go.  Until that commit the metadata
        names the fast copies, complete and untouched: a crash at any point loses nothing
        (the recovery pass removes the slow ones).  A failed copy leaves its file where it
        was, a failed ``syncfs`` the whole batch."""
        batch = [(v, self._begin(v, T.SLOW, "evict"), v.data_gen) for v in victims
                 if self._may_move(v, T.SLOW, "evict")]
        staged: list[tuple[Inode, Migration, int]] = []
        locks: list[trio.Lock] = []
        moved: list[tuple[Inode, Migration]] = []
        try:
            if batch:
                await self._stage_batch(batch, staged)
                ready = self._lock_unchanged(staged, locks)
                if ready:
                    await self._commit_batch(ready, moved)
            return len(moved)
        finally:
            for lock in locks:
                lock.release()
            slow = self.tiers[T.SLOW]
            left = [path for inode, _mig, _gen in batch if inode.tier != T.SLOW
                    for path in (slow.temp_blob(inode.ino), slow.blob(inode.ino))]
            if left:  # before the migrations count as over (a spill stages under the same temp name)
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(T.remove_blobs, left)
            for inode, mig, _gen in batch:
                self._end(inode, mig)

    async def _stage_batch(self, batch: list[tuple[Inode, Migration, int]],
                           staged: list[tuple[Inode, Migration, int]]) -> None:
        """Copy each file of ``batch`` to its temp name on the slow tier, at once, without
        an fsync; those copied go into ``staged``."""
        fast, slow = self.tiers[T.FAST], self.tiers[T.SLOW]

        async def one(inode: Inode, mig: Migration, gen: int) -> None:
            copy = functools.partial(T.copy_blob, fast.blob(inode.ino), slow.temp_blob(inode.ino), mig.progress,
                                     lambda: mig.cancelled, durable=False)
            try:
                await trio.to_thread.run_sync(copy, abandon_on_cancel=False)
            except InterruptedError:
                self.counters.migrations_abandoned += 1
            except OSError as exc:
                if mig.cancelled or not self.files.live(inode):  # deleted under the copy
                    self.counters.migrations_abandoned += 1
                else:
                    self.counters.migrations_failed += 1
                    log.error("eviction of inode %d failed: %s", inode.ino, exc)
            else:
                staged.append((inode, mig, gen))

        async with trio.open_nursery() as nursery:
            for item in batch:
                nursery.start_soon(one, *item)

    def _lock_unchanged(self, staged: list[tuple[Inode, Migration, int]],
                        locks: list[trio.Lock]) -> list[tuple[Inode, Migration]]:
        """The staged files still to switch, their locks taken (into ``locks``): unchanged
        since their copy began, not deleted, no writer holding them."""
        ready = []
        for inode, mig, gen in staged:
            lock = self.files.lock(inode)
            if inode.data_gen == gen and not mig.cancelled and self.files.live(inode) and not lock.locked():
                lock.acquire_nowait()
                locks.append(lock)
                ready.append((inode, mig))
            else:
                self.counters.migrations_abandoned += 1
        return ready

    async def _commit_batch(self, ready: list[tuple[Inode, Migration]],
                            moved: list[tuple[Inode, Migration]]) -> None:
        """The group commit of ``ready`` (their locks held): the final names and one
        ``syncfs``, the switch, one metadata commit, the fast copies removed; the files
        switched go into ``moved``."""
        fast, slow = self.tiers[T.FAST], self.tiers[T.SLOW]
        renames = [(slow.temp_blob(inode.ino), slow.blob(inode.ino)) for inode, _mig in ready]
        try:
            await trio.to_thread.run_sync(T.commit_blobs, renames, slow.path)
        except OSError as exc:
            self.counters.migrations_failed += len(ready)
            log.error("the group commit of %d evictions failed: %s", len(ready), exc)
            return
        for inode, mig in ready:
            if mig.cancelled or not self.files.live(inode):  # deleted during the commit
                self.counters.migrations_abandoned += 1
                continue
            self._switched(inode, mig)
            moved.append((inode, mig))
        if not moved:
            return
        # from here the metadata (or, if the commit fails, the recovery pass, which keeps
        # the copy the metadata names) decides; both copies are complete
        await self.files.ns.journal.sync()
        await trio.to_thread.run_sync(T.remove_blobs, [fast.blob(inode.ino) for inode, _mig in moved])
        for inode, mig in moved:
            self._count_done(inode, mig)

    async def spill(self, inode: Inode) -> None:
        """Move the file being written to the slow tier (caller holds its lock)."""
        if inode.ino in self.backed:
            # the kernel writes this blob itself while it is open: it stays (over the
            # capacity) and the evictor makes room once it is closed
            return
        log.info("spilling inode %d (%s) to the slow tier: fast tier full", inode.ino, format_size(inode.size))
        for _ in range(3):
            if inode.migration is not None:  # a promotion, demotion or eviction got there first
                # cancel it whatever its direction: its switch needs the lock we hold, so
                # waiting for a demotion to finish would deadlock (the spill moves it anyway)
                inode.migration.cancelled = True
                await inode.migration.done.wait()
            if inode.tier == T.SLOW or await self.migrate(inode, T.SLOW, reason="spill", locked=True):
                return
            await self.blobs.reap_now()  # the slow device may still hold deleted files' bytes
        raise FsError(errno.ENOSPC)

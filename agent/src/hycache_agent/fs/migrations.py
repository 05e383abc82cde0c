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
        if (not inode.is_reg or inode.tier == dst or inode.migration is not None
                or not self.files.live(inode)):  # deleted since it was chosen
            return False
        if self.passthrough["enabled"] and (inode.open_count and reason != "spill" or inode.ino in self.backed):
            return False  # the kernel writes the blob itself: it must not move under an open
        self.blob_leaving(inode.ino)
        src = inode.tier
        assert src is not None, "a regular file's bytes are on a tier"
        src_tier, dst_tier = self.tiers[src], self.tiers[dst]
        mig = Migration(inode.ino, src, dst, inode.size, reason)
        inode.migration = mig
        self.active[inode.ino] = mig
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
            log.error("migration of inode %d %s→%s failed: %s", inode.ino, src, dst, exc)
            if exc.errno == errno.ENOSPC:
                return False
            raise
        finally:
            if not moved:
                # before the migration counts as over: a spill waiting on ``done`` stages
                # its own copy under the same temp name (O_EXCL) right after
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(T.remove_blob, temp)
            inode.migration = None
            self.active.pop(inode.ino, None)
            mig.done.set()
            self.space.used -= reserved

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
        # Switch the tier, the accounting and the policy together, before the commit
        # awaits: a deletion (maybe_free) running during the commit must find them agreeing.
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
        # from here the metadata (or, if the commit fails, the recovery pass, which keeps
        # the copy the metadata names) decides; both copies are complete
        await self.files.ns.journal.sync()
        await trio.to_thread.run_sync(T.remove_blob, src_blob)
        self.counters.migrations_done += 1
        if mig.reason == "evict":
            self.counters.evictions += 1
        elif mig.reason == "spill":
            self.counters.spills += 1
        elif mig.dst == T.FAST:
            self.counters.promotions += 1
        log.debug("migrated inode %d %s→%s (%s, %s)", inode.ino, mig.src, mig.dst, mig.reason,
                  format_size(inode.size))
        return True

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

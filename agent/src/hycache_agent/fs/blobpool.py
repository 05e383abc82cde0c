"""Blobs made and removed off the requests' path.

* The pool: empty fast-tier blobs made ahead of their create in batches by one background
  hop, so a create takes a ready blob and costs no thread hop.  With kernel passthrough
  each pool blob is also registered as a backing file ahead of its create (the FUSE
  layer's ``Backings``, set once the kernel accepted passthrough): ino -> what
  ``backing_pool.prepare`` returned, taken by the open of the create.
* The reaper: the blobs of freed inodes are removed in batches by one background task.

Unused pool blobs are removed at shutdown; after a crash they and the blobs not reaped yet
are orphans (blobs without an inode), which the engine's recovery pass removes.
"""

from __future__ import annotations

import errno
from typing import Any, Callable

import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError

BLOB_POOL_LOW = 32
BLOB_POOL_BATCH = 64


class BlobPool:
    def __init__(self, tiers: dict[str, T.Tier], passthrough: dict[str, Any]) -> None:
        self.tiers = tiers
        self.passthrough = passthrough  # the engine's passthrough state (read: "enabled")
        self._blob_pool: list[int] = []  # inode numbers with an empty blob ready on the fast tier
        # With passthrough, pool blobs are registered as backing files ahead of their
        # create (the FUSE layer's Backings, set once the kernel accepted passthrough), so
        # a create needs no thread hop at all: ino -> what backing_pool.prepare returned.
        self.backing_pool: Any = None
        self.pooled_backings: dict[int, Any] = {}
        self._doomed: list[str] = []  # blobs of freed inodes, removed in batches by reaper
        self._reaping: trio.Event | None = None  # set when a removal batch in flight is done
        self._reaper_wakeup = trio.Event()
        self._pool_wakeup = trio.Event()
        self.pool_filling: set[int] = set()  # inode numbers whose pool blobs are being made

    @property
    def ready(self) -> list[int]:
        """The inode numbers with an empty blob ready (the list itself: a create pops from
        it, and calls :meth:`refill_soon` when fewer than BLOB_POOL_LOW are left)."""
        return self._blob_pool

    def refill_soon(self) -> None:
        self._pool_wakeup.set()

    async def new_blob(self, ino: int) -> str:
        """Create an empty blob for a new file: on the fast tier, or the slow one if the
        fast file system itself is full."""
        for tier in (T.FAST, T.SLOW):
            try:
                await trio.to_thread.run_sync(T.create_blob, self.tiers[tier].blob(ino))
                return tier
            except OSError as exc:
                if exc.errno != errno.ENOSPC or tier == T.SLOW:
                    raise FsError(exc.errno) from exc
        raise AssertionError("unreachable")

    async def filler(self, allocate_ino: Callable[[], int]) -> None:
        """Keep empty fast-tier blobs ready so that a create costs one thread hop (the
        metadata commit) instead of two.  Unused ones are removed at shutdown, or by
        the recovery pass after a crash (they have no inode)."""
        fast = self.tiers[T.FAST]

        def make(inos: list[int], pool) -> list[tuple[int, Any]]:
            made = []
            for ino in inos:
                path = fast.blob(ino)
                try:
                    if pool is None:
                        T.create_blob(path)
                        made.append((ino, None))
                    else:  # made and registered with one open
                        made.append((ino, pool.prepare(path, create=True)))
                except OSError:
                    break
            return made

        while True:
            if len(self._blob_pool) < BLOB_POOL_LOW:
                inos = [allocate_ino() for _ in range(BLOB_POOL_BATCH)]
                self.pool_filling = set(inos)
                pool = self.backing_pool if self.passthrough["enabled"] else None
                try:
                    made = await trio.to_thread.run_sync(make, inos, pool)
                finally:
                    self.pool_filling = set()
                for ino, entry in made:
                    self._blob_pool.append(ino)
                    if entry is not None:
                        self.pooled_backings[ino] = entry
                if len(made) < len(inos):  # fast device full: try again later
                    await trio.sleep(1.0)
                continue
            await self._pool_wakeup.wait()
            self._pool_wakeup = trio.Event()

    def doom(self, ino: int) -> None:
        """A freed inode: its blobs (on whichever tier) go in the next removal batch."""
        self._doomed.extend(tier.blob(ino) for tier in self.tiers.values())
        self._reaper_wakeup.set()

    async def reaper(self) -> None:
        """Remove the blobs of freed inodes in batches, off the requests' path (a crash
        before that leaves orphans, which the recovery pass removes)."""
        while True:
            await self._reaper_wakeup.wait()
            self._reaper_wakeup = trio.Event()
            await self.reap_now()

    async def reap_now(self) -> bool:
        """Remove the blobs of freed inodes now.  Also called before a write or a spill
        gives up with ENOSPC: a device full of deleted files' bytes must not fail it.
        Returns whether anything was (being) removed."""
        reaping = self._reaping
        if reaping is not None:
            await reaping.wait()
        doomed, self._doomed = self._doomed, []
        if not doomed:
            return reaping is not None
        self._reaping = done = trio.Event()
        try:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: [T.remove_blob(b) for b in doomed])
        finally:
            self._reaping = None
            done.set()
        return True

    def close(self) -> None:
        """(blocking, at shutdown) Remove the unused pool blobs and the doomed ones."""
        for ino in self._blob_pool:  # unused pre-created blobs
            entry = self.pooled_backings.pop(ino, None)
            if entry is not None:
                self.backing_pool.discard(entry)
            T.remove_blob(self.tiers[T.FAST].blob(ino))
        self._blob_pool.clear()
        for path in self._doomed:
            T.remove_blob(path)
        self._doomed.clear()

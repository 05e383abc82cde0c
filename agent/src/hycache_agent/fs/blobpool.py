"""Blobs made and removed off the requests' path.

* The pool: empty fast-tier blobs made ahead of their create in batches by one background
  hop, so a create takes a ready blob and costs no thread hop.  With kernel passthrough
  each pool blob is also registered as a backing file ahead of its create (the FUSE
  layer's ``Backings``, set once the kernel accepted passthrough): ino -> what
  ``backing_pool.prepare`` returned, taken by the open of the create.  Blobs made before
  passthrough was accepted are registered by the next refill.  The refill starts below
  the pool's low watermark and fills it to twice that while creates keep coming (a job
  that served none ends it at the watermark: what follows a burst gets the cores); the
  watermark follows the create rate (twice the creates one refill had to serve, slowly
  lowered again, between BLOB_POOL_LOW and BLOB_POOL_MAX), so that the pool does not run
  empty while a refill is under way.
* The reserve: what the pool holds between bursts, beyond twice the low watermark — the
  configured floor (``blob_pool_reserve``) or the largest burst of creates of the last
  RESERVE_MEMORY seconds, whichever is larger, within the descriptor budget
  (:meth:`BlobPool.budget`).  A burst is the creates served since the pool last held its
  reserve.  The reserve is made by a second job on a thread of its own at a low CPU
  priority, beside the refill: between bursts it takes idle cores, and during one it is a
  second maker of blobs that yields to the requests.  A fresh file's blob costs an inode
  allocation and a registration (~100 µs of CPU here, docs/benchmarks.md); made ahead,
  a burst of creates up to the reserve costs what creates of recycled blobs cost.
* The reaper: the blobs of freed inodes are removed in batches by one background task, on
  a thread of its own at a low CPU priority (``transport.idle.BackgroundThreads``): its
  work is the kernel's (unlink, truncate, rename of blobs), which the requests of the same
  moment need the cores for; it runs in what they leave (a run of removals through the
  mount used to spend as much CPU in the reaper's syscalls as in the agent's loop).
* Recycling: a freed fast-tier file whose registration was parked (passthrough) gives its
  blob to the pool instead: emptied (``ftruncate``), renamed to a new inode number, still
  registered, in the reaper's batch.  A create then costs no ``open(O_CREAT)`` and no
  registration, and the removal no ``unlink`` and no unregistration (on this project's
  test machine, an ext4 without a journal, every inode allocation also scanned past the
  inodes deleted in the last seconds: ~100 µs of CPU a blob in a run of creates and
  removes, docs/benchmarks.md).  The pool takes as many as the parked registrations may
  hold (the registration and its descriptor move from one to the other).  Recycled blobs
  go on top of the pool and made ones beneath, so the next creates take what was freed.

Unused pool blobs are removed at shutdown; after a crash they and the blobs not reaped yet
are orphans (blobs without an inode), which the engine's recovery pass removes.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError
from hycache_agent.transport.idle import BackgroundThreads

log = logging.getLogger(__name__)

BLOB_POOL_LOW = 64  # the smallest low watermark (an idle agent keeps 2 x this ready)
BLOB_POOL_MAX = 1024  # the largest low watermark (each ready blob holds a descriptor with passthrough)
# ready blobs the pool keeps for the agent's own creates when it hands blobs to the FUSE
# reader (a create the reader's table declines: handing it every ready blob made that one
# find the pool empty and make its blob on the request path)
BLOB_POOL_KEEP = 8
BLOB_POOL_BATCH_MAX = 128  # blobs made per worker-thread job (one hop each): small enough that
# a job delivers its blobs before the pool is empty even on a loaded node (~0.25 ms a blob)
RESERVE_MEMORY = 600.0  # seconds a burst keeps the reserve at its size
RESERVE_TICK = 0.25  # seconds between the reserve job's looks at the pool
RESERVE_IDLE = 1.0  # seconds without creates and removals before the reserve is made
RESERVE_BUSY_RATE = 1000.0  # requests/s from which the node is busy: the reserve waits


def max_low() -> int:
    """The highest low watermark: BLOB_POOL_MAX, or less with a low descriptor limit (with
    passthrough every ready blob holds a descriptor, up to twice the watermark: at most a
    quarter of the limit, as many as the parked registrations may take)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return BLOB_POOL_MAX
    return max(BLOB_POOL_LOW, min(BLOB_POOL_MAX, soft // 8))


def next_low(low: int, served: int, most: int = BLOB_POOL_MAX) -> int:
    """The low watermark after a refill job during which ``served`` creates took (or found
    no) blob: twice that, so the next job starts while as many are still ready as the last
    one had to serve; lowered by at most 1/16 a job (a quick job after a slow one does not
    undo what the slow one taught), within [BLOB_POOL_LOW, ``most``]."""
    return min(most, max(BLOB_POOL_LOW, 2 * served, low - low // 16))


class BlobPool:
    def __init__(self, tiers: dict[str, T.Tier], passthrough: dict[str, Any], reserve: int = 0) -> None:
        self.tiers = tiers
        self.passthrough = passthrough  # the engine's passthrough state (read: "enabled")
        self._blob_pool: list[int] = []  # inode numbers with an empty blob ready on the fast tier
        # With passthrough, pool blobs are registered as backing files ahead of their
        # create (the FUSE layer's Backings, set once the kernel accepted passthrough), so
        # a create needs no thread hop at all: ino -> what backing_pool.prepare returned.
        self.backing_pool: Any = None
        self.pooled_backings: dict[int, Any] = {}
        # registered pool blobs handed to the FUSE reader for the CREATEs it answers itself
        # (:meth:`give`): ino -> the registration entry, until used or taken back
        self.given: dict[int, Any] = {}
        self.on_refilled: Callable[[], None] | None = None  # (the FUSE layer: restocks its reader)
        self._doomed: list[str] = []  # blobs of freed inodes, removed in batches by reaper
        # freed inodes' registered fast-tier blobs to recycle: (new ino, old path, fd, backing id)
        self._recycling: list[tuple[int, str, int, int]] = []
        self.allocate_ino: Callable[[], int] | None = None  # (set by filler)
        self.recycled = 0  # blobs recycled into the pool since start
        self._reaping: trio.Event | None = None  # set when a removal batch in flight is done
        self._reaper_thread = BackgroundThreads("hycache-reaper", count=1)
        self._reaper_wakeup = trio.Event()
        self._pool_wakeup = trio.Event()
        self.pool_filling: set[int] = set()  # inode numbers whose pool blobs are being made
        # the refill starts when fewer are ready (read by the create path; adapted by filler)
        self.low = BLOB_POOL_LOW
        self.max_low = max_low()
        self.misses = 0  # creates that found the pool empty (a thread hop for their blob)
        self.refills = 0  # worker-thread jobs of the refill
        self.reserve_floor = reserve  # the configured reserve (module docstring)
        # the FUSE layer asked the kernel for passthrough and has not probed it yet: the
        # reserve waits (blobs made before would all wait for one registering job)
        self.negotiating = False
        self.reserve_fills = 0  # jobs of the reserve's thread
        self._reserve_misses = 0  # misses when the reserve's job last looked
        self.requests: Callable[[], int] | None = None  # the node's requests so far (the engine's)
        self._reserve_thread = BackgroundThreads("hycache-pool", count=1)
        self._added = 0  # blobs put in the pool since start (made, registered, recycled)
        self._burst_base = 0  # creates served when the pool last held its reserve
        self._bursts: list[tuple[float, int]] = []  # (when, creates): the largest of each run

    @property
    def ready(self) -> list[int]:
        """The inode numbers with an empty blob ready (the list itself: a create pops from
        it, and calls :meth:`refill_soon` when fewer than :attr:`low` are left)."""
        return self._blob_pool

    def refill_soon(self) -> None:
        self._pool_wakeup.set()

    def budget(self) -> int:
        """How many blobs the pool may hold: with passthrough each holds a descriptor and a
        registration, as many as the parked registrations may (at least twice the highest
        low watermark)."""
        return max(2 * self.max_low, getattr(self.backing_pool, "max_parked", 0))

    def served(self) -> int:
        """Creates served since start: blobs taken from the pool (by the agent's creates or
        the reader's) and creates that found none."""
        return self._added - len(self._blob_pool) - len(self.given) + self.misses

    def reserve(self, now: float | None = None) -> int:
        """The blobs the pool holds between bursts (module docstring): at least twice the
        low watermark."""
        now = time.monotonic() if now is None else now
        remembered = max((n for t, n in self._bursts if t >= now - RESERVE_MEMORY), default=0)
        burst = self.served() - self._burst_base  # the burst under way, if any
        return max(2 * self.low, min(self.budget(), max(self.reserve_floor, remembered, burst)))

    def _follow_bursts(self, now: float) -> int:
        """(the reserve's job) :meth:`reserve`, after noting the bursts: one ends when the
        pool holds its reserve again, and is remembered RESERVE_MEMORY seconds (a larger
        one later replaces it)."""
        bursts = self._bursts  # (ended, creates): the sizes decrease, the times increase
        while bursts and bursts[0][0] < now - RESERVE_MEMORY:
            bursts.pop(0)
        want = self.reserve(now)
        if len(self._blob_pool) >= want:  # held again: the burst (if any) ended
            served = self.served()
            burst = served - self._burst_base
            if burst > 0:
                while bursts and bursts[-1][1] <= burst:
                    bursts.pop()
                bursts.append((now, burst))
            self._burst_base = served
        return want

    def status(self) -> dict[str, int]:
        """``status``'s ``blob_pool``: ready blobs (``registered``: of them, as backing
        files), the low watermark now, the reserve it holds between bursts, creates that
        found none, refill jobs (and the reserve's), blobs recycled."""
        registered = sum(1 for ino in self._blob_pool if ino in self.pooled_backings)
        return {"ready": len(self._blob_pool), "registered": registered, "low": self.low,
                "reserve": self.reserve(), "misses": self.misses, "refills": self.refills,
                "reserve_fills": self.reserve_fills, "recycled": self.recycled}

    async def new_blob(self, ino: int, *, register: bool = False) -> str:
        """Create an empty blob for a new file: on the fast tier, or the slow one if the
        fast file system itself is full.  ``register`` (a create that found the pool
        empty): with passthrough a fast-tier blob is also registered as a backing file in
        the same thread hop, as a pool blob is (``pooled_backings``, taken by the create's
        open) — one hop for the miss instead of two."""
        pool = self.backing_pool if register and self.passthrough["enabled"] else None
        for tier in (T.FAST, T.SLOW):
            path = self.tiers[tier].blob(ino)
            try:
                if tier == T.FAST and pool is not None:
                    await pool.room()
                    entry = await trio.to_thread.run_sync(pool.prepare, path, True)
                    if entry is not None:
                        self.pooled_backings[ino] = entry
                else:
                    await trio.to_thread.run_sync(T.create_blob, path)
                return tier
            except OSError as exc:
                if exc.errno != errno.ENOSPC or tier == T.SLOW:
                    raise FsError(exc.errno or errno.EIO) from exc
        raise AssertionError("unreachable")

    def _make(self, inos: list[int], pool: Any, register: list[int]) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
        """(a worker thread) Make the empty blobs of ``inos`` on the fast tier and, with
        passthrough (``pool``: the FUSE layer's Backings), register them, the whole batch
        in one call without the GIL; register the blobs of ``register`` (made before the
        kernel accepted passthrough).  What was made and what was registered: (ino, the
        registration or None); it stops at the first blob that could not be made."""
        fast = self.tiers[T.FAST]
        registered = [(ino, pool.prepare(fast.blob(ino))) for ino in register]
        made: list[tuple[int, Any]] = []
        if pool is not None:
            try:
                made.extend(zip(inos, pool.create_batch([fast.blob(ino) for ino in inos])))
            except OSError:
                pass
            return made, registered
        for ino in inos:
            try:
                T.create_blob(fast.blob(ino))
            except OSError:
                break
            made.append((ino, None))
        return made, registered

    def _put(self, made: list[tuple[int, Any]], *, restock: bool = True) -> None:
        """Put made blobs in the pool beneath the ones it holds (creates take from the top):
        recycled blobs go on top (:meth:`reap_now`), so a refill under way does not bury
        them under new ones for as long as creates keep coming."""
        self._blob_pool[:0] = [ino for ino, _entry in made]
        for ino, entry in made:
            if entry is not None:
                self.pooled_backings[ino] = entry
        self._added += len(made)
        if restock and self.on_refilled is not None:
            self.on_refilled()

    async def filler(self, allocate_ino: Callable[[], int]) -> None:
        """Keep empty fast-tier blobs ready so that a create costs no thread hop.  Unused
        ones are removed at shutdown, or by the recovery pass after a crash (they have no
        inode).  Below ``low`` ready blobs the pool is refilled to ``2 * low`` in jobs of at
        most BLOB_POOL_BATCH_MAX blobs on a worker thread, each job's blobs ready when it
        ends (the loop thread only allocates the inode numbers); ``low`` becomes twice the
        creates the last job had to serve meanwhile (:func:`next_low`), so a refill ends
        before the pool is empty.  A job during which no create came ends the refill once
        ``low`` are ready (the burst is over: the reserve's job makes the rest when the
        node is quiet).  Beside it, the reserve's job (:meth:`keep_reserve`)."""
        self.allocate_ino = allocate_ino
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.keep_reserve, allocate_ino)
            await self._refill(allocate_ino)

    async def _refill(self, allocate_ino: Callable[[], int]) -> None:
        ready = self._blob_pool
        registered_old = False  # the blobs made before passthrough was accepted
        filling = False  # below low: jobs until 2 x low are ready
        while True:
            pool = self.backing_pool if self.passthrough["enabled"] else None
            # blobs made before the kernel accepted passthrough: registered by this job,
            # out of the pool meanwhile (a create must not take one being registered)
            register: list[int] = []
            if pool is not None and not registered_old:
                registered_old = True
                register = [ino for ino in ready if ino not in self.pooled_backings]
                if register:
                    ready[:] = [ino for ino in ready if ino in self.pooled_backings]
                    self._added -= len(register)  # (put back by this job)
            filling = filling or len(ready) < self.low
            if (filling and len(ready) < 2 * self.low) or register:
                if pool is not None:  # each blob made holds a descriptor
                    await pool.room()
                want = max(0, min(2 * self.low - len(ready) - len(register), BLOB_POOL_BATCH_MAX))
                inos = [allocate_ino() for _ in range(want)]
                job = set(inos) | set(register)
                self.pool_filling |= job
                before, missed = len(ready), self.misses
                try:
                    made, registered = await trio.to_thread.run_sync(self._make, inos, pool, register)
                finally:
                    self.pool_filling -= job
                self.refills += 1
                # the creates while the job ran: those that took a blob and those that found none
                served = before - len(ready) + self.misses - missed
                self.low = next_low(self.low, served, self.max_low)
                self._put([*registered, *made])
                if len(made) < len(inos):  # fast device full: try again later
                    await trio.sleep(1.0)
                elif served == 0 and len(ready) >= self.low:
                    # no create came while the job ran: the burst is over, and what it
                    # taught the watermark is ready; the rest (to 2 x low, the reserve) is
                    # the reserve's job, at a low priority once the node is quiet, not
                    # this one's on the cores of what follows the burst (a run of stats)
                    filling = False
                continue
            filling = False
            await self._pool_wakeup.wait()
            self._pool_wakeup = trio.Event()

    async def keep_reserve(self, allocate_ino: Callable[[], int]) -> None:
        """Fill the pool to its reserve (:meth:`reserve`) in jobs of BLOB_POOL_BATCH_MAX
        on a thread of its own at a low CPU priority, beside the refill: once no create
        took a blob, no removal freed one and the node served fewer than RESERVE_BUSY_RATE
        requests a second for RESERVE_IDLE seconds (blobs made during a run of creates take
        cores from it, as from a run of stats or reads, and a run of removals that follows
        gives the pool recycled blobs, cheaper than new ones), or at once while creates
        find the pool empty (a second maker beside the refill).  Not before the kernel
        answered whether it takes passthrough (blobs made before would wait for one
        registering job)."""
        ready = self._blob_pool
        seen: tuple[int, ...] = ()
        quiet_since = last_look = time.monotonic()
        requests = self.requests() if self.requests is not None else 0
        while True:
            now = time.monotonic()
            want = self._follow_bursts(now)
            # creates served (a blob taken or none found), blobs recycled, blobs to remove;
            # and the node's request rate (a storm of stats or reads needs the cores too)
            activity = (self.served(), self.recycled + len(self._recycling), len(self._doomed))
            before, requests = requests, self.requests() if self.requests is not None else 0
            busy = requests - before > RESERVE_BUSY_RATE * max(now - last_look, 1e-3)
            last_look = now
            if activity != seen or self.reaping or busy:
                quiet_since = now
            seen = activity
            missing, self._reserve_misses = self.misses > self._reserve_misses, self.misses
            # (up to twice the low watermark the pool is the refill's alone)
            short = want - len(ready) - len(self.pool_filling) if want > 2 * self.low else 0
            if short <= 0 or self.negotiating or not (missing or now - quiet_since >= RESERVE_IDLE):
                await trio.sleep(RESERVE_TICK)
                continue
            pool = self.backing_pool if self.passthrough["enabled"] else None
            if pool is not None:
                await pool.room()
            inos = [allocate_ino() for _ in range(min(short, BLOB_POOL_BATCH_MAX))]
            self.pool_filling |= set(inos)
            made: list[tuple[int, Any]] = []
            try:
                await self._reserve_thread.run(
                    lambda inos, pool, _check: made.extend(self._make(inos, pool, [])[0]), inos, pool)
            except trio.Cancelled:
                # (at shutdown the job still ends, its blobs made: into the pool, where
                # close() removes them, not left for the next start's recovery as orphans)
                self._put(made, restock=False)
                raise
            finally:
                self.pool_filling -= set(inos)
            self.reserve_fills += 1
            self._put(made)
            if len(made) < len(inos):  # fast device full: try again later
                await trio.sleep(1.0)

    @property
    def reaping(self) -> bool:
        """Blobs of freed inodes wait for their removal batch or are being removed."""
        return bool(self._doomed) or self._reaping is not None

    def doom(self, ino: int, *, recycled: bool = False) -> None:
        """A freed inode: its blobs (on whichever tier) go in the next removal batch
        (``recycled``: but the fast tier's, which :meth:`recycle` took)."""
        self._doomed.extend(tier.blob(ino) for name, tier in self.tiers.items()
                            if not (recycled and name == T.FAST))
        self._reaper_wakeup.set()

    def may_recycle(self) -> bool:
        """Whether the pool takes a freed file's registered blob (:meth:`recycle`): while
        it holds fewer than the parked registrations may (the registration and its
        descriptor only move from one to the other), at least twice the low watermark."""
        return (self.allocate_ino is not None and self.passthrough["enabled"]
                and len(self._blob_pool) + len(self._recycling) < self.budget())

    def recycle(self, ino: int, fd: int, backing_id: int) -> None:
        """A freed inode's fast-tier blob, with its descriptor and backing id (its parked
        registration): emptied and renamed to a new pool blob in the next removal batch
        (:meth:`may_recycle` said yes)."""
        assert self.allocate_ino is not None, "may_recycle: the filler runs"
        self._recycling.append((self.allocate_ino(), self.tiers[T.FAST].blob(ino), fd, backing_id))
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
        recycling, self._recycling = self._recycling, []
        if not doomed and not recycling:
            return reaping is not None
        self._reaping = done = trio.Event()
        fast = self.tiers[T.FAST]
        jobs = [(fd, bid, old, fast.blob(new)) for new, old, fd, bid in recycling]
        try:
            with trio.CancelScope(shield=True):
                stats = await self._reaper_thread.run(_reap, doomed, jobs, self.backing_pool)
            for (new, _old, fd, bid), st in zip(recycling, stats):
                if st is None:  # (logged) could not be emptied or renamed: gone
                    continue
                self._blob_pool.append(new)
                self.pooled_backings[new] = (fd, bid, st)
                self.recycled += 1
                self._added += 1
        finally:
            self._reaping = None
            done.set()
        return True

    def give(self, n: int, put: Callable[[int, int, int], bool]) -> int:
        """Hand up to ``n`` ready blobs with their registrations to the FUSE reader
        (``put(ino, backing_id, fd)``), which creates files with them itself, keeping
        BLOB_POOL_KEEP for the agent's own creates: how many."""
        ready, given = self._blob_pool, 0
        while given < n and len(ready) > BLOB_POOL_KEEP:
            ino = ready[-1]
            entry = self.pooled_backings.get(ino)
            if entry is None or not put(ino, entry[1], entry[0]):
                break
            ready.pop()
            self.given[ino] = self.pooled_backings.pop(ino)
            given += 1
        if len(ready) < self.low:
            self.refill_soon()
        return given

    def used(self, ino: int) -> Any:
        """The registration entry of a given blob the reader made a file with."""
        return self.given.pop(ino)

    def taken_back(self, inos: list[int]) -> None:
        """Given blobs the reader did not use: ready again, with their registrations."""
        for ino in inos:
            entry = self.given.pop(ino, None)
            if entry is not None:
                self._blob_pool.append(ino)
                self.pooled_backings[ino] = entry

    def close(self) -> None:
        """(blocking, at shutdown) Remove the unused pool blobs and the doomed ones."""
        self.taken_back(list(self.given))  # (the reader is stopped: none is used any more)
        for ino in self._blob_pool:  # unused pre-created blobs
            entry = self.pooled_backings.pop(ino, None)
            if entry is not None:
                self.backing_pool.discard(entry)
            T.remove_blob(self.tiers[T.FAST].blob(ino))
        self._blob_pool.clear()
        for path in self._doomed:
            T.remove_blob(path)
        self._doomed.clear()


def _remove_blobs(paths: list[str]) -> None:
    for path in paths:
        T.remove_blob(path)


def _settle_truncation(path: str) -> None:
    """Open and close the blob just emptied: ext4 (with its default ``auto_da_alloc``) marks
    a file truncated to size 0 so that the next release of one of its open files flushes
    its delayed allocations (``EXT4_STATE_DA_ALLOC_CLOSE``: the replace-by-truncate
    pattern's safety net), and that release would otherwise be the close(2) of the create
    that takes this blob — block allocation and the data's writeback started inside the
    application's close (~20 µs more a create, docs/benchmarks.md).  Released here with
    nothing written, it costs an open and a close on the reaper's thread."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:  # (then the create's close pays for it)
        log.debug("settling the truncation of %s: %s", path, exc)


def _reap(paths: list[str], recycle: list[tuple[int, int, str, str]], backings: Any,
          _check: Callable[[], None]) -> list[Any]:
    """(the reaper's thread) Remove ``paths``; empty each recycled blob (by its descriptor)
    and rename it from its old path to its new one: its ``os.stat_result`` now, or None
    where that failed (then its registration is dropped and the blob removed).  (Runs
    shielded from cancellation: ``_check`` is never needed.)"""
    _remove_blobs(paths)
    out: list[Any] = []
    for fd, bid, old, new in recycle:
        try:
            os.ftruncate(fd, 0)
            os.rename(old, new)
            _settle_truncation(new)
            out.append(os.fstat(fd))
        except OSError as exc:
            log.warning("recycling blob %s as %s: %s (removed)", old, new, exc)
            backings.discard((fd, bid, None))
            T.remove_blob(old)
            out.append(None)
    return out

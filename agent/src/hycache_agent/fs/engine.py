"""The tiering engine: owns the tiers, the namespace, space accounting and migrations.

Placement follows Algorithms 1–3 of the HyCache papers, with an inode store instead of
symlink stubs (see :mod:`hycache_agent.fs.tiers`):

* new data lands on the fast tier; a write that does not fit first evicts closed,
  unpinned files in policy order, and if that is not enough *spills*: the file being
  written moves to the slow tier and the write continues there (never ENOSPC while the
  slow tier has room);
* above the high watermark a background evictor moves files to the slow tier until the
  low watermark;
* opening an evicted file reads through from the slow tier at once and promotes it in
  the background (reads never wait for a multi-GB copy);
* a migration is stage (O_EXCL temp) → copy → fsync file and dir → atomic switch
  (rename + metadata commit) → remove the old copy.  Writes during the copy bump the
  inode's data generation and the switch is abandoned, so an open file is never
  corrupted.  :meth:`TieringEngine.recover` resolves whatever a crash left behind.

Every blocking call runs in a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from hycache_core.policies import OnlinePolicy, load_policy
from hycache_core.sizes import format_size

from hycache_agent.fs import tiers as T
from hycache_agent.config import AgentConfig
from hycache_agent.fs.lane import Lane
from hycache_agent.fs.metastore import MetaJournal, SQLiteStore
from hycache_agent.fs.namespace import ROOT_INO, FsError, Inode, Namespace, check_name, now_ns

log = logging.getLogger(__name__)

O_ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
BLOB_POOL_LOW = 32
_HAVE_NOWAIT = hasattr(os, "RWF_NOWAIT") and hasattr(os, "preadv")
BLOB_POOL_BATCH = 64
# a change that only other nodes wait for (a size at close, in a cluster) is committed
# this soon, unless the next operation's commit takes it first (then it costs no commit)
COMMIT_SHORTLY_SECONDS = 0.005
STATUS_SLICE = 20_000  # inodes counted by status() between two yields to the event loop


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


@dataclass(eq=False)
class Handle:
    inode: Inode
    flags: int
    uid: int
    tier: str | None = None
    fd: int = -1
    blob_gen: int = -1  # the inode's blob generation when fd was opened
    # Descriptors replaced after a migration stay open until release: a worker thread
    # may still be reading through one, and a closed number could be reused at once.
    stale_fds: list[int] = field(default_factory=list)
    reopen_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def writable(self) -> bool:
        return (self.flags & O_ACCMODE) != os.O_RDONLY

    def fd_for(self, path: str, tier: str, gen: int) -> int:
        """(worker thread) The descriptor for the blob at ``path``, opened on first use
        and re-opened when the file moved to another tier or blob generation."""
        with self.reopen_lock:
            if self.fd < 0 or self.tier != tier or self.blob_gen != gen:
                mode = os.O_RDWR if self.writable else os.O_RDONLY
                fd = os.open(path, mode | os.O_CLOEXEC)
                if self.fd >= 0:
                    self.stale_fds.append(self.fd)
                self.fd, self.tier, self.blob_gen = fd, tier, gen
            return self.fd

    def close_all(self) -> None:
        """(worker thread, at release)"""
        for fd in [self.fd, *self.stale_fds]:
            if fd >= 0:
                os.close(fd)
        self.fd = -1
        self.stale_fds = []


@dataclass
class Counters:
    migrations_done: int = 0
    migrations_failed: int = 0
    migrations_abandoned: int = 0
    bytes_promoted: int = 0
    bytes_demoted: int = 0
    spills: int = 0
    evictions: int = 0
    promotions: int = 0


class TierIO:
    """Cumulative I/O of one tier since the agent started (plain integer increments on the
    event loop thread: negligible per read)."""

    __slots__ = ("read_bytes", "write_bytes", "reads", "writes", "hits")

    def __init__(self) -> None:
        self.read_bytes = self.write_bytes = self.reads = self.writes = self.hits = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class IOStats:
    """The engine's measured counters (the control plane's heartbeat ``counters``).

    A *hit* is an open for reading of a file whose bytes are on the fast tier; a *miss*
    one whose bytes are on the slow tier or on another node (``tiers[slow].hits`` counts
    the slow-tier ones, ``remote_opens`` the others)."""

    __slots__ = ("tiers", "misses", "remote_read_bytes", "remote_opens", "metadata_ops")

    def __init__(self) -> None:
        self.tiers = {T.FAST: TierIO(), T.SLOW: TierIO()}
        self.misses = self.remote_read_bytes = self.remote_opens = self.metadata_ops = 0


POLICY_FILE = "policy.json"


class PolicyError(ValueError):
    """A policy setting that cannot be applied (unknown policy, bad watermarks)."""


def validate_policy(policy: str, high: float, low: float) -> None:
    from hycache_core.policies import available_policies

    if policy not in available_policies():
        raise PolicyError(f"policy: unknown policy {policy!r}; available: {', '.join(available_policies())}")
    if not (isinstance(high, (int, float)) and 0 < high <= 1):
        raise PolicyError(f"high_watermark: must be in (0, 1], got {high!r}")
    if not (isinstance(low, (int, float)) and 0 <= low < 1):
        raise PolicyError(f"low_watermark: must be in [0, 1), got {low!r}")
    if low >= high:
        raise PolicyError(f"low_watermark ({low}) must be below high_watermark ({high})")


def write_json_atomic(path: Path, obj: Any) -> None:
    """(blocking) Write ``obj`` as JSON to ``path``: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(obj, indent=1).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    T.fsync_dir(str(path))


class TieringEngine:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.tiers = {T.FAST: T.Tier(T.FAST, config.fast_dir), T.SLOW: T.Tier(T.SLOW, config.slow_dir)}
        self.policy: OnlinePolicy = load_policy(config.policy)
        self.store: SQLiteStore | None = None
        self.ns: Namespace | None = None
        self.capacity = 0
        # logical bytes of fast-tier files, plus reservations of promotions, plus the local
        # copies of other nodes' files under fast/remote-cache/ (remote_cache_used of it)
        self.fast_used = 0
        self.remote_cache_used = 0
        self.handles: dict[int, Handle] = {}
        self._fh = itertools.count(1)
        self._locks: dict[int, trio.Lock] = {}
        # bumped by every tier switch: a handle's fd is stale when its generation differs,
        # even if the tier *name* matches again (slow→fast→slow)
        self._blob_gens: dict[int, int] = {}
        self._blob_pool: list[int] = []  # inode numbers with an empty blob ready on the fast tier
        # With passthrough, pool blobs are registered as backing files ahead of their
        # create (the FUSE layer's Backings, set once the kernel accepted passthrough), so
        # a create needs no thread hop at all: ino -> what backing_pool.prepare returned.
        self.backing_pool: Any = None
        self.pooled_backings: dict[int, Any] = {}
        self._doomed: list[str] = []  # blobs of freed inodes, removed in batches by _reaper
        self._reaping: trio.Event | None = None  # set when a removal batch in flight is done
        self.lanes: list[Lane] = []  # worker threads whose callbacks come back drained (lane.py)
        self._reaper_wakeup = trio.Event()
        self._pool_wakeup = trio.Event()
        self._commit_shortly = trio.Event()
        self.pool_filling: set[int] = set()  # inode numbers whose pool blobs are being made
        self.active: dict[int, Migration] = {}
        self.counters = Counters()
        self.io = IOStats()
        self.policy_version = 0  # the control plane's policy version applied (0: none)
        self.device_capacity = 0
        self.control = None  # control_link.ControlLink when linked to a control plane
        self._census_cache: tuple[float, float, Any] | None = None  # (when, seconds taken, counts)
        self.cluster = None  # cluster.ClusterLink when the agent joins a global namespace
        self.on_file_created = None  # (cluster) called with each regular file create_file makes
        self._nursery: trio.Nursery | None = None
        self._evict_wakeup = trio.Event()
        self.started = time.time()
        # kernel FUSE passthrough (set by the FUSE layer once the kernel accepted it): the
        # agent sees no reads or writes, so a file is migrated only while nobody holds it
        self.passthrough: dict[str, Any] = {"enabled": False, "reason": "not negotiated yet"}
        self._idle: dict[int, trio.Event] = {}  # ino -> set when its last handle is released
        self.backed: set[int] = set()  # inodes whose blob the kernel holds (a backing id)

    # ------------------------------------------------------------------ start-up
    def start(self) -> dict[str, int]:
        """Blocking start-up (before the event loop serves requests): create the tier
        directories, load the metadata, run the recovery pass, rebuild the policy."""
        for tier in self.tiers.values():
            tier.path.mkdir(parents=True, exist_ok=True)
            tier.prepare()
        self.store = SQLiteStore(self.config.state_dir / "meta.db")
        self.ns = Namespace(lambda row: MetaJournal(self.store, row))
        self.ns.load(self.store.load(), os.getuid(), os.getgid())
        saved = self.load_saved_policy()
        if saved is not None:
            self.config.policy = saved["policy"]
            self.config.high_watermark = saved["high_watermark"]
            self.config.low_watermark = saved["low_watermark"]
            self.policy_version = saved["version"]
            log.info("running the saved control-plane policy version %d: %s, watermarks %.2f/%.2f",
                     self.policy_version, saved["policy"], saved["high_watermark"], saved["low_watermark"])
        report = self.recover()  # first: it fixes the sizes the capacity counts
        fast_vfs = self.tiers[T.FAST].statvfs()
        self.device_capacity = fast_vfs.f_blocks * fast_vfs.f_frsize
        if self.config.fast_capacity:
            self.capacity = self.config.fast_capacity
        else:
            # what the agent can really use: its own files plus the free space (another
            # tenant's files on the same file system are not ours to count)
            own = sum(i.size for i in self.ns.inodes.values() if i.is_reg and i.tier == T.FAST)
            self.capacity = min(self.device_capacity, own + fast_vfs.f_bavail * fast_vfs.f_frsize)
        self.policy = load_policy(self.config.policy, capacity=self.capacity)  # size-aware ones want it
        resident = sorted((i for i in self.ns.inodes.values() if i.is_reg and i.tier == T.FAST),
                          key=lambda i: i.last_access)
        for inode in resident:  # the policy queue in last-access order
            self.policy.admit(inode.ino, inode.size, max(1, inode.hits))
        self.fast_used = sum(i.size for i in resident)
        self.ns.journal.sync_blocking()
        return report

    def recover(self) -> dict[str, int]:
        """Resolve what a crash left: staged copies, duplicate copies of a migrated file,
        blobs of deleted inodes, nameless inodes; refresh sizes from the blobs."""
        ns = self.ns
        report = {"temp_removed": 0, "duplicates_removed": 0, "orphan_blobs_removed": 0,
                  "orphan_inodes_removed": 0, "missing_blobs": 0, "sizes_fixed": 0}
        referenced = {ino for entries in ns.children.values() for ino in entries.values()}
        for inode in list(ns.inodes.values()):
            if inode.ino != ROOT_INO and (inode.nlink <= 0 or inode.ino not in referenced):
                ns.forget_inode(inode)
                report["orphan_inodes_removed"] += 1
        for tier in self.tiers.values():
            for path, ino, temp in tier.scan():
                inode = ns.inodes.get(ino) if ino is not None else None
                if temp:
                    T.remove_blob(path)
                    report["temp_removed"] += 1
                elif inode is None or not inode.is_reg:
                    T.remove_blob(path)
                    report["orphan_blobs_removed"] += 1
                elif inode.tier != tier.name:
                    # the switch committed (or never did) — the metadata names the copy to keep
                    other = self.tiers[inode.tier] if inode.tier in self.tiers else None
                    if other is not None and os.path.exists(other.blob(inode.ino)):
                        T.remove_blob(path)
                        report["duplicates_removed"] += 1
                    else:  # only this copy exists: adopt it (never lose bytes)
                        inode.tier = tier.name
                        ns.journal.inode(inode.ino)
        for inode in ns.inodes.values():
            if not inode.is_reg:
                continue
            try:
                st = os.stat(self.tiers[inode.tier].blob(inode.ino))
            except (FileNotFoundError, KeyError):
                log.error("inode %d (%r): its bytes are missing on every tier; recreated empty",
                          inode.ino, ns.path_of(inode.ino))
                inode.tier = T.FAST
                T.create_blob(self.tiers[T.FAST].blob(inode.ino))
                inode.size = 0
                ns.journal.inode(inode.ino)
                report["missing_blobs"] += 1
                continue
            if st.st_size != inode.size:
                inode.size = st.st_size
                ns.journal.inode(inode.ino)
                report["sizes_fixed"] += 1
        if any(report.values()):
            log.warning("recovery: %s", report)
        return report

    async def run(self, nursery: trio.Nursery) -> None:
        """Start the background tasks (evictor, periodic metadata flush)."""
        self._nursery = nursery
        nursery.start_soon(self._evictor)
        nursery.start_soon(self._flusher)
        nursery.start_soon(self._blob_pool_filler)
        nursery.start_soon(self._reaper)
        for lane in [self.ns.journal.lane, *self.lanes]:
            nursery.start_soon(lane.drainer)
        self._check_watermark()

    def close(self) -> None:
        self._nursery = None  # the event loop is gone: what the lanes' callbacks record is
        for lane in self.lanes:  # committed by sync_blocking() below
            lane.close()
        for h in self.handles.values():
            h.close_all()
        self.handles.clear()
        for ino in self._blob_pool:  # unused pre-created blobs
            entry = self.pooled_backings.pop(ino, None)
            if entry is not None:
                self.backing_pool.discard(entry)
            T.remove_blob(self.tiers[T.FAST].blob(ino))
        self._blob_pool.clear()
        for path in self._doomed:
            T.remove_blob(path)
        self._doomed.clear()
        if self.ns is not None:
            self.ns.journal.counter("access_seq", self.ns.access_seq)
            self.ns.journal.sync_blocking()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ helpers
    def lock(self, inode: Inode) -> trio.Lock:
        lock = self._locks.get(inode.ino)
        if lock is None:
            lock = self._locks[inode.ino] = trio.Lock()
        return lock

    def blob_gen(self, ino: int) -> int:
        """Bumped by every tier switch of the inode: its blob is another file then."""
        return self._blob_gens.get(ino, 0)

    def _blob_leaving(self, ino: int) -> None:
        """The inode's blob is about to move or go: the FUSE layer drops the registration
        it may have kept for it after the last release (passthrough.Backings.parked)."""
        if self.backing_pool is not None:
            self.backing_pool.forget_parked(ino)

    def blob(self, inode: Inode) -> str:
        return self.tiers[inode.tier].blob(inode.ino)

    def _read_cached(self, h: Handle, off: int, size: int) -> bytes | None:
        """Read on the event loop thread only if the bytes are already in the page cache
        (``RWF_NOWAIT`` fails with EAGAIN instead of waiting for the disk), so the loop
        never blocks; None means "go to a worker thread"."""
        inode = h.inode
        if (not _HAVE_NOWAIT or h.fd < 0 or h.tier != inode.tier
                or h.blob_gen != self._blob_gens.get(inode.ino, 0)):
            return None
        buf = bytearray(size)
        try:
            n = os.preadv(h.fd, [buf], off, os.RWF_NOWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return None
            raise
        if n < size and off + n < inode.size:  # partly cached: a short reply would read as EOF
            return None
        return bytes(memoryview(buf)[:n])

    async def _io(self, h: Handle, fn, *args):
        """Run ``fn(fd, *args)`` in a worker thread on the handle's descriptor for the
        blob that holds the file now: one thread hop, including a (re)open after a
        migration moved the file.  Reads take no lock: a migration may switch and remove
        the chosen blob before the worker opens it (ENOENT); then the current one serves."""
        inode = h.inode
        while True:
            tier, gen = inode.tier, self._blob_gens.get(inode.ino, 0)
            path = self.tiers[tier].blob(inode.ino)

            def job(path=path, tier=tier, gen=gen):
                return fn(h.fd_for(path, tier, gen), *args)

            try:
                return await trio.to_thread.run_sync(job)
            except FileNotFoundError:
                if (inode.tier, self._blob_gens.get(inode.ino, 0)) == (tier, gen):
                    raise  # not moved meanwhile: a real ENOENT

    def _evictable(self, inode: Inode | None) -> bool:
        """May the evictor move this file now?  Not if pinned, open, being migrated or
        locked by a writer (checked again when a chosen victim's turn comes)."""
        return (inode is not None and inode.tier == T.FAST and not inode.pinned and not self._held(inode)
                and inode.migration is None and self.ns.inodes.get(inode.ino) is inode
                and not self._locks.get(inode.ino, _UNLOCKED).locked())

    def eviction_candidates(self, exclude: Inode | None = None):
        for ino in self.policy.eviction_order():
            inode = self.ns.inodes.get(ino)
            if inode is not exclude and self._evictable(inode):
                yield inode

    async def _room_for(self, nbytes: int, exclude: Inode | None) -> bool:
        """Make ``nbytes`` fit on the fast tier, evicting closed files if needed."""
        if self.fast_used + nbytes <= self.capacity:
            return True
        if nbytes > self.capacity:
            return False
        for victim in list(itertools.islice(self.eviction_candidates(exclude), 64)):
            if self.fast_used + nbytes <= self.capacity:
                break
            await self.migrate(victim, T.SLOW, reason="evict")
        return self.fast_used + nbytes <= self.capacity

    def _check_watermark(self) -> None:
        if self.fast_used > self.config.high_watermark * self.capacity:
            self._evict_wakeup.set()

    async def _evictor(self) -> None:
        while True:
            await self._evict_wakeup.wait()
            self._evict_wakeup = trio.Event()
            target = self.config.low_watermark * self.capacity
            failures = 0
            while self.fast_used > target:
                victim = next(self.eviction_candidates(), None)
                if victim is None:
                    break
                try:
                    moved = await self.migrate(victim, T.SLOW, reason="evict")
                except OSError as exc:  # the slow tier failed (EIO, vanished): keep serving
                    log.error("eviction of inode %d failed: %s", victim.ino, exc)
                    moved = False
                if moved:
                    failures = 0
                else:  # back off: a full or failing slow tier must not become a busy loop
                    failures += 1
                    await trio.sleep(min(2.0, 0.05 * 2 ** min(failures - 1, 6)))

    async def _flusher(self) -> None:
        while True:
            with trio.move_on_after(1.0):  # what rides on no other commit (times, heat)
                await self._commit_shortly.wait()
            if self._commit_shortly.is_set():
                self._commit_shortly = trio.Event()
                await trio.sleep(COMMIT_SHORTLY_SECONDS)
            self.ns.journal.commit_soon()

    def commit_shortly(self) -> None:
        """Commit what is recorded within COMMIT_SHORTLY_SECONDS: with a stream of
        operations it rides on the next one's commit."""
        self._commit_shortly.set()

    def commit_soon(self) -> None:
        """Commit what is recorded so far in the background: the caller answers the kernel
        at once, and the commit overlaps with the application's next steps.  Names made
        this way are durable within a commit's time; a writer's close waits for its file's
        name (:meth:`flush`), fsync and fsyncdir for everything."""
        if self._nursery is not None:  # (not serving yet: the next sync takes it)
            self.ns.journal.commit_soon()

    async def _reaper(self) -> None:
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

    # ------------------------------------------------------------------ migration
    async def migrate(self, inode: Inode, dst: str, *, reason: str, locked: bool = False) -> bool:
        """Move a regular file's bytes to tier ``dst``.  Returns True if it moved.

        ``locked``: the caller holds the inode's lock (a spill from inside a write)."""
        if (not inode.is_reg or inode.tier == dst or inode.migration is not None
                or self.ns.inodes.get(inode.ino) is not inode):  # deleted since it was chosen
            return False
        if reason == "evict" and not self._evictable(inode):  # opened since it was chosen
            return False
        if self.passthrough["enabled"] and (inode.open_count and reason != "spill" or inode.ino in self.backed):
            return False  # the kernel writes the blob itself: it must not move under an open
        self._blob_leaving(inode.ino)
        src = inode.tier
        src_tier, dst_tier = self.tiers[src], self.tiers[dst]
        mig = Migration(inode.ino, src, dst, inode.size, reason)
        inode.migration = mig
        self.active[inode.ino] = mig
        reserved = 0
        if dst == T.FAST:
            reserved = inode.size
            self.fast_used += reserved
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
            if mig.cancelled or self.ns.inodes.get(inode.ino) is not inode:
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
            self.fast_used -= reserved

    async def _acquire_for_switch(self, inode: Inode, mig: Migration) -> trio.Lock | None:
        """Take the file's lock for the switch.  An eviction never waits for a writer;
        other migrations wait, but give up when cancelled (a spill of the same file
        cancels a promotion while it holds the lock, so a blocking wait could deadlock)."""
        lock = self.lock(inode)
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
        if inode.data_gen != gen or mig.cancelled or self.ns.inodes.get(inode.ino) is not inode:
            return False
        src_blob = self.tiers[mig.src].blob(inode.ino)
        dst_blob = self.tiers[mig.dst].blob(inode.ino)
        await trio.to_thread.run_sync(T.commit_blob, temp, dst_blob)
        if mig.cancelled or self.ns.inodes.get(inode.ino) is not inode:
            # deleted during the rename: maybe_free() may have run before the new name existed
            await trio.to_thread.run_sync(T.remove_blob, dst_blob)
            return False
        # Switch the tier, the accounting and the policy together, before the commit
        # awaits: a deletion (maybe_free) running during the commit must find them agreeing.
        inode.tier = mig.dst
        self._blob_gens[inode.ino] = self._blob_gens.get(inode.ino, 0) + 1  # open fds are stale
        if mig.dst == T.FAST:
            self.fast_used += inode.size
            # admitted as the most recently used: persist that, so a restart (which
            # re-admits in last-access order) rebuilds the same queue
            self.ns.access_seq += 1
            inode.last_access = self.ns.access_seq
            self.policy.admit(inode.ino, inode.size, max(1, inode.hits))
            self.counters.bytes_promoted += inode.size
        else:
            self.fast_used -= inode.size
            self.policy.remove(inode.ino)
            self.counters.bytes_demoted += inode.size
        self.ns.journal.inode(inode.ino)
        # from here the metadata (or, if the commit fails, the recovery pass, which keeps
        # the copy the metadata names) decides; both copies are complete
        await self.ns.journal.sync()
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

    def start_migration(self, inode: Inode, dst: str, reason: str) -> bool:
        """Start a migration in the background (promotion on open, xattr/CLI requests)."""
        if not inode.is_reg or self._nursery is None:
            return False
        if inode.migration is not None:
            if inode.migration.dst == dst:
                return True  # already on its way
        elif inode.tier == dst:
            return False
        self._nursery.start_soon(self._background_migration, inode, dst, reason)
        return True

    async def _background_migration(self, inode: Inode, dst: str, reason: str) -> None:
        try:
            await self.move_now(inode, dst, reason)
        except Exception:
            log.exception("background migration of inode %d failed", inode.ino)

    async def move_now(self, inode: Inode, dst: str, reason: str) -> str | None:
        """Move a file to tier ``dst`` and wait for it: None once it is there, else why not."""
        # a migration in flight the other way (e.g. the tail of a demotion when the
        # file is opened again) finishes first; then this one decides afresh
        while inode.migration is not None or self.passthrough["enabled"] and self._held(inode):
            if inode.migration is not None:
                await inode.migration.done.wait()
            else:  # passthrough: the blob moves only once the last handle is gone
                await self._idle_event(inode).wait()
            if self.ns.inodes.get(inode.ino) is not inode:
                return "the file was deleted"
        if self.ns.inodes.get(inode.ino) is not inode:
            return "the file was deleted"
        if inode.tier == dst:
            return None
        if dst == T.FAST and not await self._room_for(inode.size, inode):
            log.info("not promoting inode %d (%s): no room on the fast tier", inode.ino,
                     format_size(inode.size))
            return f"no room on the fast tier for {format_size(inode.size)}"
        try:
            moved = await self.migrate(inode, dst, reason=reason)
        except OSError as exc:
            return f"migration failed: {exc}"
        self._check_watermark()
        if moved or inode.tier == dst:
            return None
        if inode.tier != dst and inode.migration is not None and inode.migration.dst == dst:
            await inode.migration.done.wait()  # another request moved it meanwhile
            return None if inode.tier == dst else "the file changed during the copy"
        return "no room on the " + dst + " tier, or the file changed during the copy"

    # ------------------------------------------------------------------ files
    async def _new_blob(self, ino: int) -> str:
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

    async def _blob_pool_filler(self) -> None:
        """Keep empty fast-tier blobs ready so that a create costs one thread hop (the
        metadata commit) instead of two.  Unused ones are removed at shutdown, or by
        the recovery pass after a crash (they have no inode)."""
        fast = self.tiers[T.FAST]

        def make(inos: list[int], pool) -> list[tuple[int, Any]]:
            made = []
            for ino in inos:
                try:
                    T.create_blob(fast.blob(ino))
                except OSError:
                    break
                made.append((ino, pool.prepare(fast.blob(ino)) if pool is not None else None))
            return made

        while True:
            if len(self._blob_pool) < BLOB_POOL_LOW:
                inos = [self.ns.allocate_ino() for _ in range(BLOB_POOL_BATCH)]
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

    async def create_file(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
                          rdev: int = 0) -> Inode:
        """A new file and its name.  The name is committed in the background
        (:meth:`commit_soon`): a create costs no thread hop when the pool has a blob."""
        ns = self.ns
        check_name(name)
        if name in ns.dir(parent):
            raise FsError(errno.EEXIST)
        if stat.S_ISREG(mode) and self._blob_pool:
            ino, tier = self._blob_pool.pop(), T.FAST
            if len(self._blob_pool) < BLOB_POOL_LOW:
                self._pool_wakeup.set()
        else:
            ino = ns.allocate_ino()
            tier = await self._new_blob(ino) if stat.S_ISREG(mode) else None
        try:
            inode = ns.new_inode(parent, name, mode, uid, gid, rdev=rdev, tier=tier, ino=ino)
        except FsError:
            entry = self.pooled_backings.pop(ino, None)
            if entry is not None:
                await trio.to_thread.run_sync(self.backing_pool.discard, entry)
            if tier is not None:
                await trio.to_thread.run_sync(T.remove_blob, self.tiers[tier].blob(ino))
            raise
        if tier == T.FAST:
            self.policy.admit(inode.ino, 0)
        if self.on_file_created is not None and stat.S_ISREG(mode):
            self.on_file_created(inode)  # (cluster) rides on the same commit
        self.commit_soon()
        return inode

    async def adopt_file(self, parent: int, name: bytes, attrs, src: str | None, taken_from: str) -> Inode:
        """A new local file whose bytes already exist: a file taken over from node
        ``taken_from``.  ``src`` (a file on the fast tier's file system, or None for an
        empty file) becomes its blob; owner, mode and times come from ``attrs``.  Nothing
        is committed here."""
        check_name(name)
        if name in self.ns.dir(parent):
            raise FsError(errno.EEXIST)
        ino = self.ns.allocate_ino()
        if src is None:
            tier = await self._new_blob(ino)
            size = 0
        else:
            tier, blob = T.FAST, self.tiers[T.FAST].blob(ino)

            def place() -> int:
                size = os.stat(src).st_size
                os.rename(src, blob)
                return size

            size = await trio.to_thread.run_sync(place)
        inode = self.ns.new_inode(parent, name, stat.S_IFREG | stat.S_IMODE(attrs.mode), attrs.uid, attrs.gid,
                                  tier=tier, ino=ino, taken_from=taken_from)
        inode.size = size
        inode.atime_ns, inode.mtime_ns, inode.ctime_ns = attrs.atime_ns, attrs.mtime_ns, attrs.ctime_ns
        if tier == T.FAST:
            self.fast_used += size
            self.policy.admit(inode.ino, size)
        self._check_watermark()  # too big for the fast tier: the evictor moves it once closed
        return inode

    def _held(self, inode: Inode) -> bool:
        """Open, or (passthrough) its blob still registered with the kernel: its final size
        is known only once the FUSE layer has dropped the backing (:meth:`backing_dropped`)."""
        return bool(inode.open_count) or inode.ino in self.backed

    def _now_free(self, inode: Inode) -> None:
        ev = self._idle.pop(inode.ino, None)
        if ev is not None:
            ev.set()
        if self.passthrough["enabled"]:
            self._check_watermark()  # passthrough writes grew it behind the evictor's back

    def backing_dropped(self, ino: int) -> None:
        """The FUSE layer dropped the inode's backing file (passthrough) after taking its
        final size: it may move now."""
        self.backed.discard(ino)
        inode = self.ns.inodes.get(ino)
        if inode is not None and not self._held(inode):
            self._now_free(inode)

    def _idle_event(self, inode: Inode) -> trio.Event:
        ev = self._idle.get(inode.ino)
        if ev is None:
            ev = self._idle[inode.ino] = trio.Event()
        return ev

    async def open(self, inode: Inode, flags: int, uid: int, *, created: bool = False) -> int:
        """Open a local regular file.  ``created``: the open of create(2), not counted as
        a hit or a miss."""
        if inode.is_dir:
            raise FsError(errno.EISDIR)
        if not inode.is_reg:
            raise FsError(errno.ENXIO)
        before_open = (self.config.promote_mode == "before-open" and self.config.promote_on_open
                       and inode.tier != T.FAST and inode.size <= self.config.high_watermark * self.capacity)
        if self.passthrough["enabled"]:
            # the handle may get the blob as its backing file: an open arriving during a
            # migration waits for the switch (and before-open promotes while nobody holds it)
            if before_open and not inode.open_count and inode.migration is None:
                await self._background_migration(inode, T.FAST, "promote")
            while inode.migration is not None:
                await inode.migration.done.wait()
            if self.ns.inodes.get(inode.ino) is not inode:
                raise FsError(errno.ENOENT)
            before_open = False
        h = Handle(inode, flags, uid)
        inode.open_count += 1
        try:
            # the descriptor is opened by the first read or write (one thread hop less)
            if flags & os.O_TRUNC and (flags & O_ACCMODE) != os.O_RDONLY:
                await self.truncate(inode, 0, uid)
        except BaseException:
            inode.open_count -= 1
            raise
        fh = next(self._fh)
        self.handles[fh] = h
        self.ns.touch_access(inode)
        if not created and (flags & O_ACCMODE) != os.O_WRONLY:
            self.io.tiers[inode.tier].hits += 1
            if inode.tier != T.FAST:
                self.io.misses += 1
        if inode.tier == T.FAST:
            self.policy.touch(inode.ino, inode.size)
        elif self.config.promote_on_open and inode.size <= self.config.high_watermark * self.capacity:
            if before_open:
                await self._background_migration(inode, T.FAST, "promote")
            else:  # with passthrough: once the last handle is released
                self.start_migration(inode, T.FAST, "promote")
        return fh

    async def passthrough_for(self, inode: Inode, writing: bool) -> bool:
        """May this open hand the blob to the kernel?  Not for a writer while the fast
        tier is full and evicting closed files cannot make room: the kernel's writes could
        not spill to the slow tier, so such a writer goes through the agent (spill, or
        ENOSPC when both tiers are full)."""
        if not self.passthrough["enabled"]:
            return False
        if writing and inode.tier == T.FAST and self.fast_used >= self.capacity:
            return await self._room_for(1, inode)
        return True

    def written_through(self, inode: Inode, size: int, mtime_ns: int) -> None:
        """The kernel wrote the blob directly (passthrough): take its size and mtime."""
        if self.ns.inodes.get(inode.ino) is not inode:
            return
        if inode.tier == T.FAST:  # (a migration in flight is abandoned: data_gen changes)
            self.fast_used += size - inode.size
        inode.size = size
        inode.mtime_ns = inode.ctime_ns = max(mtime_ns, inode.ctime_ns)
        inode.data_gen += 1
        if inode.replicas:  # the copies on other nodes are stale now
            inode.replicas = []
        self.ns.journal.inode(inode.ino)
        if self.cluster is not None:  # its publication to the other nodes
            self.commit_shortly()
        # the evictor is woken by the last release (engine.release), once the file is free

    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles[fh]
        inode = h.inode
        tier = inode.tier  # the tier that serves this read
        data = self._read_cached(h, off, size)
        if data is None:
            data = await self._io(h, os.pread, size, off)
        c = self.io.tiers[tier]
        c.reads += 1
        c.read_bytes += len(data)
        t = now_ns()
        if inode.atime_ns <= max(inode.mtime_ns, inode.ctime_ns) or t - inode.atime_ns > 86_400 * 10**9:
            inode.atime_ns = t  # relatime
            self.ns.journal.inode(inode.ino)
        return data

    def _kill_suid(self, inode: Inode, uid: int) -> None:
        if uid != 0 and inode.mode & (stat.S_ISUID | stat.S_ISGID):
            inode.mode &= ~stat.S_ISUID
            if inode.mode & stat.S_IXGRP:
                inode.mode &= ~stat.S_ISGID

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handles[fh]
        inode = h.inode
        async with self.lock(inode):
            end = off + len(buf)
            growth = max(0, end - inode.size)
            if inode.tier == T.FAST and growth and not await self._room_for(growth, inode):
                await self._spill(inode)
            reaped = spilled = False
            while True:
                reserve = max(0, end - inode.size) if inode.tier == T.FAST else 0
                self.fast_used += reserve
                try:
                    n = await self._io(h, os.pwrite, buf, off)
                except OSError as exc:
                    self.fast_used -= reserve
                    if exc.errno == errno.ENOSPC and not reaped:
                        reaped = True
                        if await self.reap_now():
                            continue  # deleted files' bytes were still on the device
                    if exc.errno == errno.ENOSPC and inode.tier == T.FAST and not spilled:
                        spilled = True
                        await self._spill(inode)  # the fast device itself is full
                        continue
                    raise FsError(exc.errno) from exc
                self.fast_used -= reserve
                break
            c = self.io.tiers[inode.tier]  # the tier written (after a spill: the slow one)
            c.writes += 1
            c.write_bytes += n
            new_size = max(inode.size, off + n)
            if inode.tier == T.FAST:
                self.fast_used += new_size - inode.size
            inode.size = new_size
            inode.data_gen += 1
            if inode.replicas:  # the copies on other nodes are stale now
                inode.replicas = []
            inode.mtime_ns = inode.ctime_ns = now_ns()
            self._kill_suid(inode, h.uid)
            self.ns.journal.inode(inode.ino)
        self._check_watermark()
        return n

    async def _spill(self, inode: Inode) -> None:
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
            await self.reap_now()  # the slow device may still hold deleted files' bytes
        raise FsError(errno.ENOSPC)

    async def truncate(self, inode: Inode, size: int, uid: int) -> None:
        async with self.lock(inode):
            growth = size - inode.size
            if inode.tier == T.FAST and growth > 0 and not await self._room_for(growth, inode):
                await self._spill(inode)
            try:
                await trio.to_thread.run_sync(os.truncate, self.blob(inode), size)
            except OSError as exc:
                raise FsError(exc.errno) from exc
            if inode.tier == T.FAST:
                self.fast_used += size - inode.size
            inode.size = size
            inode.data_gen += 1
            if inode.replicas:
                inode.replicas = []
            inode.mtime_ns = inode.ctime_ns = now_ns()
            self._kill_suid(inode, uid)
            self.ns.journal.inode(inode.ino)
        self._check_watermark()

    async def flush(self, fh: int) -> None:
        """close(2) of a writer waits only for its file's name to be committed (usually
        done already: create commits in the background).  Its bytes are in its blob as soon
        as each write returned (they survive an agent crash; fsync makes them survive a
        power failure), and the recovery pass takes the size from the blob.  Size and
        times reach the metadata store with a later group commit (at most a second; in a
        cluster, where the commit also queues their publication to the other nodes, within
        COMMIT_SHORTLY_SECONDS, usually with the next operation's commit; and a restart
        republishes every local name)."""
        h = self.handles[fh]
        if h.writable and not self.ns.journal.is_durable(h.inode.name_seq):
            await self.ns.journal.sync(upto=h.inode.name_seq)

    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.handles[fh]
        await self._io(h, os.fdatasync if datasync else os.fsync)
        await self.ns.journal.sync(durable=True)

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh)
        inode = h.inode
        inode.open_count -= 1
        if not self._held(inode):
            self._now_free(inode)
        if h.fd >= 0 or h.stale_fds:  # (none when the kernel did the I/O: passthrough)
            await trio.to_thread.run_sync(h.close_all)
        await self.maybe_free(inode)

    async def maybe_free(self, inode: Inode) -> None:
        """Delete an inode's bytes once nothing refers to it (no name, handle or lookup);
        the blobs go in the next removal batch (_reaper)."""
        if inode.nlink > 0 or inode.open_count > 0 or inode.lookups > 0:
            return
        if self.ns.inodes.get(inode.ino) is not inode:
            return
        self.ns.forget_inode(inode)
        self._blob_leaving(inode.ino)
        self._locks.pop(inode.ino, None)
        self._blob_gens.pop(inode.ino, None)
        if inode.migration is not None:
            inode.migration.cancelled = True
        if inode.is_reg:
            if inode.tier == T.FAST:
                self.fast_used -= inode.size
            self.policy.remove(inode.ino)
            self._doomed.extend(tier.blob(inode.ino) for tier in self.tiers.values())
            self._reaper_wakeup.set()

    async def forget(self, ino: int, n: int) -> None:
        inode = self.ns.inodes.get(ino)
        if inode is None:
            return
        inode.lookups = max(0, inode.lookups - n)
        await self.maybe_free(inode)

    async def remove(self, parent: int, name: bytes, *, rmdir: bool) -> None:
        """unlink/rmdir, committed in the background (as a local file system's journal
        does; fsyncdir waits for it)."""
        inode = self.ns.unlink(parent, name, rmdir=rmdir)
        await self.maybe_free(inode)
        self.commit_soon()

    async def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int) -> None:
        replaced = self.ns.rename(old_parent, old_name, new_parent, new_name, flags)
        if replaced is not None:
            await self.maybe_free(replaced)
        await self.ns.journal.sync()

    # ------------------------------------------------------------------ control
    # One implementation of the per-file controls, shared by the user.hycache.* xattrs,
    # the CLI (through the xattrs) and the control-plane link.
    def pin(self, inode: Inode, pinned: bool) -> None:
        inode.pinned = pinned
        self.ns.journal.inode(inode.ino)

    async def set_pinned(self, inode: Inode, pinned: bool) -> None:
        """Pin (never evict) or unpin a file, durably."""
        self.pin(inode, pinned)
        await self.ns.journal.sync()

    def _check_move(self, inode: Inode, tier: str) -> None:
        if tier not in T.TIER_NAMES:
            raise FsError(errno.EINVAL, f"no tier named {tier!r}")
        if not inode.is_reg:
            raise FsError(errno.EINVAL, "not a regular file")
        if tier == T.FAST and inode.size > self.capacity:
            raise FsError(errno.ENOSPC, f"{format_size(inode.size)} is larger than the fast tier")

    def request_move(self, inode: Inode, tier: str) -> bool:
        """Start moving a file to ``tier`` in the background (FsError if it cannot go)."""
        self._check_move(inode, tier)
        return self.start_migration(inode, tier, "promote" if tier == T.FAST else "demote")

    async def move(self, inode: Inode, tier: str) -> str | None:
        """Move a file to ``tier`` and wait: None when it is there, else the reason."""
        self._check_move(inode, tier)
        return await self.move_now(inode, tier, "promote" if tier == T.FAST else "demote")

    # ------------------------------------------------------------------ remote copies
    def remote_copy_added(self, nbytes: int) -> None:
        """A copy of another node's file landed in fast/remote-cache/: it takes fast-tier
        room like any fast-tier file (the evictor makes room among local files)."""
        self.fast_used += nbytes
        self.remote_cache_used += nbytes
        self._check_watermark()

    def remote_copy_removed(self, nbytes: int) -> None:
        self.fast_used -= nbytes
        self.remote_cache_used -= nbytes

    async def prefetch(self, path: str | bytes) -> str:
        """Bring a file's bytes onto this node's fast tier ahead of the job that reads it
        (a plan step of the 2-layer scheduling).  A local file on the slow tier is promoted
        (waited for); a file whose primary is another node is fetched into this node's
        remote cache on the fast tier, where a later open finds it (a fast-tier hit).  Room
        is made like for a promotion (closed, unpinned files are evicted) and never beyond
        the capacity.  Returns what was done; raises FsError (ENOENT: no such file, ENOSPC:
        no room, …) with the reason as its second argument."""
        raw = os.fsencode(path)
        try:
            inode = self.local_inode(raw)
        except FsError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or self.cluster is None:
                raise
            return await self._prefetch_remote(raw)
        if not inode.is_reg:
            raise FsError(errno.EINVAL, "not a regular file")
        if inode.tier == T.FAST:
            return "already fast"
        why = await self.move(inode, T.FAST)
        if why is not None:
            raise FsError(errno.ENOSPC, why)
        return T.FAST

    async def _prefetch_remote(self, raw: bytes) -> str:
        cluster = self.cluster
        meta = await cluster.query("get", raw, missing=None)
        if meta is cluster.UNREACHABLE:
            raise FsError(errno.EIO, "the metadata store is unreachable")
        if meta is None or (meta.primary == cluster.node_id and meta.kind != "dir"):
            raise FsError(errno.ENOENT, "no such file")
        if meta.kind != "file":
            raise FsError(errno.EINVAL, "not a regular file")
        node = cluster.remote_node(raw, meta)
        async with cluster.fetch_lock(raw):
            if cluster.has_copy(node):
                return "already fast (remote copy)"
            size = node.meta.size
            if size > self.capacity:
                raise FsError(errno.ENOSPC, f"{format_size(size)} is larger than the fast tier")
            if not await self._room_for(size, None):
                raise FsError(errno.ENOSPC, f"no room for {format_size(size)} on the fast tier "
                                            f"({format_size(self.fast_used)} of {format_size(self.capacity)} "
                                            "used by pinned, open or moving files)")
            self.fast_used += size  # reserved while fetching (the copy is counted once there)
            try:
                await cluster.fetch_locked(node)
            finally:
                self.fast_used -= size
        return f"fast (fetched {format_size(node.cache_size)} from {meta.primary})"

    def local_inode(self, path: str | bytes) -> Inode:
        """The inode this node holds at an absolute path of the mount (FsError ENOENT)."""
        raw = os.fsencode(path)
        if not raw.startswith(b"/") or b"\0" in raw:
            raise FsError(errno.EINVAL, "the path must be absolute, without NUL")
        return self.ns.resolve(raw)

    # ------------------------------------------------------------------ policy
    def load_saved_policy(self) -> dict[str, Any] | None:
        """(blocking, at start) The policy last applied from the control plane, if any."""
        path = self.config.state_dir / POLICY_FILE
        try:
            saved = json.loads(path.read_text())
            validate_policy(saved["policy"], saved["high_watermark"], saved["low_watermark"])
            saved["version"] = int(saved["version"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.error("ignoring the saved policy %s: %s", path, exc)
            return None
        return saved

    def apply_policy(self, policy: str, high: float, low: float, version: int | None = None) -> None:
        """Swap the eviction policy and the watermarks of the running engine (PolicyError
        if invalid; nothing changes then).  The fast tier's files are re-admitted in their
        recency order; pinned files stay pinned (the evictor skips them whatever the
        policy); the evictor runs if the fast tier is above the new high mark."""
        validate_policy(policy, high, low)
        if policy != self.policy.name:
            new = load_policy(policy, capacity=self.capacity)
            resident = sorted((i for i in self.ns.inodes.values() if i.is_reg and i.tier == T.FAST),
                              key=lambda i: i.last_access)
            for inode in resident:
                new.admit(inode.ino, inode.size, max(1, inode.hits, self.policy.hits(inode.ino)))
            self.policy = new
            self.config.policy = policy
        self.config.high_watermark = float(high)
        self.config.low_watermark = float(low)
        if version is not None:
            self.policy_version = version
        log.info("policy %s, watermarks %.2f/%.2f applied (version %s)", policy, high, low, version)
        self._check_watermark()

    def save_policy(self) -> None:
        """(blocking) Keep the applied policy in the state directory for the next start."""
        write_json_atomic(self.config.state_dir / POLICY_FILE, {
            "version": self.policy_version, "policy": self.policy.name,
            "high_watermark": self.config.high_watermark, "low_watermark": self.config.low_watermark})

    # ------------------------------------------------------------------ counters
    def counters_dict(self) -> dict[str, Any]:
        """Cumulative counters since start, shaped as the heartbeat's ``counters``."""
        io = self.io
        remote = {"read_bytes": io.remote_read_bytes, "fetches": 0, "fetch_bytes": 0, "opens": io.remote_opens}
        if self.cluster is not None:
            remote["fetches"] = self.cluster.status.remote_fetches
            remote["fetch_bytes"] = self.cluster.status.remote_bytes
        return {
            T.FAST: io.tiers[T.FAST].as_dict(),
            T.SLOW: io.tiers[T.SLOW].as_dict(),
            "remote": remote,
            "misses": io.misses,
            "metadata_ops": io.metadata_ops,
            "migrations": self.counters.migrations_done,
            "migration_bytes": self.counters.bytes_promoted + self.counters.bytes_demoted,
        }

    def file_info(self, inode: Inode) -> dict[str, Any]:
        info: dict[str, Any] = {
            "ino": inode.ino,
            "type": "dir" if inode.is_dir else "file" if inode.is_reg else "symlink" if stat.S_ISLNK(inode.mode) else "special",
            "tier": inode.tier, "size": inode.size, "pinned": inode.pinned, "hits": inode.hits,
            "open": inode.open_count, "agent_root": str(self.config.root),
        }
        if inode.is_reg:
            info["blob"] = self.blob(inode)
            if self.cluster is not None:
                info["primary"] = self.cluster.node_id
                info["replicas"] = list(inode.replicas)
        if inode.migration is not None:
            info["migration"] = inode.migration.as_dict()
        return info

    def _tier_vfs(self) -> tuple[os.statvfs_result, os.statvfs_result]:
        """(worker thread) statvfs of the fast and slow tiers: a hung slow tier (a lost NFS
        server) must never block the event loop."""
        return self.tiers[T.FAST].statvfs(), self.tiers[T.SLOW].statvfs()

    async def _census(self, max_age: float) -> tuple[dict[str, list[int]], int, int]:
        """Files and bytes per tier, directories, other inodes: a walk of every inode
        (about 1.3 s for a million), so callers that poll (the control-plane link, the
        /metrics scrapes) accept one up to ``max_age`` seconds old — or older when the
        walk itself is slow (at most 5 % of the loop's time).  The walk yields to the
        loop between slices, so file system requests never wait for all of it."""
        cached = self._census_cache
        now = time.monotonic()
        if cached is not None and now - cached[0] < max(max_age, 20 * cached[1]) and max_age > 0:
            return cached[2]
        counts = {T.FAST: [0, 0, 0], T.SLOW: [0, 0, 0]}  # files, bytes, pinned bytes
        dirs = others = 0
        t0 = time.perf_counter()
        for n, inode in enumerate(list(self.ns.inodes.values()), 1):
            if n % STATUS_SLICE == 0:
                await trio.lowlevel.checkpoint()
            if inode.is_reg:
                c = counts[inode.tier]
                c[0] += 1
                c[1] += inode.size
                if inode.pinned:
                    c[2] += inode.size
            elif inode.is_dir:
                dirs += 1
            else:
                others += 1
        result = (counts, dirs, others)
        self._census_cache = (now, time.perf_counter() - t0, result)
        return result

    async def status(self, max_age: float = 0.0) -> dict[str, Any]:
        """The agent's state (``hycache-agent status --json``).  ``max_age`` > 0: the file
        and directory counts may be that many seconds old (see :meth:`_census`)."""
        fast_vfs, slow_vfs = await trio.to_thread.run_sync(self._tier_vfs)
        counts, dirs, others = await self._census(max_age)
        return {
            "pid": os.getpid(),
            "mountpoint": str(self.config.mountpoint),
            "root": str(self.config.root),
            "uptime_seconds": round(time.time() - self.started, 1),
            "policy": self.policy.name,
            "policy_version": self.policy_version,
            "watermarks": {"high": self.config.high_watermark, "low": self.config.low_watermark},
            "tiers": {
                T.FAST: {"path": str(self.tiers[T.FAST].path), "capacity": self.capacity,
                         "device_capacity": fast_vfs.f_blocks * fast_vfs.f_frsize,
                         "used": self.fast_used, "files": counts[T.FAST][0], "bytes": counts[T.FAST][1],
                         "remote_cache_bytes": self.remote_cache_used, "pinned_bytes": counts[T.FAST][2],
                         "device_free": fast_vfs.f_bavail * fast_vfs.f_frsize},
                T.SLOW: {"path": str(self.tiers[T.SLOW].path),
                         "capacity": slow_vfs.f_blocks * slow_vfs.f_frsize,
                         "device_capacity": slow_vfs.f_blocks * slow_vfs.f_frsize,
                         "used": counts[T.SLOW][1], "files": counts[T.SLOW][0], "bytes": counts[T.SLOW][1],
                         "device_free": slow_vfs.f_bavail * slow_vfs.f_frsize},
            },
            "counters": self.counters_dict(),
            "directories": dirs,
            "other_inodes": others,
            "open_handles": len(self.handles),
            "passthrough": dict(self.passthrough),
            "migrations": {**self.counters.__dict__, "active": [m.as_dict() for m in self.active.values()]},
            "cluster": None if self.cluster is None else self.cluster.status_dict(),
            "control": None if self.control is None else self.control.status_dict(),
            "hccache": None if self.cluster is None or self.cluster.reader is None else self.cluster.reader.status(),
            "metadata": {"commits": self.ns.journal.commits, "pending": self.ns.journal.pending,
                         "error": None if self.ns.journal.failed is None else str(self.ns.journal.failed)},
        }

    async def statfs(self) -> tuple[int, int, int, int]:
        """(total bytes, free bytes, total inodes, free inodes) of the whole mount."""
        slow = await trio.to_thread.run_sync(self.tiers[T.SLOW].statvfs)
        fast_free = max(0, self.capacity - self.fast_used)
        total = self.capacity + slow.f_blocks * slow.f_frsize
        free = fast_free + slow.f_bavail * slow.f_frsize
        files = max(slow.f_files, len(self.ns.inodes) + 1_000_000)
        return total, free, files, files - len(self.ns.inodes)


class _Unlocked:
    @staticmethod
    def locked() -> bool:
        return False


_UNLOCKED = _Unlocked()

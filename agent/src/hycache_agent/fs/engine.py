"""The tiering engine: owns the tiers, the namespace, space accounting and the file
operations (create, open, read, write, truncate, flush, fsync, release, remove, rename),
start-up and recovery; composes the parts that do the rest, passed in (or made with
defaults) as s3ql's ``Operations(block_cache, db, inode_cache)``:

* :mod:`~hycache_agent.fs.counters` — what is counted and reported (status, statfs);
* :mod:`~hycache_agent.fs.blobpool` — empty fast-tier blobs made ahead of creates, and the
  removal of freed inodes' blobs;
* :mod:`~hycache_agent.fs.placement` — room on the fast tier, watermarks and the evictor,
  the policy's settings, pins, move requests, prefetch (Algorithms 1–3 of the papers);
* :mod:`~hycache_agent.fs.migrations` — stage → copy → fsync → atomic switch → remove;
* :mod:`~hycache_agent.fs.recovery` — the redo log's replay and the recovery pass.

The state they share is given to each part's constructor: the fast tier's accounting and
policy queue (:class:`~hycache_agent.fs.space.Space`), the namespace, the files' locks and
which files are held (:class:`~hycache_agent.fs.files.Files`); the handles stay here.  The
request path keeps direct references to the parts' attributes it uses per request (the
blob pool's list, the blob generations, the room check), so the split adds no call on it.
The engine knows nothing of other nodes: a cluster link hooks into the namespace's journal
(its events and outbox) and calls the engine, never the other way round.

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
* :meth:`TieringEngine.recover` resolves whatever a crash left behind.

Every blocking call runs in a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import time
from typing import Any

import trio
from hycache_core.policies import OnlinePolicy, Usage, load_policy

from hycache_agent.config import AgentConfig
from hycache_agent.fs import counters as C
from hycache_agent.fs import tiers as T
from hycache_agent.fs.blobpool import BlobPool
from hycache_agent.fs.commits import Commits
from hycache_agent.fs.counters import Census, Counters, IOStats
from hycache_agent.fs.files import Files
from hycache_agent.fs.handles import O_ACCMODE, Handle, blob_io, read_cached
from hycache_agent.fs.kreads import KernelReads
from hycache_agent.fs.lane import Lane
from hycache_agent.fs.metastore import MetaJournal, SQLiteStore
from hycache_agent.fs.migrations import Migrations
from hycache_agent.fs.namespace import FsError, Inode, Namespace, check_name, local_inode, now_ns
from hycache_agent.fs.placement import Placement
from hycache_agent.fs.prefetch import LANES, OpenPrefetch
from hycache_agent.fs.recovery import recover, replay
from hycache_agent.fs.redolog import RedoLog
from hycache_agent.fs.space import Space

log = logging.getLogger(__name__)

class TieringEngine:
    # the namespace, made by start() with the store (the store set: the namespace is too);
    # the file operations run only once start() has
    ns: Namespace

    def __init__(self, config: AgentConfig, *, counters: Counters | None = None, io: IOStats | None = None,
                 census: Census | None = None, blobs: BlobPool | None = None,
                 kreads: KernelReads | None = None) -> None:
        self.config = config
        self.tiers = {T.FAST: T.Tier(T.FAST, config.fast_dir), T.SLOW: T.Tier(T.SLOW, config.slow_dir)}
        # kernel FUSE passthrough (set by the FUSE layer once the kernel accepted it): the
        # agent sees no reads or writes, so a file is migrated only while nobody holds it
        self.passthrough: dict[str, Any] = {"enabled": False, "reason": "not negotiated yet"}
        # the pool of ready blobs and the reaper of freed ones (fs/blobpool.py); the
        # create path uses its list and the backings' dict directly (no call per create)
        self.blobs = blobs if blobs is not None else BlobPool(
            self.tiers, self.passthrough, reserve=config.blob_pool_reserve)
        self._blob_pool = self.blobs.ready
        self.pooled_backings = self.blobs.pooled_backings
        self.space = Space(load_policy(config.policy))
        self.files = Files()
        self.backed = self.files.backed
        self.store: SQLiteStore | None = None  # (with self.ns) made by start()
        self.handles: dict[int, Handle] = {}
        self._fh = itertools.count(1)
        # worker threads whose callbacks come back drained (lane.py): the one where the
        # last release of a file drops its backing registration (fs/passthrough.py)
        self.backings_lane = Lane("backings")
        self.lanes: list[Lane] = [self.backings_lane]
        self.kreads = kreads if kreads is not None else KernelReads()  # started by the mount
        # a passthrough reader's blob read ahead at open (off at 0) and as it reads in order
        # (the trace's reader, when it follows: fs/prefetch.py)
        self.prefetch = OpenPrefetch(config.open_prefetch_mb << 20, [Lane(f"prefetch-{i}", hold=False)
                                                                     for i in range(LANES)]
                                     if config.open_prefetch_mb else [], self.kreads)
        self.lanes += self.prefetch.lanes
        self.counters = counters if counters is not None else Counters()
        self.io = io if io is not None else IOStats()
        self.blobs.requests = functools.partial(C.requests_seen, self.io)  # (the reserve waits out a busy node)
        self.census = census if census is not None else Census()
        # (the cluster link's ownership, when the agent joins a global namespace) called
        # with each regular file create_file makes, inside the create
        self.on_file_created = None
        # background commits of what is recorded (fs/commits.py)
        self.commits = Commits(self.files)
        self.commit_soon = self.commits.commit_soon
        self.commit_shortly = self.commits.commit_shortly
        self.started = time.time()
        # moving files between the tiers; the read path uses its generations directly
        self.migrations = Migrations(self.tiers, self.files, self.space, self.blobs, self.counters,
                                     self.passthrough)
        self.active = self.migrations.active
        self._blob_gens = self.migrations.blob_gens
        self.blob_gen = self.migrations.blob_gen  # (per passthrough open: no extra call)
        # room, watermarks, the evictor, the policy's settings, pins, moves, prefetch
        self.placement = Placement(config, self.files, self.space, self.migrations)
        # the write path asks these on every request that grows a file: direct references
        self._room_for = self.placement.room_for
        self._check_watermark = self.placement.check_watermark

    # the fast tier's accounting and policy queue (fs/space.py), as the other layers read it
    @property
    def fast_used(self) -> int:
        return self.space.used

    @property
    def remote_cache_used(self) -> int:
        return self.space.remote_cache_used

    @property
    def capacity(self) -> int:
        return self.space.capacity

    @capacity.setter
    def capacity(self, nbytes: int) -> None:
        self.space.capacity = nbytes

    @property
    def policy(self) -> OnlinePolicy:
        return self.space.policy

    @property
    def policy_version(self) -> int:
        """The control plane's policy version applied (0: none)."""
        return self.placement.policy_version

    # ------------------------------------------------------------------ start-up
    def start(self) -> dict[str, int]:
        """Blocking start-up (before the event loop serves requests): create the tier
        directories, load the metadata, run the recovery pass, rebuild the policy."""
        for tier in self.tiers.values():
            tier.path.mkdir(parents=True, exist_ok=True)
            tier.prepare()
        store = SQLiteStore(self.config.state_dir / "meta.db")
        self.ns = self.files.ns = Namespace(lambda row: MetaJournal(store, row))
        self.store = store
        snapshot = store.load()
        self.ns.load(snapshot, os.getuid(), os.getgid())
        redo = RedoLog(self.config.state_dir / "redo.log")
        replayed = replay(self.ns, redo, snapshot.counters.get("redo_upto", 0))
        self.placement.restore_saved_policy()
        report = self.recover()  # first: it fixes the sizes the capacity counts
        self.space.size_up(self.config, self.tiers[T.FAST].statvfs(), self.ns.inodes.values())
        self.ns.journal.sync_blocking()
        redo.reset()  # (its records are committed now) from here on, names are logged
        self.ns.journal.redo = redo
        if replayed:
            report["redo_replayed"] = replayed
        return report

    def recover(self) -> dict[str, int]:
        """Resolve what a crash left (see :func:`hycache_agent.fs.recovery.recover`)."""
        return recover(self.ns, self.tiers)

    async def run(self, nursery: trio.Nursery) -> None:
        """Start the background tasks (evictor, periodic metadata flush)."""
        await self.placement.run(nursery)
        self.commits.run(nursery)
        nursery.start_soon(self.blobs.filler, self.ns.allocate_ino)
        nursery.start_soon(self.blobs.reaper)
        for lane in [self.ns.journal.lane, *self.lanes]:
            nursery.start_soon(lane.drainer)
        self._check_watermark()

    def close(self) -> None:
        self.commits.stop()  # the event loop is gone: what the lanes' callbacks record is
        self.placement.stop()
        for lane in self.lanes:  # committed by sync_blocking() below
            lane.close()
        for h in self.handles.values():
            h.close_all()
        self.handles.clear()
        self.blobs.close()
        if self.store is None:  # never started: no namespace
            return
        self.ns.journal.counter("access_seq", self.ns.access_seq)
        self.ns.journal.sync_blocking()
        self.store.close()
        if self.ns.journal.redo is not None:
            self.ns.journal.redo.close()
            self.ns.journal.redo = None

    # ------------------------------------------------------------------ helpers
    def lock(self, inode: Inode) -> trio.Lock:
        return self.files.lock(inode)

    @property
    def backing_pool(self) -> Any:
        """The FUSE layer's Backings once the kernel accepted passthrough (use_backings)."""
        return self.blobs.backing_pool

    def use_backings(self, backings: Any) -> None:
        """The kernel accepted passthrough: blobs are registered with ``backings`` (the
        FUSE layer's) from now on; those made before, by the next refill."""
        self.blobs.backing_pool = backings
        self.blobs.refill_soon()

    def new_fh(self) -> int:
        """A file handle number, unique among local and remote opens."""
        return next(self._fh)

    def blob(self, inode: Inode) -> str:
        assert inode.tier is not None, "a regular file's bytes are on a tier"
        return self.tiers[inode.tier].blob(inode.ino)

    # ------------------------------------------------------------------ files
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
            if len(self._blob_pool) < self.blobs.low:
                self.blobs.refill_soon()
        else:
            ino = ns.allocate_ino()
            if stat.S_ISREG(mode):
                self.blobs.misses += 1
                self.blobs.refill_soon()
                tier = await self.blobs.new_blob(ino, register=True)
            else:
                tier = None
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
            tier = await self.blobs.new_blob(ino)
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
            self.space.used += size
            self.policy.admit(inode.ino, size)
        self._check_watermark()  # too big for the fast tier: the evictor moves it once closed
        return inode

    def held(self, inode: Inode) -> bool:
        """Open, or (passthrough) its blob still registered with the kernel: its final size
        is known only once the FUSE layer has dropped the backing (:meth:`backing_dropped`)."""
        return self.files.held(inode)

    def _now_free(self, inode: Inode) -> None:
        # a file no longer held may be the evictor's victim now: an open one above the high
        # watermark (in the write slack) was none, and passthrough writes grew it unseen
        self.files.now_free(inode)
        self._check_watermark()

    def backing_dropped(self, ino: int) -> None:
        """The FUSE layer dropped the inode's backing file (passthrough) after taking its
        final size: it may move now."""
        self.backed.discard(ino)
        inode = self.ns.inodes.get(ino)
        if inode is not None and not self.held(inode):
            self._now_free(inode)

    async def open(self, inode: Inode, flags: int, uid: int, *, created: bool = False) -> int:
        """Open a local regular file.  ``created``: the open of create(2), not counted as
        a hit or a miss."""
        if inode.is_dir:
            raise FsError(errno.EISDIR)
        if not inode.is_reg:
            raise FsError(errno.ENXIO)
        arrived = inode.tier
        # a writer that will wait for the device: O_SYNC / O_DSYNC, or a file its writers sync
        # (not truncated: nothing to copy)
        syncing = ((flags & O_ACCMODE) != os.O_RDONLY and not flags & os.O_TRUNC
                   and (inode.synced or bool(flags & (os.O_SYNC | os.O_DSYNC))))
        before_open = await self.placement.before_open(inode, self.passthrough["enabled"], syncing=syncing)
        h = Handle(inode, flags, uid)
        inode.open_count += 1
        try:
            # the descriptor is opened by the first read or write (one thread hop less)
            if flags & os.O_TRUNC and (flags & O_ACCMODE) != os.O_RDONLY:
                await self.truncate(inode, 0, uid)
        except BaseException:
            inode.open_count -= 1
            raise
        fh = self.new_fh()
        self.handles[fh] = h
        prior = Usage(inode.hits, inode.last_access)
        self.ns.touch_access(inode)
        assert inode.tier is not None, "a regular file's bytes are on a tier"
        if not created and (flags & O_ACCMODE) != os.O_WRONLY:
            # counted on the tier the bytes were on when the open arrived (a promotion
            # the open waited for is a miss), or the one it is served from if they left
            # the fast tier meanwhile (an eviction it waited for is a miss too)
            tier = arrived if arrived is not None and arrived != T.FAST else inode.tier
            self.io.tiers[tier].hits += 1
            if tier != T.FAST:
                self.io.misses += 1
        await self.placement.opened(inode, before_open, prior)
        return fh

    def opened_lent(self, inode: Inode, n: int, *, created: bool = False) -> None:
        """``n`` opens of a closed fast-tier file that the FUSE layer answered without
        asking (a registration lent to its answer table): counted as :meth:`open` counts
        them, with no handle of the engine's (the kernel reads and writes the blob).
        ``created``: the open of a create, answered with the new file's lent registration
        (no hit or miss, as :meth:`open`'s)."""
        inode.open_count += n
        for _ in range(n):
            self.ns.touch_access(inode)
        if not created:
            self.io.tiers[T.FAST].hits += n
        self.space.policy.touch(inode.ino, inode.size)

    def released_lent(self, inode: Inode, n: int) -> bool:
        """``n`` of the opens :meth:`opened_lent` counted were released: whether the file
        may be freed now (then :meth:`maybe_free`; it has no name left)."""
        inode.open_count -= n
        if not self.held(inode):
            self._now_free(inode)
        return inode.nlink == 0 and inode.open_count == 0

    async def passthrough_for(self, inode: Inode, writing: bool) -> bool:
        """May this open hand the blob to the kernel?  Not for a writer while the fast
        tier is full and evicting closed files cannot make room: the kernel's writes could
        not spill to the slow tier, so such a writer goes through the agent (spill, or
        ENOSPC when both tiers are full)."""
        if not self.passthrough["enabled"]:
            return False
        if writing and inode.tier == T.FAST and self.space.used >= self.space.capacity:
            return await self._room_for(1, inode, slack=True)
        return True

    def written_through(self, inode: Inode, size: int, mtime_ns: int) -> None:
        """The kernel wrote the blob directly (passthrough): take its size and mtime."""
        if self.ns.inodes.get(inode.ino) is not inode:
            return
        if inode.tier == T.FAST:  # (a migration in flight is abandoned: data_gen changes)
            self.space.used += size - inode.size
        C.grew(self.io, inode.tier, size - inode.size)
        inode.size = size
        inode.mtime_ns = inode.ctime_ns = max(mtime_ns, inode.ctime_ns)
        inode.data_gen += 1
        if inode.replicas:  # the copies on other nodes are stale now
            inode.replicas = ()
        self.ns.journal.inode(inode.ino)
        if self.ns.events is not None:  # other nodes learn the size from the commit: soon
            self.commit_shortly()
        # the evictor is woken by the last release (engine.release), once the file is free

    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles[fh]
        inode = h.inode
        tier = inode.tier  # the tier that serves this read
        assert tier is not None, "a regular file's bytes are on a tier"
        data = read_cached(h, off, size, self._blob_gens.get(inode.ino, 0))
        if data is None:
            data = await blob_io(h, self.tiers, self._blob_gens, os.pread, size, off)
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
            if inode.tier == T.FAST and growth and not await self._room_for(growth, inode, slack=True):
                await self.migrations.spill(inode)
            reaped = spilled = False
            while True:
                reserve = max(0, end - inode.size) if inode.tier == T.FAST else 0
                self.space.used += reserve
                try:
                    n = await blob_io(h, self.tiers, self._blob_gens, os.pwrite, buf, off)
                except OSError as exc:
                    self.space.used -= reserve
                    if exc.errno == errno.ENOSPC and not reaped:
                        reaped = True
                        if await self.blobs.reap_now():
                            continue  # deleted files' bytes were still on the device
                    if exc.errno == errno.ENOSPC and inode.tier == T.FAST and not spilled:
                        spilled = True
                        await self.migrations.spill(inode)  # the fast device itself is full
                        continue
                    raise FsError(exc.errno or errno.EIO) from exc
                self.space.used -= reserve
                break
            assert inode.tier is not None, "a regular file's bytes are on a tier"
            c = self.io.tiers[inode.tier]  # the tier written (after a spill: the slow one)
            c.writes += 1
            c.write_bytes += n
            new_size = max(inode.size, off + n)
            if inode.tier == T.FAST:
                self.space.used += new_size - inode.size
            inode.size = new_size
            inode.data_gen += 1
            if inode.replicas:  # the copies on other nodes are stale now
                inode.replicas = ()
            inode.mtime_ns = inode.ctime_ns = now_ns()
            self._kill_suid(inode, h.uid)
            self.ns.journal.inode(inode.ino)
        self._check_watermark()
        return n

    async def truncate(self, inode: Inode, size: int, uid: int) -> None:
        async with self.lock(inode):
            growth = size - inode.size
            if inode.tier == T.FAST and growth > 0 and not await self._room_for(growth, inode, slack=True):
                await self.migrations.spill(inode)
            try:
                await trio.to_thread.run_sync(os.truncate, self.blob(inode), size)
            except OSError as exc:
                raise FsError(exc.errno or errno.EIO) from exc
            if inode.tier == T.FAST:
                self.space.used += size - inode.size
            inode.size = size
            inode.data_gen += 1
            if inode.replicas:
                inode.replicas = ()
            inode.mtime_ns = inode.ctime_ns = now_ns()
            self._kill_suid(inode, uid)
            self.ns.journal.inode(inode.ino)
        self._check_watermark()

    async def flush(self, fh: int) -> None:
        """close(2) of a writer waits only for its file's name to be safe from a crash of
        the agent: in the redo log since its create (``name_seq`` 0: no wait, the usual
        case), else committed (the ring was full).  Its bytes are in its blob as soon
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
        h.inode.synced = True  # its writers wait for the device: placement._promotes_before_write
        await blob_io(h, self.tiers, self._blob_gens, os.fdatasync if datasync else os.fsync)
        await self.ns.journal.sync(durable=True)

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh)
        inode = h.inode
        inode.open_count -= 1
        if not self.held(inode):
            self._now_free(inode)
        if h.fd >= 0 or h.stale_fds:  # (none when the kernel did the I/O: passthrough)
            await trio.to_thread.run_sync(h.close_all)
        await self.maybe_free(inode)

    async def maybe_free(self, inode: Inode) -> None:
        """Delete an inode's bytes once nothing refers to it (no name, handle or lookup);
        the blobs go in the next removal batch (BlobPool.reaper)."""
        self.free_if_unused(inode)

    def free_if_unused(self, inode: Inode) -> None:
        """:meth:`maybe_free`, for callers that cannot wait (nothing in it does)."""
        if inode.nlink > 0 or inode.open_count > 0 or inode.lookups > 0:
            return
        if self.ns.inodes.get(inode.ino) is not inode:
            return
        self.ns.forget_inode(inode)
        # a fast-tier blob whose registration was parked goes back to the pool, still
        # registered (BlobPool.recycle); otherwise the registration is dropped
        parked = None
        if inode.is_reg and inode.tier == T.FAST and self.blobs.may_recycle():
            parked = self.blobs.backing_pool.take_parked(inode.ino, self.blob_gen(inode.ino))
        if parked is None:
            self.migrations.blob_leaving(inode.ino)
        self.files.locks.pop(inode.ino, None)
        self._blob_gens.pop(inode.ino, None)
        if inode.migration is not None:
            inode.migration.cancelled = True
        if inode.is_reg:
            if inode.tier == T.FAST:
                self.space.used -= inode.size
            self.space.policy.remove(inode.ino)
            if parked is not None:
                self.blobs.recycle(inode.ino, *parked)
            self.blobs.doom(inode.ino, recycled=parked is not None)

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

    def created_by_reader(self, parent: int, name: bytes, ino: int, mode: int, uid: int, gid: int,
                          t: int) -> tuple[Inode, Any]:
        """A create the FUSE reader answered at ``t`` with a pool blob it was given
        (``BlobPool.give``) and logged in the redo log itself: the same as
        :meth:`create_file`, told after the fact.  The inode and its blob's registration
        entry (the create's open holds it)."""
        entry = self.blobs.used(ino)
        inode = self.ns.new_inode(parent, name, mode, uid, gid, tier=T.FAST, ino=ino, t=t, logged=True)
        self.policy.admit(inode.ino, 0)
        if self.on_file_created is not None:
            self.on_file_created(inode)  # (cluster) rides on the same commit
        self.commit_soon()
        return inode, entry

    def removed_by_reader(self, parent: int, name: bytes, t: int) -> Inode:
        """An unlink the FUSE reader answered at ``t`` and logged in the redo log itself:
        the same as :meth:`remove`, told after the fact."""
        inode = self.ns.unlink(parent, name, rmdir=False, t=t, logged=True)
        self.free_if_unused(inode)
        self.commit_soon()
        return inode

    async def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int) -> None:
        replaced = self.ns.rename(old_parent, old_name, new_parent, new_name, flags)
        if replaced is not None:
            await self.maybe_free(replaced)
        await self.ns.journal.sync()

    # ------------------------------------------------------------------ placement
    # (fs/placement.py) what the other seams ask of it: the FUSE layer's xattrs, the
    # control link, rebalance
    def eviction_candidates(self, exclude: Inode | None = None):
        return self.placement.eviction_candidates(exclude)

    async def set_pinned(self, inode: Inode, pinned: bool) -> None:
        await self.placement.set_pinned(inode, pinned)

    async def move(self, inode: Inode, tier: str) -> str | None:
        return await self.placement.move(inode, tier)

    # ------------------------------------------------------------------ remote copies
    def remote_copy_added(self, nbytes: int) -> None:
        """A copy of another node's file landed in fast/remote-cache/ (fs/space.py)."""
        self.space.remote_copy_added(nbytes)
        self._check_watermark()

    def remote_copy_removed(self, nbytes: int) -> None:
        self.space.remote_copy_removed(nbytes)

    def local_inode(self, path: str | bytes) -> Inode:
        """The inode this node holds at an absolute path of the mount (FsError ENOENT)."""
        return local_inode(self.ns, path)

    # ------------------------------------------------------------------ counters
    # (fs/counters.py: the counting and the report shapes)
    def counters_dict(self) -> dict[str, Any]:
        """Cumulative counters since start, shaped as the heartbeat's ``counters``."""
        return C.engine_counters(self.io, self.counters, self.kreads, bool(self.passthrough["enabled"]))

    def file_info(self, inode: Inode, node_id: str | None = None) -> dict[str, Any]:
        """``user.hycache.info`` (``node_id``: this node's, in a cluster)."""
        return C.file_info(inode, self.blob(inode) if inode.is_reg else None, str(self.config.root), node_id)

    async def status(self, max_age: float = 0.0) -> dict[str, Any]:
        """The file system's part of the agent's state, see :func:`counters.status`."""
        return await C.status(self, max_age)

    async def statfs(self) -> tuple[int, int, int, int]:
        """(total bytes, free bytes, total inodes, free inodes) of the whole mount."""
        slow = await trio.to_thread.run_sync(self.tiers[T.SLOW].statvfs)
        return C.statfs(self.space.capacity, self.space.used, slow, len(self.ns.inodes))

"""Kernel FUSE passthrough (Linux >= 6.9): the kernel reads and writes a file's blob itself.

An open of a file on a local tier answers with a *backing id*: the blob's descriptor,
registered on the /dev/fuse descriptor (``pyfuse3.passthrough_open``, an ioctl that needs
CAP_SYS_ADMIN).  Reads, writes and mmap then go kernel → blob without reaching the agent;
open, flush, fsync, release, setattr and every metadata operation still do.

One backing id per inode, shared by all its opens and dropped when the last one is
released.  While a file has one, its blob must stay where it is: the engine migrates a
file only when no handle holds it (``TieringEngine.passthrough``), and an open arriving
during a migration waits for the switch.  Since the agent no longer sees writes, the
blob itself is the truth for size and mtime while the file is open: ``refresh`` fstat()s
the backing descriptor before attributes are answered.

This module decides nothing about tiering; it keeps the registrations and their fds.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import resource
import stat
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import pyfuse3
import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import Inode

log = logging.getLogger(__name__)

MIN_KERNEL = (6, 9)

# Registrations kept after the last release of a fast-tier file (see Backings.parked): at
# most this many, and at most a quarter of the process's descriptor limit.
MAX_PARKED = 8192


def parked_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_PARKED
    return max(0, min(MAX_PARKED, soft // 4))


def supported() -> str | None:
    """Why passthrough cannot be asked for on this host (None: it can)."""
    if not hasattr(pyfuse3, "passthrough_open"):
        return "pyfuse3 is built without passthrough (scripts/bootstrap.sh builds the patched one)"
    try:
        release = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        release = (0, 0)
    if release < MIN_KERNEL:
        return f"kernel {platform.release()} < {MIN_KERNEL[0]}.{MIN_KERNEL[1]}"
    if os.geteuid() != 0:
        return "registering a backing file needs root (CAP_SYS_ADMIN)"
    return None


def open_backing(path: str) -> tuple[int, int, os.stat_result]:
    """(blocking) Open a blob and register it as a backing file: (fd, backing id, stat)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        return fd, pyfuse3.passthrough_open(fd), st
    except BaseException:
        os.close(fd)
        raise


def unregister(fd: int, backing_id: int, *, quiet: bool = False) -> None:
    """(blocking) Drop a registration and its fd.  ``quiet``: at shutdown the session is
    gone, and with it every id."""
    try:
        pyfuse3.passthrough_close(backing_id)
    except OSError as exc:  # the kernel keeps its own reference to the file anyway
        if not quiet:
            log.warning("closing backing id %d: %s", backing_id, exc)
    os.close(fd)


def close_backing(fd: int, backing_id: int) -> os.stat_result | None:
    """(blocking) The blob's last size and times, then drop the registration and the fd."""
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    unregister(fd, backing_id)
    return st


def invalidate_attrs(ino: int) -> None:
    """(blocking, off the event loop: pyfuse3 writes the notification to /dev/fuse) Make
    the kernel forget the cached attributes of ``ino`` (the request reader's answer table,
    fuse/answers.py, dropped them when the change was recorded: it answers the new ones)."""
    try:
        pyfuse3.invalidate_inode(ino, attr_only=True)
    except OSError:  # ENOENT: the kernel no longer knows the inode, nothing is cached
        pass


class BlobStat(NamedTuple):
    """What the registration of a blob made by :meth:`Backings.create_batch` keeps of its
    fstat (the fields of ``os.stat_result`` the backing reads)."""

    st_size: int
    st_mtime_ns: int
    st_dev: int
    st_ino: int


@dataclass(eq=False)
class Backing:
    fd: int
    backing_id: int
    tier: str
    refs: int = 0
    size: int = 0  # the blob's size and mtime when the agent last looked
    mtime_ns: int = 0
    closed: trio.Event | None = None  # set while the last release drops it (and once dropped)
    blob_gen: int = 0  # the engine's blob generation of the inode when registered
    blob_key: tuple[int, int] | None = None  # the blob's (st_dev, st_ino), when the reads are traced
    # an open that can map the blob shared and writable (O_RDWR) took it since its refs were
    # last 0: stores through such a mapping change the blob unseen by the kernel's FUSE inode
    # (its RELEASE comes after the mapping is gone, so the last release sees them all)
    mappable: bool = False
    # an open the agent answered took it since it was last parked (any such open may have
    # written); opens answered with the lent registration are read-only and cannot change
    # the blob, so a release after only those parks it again without looking (no fstat)
    agent_opened: bool = True


class Lender(Protocol):
    """Where parked registrations are lent (the FUSE layer's answer table,
    fuse/answers.py): it answers read-only opens of the file with the registration (and,
    ``writable``, opens for writing but not truncating), and their releases, without
    asking; they are counted to the agent after the fact (:meth:`Backings.lent_opened`,
    :meth:`Backings.lent_released`).  ``fd``: the agent's descriptor of the blob, open
    while lent or given (the table fstat()s it at the last release of writers' opens)."""

    def lend(self, ino: int, backing_id: int, writable: bool, fd: int, opened: int = 0) -> bool: ...

    def take_back(self, ino: int) -> None: ...

    def give(self, ino: int, backing_id: int, fd: int) -> bool: ...

    def take_given(self) -> list[int]: ...


class Backings:
    """The registered backing files, by inode number."""

    def __init__(self, engine: TieringEngine) -> None:
        self.engine = engine
        self.by_ino: dict[int, Backing] = {}
        self.served: dict[int, int] = {}  # ino -> its opens served by the agent (cached io mode)
        # Parked registrations: the last release of a fast-tier file takes the final size
        # and times (an fstat, no hop) and keeps the registration and its descriptor here,
        # least recently released first, instead of dropping them; the next open of the file
        # takes it back without a thread hop (a reopen cost an open(2) + ioctl on a worker
        # thread, and a reopen during the drop waited for the lane).  A parked file holds
        # nothing the engine cares about: it is not open, not "backed", may migrate or be
        # deleted — either drops its parked registration first (forget_parked), and a
        # registration of another blob generation is never handed out.
        self.parked: OrderedDict[int, Backing] = OrderedDict()
        self.max_parked = parked_limit()
        # Parked registrations lent to the FUSE layer (Lender): read-only opens of those
        # files are answered with them without the agent; each is taken back before its
        # registration leaves ``parked`` for anything but those opens (_take_back).
        self.lender: Lender | None = None
        self.lent: set[int] = set()
        # Writers too, where the FUSE layer says a writer's open and close of the file ask
        # nothing of the agent (standalone; in a cluster, while the file's write lease is
        # held and reusable and no replica is pushed at close: _lends_to_writers): the files
        # whose registrations are lent for writers as well
        self.writers_lent: Callable[[Inode], bool] | None = None
        self.creates_lent: Callable[[], bool] | None = None  # (the FUSE layer: creates answered by its reader)
        self.lent_writable: set[int] = set()
        # Registrations being dropped on the lane hold their descriptors until its worker
        # gets to them; past this many, whatever would open another one waits (room).
        self.max_dropping = max(16, parked_limit())
        self._warned = -3600.0  # when room() last logged that it waits
        self._deciding: dict[int, trio.Event] = {}  # ino -> set when its deciding open is done
        # the last release of a file drops its backing here, without waiting for it
        self.lane = engine.backings_lane

    # -- the engine's blob pool registers blobs ahead of their create (worker thread) ----
    @staticmethod
    def create_batch(paths: list[str]) -> list[tuple[int, int, BlobStat] | None]:
        """(blocking) Make the blobs ``paths`` (O_EXCL) and register each as a backing
        file, the whole batch in one call without the GIL
        (``pyfuse3.passthrough_create_batch``): a worker thread beside a busy loop thread
        waits for the GIL once for the batch, not after each of the three system calls of
        each blob.  One entry per blob made, in order; None for a blob made whose
        registration the kernel refused (it is there, unregistered).  Stops at the first
        blob that could not be made (the list is shorter); that error is raised when it
        is the first."""
        out: list[tuple[int, int, BlobStat] | None] = []
        for i, (fd, bid, size, mtime_ns, dev, ino) in enumerate(
                pyfuse3.passthrough_create_batch([os.fsencode(p) for p in paths], 0o600)):
            if bid < 0:
                log.warning("registering pool blob %s as a backing file: %s", paths[i], os.strerror(-bid))
                out.append(None)
            else:
                out.append((fd, bid, BlobStat(size, mtime_ns, dev, ino)))
        return out

    @staticmethod
    def prepare(path: str, create: bool = False) -> tuple[int, int, os.stat_result | BlobStat] | None:
        """``create``: make the blob with the same call (O_EXCL; an error there is raised:
        no blob), :meth:`create_batch` of one."""
        if create:
            return Backings.create_batch([path])[0]
        try:
            return open_backing(path)
        except OSError as exc:
            log.warning("registering pool blob %s as a backing file: %s", path, exc)
            return None

    @staticmethod
    def discard(entry: tuple[int, int, os.stat_result]) -> None:
        """(blocking) Drop a pool blob's registration that no open took."""
        unregister(entry[0], entry[1], quiet=True)

    @property
    def enabled(self) -> bool:
        return bool(self.engine.passthrough["enabled"])

    async def room(self) -> None:
        """Wait, before registering another blob, while more than ``max_dropping``
        registrations are queued to be dropped.  Each holds its descriptor until the lane
        closes it, and closing the last descriptor of a deleted file frees its blocks,
        which on a busy disk waits for the journal: a run of creates and removes then
        queued drops faster than they went, and the agent ran out of descriptors (EMFILE
        to the applications; tests/posix/test_migration_integrity.py under I/O load)."""
        if self.lane.backlog > self.max_dropping:
            state = self.engine.passthrough
            state["drop_waits"] = state.get("drop_waits", 0) + 1  # (status: passthrough)
            now = time.monotonic()
            if now - self._warned > 60.0:
                self._warned = now
                log.warning("%d backing files wait to be dropped (the disk is slow to free deleted "
                            "files): new registrations wait for them", self.lane.backlog)
            await self.lane.wait_backlog(self.max_dropping)

    def probe(self) -> None:
        """(after INIT) Register and drop a blob-tier file once: the kernel may refuse
        (EPERM: no CAP_SYS_ADMIN or passthrough not negotiated; ELOOP: the tier sits on
        a stacked file system deeper than allowed).  Sets the engine's status."""
        try:
            self._probe()
        finally:
            self.engine.blobs.negotiating = False  # the pool's reserve may be made now

    def _probe(self) -> None:
        state = self.engine.passthrough
        if not getattr(pyfuse3, "passthrough_enabled", False):
            state.update(enabled=False, reason="the kernel did not offer FUSE_PASSTHROUGH at INIT")
            return
        path = os.path.join(self.engine.tiers[T.FAST].data_dir, ".passthrough-probe")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                pyfuse3.passthrough_close(pyfuse3.passthrough_open(fd))
            finally:
                os.close(fd)
                os.unlink(path)
        except OSError as exc:
            state.update(enabled=False,
                         reason=f"registering a backing file failed: {os.strerror(exc.errno or errno.EIO)} "
                                "(the writeback cache is off for this mount)")
            return
        # parked_max: registrations kept after the last release (a quarter of the soft
        # descriptor limit, at most MAX_PARKED); reopening more recent files than that hops
        state.update(enabled=True, reason="kernel FUSE passthrough for files on the local tiers",
                     parked_max=self.max_parked)
        self.engine.use_backings(self)
        self.engine.placement.on_filling = self.tier_filling

    async def open(self, inode: Inode, wanted: Callable[[], Awaitable[bool]], *, mappable: bool) -> int:
        """The backing id for a new open of ``inode``, or 0: served by the agent.
        ``mappable``: the open may map the file shared and writable (O_RDWR; an O_WRONLY or
        O_RDONLY descriptor cannot), so the last release takes the blob's times to the kernel.

        The kernel keeps one io mode per inode: while it holds a passthrough open, every
        other open must carry the same backing id, and while it holds one served by the
        agent (cached), none may carry any; either mistake fails the open with EIO.  So
        the mode of an inode with opens is kept, and only an inode with none asks
        ``wanted`` (the engine's choice).  The agent's counts are released after the
        kernel's (the kernel drops its mode before it sends RELEASE), so they can only err
        towards "still open", which is safe.  One open of an inode decides at a time."""
        ino = inode.ino
        b = self.by_ino.get(ino)
        if b is not None and b.closed is None and ino not in self._deciding:  # nothing to decide
            b.refs += 1
            b.mappable |= mappable
            b.agent_opened = True
            return b.backing_id
        while (busy := self._deciding.get(ino)) is not None:
            await busy.wait()
        gate = self._deciding[ino] = trio.Event()
        # no open of it is answered without the agent while this one decides (``wanted``
        # may wait: a lent open meanwhile would give the file a passthrough open, with
        # which an open served by the agent cannot coexist)
        self._take_back(ino)
        try:
            if ino in self.by_ino or (not self.served.get(ino) and await wanted()):
                bid = await self._acquire(inode)
                if bid:
                    b = self.by_ino[ino]
                    b.mappable |= mappable
                    b.agent_opened = True
                    return bid
            # served by the agent: a new file's ahead-of-time registration goes, and so
            # does a parked one (the agent may change the blob: it must not be reused)
            self.forget_parked(ino)
            pooled = self.engine.pooled_backings.pop(ino, None)
            if pooled is not None:
                await trio.to_thread.run_sync(self.discard, pooled)
            self.served[ino] = self.served.get(ino, 0) + 1
            return 0
        finally:
            del self._deciding[ino]
            gate.set()

    def served_closed(self, ino: int) -> None:
        """An open that :meth:`open` answered with 0 was released."""
        left = self.served.get(ino, 0) - 1
        if left > 0:
            self.served[ino] = left
        else:
            self.served.pop(ino, None)

    async def _acquire(self, inode: Inode) -> int:
        """(under the inode's gate in :meth:`open`, so no other open registers it meanwhile)
        The backing id for this open (0: the kernel refused it; served by the agent).

        The kernel looks an id up only after it has the reply, so an id handed out must not
        be closing: a registration whose last release is being dropped is waited for, and
        the open then registers afresh.  Nothing is registered before the last await that
        could be cancelled, and a thread hop always completes, so nothing can leak."""
        ino = inode.ino
        b = self.by_ino.get(ino)
        if b is not None and b.closed is not None:  # being dropped: wait for it to go
            with self.lane.watching():
                await b.closed.wait()
            b = self.by_ino.get(ino)
        if b is not None:
            b.refs += 1
            return b.backing_id
        if ino not in self.parked and ino not in self.engine.pooled_backings:  # a new descriptor
            await self.room()  # (none registers it meanwhile: the caller holds its gate)
        self.engine.backed.add(ino)  # before any hop: no migration may start now
        b = self.parked.pop(ino, None)  # (taken back from the table by open's gate)
        if b is not None:
            if b.tier == inode.tier == T.FAST and b.blob_gen == self.engine.blob_gen(ino):
                b.refs = 1
                self.by_ino[ino] = b
                return b.backing_id
            self._drop(b)  # (cannot happen: a move forgets it first) another blob now
        gen = self.engine.blob_gen(ino)
        pooled = self.engine.pooled_backings.pop(ino, None)
        if pooled is not None and inode.tier == T.FAST:  # a new file: no hop
            fd, bid, st = pooled
        else:
            if pooled is not None:
                await trio.to_thread.run_sync(self.discard, pooled)
            try:
                fd, bid, st = await trio.to_thread.run_sync(open_backing, self.engine.blob(inode))
            except OSError as exc:
                self.engine.backing_dropped(ino)
                log.warning("passthrough for inode %d refused (%s): served by the agent", ino, exc)
                return 0
        self._in_use(inode, fd, bid, st, gen)
        return bid

    def _in_use(self, inode: Inode, fd: int, bid: int, st, gen: int) -> Backing:
        """``inode``'s blob (generation ``gen``), open as ``fd`` and registered as ``bid``,
        is its registration, in use by one open."""
        assert inode.tier is not None, "a regular file's bytes are on a tier"
        key = None
        if self.engine.kreads.active:  # its reads are counted by the blob's device and inode
            self.engine.kreads.learn(inode.tier, st.st_dev, st.st_ino)
            key = (st.st_dev, st.st_ino)
        b = self.by_ino[inode.ino] = Backing(fd, bid, inode.tier, 1, st.st_size, st.st_mtime_ns,
                                             blob_gen=gen, blob_key=key)
        return b

    def created_by_reader(self, inode: Inode, entry, mappable: bool) -> None:
        """A file the FUSE reader created with a pool blob it was given: its registration
        (``entry``) is in use by the create's open and lent for writers, as
        :meth:`lend_created` leaves a create's the agent answers."""
        fd, bid, st = entry
        self.engine.backed.add(inode.ino)
        b = self._in_use(inode, fd, bid, st, self.engine.blob_gen(inode.ino))
        b.agent_opened, b.mappable = True, mappable
        self.lent.add(inode.ino)
        self.lent_writable.add(inode.ino)

    def stock_creates(self, want: int, have: int) -> None:
        """Keep ``want`` pool blobs with the FUSE reader for the CREATEs it answers (it
        holds ``have``), while new files' writers may be lent at all
        (:meth:`_creates_lent`)."""
        if have < want and self.lender is not None and self._creates_lent():
            self.engine.blobs.give(want - have, self.lender.give)

    def _creates_lent(self) -> bool:
        """:meth:`_lends_to_writers` for a file not made yet: the FUSE layer allows it
        (``creates_lent``: in a cluster, no replica to push at close; the new file's lease
        is this node's from its create), and the fast tier is below its high watermark."""
        return (self.creates_lent is not None and self.creates_lent()
                and not self.engine.placement.over_high_watermark())

    def lend_created(self, inode: Inode, mappable: bool) -> int:
        """The open of ``inode``'s create, answered with its pooled registration lent for
        writers with that open counted (the table answers its RELEASE, and later opens, as
        for a parked file's lent writers: :meth:`_lends_to_writers` must allow it): the
        backing id, in use by the open; 0 if it cannot be (then :meth:`open` as before)."""
        ino = inode.ino
        pooled = self.engine.pooled_backings.get(ino)
        if (pooled is None or self.lender is None or inode.tier != T.FAST or ino in self.by_ino
                or ino in self.parked or not self._lends_to_writers(inode)):
            return 0
        fd, bid, st = pooled
        if not self.lender.lend(ino, bid, True, fd, opened=1):
            return 0
        del self.engine.pooled_backings[ino]
        self.engine.backed.add(ino)  # no migration may start now
        b = self._in_use(inode, fd, bid, st, self.engine.blob_gen(ino))
        b.agent_opened, b.mappable = True, mappable  # the kernel writes it: fstat at the last release
        self.lent.add(ino)
        self.lent_writable.add(ino)
        return bid

    def blob_key(self, ino: int) -> tuple[int, int] | None:
        """The (st_dev, st_ino) of ``ino``'s registered blob, when its reads are traced."""
        b = self.by_ino.get(ino)
        return b.blob_key if b is not None else None

    def refresh_now(self, inode: Inode) -> bool:
        """:meth:`refresh` when it needs no waiting (no backing, or a fast-tier blob not
        being released): done, True; else False and nothing done (await refresh)."""
        b = self.by_ino.get(inode.ino)
        if b is None:
            return True
        if b.closed is not None or b.tier != T.FAST:
            return False
        self._took(inode, b, os.fstat(b.fd))
        return True

    async def refresh(self, inode: Inode) -> None:
        """Bring size and mtime up to what the kernel wrote into the blob.

        A blob on the fast tier (a local device) is fstat()ed right here: the fstat of an
        open descriptor of a local file system reads the in-memory inode, no I/O, and is
        cheaper than the thread hop around it.  A slow-tier blob may sit on a network
        file system, whose fstat can ask its server: that one goes to a worker thread."""
        if self.refresh_now(inode):
            return
        b = self.by_ino[inode.ino]
        if b.closed is not None:  # the last release is taking the final size right now
            with self.lane.watching():
                await b.closed.wait()
            return
        b.refs += 1  # a release during the fstat must not close the descriptor under it
        try:
            self._took(inode, b, await trio.to_thread.run_sync(os.fstat, b.fd))
        finally:
            self._put(b, inode)

    def _took(self, inode: Inode, b: Backing, st: os.stat_result, *, at_release: bool = False) -> None:
        if self.engine.kreads.active:
            self.engine.kreads.learn(b.tier, st.st_dev, st.st_ino)
        if st.st_size != b.size or st.st_mtime_ns != b.mtime_ns:
            b.size, b.mtime_ns = st.st_size, st.st_mtime_ns
            self.engine.written_through(inode, st.st_size, st.st_mtime_ns)
            if at_release and b.mappable:
                # Changed after the writers' last flush: maybe through a shared mapping,
                # whose stores the kernel's FUSE inode does not see (its own write(2)s
                # update its size and invalidate its times).  The kernel keeps a local
                # file's attributes for a while (fuse.operations.LOCAL_TIMEOUT): make it ask
                # again.  Opens none of which could map it writable: nothing to tell.
                self.lane.submit(invalidate_attrs, inode.ino)
        if at_release:
            b.mappable = False

    def release(self, inode: Inode) -> None:
        """One open of ``inode`` is gone; the last one takes the final size and times and
        drops the registration (one job on the lane for both; the release is answered at
        once)."""
        b = self.by_ino.get(inode.ino)
        if b is not None:
            self._put(b, inode)

    def _put(self, b: Backing, inode: Inode) -> None:
        b.refs -= 1
        if b.refs > 0 or b.closed is not None:
            return
        ino = inode.ino
        if (b.tier == T.FAST and self.max_parked and self.by_ino.get(ino) is b
                and self.engine.ns.inodes.get(ino) is inode and inode.nlink > 0
                and inode.tier == T.FAST and b.blob_gen == self.engine.blob_gen(ino)):
            # Parked, with the final size and times, and the file is free for the engine.
            if self._settled(b, inode):
                del self.by_ino[ino]
                self.parked[ino] = b
                while len(self.parked) > self.max_parked:
                    old, oldest = self.parked.popitem(last=False)
                    self._take_back(old)
                    self._drop(oldest)
                if self.lender is not None:  # a large file's readers are read ahead of by the agent
                    if self.engine.prefetch.wants_opens(b.size):
                        self._take_back(ino)
                    else:
                        self._lend(ino, b, self._lends_to_writers(inode))
                self.engine.backing_dropped(ino)
                return
        self._take_back(ino)
        # Dropped on the lane.  It stays listed until then, so that opens and attribute
        # requests arriving meanwhile wait for the final size instead of reading a stale one.
        b.closed = closed = trio.Event()

        def dropped(st: os.stat_result | None, error: BaseException | None) -> None:
            if st is not None:
                self._took(inode, b, st, at_release=True)
            if self.by_ino.get(inode.ino) is b:
                del self.by_ino[inode.ino]
                self.engine.backing_dropped(inode.ino)
            closed.set()
            if error is not None:
                log.warning("dropping the backing file of inode %d: %s", inode.ino, error)

        self.lane.submit(close_backing, b.fd, b.backing_id, then=dropped)

    def _settled(self, b: Backing, inode: Inode) -> bool:
        """The final size and times of a fast-tier blob about to be parked, from the blob
        (its fstat reads the in-memory inode, as :meth:`refresh`'s does); False if it cannot
        be looked at (then it is dropped instead).  One held by lent opens alone since it
        was last parked was not written: nothing to look at."""
        if not b.agent_opened:
            return True
        try:
            st = os.fstat(b.fd)
        except OSError:
            return False
        self._took(inode, b, st, at_release=True)
        b.agent_opened = False
        return True

    def take_parked(self, ino: int, blob_gen: int) -> tuple[int, int] | None:
        """The parked registration of ``ino``'s current fast-tier blob (generation
        ``blob_gen``), taken out for the blob pool to recycle: (fd, backing id); None if
        there is none (then :meth:`forget_parked` as before)."""
        b = self.parked.get(ino)
        if b is None or b.tier != T.FAST or b.blob_gen != blob_gen:
            return None
        self._take_back(ino)
        del self.parked[ino]
        return b.fd, b.backing_id

    def forget_parked(self, ino: int) -> None:
        """Drop the parked registration of ``ino`` if there is one: its blob is about to
        move or go (a migration starts, the inode is freed) or the agent will serve it."""
        self._take_back(ino)
        b = self.parked.pop(ino, None)
        if b is not None:
            self._drop(b)

    # -- opens answered with a lent registration (fuse/answers.py) ----------------------
    def _lend(self, ino: int, b: Backing, writable: bool) -> None:
        assert self.lender is not None, "lent only through a lender"
        if ino in self.lent and (ino in self.lent_writable) == writable:
            return
        if not self.lender.lend(ino, b.backing_id, writable, b.fd):
            self._take_back(ino)  # (the table is full: a writable lend is not left behind)
            return
        self.lent.add(ino)
        if writable:
            self.lent_writable.add(ino)
        else:
            self.lent_writable.discard(ino)

    def _lends_to_writers(self, inode: Inode) -> bool:
        """Whether opens for writing of a file being parked may be answered without the
        agent: where the FUSE layer allows it (``writers_lent``), for a file whose writes
        the agent need not see (no set-ID bits: a write through the agent clears them),
        whose name is safe from a crash already (nothing to wait for at close), and while
        the fast tier is below its high watermark (a writer of a full tier goes through the
        agent, which can spill: ``TieringEngine.passthrough_for``; :meth:`tier_filling`)."""
        return (self.writers_lent is not None and not inode.mode & (stat.S_ISUID | stat.S_ISGID)
                and self.engine.ns.journal.is_durable(inode.name_seq)
                and not self.engine.placement.over_high_watermark() and self.writers_lent(inode))

    def readers_only(self, ino: int) -> None:
        """Opens for writing of ``ino`` go to the agent again (its write lease may no
        longer be used without asking, the tier filled: :meth:`_lends_to_writers` is asked
        again when it is next parked); readers' stay lent (its registration is parked, or
        in use by lent opens alone: an open the agent answers takes it back)."""
        if ino not in self.lent_writable:
            return
        b = self.parked.get(ino) or self.by_ino.get(ino)
        if b is not None:
            self._lend(ino, b, False)
        else:  # (cannot happen: lent while parked or in use) not lent at all then
            self._take_back(ino)

    def writers_recheck(self, inode: Inode | None, ino: int) -> None:
        """``ino`` changed (the journal's watcher): if its writers are lent and it no longer
        qualifies (made set-ID, gone), they go to the agent again."""
        if ino in self.lent_writable and (inode is None or not self._lends_to_writers(inode)):
            self.readers_only(ino)

    def tier_filling(self) -> None:
        """The fast tier passed its high watermark: writers' opens go to the agent, and so
        do creates (the blobs given to the reader come back)."""
        if self.lender is not None and self.engine.blobs.given:
            self.engine.blobs.taken_back(self.lender.take_given())
        if self.lent_writable:
            for ino in list(self.lent_writable):
                self.readers_only(ino)

    def _take_back(self, ino: int) -> None:
        """No more opens of ``ino`` are answered with its registration without the agent
        (those answered before are counted already: the FUSE layer hands them over before
        the agent runs anything, and their releases come to the agent)."""
        if ino in self.lent:
            self.lent.discard(ino)
            self.lent_writable.discard(ino)
            assert self.lender is not None, "lent only through a lender"
            self.lender.take_back(ino)

    def lent_opened(self, inode: Inode, n: int, writers: int = 0) -> None:
        """``n`` opens of ``inode`` (``writers`` of them for writing) were answered with
        its lent registration: it is in use now (listed as an open one's, ``n``
        references), as after :meth:`open`; the engine counts them
        (``TieringEngine.opened_lent``).  A writer's may have changed the blob by its last
        release (the fstat at parking), and may map it shared and writable (the table
        does not say whether it was O_RDWR)."""
        ino = inode.ino
        b = self.by_ino.get(ino)
        if b is None:
            b = self.parked.pop(ino, None)
            if b is None:  # cannot happen: lent registrations are taken back before they go
                log.error("inode %d: %d opens answered with a registration the agent no longer has", ino, n)
                return
            self.by_ino[ino] = b
            self.engine.backed.add(ino)
        b.refs += n
        if writers:
            b.agent_opened = b.mappable = True

    def lent_released(self, inode: Inode, n: int) -> None:
        """``n`` opens :meth:`lent_opened` counted were released (as :meth:`release`)."""
        b = self.by_ino.get(inode.ino)
        if b is None:  # cannot happen: in use until its last release
            log.error("inode %d: %d releases of opens of a registration not in use", inode.ino, n)
            return
        for _ in range(n):
            self._put(b, inode)

    def _drop(self, b: Backing) -> None:
        """Unregister a parked registration on the lane (nobody waits for it: its id is
        no longer handed out, and the kernel keeps its own reference while in use)."""
        self.lane.submit(unregister, b.fd, b.backing_id)

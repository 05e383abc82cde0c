"""Open files, local or held by other nodes: the write lease a local writer holds, a
remote file read where it is (HCCache) or from a whole copy on this node's fast tier, the
kernel's passthrough of a blob or copy, and what close and fsync wait for (replicas)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import FsError, Inode
from hycache_agent.fs.passthrough import Backings
from hycache_agent.remote.backing import RemoteBackings
from hycache_agent.remote.copy import Filling
from hycache_agent.vfs.view import Part, View

log = logging.getLogger(__name__)


@dataclass
class Opened:
    """An open's answer: the handle, the backing id given to the kernel (0: the agent
    serves its reads and writes), whether close(2) has nothing to wait for, whether the
    kernel may keep the file's pages from an earlier open."""

    fh: int
    backing_id: int = 0
    nothing_at_close: bool = False
    keep_cache: bool = False
    lent_ino: int = 0  # an open answered with the inode's lent registration (no handle: fh 0)


def can_map_writable(flags: int) -> bool:
    """Whether a descriptor opened with ``flags`` can map its file shared and writable
    (mmap needs read access, and PROT_WRITE with MAP_SHARED write access: O_RDWR)."""
    return flags & os.O_ACCMODE == os.O_RDWR


class Opens(Part):
    def __init__(self, engine: TieringEngine, view: View, backings: Backings,
                 remote_backings: RemoteBackings) -> None:
        super().__init__(engine, view, backings, remote_backings)
        self._remote_handles: dict[int, tuple] = {}  # fh -> (RemoteNode, fd or HCCache handle, backing id)
        self._leased: dict[int, int] = {}  # fh -> ino of a write handle holding the write lease
        self._backed: dict[int, Inode] = {}  # fh -> inode of a handle answered with a backing id

    # -- opening ---------------------------------------------------------------------
    async def create(self, parent: int, name: bytes, mode: int, flags: int, uid: int, gid: int
                     ) -> tuple[Opened, Inode]:
        parent = await self.view.local_dir(parent)
        node = await self.engine.create_file(parent, name, stat.S_IFREG | stat.S_IMODE(mode), uid, gid)
        if not flags & os.O_DIRECT and self.backings.lender is not None:
            bid = self.backings.lend_created(node, can_map_writable(flags))
            if bid:  # its RELEASE is the answer table's (a lent writer's)
                self.engine.opened_lent(node, 1, created=True)
                if self.own is not None:  # the lease create_file registered, lendable
                    self.own.write.lent_writers(node.ino, 1)
                return Opened(0, bid, nothing_at_close=True, lent_ino=node.ino), node
        fh = await self.engine.open(node, flags & ~os.O_TRUNC, uid, created=True)
        if self.own is not None:  # the lease create_file registered: no store round trip
            await self.own.lease_for_write(node)
            self._leased[fh] = node.ino
        try:
            opened = await self._local_open(fh, node, True, mappable=can_map_writable(flags))
        except BaseException:
            if self._leased.pop(fh, None) is not None:
                assert self.own is not None, "a write lease is taken only with the cluster link's ownership"
                await self.own.write_done(node.ino)
            raise
        return opened, node

    async def open(self, ino: int, flags: int, uid: int, pid: int) -> Opened:
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)
        nonblocking = bool(flags & os.O_NONBLOCK)
        local = self.view.local(ino)
        if ino not in self.ns.inodes and self.cluster is not None:
            remote = self.view.remote(ino)
            if remote is None:
                raise FsError(errno.ENOENT)
            if local is None and not writing:
                return await self._open_remote(remote, pid)
            if local is None:  # writes are always local: this node becomes the file's primary
                assert self.own is not None, "a remote inode comes with the cluster link's ownership"
                await self.own.take_over(remote, truncate=bool(flags & os.O_TRUNC), nonblocking=nonblocking)
            # The kernel knows this name as the remote inode, whose size it keeps to itself
            # (writeback cache): ESTALE makes it walk the path again with LOOKUP_REVAL, find
            # the local inode and open that (the lease stays held for the retried open).
            raise FsError(errno.ESTALE)
        if local is None:
            raise FsError(errno.ENOENT)
        own = self.own if writing and local.is_reg else None  # None: no write lease
        if own is not None:
            await own.lease_for_write(local, nonblocking)
        try:
            fh = await self.engine.open(local, flags, uid)
        except BaseException:
            if own is not None:
                await own.write_done(local.ino)
            raise
        if own is not None:
            self._leased[fh] = local.ino
        return await self._local_open(fh, local, writing, direct=bool(flags & os.O_DIRECT),
                                      mappable=can_map_writable(flags))

    async def _local_open(self, fh: int, node: Inode, writing: bool, *, mappable: bool,
                          direct: bool = False) -> Opened:
        """With passthrough, the blob's backing id (and no keep_cache: the kernel answers
        EIO to both together); a reader of a fast-tier blob through it gets the blob's
        start read ahead and is followed (fs/prefetch.py), and a slow-tier blob's reads are
        read around in whole blocks (ktrace_reader.Follower), unless it reads around the page
        cache."""

        async def wanted() -> bool:  # set-ID files are written through the agent, which clears the bits
            return not node.mode & (stat.S_ISUID | stat.S_ISGID) and await self.engine.passthrough_for(node, writing)

        try:
            bid = await self.backings.open(node, wanted, mappable=mappable)
        except BaseException:
            await self.engine.release(fh)
            raise
        if bid:
            self._backed[fh] = node
            if not writing and not direct and node.tier == T.FAST:
                path = self.engine.blob(node)
                self.engine.prefetch.start(path)
                self.engine.prefetch.follow(fh, self.backings.blob_key(node.ino), path)
            elif not direct and node.tier == T.SLOW:  # read or written: its reads go around in blocks
                self.engine.prefetch.follow(fh, self.backings.blob_key(node.ino), self.engine.blob(node), blocks=True)
        quiet = not writing or bool(bid and self._nothing_at_close(node))
        return Opened(fh, bid, quiet, keep_cache=not bid and self.engine.config.kernel_cache)

    def _nothing_at_close(self, node: Inode) -> bool:
        """A writer through passthrough whose close(2) has nothing to wait for: its name
        is safe from an agent crash already (in the redo log since its create), and no
        replica waits for the final bytes.  The kernel then sends no FLUSH (FOPEN_NOFLUSH):
        the size it wrote is taken at RELEASE, which the kernel sends after close(2) has
        returned, as it takes a reader's."""
        if not self.ns.journal.is_durable(node.name_seq):
            return False
        return self.cluster is None or self.cluster.replicator.count == 0

    async def _open_remote(self, remote, pid: int) -> Opened:
        await self.cluster.refresh(remote)
        if remote.meta.kind != "file":
            raise FsError(errno.EISDIR if remote.is_dir else errno.ENXIO)
        reader = self.cluster.reader
        if reader is not None and remote.superseded:  # a newer version is a new inode: looked up again
            raise FsError(errno.ESTALE)
        # a copy of this version already on this node's fast tier (prefetched by a plan, or
        # kept from an earlier read) is read from there without a fetch: a fast-tier hit;
        # otherwise a miss, read through HCCache (blocks/objects on demand, remote/reader.py)
        # or, with HCCache off, fetched whole to the fast tier first (a large file HCCache
        # reads whole too, reader.wants_copy); a whole copy is then read by the kernel itself
        # (passthrough, remote/backing.py)
        hit = self.cluster.has_copy(remote)
        copy = fd = None
        if reader is not None and not hit and not reader.wants_copy(remote):
            fd = reader.open(remote, pid)
        else:  # the whole copy, or a large one still streaming in (read while it fills, remote/copy.py)
            got = await self.cluster.stream_open(remote)
            if isinstance(got, str):
                copy = got
            else:
                fd = got
        try:  # (a copy still filling is never given to the kernel: 0, served by the agent)
            bid = await self.remote_backings.open(remote.ino, copy)
        except BaseException:
            if isinstance(fd, Filling):
                with trio.CancelScope(shield=True):
                    await fd.aclose()
            raise
        if copy is not None and not bid:
            try:
                fd = await trio.to_thread.run_sync(os.open, copy, os.O_RDONLY | os.O_CLOEXEC)
            except BaseException:
                await self.remote_backings.release(remote.ino, 0)
                raise
        elif bid:
            fd = None
        fh = self.engine.new_fh()
        io = self.engine.io
        io.remote_opens += 1
        if hit:
            io.tiers[T.FAST].hits += 1
        else:
            io.misses += 1
        remote.open_count += 1
        self._remote_handles[fh] = (remote, fd, bid)
        # the bytes may differ from the last version the kernel cached: no keep_cache;
        # read-only: nothing to do at close
        return Opened(fh, bid, nothing_at_close=True)

    # -- I/O and closing -------------------------------------------------------------
    async def read(self, fh: int, off: int, size: int) -> bytes:
        remote = self._remote_handles.get(fh)
        if remote is None:
            return await self.engine.read(fh, off, size)
        if remote[1] is None:  # passthrough: the kernel reads the copy (a straggler read)
            data = await trio.to_thread.run_sync(os.pread, self.remote_backings.by_ino[remote[0].ino].fd,
                                                 size, off)
        elif not isinstance(remote[1], int):  # an HCCache handle, or a copy still filling
            data = await remote[1].read(off, size)
        else:
            data = await trio.to_thread.run_sync(os.pread, remote[1], size, off)
        self.engine.io.remote_read_bytes += len(data)
        return data

    async def flush(self, fh: int) -> None:
        if fh in self._remote_handles:
            return
        h = self.engine.handles[fh]
        if h.writable and fh in self._backed:
            # the size the kernel wrote counts at close: in the fast tier's accounting (the
            # next writer's room), on the other nodes, and in replicas (the final bytes)
            await self.backings.refresh(h.inode)
        await self.engine.flush(fh)
        if h.writable and self.cluster is not None and self.cluster.replicator.count > 0:
            await self.cluster.replicator.closed(h.inode)

    async def release(self, fh: int) -> None:
        remote = self._remote_handles.pop(fh, None)
        if remote is not None:
            node, fd, bid = remote
            node.open_count -= 1
            if isinstance(fd, int):
                await trio.to_thread.run_sync(os.close, fd)
            elif isinstance(fd, Filling):
                await fd.aclose()
            elif fd is not None:
                fd.close()
            await self.remote_backings.release(node.ino, bid)
            return
        # the handle first (flush already took the size): a file released just now is
        # evictable at once; then the backing id (a last refresh for writes through a
        # mapping after close, which aborts a migration that started meanwhile)
        node = self._backed.pop(fh, None)
        self.engine.prefetch.unfollow(fh)
        if node is None:
            self.backings.served_closed(self.engine.handles[fh].inode.ino)
        await self.engine.release(fh)
        if node is not None:
            self.backings.release(node)
        ino = self._leased.pop(fh, None)
        if ino is not None:
            assert self.own is not None, "a write lease is taken only with the cluster link's ownership"
            await self.own.write_done(ino)

    # -- opens answered by the FUSE layer with a lent registration (Backings.lender) -----
    def lent_opened(self, ino: int, n: int, writers: int = 0) -> None:
        """``n`` opens of local file ``ino`` (``writers`` of them for writing) were
        answered with its parked registration (passthrough): counted as opens now, before
        anything else runs."""
        node = self.ns.inodes.get(ino)
        if node is None:  # cannot happen: its registration is taken back before it goes
            log.error("inode %d: %d opens answered for a file that is gone", ino, n)
            return
        self.engine.opened_lent(node, n)
        self.backings.lent_opened(node, n, writers)
        if writers and self.own is not None:  # with the lease the table was allowed to use
            self.own.write.lent_writers(ino, writers)

    def lent_released(self, ino: int, n: int) -> Inode | None:
        """``n`` of those opens were released, as :meth:`release` of a reader's: the inode
        when it may be freed now (``TieringEngine.maybe_free``: it has no name left)."""
        node = self.ns.inodes.get(ino)
        if node is None:
            log.error("inode %d: %d releases of opens answered for a file that is gone", ino, n)
            return None
        self.backings.lent_released(node, n)
        return node if self.engine.released_lent(node, n) else None

    def lent_writers_closed(self, ino: int, n: int) -> Callable[[], Awaitable[None]] | None:
        """``n`` of the released opens were for writing: their use of the write lease ends
        now (as :meth:`release` of a writer's); what is left to do in a task (the lease's
        release, when another node asked for it), if anything."""
        if self.own is None:
            return None
        leases = self.own.write
        entry = leases.writers_closed(ino, n)
        if entry is None:
            node = self.ns.inodes.get(ino)
            if node is None or node.nlink == 0:  # (the table removed it before this drain)
                leases.forget_idle(ino)  # as Names.removed_by_reader would have
            return None
        return partial(leases.release_closed, ino, entry)

    def created_by_reader(self, parent: int, name: bytes, ino: int, mode: int, uid: int, gid: int,
                          t: int, flags: int) -> Inode:
        """A CREATE the FUSE reader answered itself (a pool blob it was given, the name
        logged in the redo log, the open a lent writer's): the file made here as
        :meth:`create` would have, with its open counted as a lent writer's."""
        node, entry = self.engine.created_by_reader(parent, name, ino, mode, uid, gid, t)
        self.backings.created_by_reader(node, entry, can_map_writable(flags))
        self.engine.opened_lent(node, 1, created=True)
        if self.own is not None:  # the lease the create registered, idle: in use now
            self.own.write.lent_writers(node.ino, 1)
        return node

    def lends_creates(self) -> bool:
        """(``Backings.creates_lent``) Whether a create may be answered without the agent
        (``lends_writers`` for a file not made yet): standalone, always; in a cluster while
        no replica is pushed at close (the new file's lease is this node's from its create)."""
        return self.own is None or (self.cluster is not None and self.cluster.replicator.count == 0)

    def lends_writers(self, node: Inode) -> bool:
        """(``Backings.writers_lent``) Whether a writer's open and close of ``node`` would
        ask nothing of the agent beyond what the table does: standalone, always; in a
        cluster, while its write lease may be used without the store (``WriteLeases.lendable``)
        and no replica is pushed at close."""
        if self.own is None:
            return True
        assert self.cluster is not None, "ownership comes with the cluster link"
        return self.cluster.replicator.count == 0 and self.own.write.lendable(node.ino)

    async def fsync_lent(self, ino: int, datasync: bool) -> None:
        """fsync(2) of a descriptor the table answered: the blob (through its
        registration, in use while the open is) and the metadata journal, as
        ``TieringEngine.fsync`` does for the agent's own."""
        b = self.backings.by_ino.get(ino)
        node = self.ns.inodes.get(ino)
        if node is not None:
            node.synced = True  # its writers wait for the device: placement._promotes_before_write
        if b is not None:
            await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, b.fd)
        await self.ns.journal.sync(durable=True)

    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.engine.handles.get(fh)
        rep = self.cluster.replicator if self.cluster is not None else None
        if (rep is None or rep.mode != "sync" or rep.count == 0 or h is None or not h.writable
                or fh in self._remote_handles or h.inode.open_count != 1):
            await self.engine.fsync(fh, datasync)
            return

        async def current() -> None:  # what the kernel wrote through passthrough
            if fh in self._backed:
                await self.backings.refresh(h.inode)

        # sync replicas: the push runs beside the local fsync (replicas.Replicator.synced)
        await current()
        await rep.synced(h.inode, lambda: self.engine.fsync(fh, datasync), current)

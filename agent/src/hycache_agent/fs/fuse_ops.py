"""The FUSE operations layer: translates kernel requests into engine calls and maps
errors to errno.  No decisions are made here."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import stat
from collections.abc import Callable

import pyfuse3
import trio

from hycache_agent.cluster.dht_link import LATER, META_TTL_SECONDS
from hycache_agent.fs import tiers as T
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, FsError, Inode, join_path, now_ns
from hycache_agent.fs.passthrough import Backings, invalidate_attrs
from hycache_agent.remote.backing import RemoteBackings

log = logging.getLogger(__name__)

XATTR_PREFIX = b"user.hycache."
XATTR_TIER = b"user.hycache.tier"
XATTR_PINNED = b"user.hycache.pinned"
XATTR_INFO = b"user.hycache.info"
VIRTUAL_XATTRS = (XATTR_TIER, XATTR_PINNED, XATTR_INFO)

# How long the kernel may keep a negative lookup: standalone, only this mount makes names
# (and the kernel drops its negative dentry when it does); in a cluster another node may
# publish the name, so no longer than the agent's own view of other nodes' names.
NEGATIVE_TIMEOUT = 30.0
REMOTE_NEGATIVE_TIMEOUT = META_TTL_SECONDS

# How long the kernel may keep the entries and attributes of what this node holds (its
# local inodes): every change to them goes through this mount, whose replies update the
# kernel, except those the agent makes itself, which it invalidates (pyfuse3.invalidate_*):
# a name another node removes, renames or takes over (cluster/ownership.py), a blob
# changed through a mapping after its writers' last flush (passthrough.Backings).  With 1 s
# the kernel asked again (LOOKUP, GETATTR) for every file not touched within the second,
# e.g. stat or open after a create phase.  Files held by other nodes keep the short
# timeouts below (another node may change them: no longer than the agent's own view).
LOCAL_TIMEOUT = 60.0

# FOPEN_NOFLUSH (pyfuse3 patched here, agent/patches): the close(2) of a handle opened for
# reading sends no FLUSH, which the kernel waits for and the agent has nothing to do for
# (flush matters for writers only: their size and name at close).
HAS_NOFLUSH = hasattr(pyfuse3.FileInfo(), "noflush")


def errno_of(exc: Exception, where: str) -> int:
    """The errno a request that failed with ``exc`` is answered with (the only place
    errno is mapped; :func:`errno_edge` and :func:`answer_now` use it)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, (FsError, OSError)):
        code = exc.errno or errno.EIO
        if code == errno.EIO:  # always worth a line: something failed underneath
            log.warning("%s: EIO (%s)", where, exc)
        return code
    log.error("internal error in %s", where, exc_info=exc)
    return errno.EIO


def errno_edge(fn: Callable, *, metadata: bool = False) -> Callable:
    """Turn engine and OS errors into FUSE replies.
    ``metadata``: the operation counts as a metadata op in the engine's counters."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        if metadata:
            args[0].engine.io.metadata_ops += 1
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            raise pyfuse3.FUSEError(errno_of(exc, fn.__name__)) from None

    return wrapper


def metadata_op(fn: Callable) -> Callable:
    """:func:`errno_edge` for a metadata operation (lookup, getattr, mkdir, rename…)."""
    return errno_edge(fn, metadata=True)


def answer_now(fn: Callable) -> Callable:
    """The edge of a synchronous answer (``lookup_now``, ``getattr_now``,
    ``getxattr_now``: the patched pyfuse3 calls them from the request's callback, before
    it makes a coroutine).  ``fn`` returns the reply, an errno (int) or None when the
    answer needs I/O or another thread: then pyfuse3 runs the coroutine (the ``async``
    handler of the same name), which counts the request itself, so this one counts only
    what it answers.  Errors are mapped by :func:`errno_of` and answered as errnos (no
    exception crosses into pyfuse3's callback).  Metadata ops all."""

    @functools.wraps(fn)
    def wrapper(self, *args):
        try:
            reply = fn(self, *args)
        except Exception as exc:
            reply = errno_of(exc, fn.__name__)
        if reply is not None:
            self.engine.io.metadata_ops += 1
        return reply

    return wrapper


class HyCacheOperations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = True

    def __init__(self, engine: TieringEngine, attr_timeout: float = 1.0) -> None:
        super().__init__()
        self.engine = engine
        self.ns = engine.ns
        # The kernel's writeback cache turns many small writes into few large ones (read
        # by pyfuse3 when the kernel sends INIT).
        self.enable_writeback_cache = engine.config.writeback_cache
        # Passthrough is asked for at INIT when the host allows it (mount.py decides); the
        # patched pyfuse3 then leaves the writeback cache off (the kernel refuses both).
        self.enable_passthrough = False
        self.max_backing_stack_depth = 1  # tiers may sit on overlayfs (containers)
        # The agent clears set-user/group-ID bits itself (engine._kill_suid on write and
        # truncate): with FUSE_HANDLE_KILLPRIV_V2 the kernel marks the super block NOSEC and
        # stops sending GETXATTR security.capability before every write (docs/agent.md).
        self.enable_killpriv_v2 = True
        self.backings = Backings(engine)
        self.nursery: trio.Nursery | None = None  # set by mount.py before the session runs
        self.attr_timeout = attr_timeout  # what other nodes hold (directories; files: 0)
        self.local_timeout = LOCAL_TIMEOUT
        self._dir_handles: dict[int, list[tuple[bytes, int]]] = {}
        self._next_dir_fh = 1
        self.cluster = engine.cluster  # None when standalone
        self._remote_handles: dict[int, tuple] = {}  # fh -> (RemoteNode, fd or HCCache handle, backing id)
        self.remote_backings = RemoteBackings(engine)  # passthrough of whole copies of remote files
        self._leased: dict[int, int] = {}  # fh -> ino of a write handle holding the write lease
        self._backed: dict[int, Inode] = {}  # fh -> inode of a handle answered with a backing id
        self.own = engine.cluster.ownership if engine.cluster is not None else None
        if self.own is not None:
            self.own.on_invalidate = self._invalidate_entry
        if self.cluster is not None:
            self.cluster.on_copy = self._park_copy
            self.cluster.on_copy_dropped = self.remote_backings.forget

    async def _park_copy(self, ino: int, copy: str) -> None:
        if ino in self.cluster.remote:  # (not forgotten by the kernel meanwhile)
            await self.remote_backings.park_copy(ino, copy)

    def init(self) -> None:
        """pyfuse3 calls this while answering INIT: a backing file can be registered only
        after the reply, so the probe runs as a task."""
        if self.enable_passthrough and self.nursery is not None:
            self.nursery.start_soon(self._probe_passthrough)

    async def _probe_passthrough(self) -> None:
        self.backings.probe()
        state = self.engine.passthrough
        log.info("passthrough: %s (%s)", "on" if state["enabled"] else "off", state["reason"])
        if not state["enabled"] and self.engine.config.passthrough == "on":
            log.error("--passthrough on, but %s: stopping", state["reason"])
            pyfuse3.terminate()

    def _invalidate_entry(self, parent: int, name: bytes) -> None:
        """Another node removed, renamed or took over a name here: the kernel forgets the
        name and the directory's attributes (kept for LOCAL_TIMEOUT)."""
        try:
            pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)
        except Exception:
            return
        self.backings.lane.submit(invalidate_attrs, parent)

    # -- attributes ------------------------------------------------------------------
    def _stat(self, ino: int, src, nlink: int, attr_timeout: float,
              entry_timeout: float | None = None) -> pyfuse3.EntryAttributes:
        """Attributes from a local Inode or a remote EntryMeta (same field names)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = self.attr_timeout if entry_timeout is None else entry_timeout
        a.attr_timeout = attr_timeout
        a.st_mode, a.st_nlink, a.st_uid, a.st_gid, a.st_rdev = src.mode, nlink, src.uid, src.gid, src.rdev
        a.st_size = src.size
        a.st_blksize = 4096
        a.st_blocks = (src.size + 511) // 512
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = src.atime_ns, src.mtime_ns, src.ctime_ns
        return a

    def _attrs(self, inode: Inode) -> pyfuse3.EntryAttributes:
        """A local inode's attributes, kept by the kernel for LOCAL_TIMEOUT."""
        return self._stat(inode.ino, inode, inode.nlink, self.local_timeout, self.local_timeout)

    def _entry(self, inode: Inode) -> pyfuse3.EntryAttributes:
        inode.lookups += 1
        return self._attrs(inode)

    def _remote_attrs(self, node) -> pyfuse3.EntryAttributes:
        # another node may still be writing a remote file: the kernel keeps its entry and
        # size only while announcements of its changes are heard (a covered entry's lease,
        # cluster/invalidation.py), else never (a stale size would make reads stop early)
        if node.is_dir:
            return self._stat(node.ino, node.meta, 2, self.attr_timeout)
        lease = self.cluster.inval.lease_left(node)
        return self._stat(node.ino, node.meta, 1, lease, lease or None)

    def _remote(self, ino: int):
        return self.cluster.remote.get(ino) if self.cluster is not None else None

    def _local(self, ino: int) -> Inode | None:
        """The local inode behind a kernel inode number: a local one, or a remote file
        this node has taken over since the kernel looked it up."""
        node = self.ns.inodes.get(ino)
        if node is not None:
            return node
        remote = self._remote(ino)
        if remote is not None and remote.local is not None and remote.local.nlink > 0:
            return remote.local
        return None

    @contextlib.asynccontextmanager
    async def _writable(self, ino: int, *, truncate: bool = False):
        """The local inode to change for ``ino`` (yields ``(inode, leased)``): a file held
        by another node is taken over first and its write lease released when the change
        is done; a directory held only elsewhere is made locally."""
        local = self._local(ino)
        remote = self._remote(ino) if local is None else None
        if local is not None or remote is None:
            yield (local or self.ns.get(ino)), False  # ns.get: ENOENT
        elif remote.is_dir:
            yield self.ns.get(await self.own.local_dir(remote.path)), False
        elif remote.meta.kind != "file":
            raise FsError(errno.EROFS)  # symlinks and devices held elsewhere: read-only here
        else:
            local = await self.own.take_over(remote, truncate=truncate)
            try:
                yield local, True
            finally:
                await self.own.write_done(local.ino)

    def _negative(self) -> pyfuse3.EntryAttributes:
        """"No such name", kept by the kernel as a negative dentry for a while (inode 0: a
        reply with a timeout, unlike the error ENOENT).  Names made through this mount
        replace it at once; a name another node publishes shows within the global
        namespace's own staleness (the agent caches small directories' listings as long)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        if self.cluster is None:
            a.entry_timeout = NEGATIVE_TIMEOUT
        else:  # not kept while the global namespace cannot be asked: ask again once it is back
            a.entry_timeout = REMOTE_NEGATIVE_TIMEOUT if self.cluster.reachable else 0
        return a

    # -- requests answered from memory ---------------------------------------------
    # lookup, getattr and getxattr first try to answer without waiting (``*_from_memory``:
    # the reply, an errno, or None when it needs the store, a worker thread or a wait);
    # the patched pyfuse3 calls the ``*_now`` forms from the request's callback, without
    # a coroutine (docs/agent.md, "The metadata path"), and the ``async`` handlers start
    # with the same call, so each answer is made in one place.

    def _remote_entry(self, node) -> pyfuse3.EntryAttributes:
        """The entry of a name the global namespace has (``node``) or not (None)."""
        if node is None:
            return self._negative()
        node.lookups += 1
        return self._remote_attrs(node)

    def _lookup_from_memory(self, parent_inode: int, name: bytes) -> pyfuse3.EntryAttributes | None:
        try:
            inode = self.ns.lookup(parent_inode, name)
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
            if self.cluster is None:
                return self._negative()
            node = self.cluster.lookup_now(parent_inode, name)
            return None if node is LATER else self._remote_entry(node)
        if not self.backings.refresh_now(inode):
            return None
        return self._entry(inode)

    @answer_now
    def lookup_now(self, parent_inode, name):
        return self._lookup_from_memory(parent_inode, name)

    @metadata_op
    async def lookup(self, parent_inode, name, ctx=None):
        entry = self._lookup_from_memory(parent_inode, name)
        if entry is not None:
            return entry
        try:
            inode = self.ns.lookup(parent_inode, name)
        except FsError:  # ENOENT (the others were raised above): maybe held elsewhere
            return self._remote_entry(await self.cluster.lookup(parent_inode, name))
        await self.backings.refresh(inode)
        return self._entry(inode)

    @errno_edge
    async def forget(self, inode_list):
        for ino, n in inode_list:
            if self.cluster is not None and await self.cluster.forget(ino, n):
                if ino not in self.cluster.remote:
                    await self.remote_backings.forget(ino)
                continue
            await self.engine.forget(ino, n)

    def _getattr_from_memory(self, inode: int) -> pyfuse3.EntryAttributes | None:
        node = self._remote(inode)
        if node is not None:
            if node.local is not None and node.local.nlink > 0:  # taken over
                return self._stat(inode, node.local, node.local.nlink, self.attr_timeout)
            return None if self.cluster.stale(node) else self._remote_attrs(node)
        node = self.ns.get(inode)
        # the kernel writes a backed file directly: the blob knows its size and times
        return self._attrs(node) if self.backings.refresh_now(node) else None

    @answer_now
    def getattr_now(self, inode):
        return self._getattr_from_memory(inode)

    @metadata_op
    async def getattr(self, inode, ctx=None):
        attrs = self._getattr_from_memory(inode)
        if attrs is not None:
            return attrs
        node = self._remote(inode)
        if node is not None:
            return self._remote_attrs(await self.cluster.refresh(node))
        node = self.ns.get(inode)
        await self.backings.refresh(node)
        return self._attrs(node)

    @metadata_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        async with self._writable(inode, truncate=fields.update_size and attr.st_size == 0) as (node, leased):
            return await self._setattr(inode, node, attr, fields, ctx, leased)

    async def _setattr(self, inode, node, attr, fields, ctx, leased):
        if node.ino in self.backings.by_ino:  # writes first, then this change on top
            await self.backings.refresh(node)
        t = now_ns()
        if fields.update_size:
            if node.is_dir:
                raise FsError(errno.EISDIR)
            if not node.is_reg:
                raise FsError(errno.EINVAL)
            if self.own is not None and not leased:
                await self.own.lease_for_write(node)
                leased = True
                try:
                    await self.engine.truncate(node, attr.st_size, ctx.uid)
                finally:
                    await self.own.write_done(node.ino)
            else:
                await self.engine.truncate(node, attr.st_size, ctx.uid)
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        if fields.update_uid or fields.update_gid:
            if fields.update_uid:
                node.uid = attr.st_uid
            if fields.update_gid:
                node.gid = attr.st_gid
            if not node.is_dir and not fields.update_mode:
                node.mode &= ~stat.S_ISUID
                if node.mode & stat.S_IXGRP:
                    node.mode &= ~stat.S_ISGID
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
        node.ctime_ns = attr.st_ctime_ns if fields.update_ctime else t
        self.ns.journal.inode(node.ino)
        if fields.update_mode or fields.update_uid or fields.update_gid or fields.update_size:
            await self.ns.journal.sync()
        # times alone (the writeback cache sends them at every close) ride on the next
        # group commit, within a second
        if inode == node.ino:
            return self._attrs(node)
        return self._stat(inode, node, node.nlink, self.attr_timeout)  # a remote file taken over

    # -- names -----------------------------------------------------------------------
    @metadata_op
    async def readlink(self, inode, ctx):
        remote = self._remote(inode)
        if remote is not None:
            if remote.meta.target is None:
                raise FsError(errno.EINVAL)
            return remote.meta.target
        node = self.ns.get(inode)
        if node.target is None:
            raise FsError(errno.EINVAL)
        return node.target

    @metadata_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = await self.engine.create_file(parent_inode, name, mode, ctx.uid, ctx.gid, rdev)
        return self._entry(node)

    @metadata_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = self.ns.new_inode(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode), ctx.uid, ctx.gid)
        self.engine.commit_soon()  # names inside it commit after it (commits are in order)
        return self._entry(node)

    @metadata_op
    async def symlink(self, parent_inode, name, target, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = self.ns.new_inode(parent_inode, name, stat.S_IFLNK | 0o777, ctx.uid, ctx.gid, target=target)
        self.engine.commit_soon()
        return self._entry(node)

    @metadata_op
    async def link(self, inode, new_parent_inode, new_name, ctx):
        async with self._writable(inode) as (node, _):
            await self.backings.refresh(node)  # the size the kernel wrote, before the new name is published
            new_parent_inode = await self._local_dir(new_parent_inode)
            node = self.ns.link(node.ino, new_parent_inode, new_name)
            await self.ns.journal.sync()
        return self._entry(node)

    def _has_local(self, parent_ino: int, name: bytes) -> bool:
        parent = self._local(parent_ino)
        return parent is not None and name in self.ns.children.get(parent.ino, {})

    @metadata_op
    async def unlink(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, rmdir=False)

    @metadata_op
    async def rmdir(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, rmdir=True)

    async def _remove(self, parent_inode: int, name: bytes, *, rmdir: bool) -> None:
        if self.cluster is None:
            await self.engine.remove(parent_inode, name, rmdir=rmdir)
            return
        if not self._has_local(parent_inode, name):
            node = await self.cluster.lookup(parent_inode, name)
            if node is None:
                raise FsError(errno.ENOENT)
            await self.own.remove_remote(node, rmdir=rmdir)
            return
        parent = self._local(parent_inode).ino
        inode = self.ns.lookup(parent, name)
        path = self.ns.child_path(parent, name) if inode.is_dir or inode.replicas else b""
        # other nodes may hold names in it (a directory is the union of the nodes')
        if rmdir and inode.is_dir and await self.cluster.dir_has_entries(path):
            raise FsError(errno.ENOTEMPTY)
        await self.engine.remove(parent, name, rmdir=rmdir)
        await self.own.removed_here(inode, path)

    @metadata_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if self.cluster is None:
            await self.engine.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)
            return
        dst_is_local = self._has_local(parent_inode_new, name_new)
        if not self._has_local(parent_inode_old, name_old):  # the source is held elsewhere
            src = await self.cluster.lookup(parent_inode_old, name_old)
            if src is None:
                raise FsError(errno.ENOENT)
            if flags & RENAME_EXCHANGE:
                raise FsError(errno.EINVAL)  # no exchange across nodes
            dst_local = None
            if dst_is_local:
                dst_parent = self._local(parent_inode_new).ino
                dst = self.ns.lookup(dst_parent, name_new)
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST)
                if dst.is_dir != src.is_dir:
                    raise FsError(errno.EISDIR if dst.is_dir else errno.ENOTDIR)
                if dst.is_dir and self.ns.children[dst.ino]:
                    raise FsError(errno.ENOTEMPTY)
                dst_local = (dst_parent, name_new)
            dst_path = join_path(self.cluster.path_of(parent_inode_new) or b"/", name_new)
            await self.own.rename_remote(src.path, dst_path, src.meta, noreplace=bool(flags & RENAME_NOREPLACE),
                                         dst_local=dst_local)
            return
        old_parent = self._local(parent_inode_old).ino
        src = self.ns.lookup(old_parent, name_old)
        await self.backings.refresh(src)  # the size the kernel wrote, before the new name is published
        replaced = None
        if not dst_is_local:
            replaced = await self.cluster.lookup(parent_inode_new, name_new)
            if replaced is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST)
                if flags & RENAME_EXCHANGE:
                    raise FsError(errno.EINVAL)
                if replaced.is_dir != src.is_dir:
                    raise FsError(errno.EISDIR if replaced.is_dir else errno.ENOTDIR)
                if replaced.is_dir and await self.cluster.dir_has_entries(replaced.path):
                    raise FsError(errno.ENOTEMPTY)
        src_path = self.ns.child_path(old_parent, name_old)
        new_parent = await self._local_dir(parent_inode_new)
        await self.engine.rename(old_parent, name_old, new_parent, name_new, flags)
        await self.own.renamed_here(src, src_path, self.ns.child_path(new_parent, name_new), replaced)

    # -- directories -----------------------------------------------------------------
    @metadata_op
    async def opendir(self, inode, ctx):
        remote = self._remote(inode)
        if remote is not None:
            if not remote.is_dir:
                raise FsError(errno.ENOTDIR)
            listing = [(b".", inode), (b"..", inode)]
            listing.extend((name, node.ino) for name, node in await self.cluster.list_remote(remote.path))
        else:
            entries = self.ns.dir(inode)
            listing = [(b".", inode), (b"..", self.ns.parent.get(inode, inode))]
            listing.extend(entries.items())
            if self.cluster is not None:  # names held by other nodes
                path = self.ns.path_of(inode)
                if path is not None:
                    listing.extend((name, node.ino) for name, node in await self.cluster.list_remote(path)
                                   if name not in entries)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dir_handles[fh] = listing
        return fh

    @metadata_op
    async def readdir(self, fh, start_id, token):
        listing = self._dir_handles[fh]
        for i in range(start_id, len(listing)):
            name, ino = listing[i]
            node = self.ns.inodes.get(ino)
            if node is None:
                remote = self._remote(ino)
                if remote is None:  # removed since opendir
                    continue
                if not pyfuse3.readdir_reply(token, name, self._remote_attrs(remote), i + 1):
                    break
                if name not in (b".", b".."):
                    remote.lookups += 1
                continue
            if ino in self.backings.by_ino:
                await self.backings.refresh(node)
            if not pyfuse3.readdir_reply(token, name, self._attrs(node), i + 1):
                break
            if name not in (b".", b".."):
                node.lookups += 1

    @metadata_op
    async def releasedir(self, fh):
        self._dir_handles.pop(fh, None)

    @errno_edge
    async def fsyncdir(self, fh, datasync):
        await self.ns.journal.sync(durable=True)

    # -- files -----------------------------------------------------------------------
    async def _file_info(self, fh: int, node: Inode, writing: bool) -> pyfuse3.FileInfo:
        """The open reply: with passthrough, the blob's backing id (and no keep_cache:
        the kernel answers EIO to both together)."""

        async def wanted() -> bool:  # set-ID files are written through the agent, which clears the bits
            return not node.mode & (stat.S_ISUID | stat.S_ISGID) and await self.engine.passthrough_for(node, writing)

        try:
            bid = await self.backings.open(node, wanted)
        except BaseException:
            await self.engine.release(fh)
            raise
        if bid:
            self._backed[fh] = node
            fi = pyfuse3.FileInfo(fh=fh, keep_cache=False, direct_io=False, backing_id=bid)
        else:
            fi = pyfuse3.FileInfo(fh=fh, keep_cache=self.engine.config.kernel_cache, direct_io=False)
        if HAS_NOFLUSH and (not writing or (bid and self._nothing_at_close(node))):
            fi.noflush = True
        return fi

    def _nothing_at_close(self, node: Inode) -> bool:
        """A writer through passthrough whose close(2) has nothing to wait for: its name
        is safe from an agent crash already (in the redo log since its create), and no
        replica waits for the final bytes.  The kernel then sends no FLUSH (FOPEN_NOFLUSH):
        the size it wrote is taken at RELEASE, which the kernel sends after close(2) has
        returned, as it takes a reader's."""
        if not self.ns.journal.is_durable(node.name_seq):
            return False
        return self.cluster is None or self.cluster.replicator.count == 0

    @metadata_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = await self.engine.create_file(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode),
                                             ctx.uid, ctx.gid)
        fh = await self.engine.open(node, flags & ~os.O_TRUNC, ctx.uid, created=True)
        if self.own is not None:  # the lease create_file registered: no store round trip
            await self.own.lease_for_write(node)
            self._leased[fh] = node.ino
        try:
            fi = await self._file_info(fh, node, True)
        except BaseException:
            if self._leased.pop(fh, None) is not None:
                await self.own.write_done(node.ino)
            raise
        return fi, self._entry(node)

    @errno_edge
    async def open(self, inode, flags, ctx):
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)
        nonblocking = bool(flags & os.O_NONBLOCK)
        local = self._local(inode)
        leased = False
        if inode not in self.ns.inodes and self.cluster is not None:
            remote = self._remote(inode)
            if remote is None:
                raise FsError(errno.ENOENT)
            if local is None and not writing:
                return await self._open_remote(remote, ctx.pid)
            if local is None:  # writes are always local: this node becomes the file's primary
                await self.own.take_over(remote, truncate=bool(flags & os.O_TRUNC), nonblocking=nonblocking)
            # The kernel knows this name as the remote inode, whose size it keeps to itself
            # (writeback cache): ESTALE makes it walk the path again with LOOKUP_REVAL, find
            # the local inode and open that (the lease stays held for the retried open).
            raise FsError(errno.ESTALE)
        if local is None:
            raise FsError(errno.ENOENT)
        if writing and self.own is not None and local.is_reg:
            await self.own.lease_for_write(local, nonblocking)
            leased = True
        try:
            fh = await self.engine.open(local, flags, ctx.uid)
        except BaseException:
            if leased:
                await self.own.write_done(local.ino)
            raise
        if leased:
            self._leased[fh] = local.ino
        return await self._file_info(fh, local, writing)

    async def _open_remote(self, remote, pid: int):
        await self.cluster.refresh(remote)
        if remote.meta.kind != "file":
            raise FsError(errno.EISDIR if remote.is_dir else errno.ENXIO)
        reader = self.cluster.reader
        if reader is not None and remote.superseded:  # a newer version is a new inode: looked up again
            raise FsError(errno.ESTALE)
        # a copy of this version already on this node's fast tier (prefetched by a plan, or
        # kept from an earlier read) is read from there without a fetch: a fast-tier hit;
        # otherwise a miss, read through HCCache (blocks/objects on demand, remote_read.py)
        # or, with HCCache off, fetched whole to the fast tier first
        # (a large file HCCache reads whole too, remote/reader.py wants_copy); a whole copy
        # is then read by the kernel itself (passthrough, remote/backing.py)
        hit = self.cluster.has_copy(remote)
        copy = None
        if reader is not None and not hit and not reader.wants_copy(remote):
            fd = reader.open(remote, pid)
        else:  # the whole copy (streamed in first if needed, remote/copy.py)
            copy = await self.cluster.stream_remote(remote)
        bid = await self.remote_backings.open(remote.ino, copy)
        if copy is not None and not bid:
            try:
                fd = await trio.to_thread.run_sync(os.open, copy, os.O_RDONLY | os.O_CLOEXEC)
            except BaseException:
                await self.remote_backings.release(remote.ino, 0)
                raise
        elif bid:
            fd = None
        fh = next(self.engine._fh)
        self.engine.io.remote_opens += 1
        if hit:
            self.engine.io.tiers[T.FAST].hits += 1
        else:
            self.engine.io.misses += 1
        remote.open_count += 1
        self._remote_handles[fh] = (remote, fd, bid)
        # the bytes may differ from the last version the kernel cached: no keep_cache
        fi = pyfuse3.FileInfo(fh=fh, keep_cache=False, direct_io=False)
        if bid:
            fi.backing_id = bid
        if HAS_NOFLUSH:
            fi.noflush = True  # read-only: nothing to do at close
        return fi

    async def _local_dir(self, ino: int) -> int:
        """A directory's local inode; a directory held only in the global namespace is
        created locally first (with its owner and mode), so new names are always local."""
        remote = self._remote(ino)
        if remote is None:
            return ino
        if not remote.is_dir:
            raise FsError(errno.ENOTDIR)
        return await self.own.local_dir(remote.path)

    @errno_edge
    async def read(self, fh, off, size):
        remote = self._remote_handles.get(fh)
        if remote is not None:
            if remote[1] is None:  # passthrough: the kernel reads the copy (a straggler read)
                data = await trio.to_thread.run_sync(os.pread, self.remote_backings.by_ino[remote[0].ino].fd,
                                                     size, off)
            elif not isinstance(remote[1], int):  # an HCCache handle
                data = await remote[1].read(off, size)
            else:
                data = await trio.to_thread.run_sync(os.pread, remote[1], size, off)
            self.engine.io.remote_read_bytes += len(data)
            return data
        return await self.engine.read(fh, off, size)

    @errno_edge
    async def write(self, fh, off, buf):
        return await self.engine.write(fh, off, buf)

    @errno_edge
    async def flush(self, fh):
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

    @errno_edge
    async def release(self, fh):
        remote = self._remote_handles.pop(fh, None)
        if remote is not None:
            node, fd, bid = remote
            node.open_count -= 1
            if isinstance(fd, int):
                await trio.to_thread.run_sync(os.close, fd)
            elif fd is not None:
                fd.close()
            await self.remote_backings.release(node.ino, bid)
            return
        # the handle first (flush already took the size): a file released just now is
        # evictable at once; then the backing id (a last refresh for writes through a
        # mapping after close, which aborts a migration that started meanwhile)
        node = self._backed.pop(fh, None)
        if node is None:
            self.backings.served_closed(self.engine.handles[fh].inode.ino)
        await self.engine.release(fh)
        if node is not None:
            self.backings.release(node)
        ino = self._leased.pop(fh, None)
        if ino is not None:
            await self.own.write_done(ino)

    @errno_edge
    async def fsync(self, fh, datasync):
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

    # -- file system -----------------------------------------------------------------
    @metadata_op
    async def statfs(self, ctx):
        total, free, files, ffree = await self.engine.statfs()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = total // 4096
        s.f_bfree = s.f_bavail = free // 4096
        s.f_files = files
        s.f_ffree = s.f_favail = ffree
        s.f_namemax = 255
        return s

    @metadata_op
    async def access(self, inode, mode, ctx):
        node = self.ns.get(inode)
        if ctx.uid == 0:
            return not (mode & os.X_OK) or node.is_dir or bool(node.mode & 0o111)
        if ctx.uid == node.uid:
            bits = (node.mode >> 6) & 7
        elif ctx.gid == node.gid or node.gid in pyfuse3.get_sup_groups(ctx.pid):
            bits = (node.mode >> 3) & 7
        else:
            bits = node.mode & 7
        return (mode & bits) == mode

    # -- extended attributes (user.hycache.* are the agent's controls) -----------------
    @answer_now
    def getxattr_now(self, inode, name):
        return self._getxattr_from_memory(inode, name)

    @metadata_op
    async def getxattr(self, inode, name, ctx):
        value = self._getxattr_from_memory(inode, name)
        if value is None:  # user.hycache.info of a file whose blob must be asked first
            node = self._local(inode) or self.ns.get(inode)
            await self.backings.refresh(node)
            value = self._info(node)
        if type(value) is int:
            raise FsError(value)
        return value

    def _info(self, node: Inode) -> bytes:
        return json.dumps(self.engine.file_info(node)).encode()

    def _getxattr_from_memory(self, inode: int, name: bytes) -> bytes | int | None:
        """The value, an errno (ENODATA without an exception: the kernel asks for
        security.capability once per new inode) or None (a refresh must be waited for)."""
        remote = self._remote(inode) if self._local(inode) is None else None
        if remote is not None:
            if name == XATTR_INFO:
                m = remote.meta
                return json.dumps({"ino": remote.ino, "type": m.kind if m.kind != "dir" else "dir",
                                   "tier": "remote", "size": m.size, "pinned": False, "hits": 0,
                                   "open": remote.open_count, "primary": m.primary, "replicas": m.replicas,
                                   "remote_tier": m.tier, "version": m.version,
                                   "agent_root": str(self.engine.config.root)}).encode()
            if name == XATTR_TIER and remote.meta.kind == "file":
                return b"remote"
            return errno.ENODATA
        node = self._local(inode) or self.ns.get(inode)
        if name == XATTR_INFO:
            # size and times as the kernel wrote them
            return self._info(node) if self.backings.refresh_now(node) else None
        if name == XATTR_TIER:
            if not node.is_reg:
                return errno.ENODATA
            return node.tier.encode()
        if name == XATTR_PINNED:
            return b"1" if node.pinned else b"0"
        return node.xattrs.get(name, errno.ENODATA)

    @metadata_op
    async def setxattr(self, inode, name, value, ctx):
        async with self._writable(inode) as (node, _):
            await self._setxattr(node, name, value)

    async def _setxattr(self, node: Inode, name: bytes, value: bytes) -> None:
        inode = node.ino
        if name == XATTR_TIER:
            self.engine.request_move(node, value.strip().decode(errors="replace"))
            return
        if name == XATTR_PINNED:
            flag = value.strip()
            if flag not in (b"0", b"1"):
                raise FsError(errno.EINVAL)
            await self.engine.set_pinned(node, flag == b"1")
            return
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        node.xattrs[name] = value
        node.ctime_ns = now_ns()
        self.ns.journal.set_xattr(inode, name, value)
        self.ns.journal.inode(inode)
        await self.ns.journal.sync()

    @metadata_op
    async def listxattr(self, inode, ctx):
        node = self._local(inode)
        return [] if node is None else list(node.xattrs)

    @metadata_op
    async def removexattr(self, inode, name, ctx):
        async with self._writable(inode) as (node, _):
            await self._removexattr(node, name)

    async def _removexattr(self, node: Inode, name: bytes) -> None:
        inode = node.ino
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        if name not in node.xattrs:
            raise FsError(errno.ENODATA)
        del node.xattrs[name]
        node.ctime_ns = now_ns()
        self.ns.journal.del_xattr(inode, name)
        self.ns.journal.inode(inode)
        await self.ns.journal.sync()

"""The FUSE adapter (pyfuse3 ``Operations``): translates kernel requests into calls of the
vfs layer (:mod:`hycache_agent.vfs`), its answers into replies, and errors into errnos
(the only place errno is chosen).  Nothing is decided here."""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable, Sequence

import pyfuse3
import trio

from hycache_agent.fs.lane import Lane
from hycache_agent.fs.namespace import FsError, Inode
from hycache_agent.fs.passthrough import invalidate_attrs
from hycache_agent.fuse.answers import LENT_FH, LENT_INO, LENT_WRITER, AnswerTable
from hycache_agent.vfs.layer import Vfs
from hycache_agent.vfs.names import MISSING
from hycache_agent.vfs.opens import Opened

log = logging.getLogger(__name__)

# How long the kernel may keep the entries and attributes of what this node holds (its
# local inodes): every change to them goes through this mount, whose replies update the
# kernel, except those the agent makes itself, which it invalidates (pyfuse3.invalidate_*):
# a name another node removes, renames or takes over (cluster/ownership.py), a blob
# changed through a mapping after its writers' last flush (passthrough.Backings).  Files
# held by other nodes keep the short timeouts (another node may change them: no longer
# than the agent's own view).
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
            args[0].io.metadata_ops += 1
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
            self.io.metadata_ops += 1
        return reply

    return wrapper


def invalidate_entry(lane: Lane, parent: int, name: bytes) -> None:
    """Another node removed, renamed or took over a name here: the kernel forgets the
    name and the directory's attributes (kept for LOCAL_TIMEOUT).  Given to the cluster
    link (mount.py)."""
    if hasattr(pyfuse3, "answers_drop_name"):  # the reader's table forgets it too
        pyfuse3.answers_drop_name(parent, name)
    try:
        pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)
    except Exception:
        return
    lane.submit(invalidate_attrs, parent)


class HyCacheOperations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = True

    def __init__(self, vfs: Vfs, *, attr_timeout: float = 1.0, passthrough: bool = False,
                 after_init: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._after_init = after_init  # run once the kernel has the INIT reply (mount.set_read_ahead)
        engine = vfs.engine
        self.vfs = vfs
        self.engine = engine
        self.io = engine.io
        self.ns = engine.ns
        self.names, self.xattrs, self.opens = vfs.names, vfs.xattrs, vfs.opens
        # The kernel's writeback cache turns many small writes into few large ones (read
        # by pyfuse3 when the kernel sends INIT).
        self.enable_writeback_cache = engine.config.writeback_cache
        # Passthrough is asked for at INIT when the host allows it (mount.py decides); the
        # patched pyfuse3 then leaves the writeback cache off (the kernel refuses both).
        self.enable_passthrough = passthrough
        self.max_backing_stack_depth = 1  # tiers may sit on overlayfs (containers)
        # The agent clears set-user/group-ID bits itself (engine._kill_suid on write and
        # truncate): with FUSE_HANDLE_KILLPRIV_V2 the kernel marks the super block NOSEC and
        # stops sending GETXATTR security.capability before every write (docs/agent.md).
        self.enable_killpriv_v2 = True
        self.attr_timeout = attr_timeout  # what other nodes hold (directories; files: 0)
        self.local_timeout = LOCAL_TIMEOUT
        self._nursery: trio.Nursery | None = None
        self._dir_handles: dict[int, list[tuple[bytes, int]]] = {}
        self._next_dir_fh = 1
        # GETATTR, LOOKUP and GETXATTR security.capability of what is not open, answered
        # by the request reader without Python (fuse/answers.py)
        self.answers = AnswerTable(vfs, engine.config.answer_table)

    def start(self, nursery: trio.Nursery) -> None:
        """Before the session runs: the nursery of the tasks a request starts."""
        self._nursery = nursery
        self.answers.start(self.local_timeout)

    def answers_drained(self, lookups: list[tuple[int, int]], answered: int,
                        forgets: list[tuple[int, int]], opened: Sequence[tuple[int, int]] = (),
                        released: Sequence[tuple[int, int]] = (),
                        writers: Sequence[tuple[int, int]] = (),
                        writers_released: Sequence[tuple[int, int]] = (),
                        changes: Sequence[tuple] = ()) -> None:
        """(pyfuse3's reader) What the answer table answered since the last call, and the
        FORGETs it kept: processed together by one task (a reference counted a little
        longer only delays a free).  ``changes``: the CREATEs and UNLINKs it answered, in
        order, ``(name, parent, inode, time, created)`` (``created``: ``(mode, uid, gid,
        flags)`` of a create, None for a removal), which the agent makes its own first
        (a create's file may be opened or released since).  ``opened`` and ``released``:
        the opens it answered with lent registrations (``writers`` of them for writing),
        and the releases of such opens (``writers_released`` of them for writing), per
        inode — counted now, before anything else runs (a file freed by them, and the end
        of a writer's use of its write lease, in a task)."""
        # (the kernel's references first: a removal below may free what a LOOKUP named)
        unknown = self.answers.drained(lookups, answered)
        self.answers.restock()  # first: the reader's CREATEs go on while the rest is done
        # A drain may hold a file's lent opens and releases *and* the removal of its name
        # (the reader hands them over after a burst, not after each request).  Those of
        # files the agent already has were answered before the removal (an open needs the
        # name) or could have been: counted first, so that the last release parks the
        # registration and the file freed at its FORGET recycles its blob, as with a drain
        # between them; those of files created in this drain after their creates, below.
        have = self.ns.inodes
        later: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
        if changes:
            later = [e for e in opened if e[0] not in have], [e for e in released if e[0] not in have]
            opened = [e for e in opened if e[0] in have]
            released = [e for e in released if e[0] in have]
        self._lent_counted(opened, released, writers, writers_released)
        changed: set[int] = set()  # directories whose names changed: their attributes offered once
        # (the table keeps those directories' attributes meanwhile: it set their times itself)
        with self.answers.keeping(frozenset(change[1] for change in changes)):
            for name, parent, ino, t, created in changes:
                if created is None:
                    if not self.answers.removed(parent, name, ino, t):
                        continue
                else:
                    node = self.answers.created(parent, name, ino, t, *created)
                    if node is None:
                        continue
                    # the entry of the CREATE's reply, and LOOKUPs the table answered since
                    node.lookups += 1 + (unknown.pop(ino, 0) if unknown else 0)
                changed.add(parent)
            if unknown:
                self.answers.unknown_lookups(unknown)
            for parent in changed:
                self._dir_changed(parent)
        self._lent_counted(*later, writers, writers_released)
        if forgets and self._nursery is not None:
            self._nursery.start_soon(self._forget_kept, forgets)

    def _lent_counted(self, opened: Sequence[tuple[int, int]], released: Sequence[tuple[int, int]],
                      writers: Sequence[tuple[int, int]], writers_released: Sequence[tuple[int, int]]) -> None:
        """The lent opens and releases of a drain (``writers`` and ``writers_released``:
        per inode, how many of them were for writing) counted as the agent's own."""
        wrote = dict(writers) if writers else {}
        for ino, n in opened:
            self.opens.lent_opened(ino, n, wrote.get(ino, 0))
        closed = dict(writers_released) if writers_released else {}
        for ino, n in released:
            self._lent_released(ino, n, closed.get(ino, 0))
            if closed.get(ino) and self.answers.enabled:  # a writer's OPEN dropped them
                node = self.ns.inodes.get(ino)
                if node is not None and node.open_count == 0:  # parked: size and times taken
                    self._attrs(node)

    def _lent_released(self, ino: int, n: int, writers: int) -> None:
        node = self.opens.lent_released(ino, n)
        left = self.opens.lent_writers_closed(ino, writers) if writers else None
        if self._nursery is None:
            return
        if left is not None:  # the write lease's release (another node asked for it)
            self._nursery.start_soon(left)
        if node is not None:
            self._nursery.start_soon(self.engine.maybe_free, node)

    async def _forget_kept(self, forgets: list[tuple[int, int]]) -> None:
        try:
            await self.forget(forgets)
        except pyfuse3.FUSEError as exc:  # (errno_of logged an internal error already)
            log.warning("forgetting %d inodes the kernel let go: %s", len(forgets), os.strerror(exc.errno))

    def init(self) -> None:
        """pyfuse3 calls this while answering INIT: a backing file can be registered only
        after the reply, so the probe runs as a task."""
        if self.enable_passthrough and self._nursery is not None:
            self._nursery.start_soon(self._probe_passthrough)
        if self._after_init is not None and self._nursery is not None:
            self._nursery.start_soon(trio.to_thread.run_sync, self._after_init)

    async def _probe_passthrough(self) -> None:
        self.vfs.backings.probe()
        state = self.engine.passthrough
        log.info("passthrough: %s (%s)", "on" if state["enabled"] else "off", state["reason"])
        if not state["enabled"] and self.engine.config.passthrough == "on":
            log.error("--passthrough on, but %s: stopping", state["reason"])
            pyfuse3.terminate()

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

    def _attrs(self, inode: Inode, parent: int = 0, name: bytes | None = None) -> pyfuse3.EntryAttributes:
        """A local inode's attributes, kept by the kernel for LOCAL_TIMEOUT (and by the
        answer table while nothing can change them unseen; with the name they were
        looked up by)."""
        a = self._stat(inode.ino, inode, inode.nlink, self.local_timeout, self.local_timeout)
        self.answers.offer(inode, a, parent, name)
        return a

    def _dir_changed(self, ino: int) -> None:
        """A name in directory ``ino`` was made, removed or renamed: the table answers its
        next GETATTR (the kernel asks for it before the next name's permission check)."""
        node = self.ns.inodes.get(ino)
        if node is not None and self.answers.enabled:
            self._attrs(node)

    def _remote_attrs(self, node) -> pyfuse3.EntryAttributes:
        if node.is_dir:
            return self._stat(node.ino, node.meta, 2, self.attr_timeout)
        lease = self.names.remote_lease(node)
        return self._stat(node.ino, node.meta, 1, lease, lease or None)

    def _node_attrs(self, ino: int, node) -> pyfuse3.EntryAttributes:
        """The attributes of what the vfs answered for kernel inode ``ino``."""
        if isinstance(node, Inode):
            return self._attrs(node) if node.ino == ino else self._stat(ino, node, node.nlink, self.attr_timeout)
        if node.local is not None and node.local.nlink > 0:  # a remote file taken over
            return self._stat(ino, node.local, node.local.nlink, self.attr_timeout)
        return self._remote_attrs(node)

    def _entry(self, node, parent: int = 0, name: bytes | None = None) -> pyfuse3.EntryAttributes:
        """A lookup's reply (of ``name`` in ``parent``, for the answer table): the kernel
        holds one more reference to the node; "no such name" is a reply with inode 0, kept
        as a negative dentry for a while."""
        if node is MISSING:
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0
            a.entry_timeout = self.names.negative_timeout()
            if parent:
                self.answers.missing(parent)  # the table answers the next one, if it can
            return a
        node.lookups += 1
        return self._attrs(node, parent, name) if isinstance(node, Inode) else self._remote_attrs(node)

    # -- lookups (lookup, getattr and getxattr first try to answer from memory) --------
    @answer_now
    def lookup_now(self, parent_inode, name):
        self.answers.count_misses(parent_inode)
        node = self.names.lookup_now(parent_inode, name)
        return None if node is None else self._entry(node, parent_inode, name)

    @metadata_op
    async def lookup(self, parent_inode, name, ctx=None):
        return self._entry(await self.names.lookup(parent_inode, name), parent_inode, name)

    @errno_edge
    async def forget(self, inode_list):
        for ino, n in inode_list:
            await self.names.forget(ino, n)

    @answer_now
    def getattr_now(self, inode):
        node = self.names.getattr_now(inode)
        return None if node is None else self._node_attrs(inode, node)

    @metadata_op
    async def getattr(self, inode, ctx=None):
        return self._node_attrs(inode, await self.names.getattr(inode))

    @metadata_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        async with self.vfs.view.writable(inode, truncate=fields.update_size and attr.st_size == 0) as (node, leased):
            await self.names.setattr(node, attr, fields, ctx.uid, leased)
            return self._node_attrs(inode, node)

    # -- names -----------------------------------------------------------------------
    @metadata_op
    async def readlink(self, inode, ctx):
        return self.names.readlink(inode)

    @metadata_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        entry = self._entry(await self.names.mknod(parent_inode, name, mode, rdev, ctx.uid, ctx.gid), parent_inode, name)
        self._dir_changed(parent_inode)
        return entry

    @metadata_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        entry = self._entry(await self.names.mkdir(parent_inode, name, mode, ctx.uid, ctx.gid), parent_inode, name)
        self._dir_changed(parent_inode)
        return entry

    @metadata_op
    async def symlink(self, parent_inode, name, target, ctx):
        entry = self._entry(await self.names.symlink(parent_inode, name, target, ctx.uid, ctx.gid), parent_inode, name)
        self._dir_changed(parent_inode)
        return entry

    @metadata_op
    async def link(self, inode, new_parent_inode, new_name, ctx):
        entry = self._entry(await self.names.link(inode, new_parent_inode, new_name), new_parent_inode, new_name)
        self._dir_changed(new_parent_inode)
        return entry

    @metadata_op
    async def unlink(self, parent_inode, name, ctx):
        await self.names.remove(parent_inode, name, rmdir=False)
        self._dir_changed(parent_inode)

    @metadata_op
    async def rmdir(self, parent_inode, name, ctx):
        await self.names.remove(parent_inode, name, rmdir=True)
        self._dir_changed(parent_inode)

    @metadata_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        await self.names.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)
        self._dir_changed(parent_inode_old)
        if parent_inode_new != parent_inode_old:
            self._dir_changed(parent_inode_new)

    # -- directories -----------------------------------------------------------------
    @metadata_op
    async def opendir(self, inode, ctx):
        listing = await self.names.listing(inode)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dir_handles[fh] = listing
        return fh

    @metadata_op
    async def readdir(self, fh, start_id, token):
        listing = self._dir_handles[fh]
        backings = self.vfs.backings
        for i in range(start_id, len(listing)):
            name, ino = listing[i]
            node = self.ns.inodes.get(ino)
            if node is None:
                remote = self.vfs.view.remote(ino)
                if remote is None:  # removed since opendir
                    continue
                if not pyfuse3.readdir_reply(token, name, self._remote_attrs(remote), i + 1):
                    break
                if name not in (b".", b".."):
                    remote.lookups += 1
                continue
            if ino in backings.by_ino:
                await backings.refresh(node)
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
    def _file_info(self, opened: Opened) -> pyfuse3.FileInfo:
        fh = LENT_FH | LENT_WRITER | opened.lent_ino if opened.lent_ino else opened.fh  # (a lent writer's)
        fi = pyfuse3.FileInfo(fh=fh, keep_cache=opened.keep_cache, direct_io=False)
        if opened.backing_id:
            fi.backing_id = opened.backing_id
        if HAS_NOFLUSH and opened.nothing_at_close:
            fi.noflush = True
        return fi

    @metadata_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        opened, node = await self.opens.create(parent_inode, name, mode, flags, ctx.uid, ctx.gid)
        entry = self._entry(node, parent_inode, name)
        if isinstance(node, Inode):
            self.answers.no_caps(node)  # the kernel asks before the first write
        self._dir_changed(parent_inode)
        return self._file_info(opened), entry

    @errno_edge
    async def open(self, inode, flags, ctx):
        return self._file_info(await self.opens.open(inode, flags, ctx.uid, ctx.pid))

    @errno_edge
    async def read(self, fh, off, size):
        if fh & LENT_FH:  # (the kernel reads a passthrough open's file itself)
            raise FsError(errno.EIO)
        return await self.opens.read(fh, off, size)

    @errno_edge
    async def write(self, fh, off, buf):
        if fh & LENT_FH:  # (the kernel writes a passthrough open's file itself)
            raise FsError(errno.EIO)
        return await self.engine.write(fh, off, buf)

    @errno_edge
    async def flush(self, fh):
        if fh & LENT_FH:  # a reader answered by the table: nothing to wait for
            return
        await self.opens.flush(fh)

    @errno_edge
    async def release(self, fh):
        if fh & LENT_FH:  # an open the table answered, whose registration it gave back since
            self._lent_released(fh & LENT_INO, 1, 1 if fh & LENT_WRITER else 0)
            return
        h = self.engine.handles.get(fh)
        await self.opens.release(fh)
        if h is not None and self.answers.enabled and h.inode.open_count == 0:
            self._attrs(h.inode)  # closed: the table may answer for it now

    @errno_edge
    async def fsync(self, fh, datasync):
        if fh & LENT_FH:  # a reader's descriptor the table answered
            await self.opens.fsync_lent(fh & LENT_INO, datasync)
            return
        await self.opens.fsync(fh, datasync)

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
        return self.xattrs.get_now(inode, name)

    @metadata_op
    async def getxattr(self, inode, name, ctx):
        return await self.xattrs.get(inode, name)

    @metadata_op
    async def setxattr(self, inode, name, value, ctx):
        await self.xattrs.set(inode, name, value)

    @metadata_op
    async def listxattr(self, inode, ctx):
        return self.xattrs.names(inode)

    @metadata_op
    async def removexattr(self, inode, name, ctx):
        await self.xattrs.remove(inode, name)

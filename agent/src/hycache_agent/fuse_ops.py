"""The FUSE operations layer: translates kernel requests into engine calls and maps
errors to errno.  No decisions are made here."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import stat
from collections.abc import Callable

import pyfuse3
import trio

from . import tiers as T
from .engine import TieringEngine
from .namespace import ROOT_INO, FsError, Inode, now_ns

log = logging.getLogger(__name__)

XATTR_PREFIX = b"user.hycache."
XATTR_TIER = b"user.hycache.tier"
XATTR_PINNED = b"user.hycache.pinned"
XATTR_INFO = b"user.hycache.info"
VIRTUAL_XATTRS = (XATTR_TIER, XATTR_PINNED, XATTR_INFO)


def errno_edge(fn: Callable) -> Callable:
    """Turn engine and OS errors into FUSE replies (the only place errno is mapped)."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception:
            log.exception("internal error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

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
        self.attr_timeout = attr_timeout
        self._dir_handles: dict[int, list[tuple[bytes, int]]] = {}
        self._next_dir_fh = 1
        self.cluster = engine.cluster  # None when standalone
        self._remote_handles: dict[int, tuple] = {}  # fh -> (RemoteNode, fd)

    # -- attributes ------------------------------------------------------------------
    def _stat(self, ino: int, src, nlink: int, attr_timeout: float) -> pyfuse3.EntryAttributes:
        """Attributes from a local Inode or a remote EntryMeta (same field names)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = self.attr_timeout
        a.attr_timeout = attr_timeout
        a.st_mode, a.st_nlink, a.st_uid, a.st_gid, a.st_rdev = src.mode, nlink, src.uid, src.gid, src.rdev
        a.st_size = src.size
        a.st_blksize = 4096
        a.st_blocks = (src.size + 511) // 512
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = src.atime_ns, src.mtime_ns, src.ctime_ns
        return a

    def _attrs(self, inode: Inode) -> pyfuse3.EntryAttributes:
        return self._stat(inode.ino, inode, inode.nlink, self.attr_timeout)

    def _entry(self, inode: Inode) -> pyfuse3.EntryAttributes:
        inode.lookups += 1
        return self._attrs(inode)

    def _remote_attrs(self, node) -> pyfuse3.EntryAttributes:
        # another node may still be writing a remote file: never let the kernel keep its
        # size (a stale size would make reads stop early)
        return self._stat(node.ino, node.meta, 2 if node.is_dir else 1,
                          self.attr_timeout if node.is_dir else 0)

    def _remote(self, ino: int):
        return self.cluster.remote.get(ino) if self.cluster is not None else None

    def _not_remote(self, *inos: int) -> None:
        """Changing names held by another node is not supported yet: fail cleanly."""
        for ino in inos:
            if self._remote(ino) is not None:
                raise FsError(errno.EROFS)

    @errno_edge
    async def lookup(self, parent_inode, name, ctx=None):
        try:
            inode = self.ns.lookup(parent_inode, name)
        except FsError as exc:
            if exc.errno != errno.ENOENT or self.cluster is None:
                raise
            node = await self.cluster.lookup(parent_inode, name)
            if node is None:
                raise
            node.lookups += 1
            return self._remote_attrs(node)
        return self._entry(inode)

    @errno_edge
    async def forget(self, inode_list):
        for ino, n in inode_list:
            if self.cluster is not None and await self.cluster.forget(ino, n):
                continue
            await self.engine.forget(ino, n)

    @errno_edge
    async def getattr(self, inode, ctx=None):
        node = self._remote(inode)
        if node is not None:
            return self._remote_attrs(await self.cluster.refresh(node))
        return self._attrs(self.ns.get(inode))

    @errno_edge
    async def setattr(self, inode, attr, fields, fh, ctx):
        self._not_remote(inode)
        node = self.ns.get(inode)
        t = now_ns()
        if fields.update_size:
            if node.is_dir:
                raise FsError(errno.EISDIR)
            if not node.is_reg:
                raise FsError(errno.EINVAL)
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
        self.ns.journal.inode(inode)
        if fields.update_mode or fields.update_uid or fields.update_gid or fields.update_size:
            await self.ns.journal.sync()
        # times alone (the writeback cache sends them at every close) ride on the next
        # group commit, within a second
        return self._attrs(node)

    # -- names -----------------------------------------------------------------------
    @errno_edge
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

    @errno_edge
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = await self.engine.create_file(parent_inode, name, mode, ctx.uid, ctx.gid, rdev)
        return self._entry(node)

    @errno_edge
    async def mkdir(self, parent_inode, name, mode, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = self.ns.new_inode(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode), ctx.uid, ctx.gid)
        await self.ns.journal.sync()
        return self._entry(node)

    @errno_edge
    async def symlink(self, parent_inode, name, target, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = self.ns.new_inode(parent_inode, name, stat.S_IFLNK | 0o777, ctx.uid, ctx.gid, target=target)
        await self.ns.journal.sync()
        return self._entry(node)

    @errno_edge
    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._not_remote(inode)
        new_parent_inode = await self._local_dir(new_parent_inode)
        node = self.ns.link(inode, new_parent_inode, new_name)
        await self.ns.journal.sync()
        return self._entry(node)

    @errno_edge
    async def unlink(self, parent_inode, name, ctx):
        self._not_remote(parent_inode)
        await self._not_remote_name(parent_inode, name)
        await self.engine.remove(parent_inode, name, rmdir=False)

    @errno_edge
    async def rmdir(self, parent_inode, name, ctx):
        self._not_remote(parent_inode)
        await self._not_remote_name(parent_inode, name)
        await self.engine.remove(parent_inode, name, rmdir=True)

    @errno_edge
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._not_remote(parent_inode_old, parent_inode_new)
        await self._not_remote_name(parent_inode_old, name_old)
        await self._not_remote_name(parent_inode_new, name_new)
        await self.engine.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    # -- directories -----------------------------------------------------------------
    @errno_edge
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

    @errno_edge
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
            if not pyfuse3.readdir_reply(token, name, self._attrs(node), i + 1):
                break
            if name not in (b".", b".."):
                node.lookups += 1

    @errno_edge
    async def releasedir(self, fh):
        self._dir_handles.pop(fh, None)

    @errno_edge
    async def fsyncdir(self, fh, datasync):
        await self.ns.journal.sync(durable=True)

    # -- files -----------------------------------------------------------------------
    def _file_info(self, fh: int) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=fh, keep_cache=self.engine.config.kernel_cache, direct_io=False)

    @errno_edge
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent_inode = await self._local_dir(parent_inode)
        node = await self.engine.create_file(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode),
                                             ctx.uid, ctx.gid)
        fh = await self.engine.open(node, flags & ~os.O_TRUNC, ctx.uid)
        return self._file_info(fh), self._entry(node)

    @errno_edge
    async def open(self, inode, flags, ctx):
        remote = self._remote(inode)
        if remote is not None:
            return await self._open_remote(remote, flags)
        fh = await self.engine.open(self.ns.get(inode), flags, ctx.uid)
        return self._file_info(fh)

    async def _open_remote(self, remote, flags):
        if (flags & os.O_ACCMODE) != os.O_RDONLY or flags & os.O_TRUNC:
            log.warning("write to %r refused: taking over files held by another node is not supported yet",
                        remote.path)
            raise FsError(errno.EROFS)
        blob = await self.cluster.open_remote(remote)
        fd = await trio.to_thread.run_sync(os.open, blob, os.O_RDONLY | os.O_CLOEXEC)
        fh = next(self.engine._fh)
        remote.open_count += 1
        self._remote_handles[fh] = (remote, fd)
        # the bytes may differ from the last version the kernel cached: no keep_cache
        return pyfuse3.FileInfo(fh=fh, keep_cache=False, direct_io=False)

    async def _not_remote_name(self, parent: int, name: bytes) -> None:
        """A name that is not local but held by another node cannot be removed or
        renamed over from here yet: EROFS rather than a misleading ENOENT."""
        if self.cluster is None or name in self.ns.children.get(parent, {}):
            return
        if await self.cluster.lookup(parent, name) is not None:
            raise FsError(errno.EROFS)

    async def _local_dir(self, ino: int) -> int:
        """A directory's local inode; a directory held only in the global namespace is
        created locally first (with its owner and mode), so new names are always local."""
        remote = self._remote(ino)
        if remote is None:
            return ino
        if not remote.is_dir:
            raise FsError(errno.ENOTDIR)
        parent = ROOT_INO
        path = b""
        for part in [p for p in remote.path.split(b"/") if p]:
            path += b"/" + part
            try:
                child = self.ns.lookup(parent, part)
            except FsError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                meta = await self.cluster._store_get(path)
                mode, uid, gid = (meta.mode, meta.uid, meta.gid) if meta else (stat.S_IFDIR | 0o755, 0, 0)
                child = self.ns.new_inode(parent, part, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid)
                await self.ns.journal.sync()
            parent = child.ino
        return parent

    @errno_edge
    async def read(self, fh, off, size):
        remote = self._remote_handles.get(fh)
        if remote is not None:
            return await trio.to_thread.run_sync(os.pread, remote[1], size, off)
        return await self.engine.read(fh, off, size)

    @errno_edge
    async def write(self, fh, off, buf):
        return await self.engine.write(fh, off, buf)

    @errno_edge
    async def flush(self, fh):
        if fh in self._remote_handles:
            return
        await self.engine.flush(fh)

    @errno_edge
    async def release(self, fh):
        remote = self._remote_handles.pop(fh, None)
        if remote is not None:
            node, fd = remote
            node.open_count -= 1
            await trio.to_thread.run_sync(os.close, fd)
            return
        await self.engine.release(fh)

    @errno_edge
    async def fsync(self, fh, datasync):
        await self.engine.fsync(fh, datasync)

    # -- file system -----------------------------------------------------------------
    @errno_edge
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

    @errno_edge
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
    @errno_edge
    async def getxattr(self, inode, name, ctx):
        remote = self._remote(inode)
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
            raise FsError(errno.ENODATA)
        node = self.ns.get(inode)
        if name == XATTR_INFO:
            return json.dumps(self.engine.file_info(node)).encode()
        if name == XATTR_TIER:
            if not node.is_reg:
                raise FsError(errno.ENODATA)
            return node.tier.encode()
        if name == XATTR_PINNED:
            return b"1" if node.pinned else b"0"
        try:
            return node.xattrs[name]
        except KeyError:
            raise FsError(errno.ENODATA) from None

    @errno_edge
    async def setxattr(self, inode, name, value, ctx):
        self._not_remote(inode)
        node = self.ns.get(inode)
        if name == XATTR_TIER:
            wanted = value.strip().decode(errors="replace")
            if wanted not in T.TIER_NAMES or not node.is_reg:
                raise FsError(errno.EINVAL)
            if wanted == T.FAST and node.size > self.engine.capacity:
                raise FsError(errno.ENOSPC)
            self.engine.start_migration(node, wanted, "promote" if wanted == T.FAST else "demote")
            return
        if name == XATTR_PINNED:
            flag = value.strip()
            if flag not in (b"0", b"1"):
                raise FsError(errno.EINVAL)
            self.engine.pin(node, flag == b"1")
            await self.ns.journal.sync()
            return
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        node.xattrs[name] = value
        node.ctime_ns = now_ns()
        self.ns.journal.set_xattr(inode, name, value)
        self.ns.journal.inode(inode)
        await self.ns.journal.sync()

    @errno_edge
    async def listxattr(self, inode, ctx):
        if self._remote(inode) is not None:
            return []
        return list(self.ns.get(inode).xattrs)

    @errno_edge
    async def removexattr(self, inode, name, ctx):
        self._not_remote(inode)
        node = self.ns.get(inode)
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        if name not in node.xattrs:
            raise FsError(errno.ENODATA)
        del node.xattrs[name]
        node.ctime_ns = now_ns()
        self.ns.journal.del_xattr(inode, name)
        self.ns.journal.inode(inode)
        await self.ns.journal.sync()

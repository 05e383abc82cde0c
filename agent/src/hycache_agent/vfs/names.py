"""Names and attributes, local or held by other nodes: lookups, attributes, new names,
removals and renames (across nodes too), directory listings."""

from __future__ import annotations

import errno
import itertools
import stat

from hycache_agent.cluster.dht_link import LATER, META_TTL_SECONDS
from hycache_agent.fs.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO, FsError, Inode, join_path, now_ns
from hycache_agent.vfs.view import Part

# How long the kernel may keep a negative lookup: standalone, only this mount makes names
# (and the kernel drops its negative dentry when it does); in a cluster another node may
# publish the name, so no longer than the agent's own view of other nodes' names.
NEGATIVE_TIMEOUT = 30.0
REMOTE_NEGATIVE_TIMEOUT = META_TTL_SECONDS

MISSING = object()  # a lookup's answer: no such name (kept by the kernel a while)


class Names(Part):
    # -- how long the kernel may keep what it is told ---------------------------------
    def negative_timeout(self) -> float:
        """"No such name" is kept within the global namespace's own staleness; not while
        it cannot be asked (ask again once it is back)."""
        if self.cluster is None:
            return NEGATIVE_TIMEOUT
        return REMOTE_NEGATIVE_TIMEOUT if self.cluster.reachable else 0

    def remote_lease(self, node) -> float:
        """Another node may still be writing a remote file: the kernel keeps its entry and
        size only while announcements of its changes are heard (a covered entry's lease,
        cluster/invalidation.py), else never (a stale size would make reads stop early)."""
        return self.cluster.inval.lease_left(node)

    # -- lookups and attributes -------------------------------------------------------
    # ``*_now`` answer from memory: the node, or None when the answer needs the store, a
    # worker thread or a wait (then the ``async`` form, which starts with the same call)
    def lookup_now(self, parent: int, name: bytes):
        """A local Inode, a remote node, MISSING, or None (wait)."""
        try:
            inode = self.ns.lookup(parent, name)
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
            if self.cluster is None:
                return MISSING
            node = self.cluster.lookup_now(parent, name)
            if node is LATER:
                return None
            return MISSING if node is None else node
        if not self.backings.refresh_now(inode):
            return None
        return inode

    async def lookup(self, parent: int, name: bytes):
        """A local Inode, a remote node or MISSING."""
        found = self.lookup_now(parent, name)
        if found is not None:
            return found
        try:
            inode = self.ns.lookup(parent, name)
        except FsError:  # ENOENT (the others were raised above): maybe held elsewhere
            node = await self.cluster.lookup(parent, name)
            return MISSING if node is None else node
        await self.backings.refresh(inode)
        return inode

    # -- every name of a directory (the FUSE adapter's answer table) -------------------
    def complete_names(self, parent: int, at_most: int):
        """Every name local directory ``parent`` has, as ``(name, inode)`` (inode 0: a
        name another node holds, looked up by :meth:`lookup`), with until when no other
        name is there (``time.monotonic()``; ``inf``: until a name is made here) and how
        long the kernel may keep "no such name" — what :meth:`lookup_now` answers for
        any other name; None when it would not answer them all from memory, or when
        there are more than ``at_most``."""
        entries = self.ns.children.get(parent)
        if entries is None or len(entries) > at_most:
            return None
        if self.cluster is None:
            return entries.items(), float("inf"), NEGATIVE_TIMEOUT
        if parent == ROOT_INO or not self.cluster.reachable:  # (the root: the registry's names)
            return None
        listed = self.cluster.listed_names(parent)
        if listed is None or len(entries) + len(listed[1]) > at_most:
            return None
        until, remote = listed
        names = itertools.chain(entries.items(), ((name, 0) for name in remote if name not in entries))
        return names, until, REMOTE_NEGATIVE_TIMEOUT

    def count_lookups(self, parent: int, n: int) -> None:
        """``n`` lookups in ``parent`` were answered without :meth:`lookup_now` (they
        count for how often the directory's listing is read)."""
        if self.cluster is not None:
            self.cluster.count_lookups(parent, n)

    def watch_listings(self, changed) -> None:
        """``changed(dirpath)`` is called when the global view no longer answers every
        lookup in ``dirpath`` from what :meth:`complete_names` gave."""
        if self.cluster is not None:
            self.cluster.view.listing_changed = changed

    async def forget(self, ino: int, n: int) -> None:
        if self.cluster is not None and await self.cluster.forget(ino, n):
            if ino not in self.cluster.remote:
                await self.remote_backings.forget(ino)
            return
        await self.engine.forget(ino, n)

    def getattr_now(self, ino: int):
        """A local Inode, a remote node (``node.local``: taken over), or None (wait)."""
        node = self.view.remote(ino)
        if node is not None:
            if node.local is not None and node.local.nlink > 0:  # taken over
                return node
            return None if self.cluster.stale(node) else node
        node = self.ns.get(ino)
        # the kernel writes a backed file directly: the blob knows its size and times
        return node if self.backings.refresh_now(node) else None

    async def getattr(self, ino: int):
        found = self.getattr_now(ino)
        if found is not None:
            return found
        node = self.view.remote(ino)
        if node is not None:
            return await self.cluster.refresh(node)
        node = self.ns.get(ino)
        await self.backings.refresh(node)
        return node

    async def setattr(self, node: Inode, attr, fields, uid: int, leased: bool) -> None:
        """Change a local inode's attributes (``leased``: its write lease is held)."""
        if node.ino in self.backings.by_ino:  # writes first, then this change on top
            await self.backings.refresh(node)
        t = now_ns()
        if fields.update_size:
            await self._truncate(node, attr.st_size, uid, leased)
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

    async def _truncate(self, node: Inode, size: int, uid: int, leased: bool) -> None:
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if not node.is_reg:
            raise FsError(errno.EINVAL)
        if self.own is None or leased:
            await self.engine.truncate(node, size, uid)
            return
        await self.own.lease_for_write(node)
        try:
            await self.engine.truncate(node, size, uid)
        finally:
            await self.own.write_done(node.ino)

    def readlink(self, ino: int) -> bytes:
        remote = self.view.remote(ino)
        target = remote.meta.target if remote is not None else self.ns.get(ino).target
        if target is None:
            raise FsError(errno.EINVAL)
        return target

    # -- new names -------------------------------------------------------------------
    async def mknod(self, parent: int, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Inode:
        parent = await self.view.local_dir(parent)
        return await self.engine.create_file(parent, name, mode, uid, gid, rdev)

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Inode:
        parent = await self.view.local_dir(parent)
        node = self.ns.new_inode(parent, name, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid)
        self.engine.commit_soon()  # names inside it commit after it (commits are in order)
        return node

    async def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Inode:
        parent = await self.view.local_dir(parent)
        node = self.ns.new_inode(parent, name, stat.S_IFLNK | 0o777, uid, gid, target=target)
        self.engine.commit_soon()
        return node

    async def link(self, ino: int, new_parent: int, new_name: bytes) -> Inode:
        async with self.view.writable(ino) as (node, _):
            await self.backings.refresh(node)  # the size the kernel wrote, before the new name is published
            new_parent = await self.view.local_dir(new_parent)
            node = self.ns.link(node.ino, new_parent, new_name)
            await self.ns.journal.sync()
        return node

    # -- removals and renames --------------------------------------------------------
    async def remove(self, parent_ino: int, name: bytes, *, rmdir: bool) -> None:
        if self.cluster is None:
            await self.engine.remove(parent_ino, name, rmdir=rmdir)
            return
        assert self.own is not None, "the cluster link comes with its ownership"
        if not self.view.has_local(parent_ino, name):
            node = await self.cluster.lookup(parent_ino, name)
            if node is None:
                raise FsError(errno.ENOENT)
            await self.own.remove_remote(node, rmdir=rmdir)
            return
        parent_node = self.view.local(parent_ino)
        assert parent_node is not None, "has_local: the parent is local"
        parent = parent_node.ino
        inode = self.ns.lookup(parent, name)
        path = self.ns.child_path(parent, name) if inode.is_dir or inode.replicas else b""
        # other nodes may hold names in it (a directory is the union of the nodes')
        if rmdir and inode.is_dir and await self.cluster.dir_has_entries(path):
            raise FsError(errno.ENOTEMPTY)
        await self.engine.remove(parent, name, rmdir=rmdir)
        await self.own.removed_here(inode, path)

    def removed_by_reader(self, parent: int, name: bytes, t: int) -> Inode:
        """An unlink of a local regular file's name that the FUSE reader answered and
        logged itself (the answer table's, fuse/answers.py: only for files whose removal
        needs nothing but the name's — in a cluster, no replica to tell)."""
        inode = self.engine.removed_by_reader(parent, name, t)
        if self.own is not None and inode.nlink == 0:  # as removed_here, for such a file
            self.own.write.forget_idle(inode.ino)
        return inode

    def removable_by_reader(self, inode: Inode) -> bool:
        """Whether an unlink of a name of ``inode`` would need nothing but the name's
        removal, as :meth:`removed_by_reader` does it: a regular file, with no replica
        to tell in a cluster."""
        return inode.is_reg and not inode.replicas

    async def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int) -> None:
        if self.cluster is None:
            await self.engine.rename(old_parent, old_name, new_parent, new_name, flags)
        elif not self.view.has_local(old_parent, old_name):  # the source is held elsewhere
            await self._rename_remote(old_parent, old_name, new_parent, new_name, flags)
        else:
            await self._rename_local(old_parent, old_name, new_parent, new_name, flags)

    async def _rename_remote(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes,
                             flags: int) -> None:
        src = await self.cluster.lookup(old_parent, old_name)
        if src is None:
            raise FsError(errno.ENOENT)
        if flags & RENAME_EXCHANGE:
            raise FsError(errno.EINVAL)  # no exchange across nodes
        assert self.own is not None, "the cluster link comes with its ownership"
        dst_local = None
        if self.view.has_local(new_parent, new_name):
            dst_parent_node = self.view.local(new_parent)
            assert dst_parent_node is not None, "has_local: the parent is local"
            dst_parent = dst_parent_node.ino
            dst = self.ns.lookup(dst_parent, new_name)
            if flags & RENAME_NOREPLACE:
                raise FsError(errno.EEXIST)
            if dst.is_dir != src.is_dir:
                raise FsError(errno.EISDIR if dst.is_dir else errno.ENOTDIR)
            if dst.is_dir and self.ns.children[dst.ino]:
                raise FsError(errno.ENOTEMPTY)
            dst_local = (dst_parent, new_name)
        dst_path = join_path(self.cluster.path_of(new_parent) or b"/", new_name)
        await self.own.rename_remote(src.path, dst_path, src.meta, noreplace=bool(flags & RENAME_NOREPLACE),
                                     dst_local=dst_local)

    async def _rename_local(self, old_parent_ino: int, old_name: bytes, new_parent_ino: int, new_name: bytes,
                            flags: int) -> None:
        old_parent_node = self.view.local(old_parent_ino)
        assert old_parent_node is not None and self.own is not None, "has_local (in a cluster): the parent is local"
        old_parent = old_parent_node.ino
        src = self.ns.lookup(old_parent, old_name)
        await self.backings.refresh(src)  # the size the kernel wrote, before the new name is published
        replaced = None
        if not self.view.has_local(new_parent_ino, new_name):
            replaced = await self.cluster.lookup(new_parent_ino, new_name)
            if replaced is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST)
                if flags & RENAME_EXCHANGE:
                    raise FsError(errno.EINVAL)
                if replaced.is_dir != src.is_dir:
                    raise FsError(errno.EISDIR if replaced.is_dir else errno.ENOTDIR)
                if replaced.is_dir and await self.cluster.dir_has_entries(replaced.path):
                    raise FsError(errno.ENOTEMPTY)
        src_path = self.ns.child_path(old_parent, old_name)
        new_parent = await self.view.local_dir(new_parent_ino)
        await self.engine.rename(old_parent, old_name, new_parent, new_name, flags)
        await self.own.renamed_here(src, src_path, self.ns.child_path(new_parent, new_name), replaced)

    # -- directories -----------------------------------------------------------------
    async def listing(self, ino: int) -> list[tuple[bytes, int]]:
        """A directory's entries (with . and ..): the local names and, in a cluster, the
        names other nodes hold in it (a directory is the union of the nodes')."""
        remote = self.view.remote(ino)
        if remote is not None:
            if not remote.is_dir:
                raise FsError(errno.ENOTDIR)
            listing = [(b".", ino), (b"..", ino)]
            listing.extend((name, node.ino) for name, node in await self.cluster.list_remote(remote.path))
            return listing
        entries = self.ns.dir(ino)
        listing = [(b".", ino), (b"..", self.ns.parent.get(ino, ino))]
        listing.extend(entries.items())
        if self.cluster is not None:  # names held by other nodes
            path = self.ns.path_of(ino)
            if path is not None:
                listing.extend((name, node.ino) for name, node in await self.cluster.list_remote(path)
                               if name not in entries)
        return listing

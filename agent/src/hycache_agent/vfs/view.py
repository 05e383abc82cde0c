"""Which node holds a kernel inode number: a local inode of the namespace, or a name the
global namespace has (a remote node of the cluster link), or one taken over since."""

from __future__ import annotations

import contextlib
import errno

from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import FsError, Inode
from hycache_agent.fs.passthrough import Backings
from hycache_agent.remote.backing import RemoteBackings


class View:
    def __init__(self, engine: TieringEngine, cluster=None) -> None:
        self.engine = engine
        self.ns = engine.ns
        self.cluster = cluster  # None when standalone
        self.own = cluster.ownership if cluster is not None else None

    def remote(self, ino: int):
        return self.cluster.remote.get(ino) if self.cluster is not None else None

    def local(self, ino: int) -> Inode | None:
        """The local inode behind a kernel inode number: a local one, or a remote file
        this node has taken over since the kernel looked it up."""
        node = self.ns.inodes.get(ino)
        if node is not None:
            return node
        remote = self.remote(ino)
        if remote is not None and remote.local is not None and remote.local.nlink > 0:
            return remote.local
        return None

    def has_local(self, parent_ino: int, name: bytes) -> bool:
        parent = self.local(parent_ino)
        return parent is not None and name in self.ns.children.get(parent.ino, {})

    @contextlib.asynccontextmanager
    async def writable(self, ino: int, *, truncate: bool = False):
        """The local inode to change for ``ino`` (yields ``(inode, leased)``): a file held
        by another node is taken over first and its write lease released when the change
        is done; a directory held only elsewhere is made locally."""
        local = self.local(ino)
        remote = self.remote(ino) if local is None else None
        if local is not None or remote is None:
            yield (local or self.ns.get(ino)), False  # ns.get: ENOENT
            return
        own = self.own
        assert own is not None, "a remote inode comes with the cluster link's ownership"
        if remote.is_dir:
            yield self.ns.get(await own.local_dir(remote.path)), False
        elif remote.meta.kind != "file":
            raise FsError(errno.EROFS)  # symlinks and devices held elsewhere: read-only here
        else:
            local = await own.take_over(remote, truncate=truncate)
            try:
                yield local, True
            finally:
                await own.write_done(local.ino)

    async def local_dir(self, ino: int) -> int:
        """A directory's local inode; a directory held only in the global namespace is
        created locally first (with its owner and mode), so new names are always local."""
        remote = self.remote(ino)
        if remote is None:
            return ino
        if not remote.is_dir:
            raise FsError(errno.ENOTDIR)
        assert self.own is not None, "a remote inode comes with the cluster link's ownership"
        return await self.own.local_dir(remote.path)


class Part:
    """What every part of the vfs layer works with: the engine and its namespace, the view
    of local and remote inodes (with the cluster link and its ownership, None when
    standalone), and the passthrough registrations of local files and of remote copies."""

    def __init__(self, engine: TieringEngine, view: View, backings: Backings,
                 remote_backings: RemoteBackings) -> None:
        self.engine = engine
        self.ns = engine.ns
        self.view = view
        self.cluster = view.cluster
        self.own = view.own
        self.backings = backings
        self.remote_backings = remote_backings

"""Extended attributes: the user.hycache.* controls (tier, pinned, info) and the files'
own, local or of a file another node holds."""

from __future__ import annotations

import errno
import json

from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import FsError, Inode, now_ns
from hycache_agent.fs.passthrough import Backings
from hycache_agent.vfs.view import View

XATTR_PREFIX = b"user.hycache."
XATTR_TIER = b"user.hycache.tier"
XATTR_PINNED = b"user.hycache.pinned"
XATTR_INFO = b"user.hycache.info"
VIRTUAL_XATTRS = (XATTR_TIER, XATTR_PINNED, XATTR_INFO)


class Xattrs:
    def __init__(self, engine: TieringEngine, view: View, backings: Backings) -> None:
        self.engine = engine
        self.ns = engine.ns
        self.view = view
        self.backings = backings
        self.node_id = view.cluster.node_id if view.cluster is not None else None

    def info(self, node: Inode) -> bytes:
        return json.dumps(self.engine.file_info(node, self.node_id)).encode()

    def get_now(self, ino: int, name: bytes) -> bytes | int | None:
        """The value, an errno (ENODATA without an exception: the kernel asks for
        security.capability once per new inode) or None (a refresh must be waited for)."""
        remote = self.view.remote(ino) if self.view.local(ino) is None else None
        if remote is not None:
            return self._remote(remote, name)
        node = self.view.local(ino) or self.ns.get(ino)
        if name == XATTR_INFO:
            # size and times as the kernel wrote them
            return self.info(node) if self.backings.refresh_now(node) else None
        if name == XATTR_TIER:
            if not node.is_reg or node.tier is None:
                return errno.ENODATA
            return node.tier.encode()
        if name == XATTR_PINNED:
            return b"1" if node.pinned else b"0"
        return node.xattrs.get(name, errno.ENODATA)

    def _remote(self, remote, name: bytes) -> bytes | int:
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

    async def get(self, ino: int, name: bytes) -> bytes:
        value = self.get_now(ino, name)
        if value is None:  # user.hycache.info of a file whose blob must be asked first
            node = self.view.local(ino) or self.ns.get(ino)
            await self.backings.refresh(node)
            value = self.info(node)
        if isinstance(value, int):
            raise FsError(value)
        return value

    async def set(self, ino: int, name: bytes, value: bytes) -> None:
        async with self.view.writable(ino) as (node, _):
            await self._set(node, name, value)

    async def _set(self, node: Inode, name: bytes, value: bytes) -> None:
        if name == XATTR_TIER:
            self.engine.placement.request_move(node, value.strip().decode(errors="replace"))
            return
        if name == XATTR_PINNED:
            flag = value.strip()
            if flag not in (b"0", b"1"):
                raise FsError(errno.EINVAL)
            await self.engine.set_pinned(node, flag == b"1")
            return
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        node.set_xattr(name, value)
        node.ctime_ns = now_ns()
        self.ns.journal.set_xattr(node.ino, name, value)
        self.ns.journal.inode(node.ino)
        await self.ns.journal.sync()

    def names(self, ino: int) -> list[bytes]:
        node = self.view.local(ino)
        return [] if node is None else list(node.xattrs)

    async def remove(self, ino: int, name: bytes) -> None:
        async with self.view.writable(ino) as (node, _):
            if name.startswith(XATTR_PREFIX):
                raise FsError(errno.EPERM)
            if name not in node.xattrs:
                raise FsError(errno.ENODATA)
            node.remove_xattr(name)
            node.ctime_ns = now_ns()
            self.ns.journal.del_xattr(node.ino, name)
            self.ns.journal.inode(node.ino)
            await self.ns.journal.sync()

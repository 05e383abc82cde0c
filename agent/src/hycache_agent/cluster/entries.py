"""What the cluster layer knows of names: a remote name's overlay node, and the DHT entry
of a local inode."""

from __future__ import annotations

import stat
from dataclasses import dataclass

from hycache_dht.meta import EntryMeta, pack_body, unpack_body

from hycache_agent.fs.namespace import Inode

LATER = object()  # what ClusterLink.lookup_now answers when the store must be asked (lookup)
UNREACHABLE = object()  # what ClusterLink.query answers when the store cannot be asked
REMOTE_INO_BASE = 1 << 48

KIND_OF_MODE = {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFLNK: "symlink"}


def same_bytes(old: EntryMeta, new: EntryMeta) -> bool:
    """Whether a file's new DHT entry still describes the bytes of the old one.  The store
    bumps the version on every change of the entry, also when only its holder's tier, its
    replica list or its write flag changed; those must not make a remote reader throw its
    copy away and fetch the file again.  Writes change the size or the mtime, and
    chmod/chown/rename-over the ctime."""
    return old.kind == new.kind == "file" and (old.size, old.mtime_ns, old.ctime_ns, old.mode) == \
        (new.size, new.mtime_ns, new.ctime_ns, new.mode)


def kind_of(mode: int) -> str:
    return KIND_OF_MODE.get(stat.S_IFMT(mode), "special")


def entry_meta(inode: Inode, node_id: str) -> EntryMeta:
    """The DHT entry of a local inode held by ``node_id``."""
    return EntryMeta(
        kind=kind_of(inode.mode), mode=inode.mode, uid=inode.uid, gid=inode.gid, size=inode.size,
        atime_ns=inode.atime_ns, mtime_ns=inode.mtime_ns, ctime_ns=inode.ctime_ns,
        primary=node_id if inode.is_reg else None, replicas=list(inode.replicas), tier=inode.tier,
        target=inode.target, rdev=inode.rdev, pinned=inode.pinned,
    )


def pack_row_meta(meta: EntryMeta) -> bytes:
    return meta.kind.encode() + b"\0" + pack_body(meta)


def unpack_row_meta(data: bytes) -> EntryMeta:
    kind, _, body = data.partition(b"\0")
    return unpack_body(kind.decode(), body)


@dataclass(eq=False)
class RemoteNode:
    """A name of the global namespace that this node does not hold."""

    ino: int
    path: bytes
    meta: EntryMeta
    fetched: float
    lookups: int = 0
    cache_blob: str | None = None  # local copy of a remote file's bytes
    cache_version: int = -1
    cache_etag: str | None = None  # the holder's version token of cache_blob
    superseded: bool = False  # the store has a newer version (a new inode for the path)
    # HCCache: the holder ETag every read of this inode is served from (the kernel's page
    # cache is per inode, so all handles of the node must serve one version of the bytes)
    pinned_etag: str | None = None
    cache_size: int = 0  # bytes of cache_blob, counted in the engine's fast-tier use
    open_count: int = 0
    local: Inode | None = None  # taken over by this node: the local inode now holding it
    read_at: float = float("-inf")  # when the read of ``meta`` started (cluster/invalidation.py)

    @property
    def is_dir(self) -> bool:
        return self.meta.kind == "dir"


"""Copies of remote files kept after the kernel forgot their inodes.

A whole copy belongs to a remote inode (cluster/copies.py), and the kernel forgets an
inode whenever it drops its dentry and inode caches (memory pressure, ``drop_caches`` by
any process).  Without this, the next job on the node opening the same unchanged file
fetched it again.  A forgotten inode's copy is kept here, keyed by path, with the DHT
entry it was fetched for; a new node of the path adopts it only if the store's entry
still describes the same bytes (:func:`same_bytes`: size, mtime, ctime and mode — a
write, a truncate, a rename-over or a utimes all change one of them), else it is removed.

Kept copies stay counted in the fast tier's remote-copy use (fs/space.py) and are bounded:
at most ``KEPT_SHARE`` of the fast tier's capacity, least recently forgotten first out,
and none kept while the fast tier is over its capacity."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hycache_dht.meta import EntryMeta

from hycache_agent.cluster.entries import RemoteNode, same_bytes

KEPT_SHARE = 0.25


@dataclass
class KeptCopy:
    blob: str
    size: int
    meta: EntryMeta  # the entry of the version the copy holds
    etag: str | None


class KeptCopies:
    """The kept copies, by path.  It never removes a file itself: what goes is returned
    to the caller (a blob to remove, its bytes already taken off ``space``)."""

    def __init__(self, space, share: float = KEPT_SHARE) -> None:
        self.space = space
        self.share = share
        self._kept: OrderedDict[bytes, KeptCopy] = OrderedDict()
        self.bytes = 0
        self.adopted = 0  # copies a new inode of the same bytes took over (fetches saved)

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, node: RemoteNode) -> list[str]:
        """``node``'s copy (of its current version: the caller checked) is kept; returns
        the blobs that go to stay within the bound (maybe this one)."""
        assert node.cache_blob is not None, "keep: only a node with a copy"
        gone = self.take(node.path)
        self._kept[node.path] = KeptCopy(node.cache_blob, node.cache_size, node.meta, node.cache_etag)
        self.bytes += node.cache_size
        while self._kept and (self.bytes > self.share * self.space.capacity
                              or self.space.used > self.space.capacity):
            gone.extend(self._pop(next(iter(self._kept))))
        return gone

    def adopt(self, node: RemoteNode) -> list[str]:
        """A new node of a path: it takes the kept copy if the store's entry still
        describes the copy's bytes (its meta then keeps the copy's version, as a node kept
        across a republish does: cluster/remote_view.py); a copy of other bytes goes
        (returned)."""
        kept = self._kept.get(node.path)
        if kept is None:
            return []
        if node.cache_blob or not same_bytes(kept.meta, node.meta):
            return self._pop(node.path)
        del self._kept[node.path]
        self.bytes -= kept.size
        node.meta = node.meta.copy(version=kept.meta.version)
        node.cache_blob, node.cache_size = kept.blob, kept.size
        node.cache_version, node.cache_etag = kept.meta.version, kept.etag
        self.adopted += 1
        return []

    def size_of(self, path: bytes) -> int:
        kept = self._kept.get(path)
        return kept.size if kept is not None else 0

    def take(self, path: bytes) -> list[str]:
        """The kept copy of ``path`` goes (a plan's evict, a newer copy kept)."""
        return self._pop(path) if path in self._kept else []

    def _pop(self, path: bytes) -> list[str]:
        kept = self._kept.pop(path)
        self.bytes -= kept.size
        self.space.remote_copy_removed(kept.size)
        return [kept.blob]

    def status(self) -> dict[str, int]:
        return {"files": len(self._kept), "bytes": self.bytes, "adopted": self.adopted}

"""Serving peers: the engine side of the peer data service (:class:`PeerFiles`)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

from hycache_agent.cluster.replicas import ReplicaStore
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError, Inode


@dataclass(eq=False)
class _OpenedForPeer:
    blob: str
    size: int
    etag: str
    inode: Inode
    engine: Any

    async def close(self) -> None:
        self.inode.open_count -= 1
        await self.engine.maybe_free(self.inode)


@dataclass(eq=False)
class _OpenedReplica:
    blob: str
    size: int
    etag: str

    async def close(self) -> None:
        pass


class LocalPeerFiles:
    """The engine side of the peer data service: stream local files (and the replicas
    this node keeps) to other nodes, and keep the replicas they push."""

    def __init__(self, engine, replica_store: ReplicaStore | None = None) -> None:
        self.engine = engine
        self.replica_store = replica_store
        self.staging_dir = str(engine.tiers[T.SLOW].path / "peer-staging")
        os.makedirs(self.staging_dir, exist_ok=True)
        # (start-up, before the peer service) a push that a stop or a crash cut short
        # left its temp file: the sender still counts the file unreplicated and pushes it again
        for entry in os.scandir(self.staging_dir):
            if entry.name.startswith(".peer-") and entry.name.endswith(".part"):
                T.remove_blob(entry.path)

    def _resolve(self, path: bytes) -> Inode:
        try:
            inode = self.engine.ns.resolve(path)
        except FsError as exc:
            if exc.errno == errno.ENOTDIR:
                raise NotADirectoryError(path) from None
            raise FileNotFoundError(path) from None
        if inode.is_dir:
            raise IsADirectoryError(path)
        if not inode.is_reg:
            raise FileNotFoundError(path)
        return inode

    async def open_for_peer(self, path: bytes):
        try:
            inode = self._resolve(path)
        except FileNotFoundError:
            rec = self.replica_store.index.get(path) if self.replica_store is not None else None
            if rec is None:
                raise
            return _OpenedReplica(rec.data, rec.size, "r-" + rec.etag)
        inode.open_count += 1  # keeps the blob from being freed; evictions skip open files
        try:
            while inode.migration is not None:  # wait for a switch in flight, then read the winner
                await inode.migration.done.wait()
        except BaseException:  # cancelled: give the count back
            inode.open_count -= 1
            raise
        return _OpenedForPeer(self.engine.blob(inode), inode.size,
                              f"{inode.ino}-{inode.data_gen}-{inode.size}", inode, self.engine)

    async def receive_replica(self, path: bytes, temp_blob: str, headers: dict[str, str]) -> None:
        if self.replica_store is None:
            raise PermissionError("this node keeps no replicas")
        await self.replica_store.adopt(path, temp_blob, headers)

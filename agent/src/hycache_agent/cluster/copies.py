"""Remote reads by whole copies: a remote file's bytes fetched (or streamed, remote/copy.py)
from a node holding it into the remote cache on this node's fast tier, refetched when the
store's version changes."""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from hycache_agent.cluster.entries import RemoteNode
from hycache_agent.cluster.remote_view import RemoteView
from hycache_agent.cluster.store_link import LinkStatus
from hycache_agent.cluster.tasks import Background
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError
from hycache_agent.remote.copy import FILLING_MIN, Filling, StreamCopy

log = logging.getLogger("hycache_agent.cluster.dht_link")  # one log for all the parts of the link


class RemoteCopies:
    """This node's copies of remote files, one per remote node at most, and the fetches
    and streams that make them.  A copy is counted in the engine's fast-tier use.  It is
    also what a :class:`StreamCopy` reports to (``address_of``, ``peers``, ``reader``,
    :meth:`stream_done`, :meth:`stream_failed`)."""

    def __init__(self, engine, view: RemoteView, *, status: LinkStatus, peers,
                 address_of: Callable[[str], Awaitable[str]], reader, cache_dir: Path, tasks: Background,
                 copy_dropped: Callable[[int], Awaitable[None]]) -> None:
        self.engine = engine
        self.view = view
        self.status = status
        self.peers = peers
        self.address_of = address_of
        self.reader = reader
        self.cache_dir = cache_dir
        self.tasks = tasks
        self._copy_dropped = copy_dropped
        self._fetch_locks: dict[bytes, trio.Lock] = {}
        self._streams: dict[tuple[bytes, int], StreamCopy] = {}  # copies streaming in for readers
        self._copy_seq = itertools.count()  # copy_dest: a new name per fetch

    def fetch_lock(self, path: bytes) -> trio.Lock:
        return self._fetch_locks.setdefault(path, trio.Lock())

    async def forgotten(self, node: RemoteNode, current: bool) -> None:
        """The kernel forgot ``node`` (``current``: it was its path's node): a copy of its
        current version is kept (cluster/kept.py) for the next node of the same bytes;
        any other copy goes."""
        if current:
            lock = self._fetch_locks.get(node.path)
            if lock is not None and not lock.locked():
                del self._fetch_locks[node.path]
        if not node.cache_blob:
            return
        if current and not node.superseded and self.has_copy(node):
            gone = self.view.kept.keep(node)
        else:
            gone = [node.cache_blob]
            self.engine.remote_copy_removed(node.cache_size)
        node.cache_blob, node.cache_size = None, 0
        for blob in gone:
            await trio.to_thread.run_sync(T.remove_blob, blob)

    def has_copy(self, node: RemoteNode) -> bool:
        """Whether this node's fast tier already holds the node's current version."""
        return bool(node.cache_blob) and node.cache_version == node.meta.version

    async def open_remote(self, node: RemoteNode) -> str:
        """A local copy of a remote file's current version (fetched if needed)."""
        if node.meta.kind != "file":
            raise FsError(errno.EISDIR if node.is_dir else errno.ENXIO)
        await self.view.refresh(node)
        async with self.fetch_lock(node.path):
            return await self.fetch_locked(node)

    def _copy_dest(self, node: RemoteNode) -> str:
        return self.copy_dest(node.path, node.meta.version)

    def copy_dest(self, path: bytes, version: int) -> str:
        """A new file name in the remote cache for a copy of ``path`` at ``version``:
        unique per fetch, so that removing an old copy — a forgotten inode's, which runs
        in a worker thread after the node is gone — can never remove a newer copy of the
        same version fetched meanwhile for a new lookup of the same path."""
        return str(self.cache_dir / f"{hashlib.sha1(path).hexdigest()}.{version}.{next(self._copy_seq)}")

    @property
    def filling(self) -> int:
        """Copies streaming in now."""
        return len(self._streams)

    async def stream_open(self, node: RemoteNode) -> str | Filling:
        """For an open: the whole local copy of a remote file's current version, or, for a
        file of at least FILLING_MIN bytes whose copy is streaming in, a hold on that copy
        to read while it fills (once the stream has its first response head)."""
        sc = await self._stream(node)
        if isinstance(sc, str):
            return sc
        if sc.size >= FILLING_MIN:
            await sc.begun.wait()
            held = sc.hold()
            if held is not None:
                return held
        return await self._whole(node, sc)

    async def stream_remote(self, node: RemoteNode) -> str:
        """The whole local copy of a remote file's current version, streamed in with one
        GET if there is none yet (remote/copy.py; one stream per version, shared)."""
        sc = await self._stream(node)
        return sc if isinstance(sc, str) else await self._whole(node, sc)

    async def _stream(self, node: RemoteNode) -> str | StreamCopy:
        """The node's whole copy if there is one (or a whole fetch was on: it waits for
        it), else the stream of its version (started if none runs)."""
        if node.meta.kind != "file":
            raise FsError(errno.EISDIR if node.is_dir else errno.ENXIO)
        await self.view.refresh(node)
        if self.has_copy(node):
            assert node.cache_blob is not None, "has_copy: the copy's blob is known"
            return node.cache_blob
        key = (node.path, node.meta.version)
        sc = self._streams.get(key)
        if sc is None:
            if not self.tasks.running or self.fetch_lock(node.path).locked():  # a whole fetch is on: wait for it
                return await self.open_remote(node)
            sc = self._streams[key] = StreamCopy(self, node, self._copy_dest(node))
            self.tasks.spawn(sc.run)
        return sc

    async def _whole(self, node: RemoteNode, sc: StreamCopy) -> str:
        await sc.wait()
        if self.has_copy(node):
            assert node.cache_blob is not None, "has_copy: the copy's blob is known"
            return node.cache_blob
        return await self.open_remote(node)  # (the node moved on meanwhile: a plain fetch)

    def stream_done(self, sc: StreamCopy, etag: str, holder: str, seconds: float) -> None:
        """A stream copy is whole: it becomes the node's copy (counted in the fast tier's
        use) if the node still wants this version, else it goes."""
        node: RemoteNode = sc.node
        if self._streams.get((node.path, sc.version)) is sc:
            del self._streams[(node.path, sc.version)]
        self.status.remote_fetches += 1
        self.status.remote_bytes += sc.size
        log.info("streamed %r (%d bytes, version %d) from %s in %.3f s", node.path, sc.size, sc.version, holder,
                 seconds)
        if node.meta.version == sc.version and self.view.remote.get(node.ino) is node and not node.superseded:
            if node.cache_blob and node.cache_blob != sc.dest:
                self.tasks.spawn(trio.to_thread.run_sync, T.remove_blob, node.cache_blob)
            self.engine.remote_copy_removed(node.cache_size if node.cache_blob else 0)
            self.engine.remote_copy_added(sc.size)
            node.cache_blob, node.cache_version, node.cache_etag = sc.dest, sc.version, etag
            node.cache_size = sc.size
        elif node.cache_blob != sc.dest:
            log.info("stream copy of %r not kept (version %d now %d, known %s, superseded %s)", node.path,
                     sc.version, node.meta.version, self.view.remote.get(node.ino) is node, node.superseded)
            self.tasks.spawn(trio.to_thread.run_sync, T.remove_blob, sc.dest)

    def stream_failed(self, sc: StreamCopy) -> None:
        if self._streams.get((sc.node.path, sc.version)) is sc:
            del self._streams[(sc.node.path, sc.version)]
        if sc.node.cache_blob != sc.dest:
            self.tasks.spawn(trio.to_thread.run_sync, T.remove_blob, sc.dest)

    async def fetch_locked(self, node: RemoteNode) -> str:
        """(holding the path's fetch lock) the local copy of ``node.meta``'s version."""
        sc = self._streams.get((node.path, node.meta.version))
        if sc is not None:  # being streamed for a reader: that is the copy
            try:
                await sc.wait()
            except FsError:
                pass  # fetched again below
        if node.cache_blob and node.cache_version == node.meta.version:
            return node.cache_blob
        holders = [node.meta.primary, *node.meta.replicas]
        dest = self._copy_dest(node)
        last: BaseException | None = None
        for holder in [h for h in holders if h]:
            try:
                addr = await self.address_of(holder)
                t0 = time.monotonic()
                etag = await self.peers.fetch_to_file(addr, node.path, dest)
            except Exception as exc:
                last = exc
                log.warning("fetching %r from %s failed: %s", node.path, holder, exc)
                continue
            size = (await trio.to_thread.run_sync(os.stat, dest)).st_size
            self.status.remote_fetches += 1
            self.status.remote_bytes += size
            log.info("fetched %r (%d bytes) from %s in %.3f s", node.path, size, holder, time.monotonic() - t0)
            if node.cache_blob and node.cache_blob != dest:
                await trio.to_thread.run_sync(T.remove_blob, node.cache_blob)
            self.engine.remote_copy_removed(node.cache_size if node.cache_blob else 0)
            self.engine.remote_copy_added(size)
            node.cache_blob, node.cache_version, node.cache_etag = dest, node.meta.version, etag
            node.cache_size = size
            return dest
        log.error("no holder of %r could serve it (%s)", node.path, last)
        raise FsError(errno.EIO)

    async def drop_copy(self, path: bytes) -> int | None:
        """Drop this node's copy of a remote file from its fast tier (a plan's ``evict`` of
        a prefetched copy: the control plane's ``demote`` of a path another node holds).
        Returns the bytes freed (0: no copy here), or None when the copy is in use (open,
        or being fetched or streamed): it stays."""
        node = self.view.remote_by_path(path)
        if node is None or not node.cache_blob:
            freed = self.view.kept.size_of(path)  # a forgotten inode's kept copy, if any
            for blob in self.view.kept.take(path):  # (its bytes taken off the fast tier's use)
                await trio.to_thread.run_sync(T.remove_blob, blob)
            return freed
        lock = self._fetch_locks.get(path)
        if (node.open_count or (lock is not None and lock.locked())
                or any(key[0] == path for key in self._streams)):
            return None
        blob, size = node.cache_blob, node.cache_size
        node.cache_blob, node.cache_size, node.cache_version, node.cache_etag = None, 0, -1, None
        self.engine.remote_copy_removed(size)
        await self._copy_dropped(node.ino)  # a parked registration would keep the bytes
        await trio.to_thread.run_sync(T.remove_blob, blob)
        return size

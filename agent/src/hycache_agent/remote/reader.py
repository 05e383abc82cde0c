"""The remote read path through HCCache (``--hccache-size`` > 0).

A read of a file another node holds is served from the agent's HCCache
(:mod:`hycache_core.hccache`, the data structure; this module is its I/O side):

* **Small files** (below ``--hccache-small-file``, hybrid mode): the whole file is one
  cache object.  A cold one (neither in memory nor on the fast tier) is copied whole at
  open as with HCCache off (one range request, the copy written in one hop:
  ``remote/copy.py``; the kernel then reads it through passthrough) and the same bytes
  are inserted into memory, so HCCache's first open costs what off's does
  (:meth:`RemoteReader.copies_small`).  A file in memory whose copy is gone (the kernel
  forgot the inode) is served from memory; a miss without a copy (no second level, or
  larger than SMALL_WHOLE) reads the fast-tier copy (the second level) if there is one
  of this version, else fetches the whole file with one range request and writes the
  fast-tier copy behind, off the read's path.
* **Large files** (and every file in block mode, the BICache baseline): blocks of
  ``--hccache-block-size`` fetched on demand with ``Range`` requests to the holder (then
  its replicas); a sequential reader gets read-ahead (a window doubling up to
  ``READAHEAD_MAX`` blocks, fetched in the background), so the first byte of a huge file
  never waits for the whole file.  Large files get no fast-tier copy.
* **Versions.** Cache entries are keyed by path and versioned by ``(DHT version, holder
  ETag)``.  A remote inode (one per DHT version) is pinned to one ETag — the cached one
  for its DHT version, or the first one a fetch sees — for all its handles, because the
  kernel's page cache is per inode; a block of another ETag is never served for it: the
  read fails with EIO (the bytes of its version are gone; a new open finds the new inode).
  A replica's ETag is the primary's
  with an ``r-`` prefix: the same bytes.  A new DHT version learnt at lookup/refresh
  drops the path's entries.
* Fetches of blocks and small files are range GETs on the peer client's raw keep-alive
  connections (``transport/bulk.py``, the same as the whole-file streams).  Cache inserts
  (their content hash, for dedup) run in worker threads after the reply, off the read's
  path; the copies that assemble a multi-block reply run in worker threads; a small
  file's slice (at most one FUSE read) is taken on the loop.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import trio
from hycache_core.hccache import HCCache

from hycache_agent.fs.namespace import FsError
from hycache_agent.remote.copy import SMALL_WHOLE

log = logging.getLogger(__name__)

READAHEAD_MAX = 32  # blocks
READAHEAD_PARALLEL = 8  # concurrent background block fetches
HOLDER_BACKOFF = 10.0  # seconds a holder that failed is tried after the others
# A large file up to this share of the fast tier is copied whole to it at open (one
# streamed GET) and read by the kernel through passthrough; larger ones go by blocks.
COPY_SHARE = 0.25
# A small file copied whole up to this size is inserted into memory on the loop (no thread hop).
INLINE_INSERT = 64 << 10


def _norm(etag: str) -> str:
    return etag[2:] if etag.startswith("r-") else etag


class _Pending:
    """A fetch in flight that other readers of the same block wait for."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: tuple[bytes, str] | None = None


@dataclass
class ReaderStats:
    block_fetches: int = 0
    object_fetches: int = 0
    fetched_bytes: int = 0
    second_level_hits: int = 0
    readahead_blocks: int = 0
    version_changes: int = 0
    holder_failures: int = 0
    eio: int = 0


class RemoteReader:
    def __init__(self, link, cache: HCCache, *, second_level: bool = True) -> None:
        self.link = link
        self.second_level = second_level
        self.cache = cache
        self.stats = ReaderStats()
        self._inflight: dict[tuple, _Pending] = {}
        self._nursery: trio.Nursery | None = None
        self._ra_limit = trio.CapacityLimiter(READAHEAD_PARALLEL)
        self._failed: dict[str, float] = {}  # holder -> when it last failed

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await trio.sleep_forever()

    def open(self, node, client: Any) -> RemoteHandle:
        return RemoteHandle(self, node, client)

    def wants_copy(self, node) -> bool:
        """Whether an open of ``node`` should copy it whole to the fast tier and be read
        through passthrough rather than by blocks through memory.

        A large file is read faster as one streamed GET into the fast tier than as range
        requests of ``block_size`` (each a round trip and a thread hop or two here, and a
        hash of the block), and once whole the kernel reads it without the agent: the
        first read runs at the GET's speed, every later one (and random reads) at the
        local one.  A stream is also what should not churn the memory cache (a 256 MiB
        scan through a 256 MiB cache evicts everything for nothing).  Files too big for
        the fast tier's room (more than COPY_SHARE of it) keep the block path: their
        first byte must not wait for the whole file.  A cold small file is copied whole
        too (:meth:`copies_small`), so HCCache's first open of it is off's."""
        size = node.meta.size
        if size < self.cache.small_file:
            return self.copies_small(node)
        return size <= COPY_SHARE * self.link.engine.capacity

    def copies_small(self, node) -> bool:
        """Whether a cold small file (hybrid mode, with the fast-tier second level) is
        copied whole at open as with HCCache off, rather than fetched by its first READ.

        Its first open then costs what it costs without HCCache (one range request
        written in one hop, ``remote/copy.py`` SMALL_WHOLE, then the kernel reads the copy
        through passthrough: no READ through the agent, no second-level write and
        registration behind it), and the same bytes fill the memory cache
        (:meth:`keep_copied`), so a reopen after the copy is gone (the kernel forgot the
        inode) is a memory hit.  A file whose object is in memory keeps the memory path."""
        size = node.meta.size
        if not (self.second_level and self.cache.is_small(size) and 0 < size <= SMALL_WHOLE):
            return False
        return not self.holds(node)

    def holds(self, node) -> bool:
        """Whether the memory cache has ``node``'s current version whole (no counting)."""
        cached = self.cache.version_of(node.path)
        return cached is not None and cached[0] == node.meta.version and self.cache.peek(node.path, cached, 0)

    def keep_copied(self, node, version: int, etag: str, data: bytes) -> None:
        """The bytes of a small file just copied whole (``remote/copy.py``) go into the
        memory cache too: one fetch fills both levels.  The insert is a task of its own,
        started here and run by the loop once the open's task gives way (the reply to the
        kernel is then on its way): HCCache's cold open waits for nothing off's does not.
        Up to INLINE_INSERT bytes it runs on the loop (a SHA-256 of at most 64 KiB, ~40 µs,
        and the LRU bookkeeping): as a worker-thread hop beside the open's own hops it made
        every cold open 0.2-1 ms slower (quiet window, FUSE trace: OPEN 1.85-2.76 ms against
        off's 1.65-1.84; on the loop 1.49-1.53 against 1.47-1.82).  Larger ones hash in a
        thread."""
        if self._nursery is None or not self.cache.is_small(len(data)) or self.cache.limit_bytes <= 0:
            return
        self.stats.object_fetches += 1
        self.stats.fetched_bytes += len(data)
        self._nursery.start_soon(self._keep_copied, node.path, version, _norm(etag), data)

    async def _keep_copied(self, path: bytes, version: int, etag: str, data: bytes) -> None:
        try:
            if len(data) <= INLINE_INSERT:
                self.cache.insert_object(path, (version, etag), data)
            else:
                await trio.to_thread.run_sync(self.cache.insert_object, path, (version, etag), data)
        except Exception as exc:
            log.warning("caching %r failed: %s", path, exc)

    def learn_version(self, path: bytes, version: int) -> None:
        """The DHT says ``path`` is at ``version`` now: entries of another one go."""
        cached = self.cache.version_of(path)
        if cached is not None and cached[0] != version:
            self.cache.invalidate(path)
            self.stats.version_changes += 1

    def status(self) -> dict[str, Any]:
        d = self.cache.stats()
        d.update(self.stats.__dict__)
        d["second_level"] = self.second_level
        return d

    # ------------------------------------------------------------------ fetching
    def _holders(self, node) -> list[str]:
        """The primary, then its replicas; holders that failed recently go last (a dead
        primary must not cost every block its retries)."""
        now = time.monotonic()
        holders = [h for h in [node.meta.primary, *node.meta.replicas] if h]
        return sorted(holders, key=lambda h: now - self._failed.get(h, -1e9) < HOLDER_BACKOFF)

    async def fetch_range(self, node, offset: int, length: int) -> tuple[bytes, str, int]:
        """``(data, normalized etag, total)`` from the first holder that answers."""
        last: BaseException | None = None
        for holder in self._holders(node):
            try:
                addr = await self.link.address_of(holder)
                data, etag, total = await self.link.peers.read_block(addr, node.path, offset, length)
            except Exception as exc:
                last = exc
                self.stats.holder_failures += 1
                if not isinstance(exc, FsError):
                    self._failed[holder] = time.monotonic()
                log.warning("reading %r [%d+%d] from %s failed: %s", node.path, offset, length, holder, exc)
                continue
            self.stats.fetched_bytes += len(data)
            self.link.status.remote_bytes += len(data)
            self.link.status.remote_fetches += 1
            return data, _norm(etag), total
        self.stats.eio += 1
        log.error("no holder of %r could serve [%d+%d] (%s)", node.path, offset, length, last)
        raise FsError(errno.EIO)

    async def _single_flight(self, key: tuple, fetch, keep) -> tuple[bytes, str]:
        """``fetch()`` once per ``key`` in flight, its result shared by every reader that
        asks meanwhile.  ``keep(result)`` (the cache insert: a hash of the bytes in a
        worker thread) runs in the background, off the read's path; until it is done the
        key still answers from the fetched bytes, so nobody fetches them again."""
        pending = self._inflight.get(key)
        if pending is not None:
            await pending.event.wait()
            if pending.result is not None:
                return pending.result
        pending = self._inflight[key] = _Pending()
        kept = False
        try:
            pending.result = await fetch()
            if self._nursery is not None:
                self._nursery.start_soon(self._keep, key, pending, keep)
                kept = True
            else:
                await keep(pending.result)
            return pending.result
        finally:
            pending.event.set()
            if not kept and self._inflight.get(key) is pending:
                del self._inflight[key]

    async def _keep(self, key: tuple, pending: _Pending, keep) -> None:
        try:
            await keep(pending.result)
        except Exception as exc:
            log.warning("caching %r failed: %s", key[0], exc)
        finally:
            if self._inflight.get(key) is pending:
                del self._inflight[key]

    async def fetch_block(self, node, j: int) -> tuple[bytes, str]:
        """Block ``j`` of ``node``'s current DHT version (one fetch per block in flight,
        shared by every reader), inserted into the cache under its ETag."""
        bs = self.cache.block_size
        path, version, size = node.path, node.meta.version, node.meta.size

        async def fetch() -> tuple[bytes, str]:
            data, etag, _total = await self.fetch_range(node, j * bs, bs)
            self.stats.block_fetches += 1
            return data, etag

        async def keep(got: tuple[bytes, str]) -> None:
            await trio.to_thread.run_sync(self.cache.insert, path, (version, got[1]), size, j, got[0])

        return await self._single_flight((path, version, j), fetch, keep)

    async def fetch_object(self, node) -> tuple[bytes, str]:
        """A small file whole: the fast-tier copy of this version, else one range request;
        inserted into the cache as one object."""
        path, version = node.path, node.meta.version

        async def fetch() -> tuple[bytes, str]:
            if self.second_level and node.cache_blob and node.cache_version == version and node.cache_etag:
                try:
                    data = await trio.to_thread.run_sync(_read_file, node.cache_blob)
                    self.stats.second_level_hits += 1
                    return data, _norm(node.cache_etag)
                except OSError:
                    pass
            data, etag, total = await self.fetch_range(node, 0, max(1, node.meta.size))
            if total > len(data) and total < self.cache.small_file:  # grew since the DHT entry
                data, etag, total = await self.fetch_range(node, 0, total)
            self.stats.object_fetches += 1
            if self._nursery is not None and self.second_level:
                self._nursery.start_soon(self._write_second_level, node, version, data, etag)
            return data, etag

        async def keep(got: tuple[bytes, str]) -> None:
            await trio.to_thread.run_sync(self.cache.insert_object, path, (version, got[1]), got[0])

        return await self._single_flight((path, version, None), fetch, keep)

    async def _write_second_level(self, node, version: int, data: bytes, etag: str) -> None:
        dest = self.link.copy_dest(node.path, version)
        try:
            await trio.to_thread.run_sync(_write_file, dest, data)
        except OSError as exc:
            log.warning("writing the fast-tier copy of %r failed: %s", node.path, exc)
            return
        if node.meta.version == version and node.cache_version != version and node.lookups + node.open_count > 0:
            if node.cache_blob and node.cache_blob != dest:
                await trio.to_thread.run_sync(_unlink_quiet, node.cache_blob)
            # the copy takes fast-tier room like a prefetched one (engine.fast_used)
            self.link.engine.remote_copy_removed(node.cache_size if node.cache_blob else 0)
            self.link.engine.remote_copy_added(len(data))
            node.cache_blob, node.cache_version, node.cache_etag = dest, version, etag
            node.cache_size = len(data)
            if self.link.on_copy is not None:  # the next open reads it through passthrough
                await self.link.on_copy(node.ino, dest)
        elif node.cache_blob != dest:
            await trio.to_thread.run_sync(_unlink_quiet, dest)

    def readahead(self, node, handle: RemoteHandle, first: int, count: int) -> None:
        if self._nursery is None:
            return
        last = (max(1, node.meta.size) - 1) // self.cache.block_size
        for j in range(first, min(last, first + count - 1) + 1):
            if (node.path, node.meta.version, j) in self._inflight:
                continue
            self._nursery.start_soon(self._readahead_one, node, handle, j)

    async def _readahead_one(self, node, handle: RemoteHandle, j: int) -> None:
        async with self._ra_limit:
            if handle.closed or self.cache.peek(node.path, handle.cache_version(), j):
                return
            try:
                await self.fetch_block(node, j)
                self.stats.readahead_blocks += 1
            except Exception:
                pass


class RemoteHandle:
    """One open of a remote file: pinned to the DHT version it opened and to one ETag."""

    def __init__(self, reader: RemoteReader, node, client: Any) -> None:
        self.reader = reader
        self.cache = reader.cache
        self.node = node
        self.client = client
        self.version = node.meta.version
        self.size = node.meta.size
        self.closed = False
        self.next_off = 0
        self.window = 0
        self.small = self.cache.is_small(self.size)

    @property
    def etag(self) -> str | None:
        return self.node.pinned_etag

    def cache_version(self) -> tuple[int, str | None]:
        if self.node.pinned_etag is None:
            cached = self.cache.version_of(self.node.path)
            if cached is not None and cached[0] == self.version:
                self.node.pinned_etag = cached[1]
        return (self.version, self.node.pinned_etag)

    def _accept(self, etag: str) -> None:
        """A fetch of this inode's file returned ``etag``: the first one pins the inode
        (every handle of it: the kernel's page cache is per inode); another one means
        the bytes of the pinned version are gone from the holders."""
        if self.node.pinned_etag is None:
            self.node.pinned_etag = etag
        if etag != self.node.pinned_etag:
            self.reader.stats.eio += 1
            self.reader.stats.version_changes += 1
            log.warning("%r changed under its readers (version %s, now %s): EIO", self.node.path,
                        self.node.pinned_etag, etag)
            raise FsError(errno.EIO)

    async def read(self, off: int, size: int) -> bytes:
        t0 = time.monotonic()
        data, hit = await (self._read_object(off, size) if self.small else self._read_blocks(off, size))
        self.cache.account(len(data), hit)
        self.cache.record_request(time.monotonic() - t0, len(data), self.client)
        return data

    async def _read_object(self, off: int, size: int) -> tuple[bytes, int]:
        version = self.cache_version()
        if version[1] is not None:
            whole = self.cache.lookup_object(self.node.path, version, self.size)
        else:
            whole = None
            self.cache.count_misses(1)
        hit = whole is not None
        if whole is None:
            whole, etag = await self.reader.fetch_object(self.node)
            self._accept(etag)
        # a small file's slice is a copy of at most one FUSE read (128 KiB) on the loop,
        # cheaper than a thread hop; a read of the whole file (the common case) is no copy
        data = whole if off == 0 and size >= len(whole) else whole[off:off + size]
        return data, len(data) if hit else 0

    async def _read_blocks(self, off: int, size: int) -> tuple[bytes, int]:
        bs = self.cache.block_size
        end = min(off + size, self.size)
        if off >= end:
            return b"", 0
        j0, j1 = off // bs, (end - 1) // bs
        version = self.cache_version()
        blocks: dict[int, bytes] = {}
        if version[1] is not None:
            for j in range(j0, j1 + 1):
                got = self.cache.lookup(self.node.path, version, self.size, j)
                if got is not None:
                    blocks[j] = got
        else:
            self.cache.count_misses(j1 - j0 + 1)
        hit_bytes = sum(len(b) for b in blocks.values())
        missing = [j for j in range(j0, j1 + 1) if j not in blocks]
        # sequential reader: grow the read-ahead window before waiting for the misses
        if off == self.next_off and off > 0:
            self.window = min(READAHEAD_MAX, max(2, self.window * 2))
        elif off != self.next_off:
            self.window = 0
        self.next_off = end
        if missing:
            fetched: dict[int, tuple[bytes, str]] = {}

            async def one(j: int) -> None:
                fetched[j] = await self.reader.fetch_block(self.node, j)

            async with trio.open_nursery() as nursery:
                for j in missing:
                    nursery.start_soon(one, j)
            for j in missing:
                data, etag = fetched[j]
                self._accept(etag)
                blocks[j] = data
        if self.window:
            self.reader.readahead(self.node, self, j1 + 1, self.window)
        data = await trio.to_thread.run_sync(_assemble, blocks, j0, j1, bs, off, end)
        return data, min(hit_bytes, len(data))

    def close(self) -> None:
        self.closed = True


def _assemble(blocks: dict[int, bytes], j0: int, j1: int, bs: int, off: int, end: int) -> bytes:
    out = bytearray()
    for j in range(j0, j1 + 1):
        b = blocks[j]
        lo = off - j * bs if j == j0 else 0
        hi = min(len(b), end - j * bs)
        out += b[lo:hi]
        if len(b) < bs:  # the holder's file ends here
            break
    return bytes(out)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_file(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

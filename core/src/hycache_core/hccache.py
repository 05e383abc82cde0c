"""HCCache: a hybrid client-side memory cache (paper 002, Algorithms 1–3).

A pure data structure (no trio, no FUSE), shared by the agent's remote read path and the
simulator.  Files are identified by a hashable ``key`` (the agent uses the path) and carry
a ``version`` (any comparable-for-equality value: the agent uses the DHT entry's version
and the holder's ETag); a request with another version drops the file's entries.

* **Hybrid mode.** A file smaller than ``small_file`` bytes is one *data group*: one LRU
  entry holding whatever blocks of it were inserted (allocated lazily, Algorithm 1); a
  lookup moves the whole group to the MRU end (Algorithm 2); evicting it removes the whole
  group (Algorithm 3).  A larger file's blocks (``block_size``) are each their own LRU
  entry, grouped only for lookup and invalidation.
* **Block mode** (the baseline, BICache): every file, small or not, is blocks — the same
  code path with ``mode="block"``.
* **Content-addressed storage.** Data is kept in a pool keyed by a hash (injectable): a
  small file's complete content as one object, a large file's content per block.  Equal
  hashes are confirmed by comparing the bytes before sharing, so a collision stores both.
* **Bloom filter** (rbloom) answers "no such group" without touching the index; it is
  rebuilt when removals have made it stale.
* **Strict byte bound.** ``memory_bytes`` (unique stored bytes + a fixed overhead per LRU
  entry and per stored chunk) never exceeds ``limit_bytes``: an insert evicts from the LRU
  end first, and data that cannot fit even in an empty cache is not inserted.
* **Metrics**: hit ratio, byte hit ratio, ABD (Definition 1), ECDAL (Definition 2), ECDAB
  (Definition 3), dedup savings, memory used.

Thread safety: every public method takes one lock; hashing is done before taking it (the
agent calls ``insert`` from worker threads, so hashing never runs on its event loop).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from rbloom import Bloom

KIB = 1024
DEFAULT_SMALL_FILE = 256 * KIB
DEFAULT_BLOCK_SIZE = 64 * KIB
ENTRY_OVERHEAD = 256  # bytes charged per LRU entry (index, list node, group bookkeeping)
CHUNK_OVERHEAD = 128  # bytes charged per stored CAS chunk
MODES = ("hybrid", "block")


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(eq=False)
class Chunk:
    digest: bytes
    data: bytes
    refs: int = 0


class CasPool:
    """Identical content stored once; equal digests confirmed byte by byte."""

    def __init__(self) -> None:
        self.by_digest: dict[bytes, list[Chunk]] = {}
        self.stored_bytes = 0
        self.chunks = 0
        self.lookups = 0
        self.collisions = 0  # equal digest, different bytes

    def find(self, digest: bytes, data: bytes) -> Chunk | None:
        self.lookups += 1
        for chunk in self.by_digest.get(digest, ()):
            if chunk.data == data:
                return chunk
        return None

    def cost(self, digest: bytes, data: bytes) -> int:
        """Bytes that storing ``data`` would add."""
        return 0 if self.find(digest, data) is not None else len(data) + CHUNK_OVERHEAD

    def acquire(self, digest: bytes, data: bytes) -> Chunk:
        chunk = self.find(digest, data)
        if chunk is None:
            same = self.by_digest.setdefault(digest, [])
            if same:
                self.collisions += 1
            chunk = Chunk(digest, bytes(data))
            same.append(chunk)
            self.stored_bytes += len(data) + CHUNK_OVERHEAD
            self.chunks += 1
        chunk.refs += 1
        return chunk

    def release(self, chunk: Chunk) -> None:
        chunk.refs -= 1
        if chunk.refs == 0:
            same = self.by_digest[chunk.digest]
            same.remove(chunk)
            if not same:
                del self.by_digest[chunk.digest]
            self.stored_bytes -= len(chunk.data) + CHUNK_OVERHEAD
            self.chunks -= 1


@dataclass(eq=False)
class Group:
    """DGroup(F): the cached part of one file."""

    key: Hashable
    version: Any
    size: int
    small: bool  # one LRU entry for the whole group (hybrid mode, small file)
    blocks: dict[int, Chunk] = field(default_factory=dict)  # block index -> chunk
    whole: Chunk | None = None  # a small file's complete content (object-level CAS)

    def nblocks(self, block_size: int) -> int:
        return max(1, -(-self.size // block_size))

    def cached_blocks(self, block_size: int) -> list[int]:
        if self.whole is not None:
            return list(range(self.nblocks(block_size)))
        return sorted(self.blocks)


class HCCache:
    def __init__(self, limit_bytes: int, *, mode: str = "hybrid", small_file: int = DEFAULT_SMALL_FILE,
                 block_size: int = DEFAULT_BLOCK_SIZE, hash_fn: Callable[[bytes], bytes] = sha256,
                 bloom_capacity: int = 100_000, bloom_fp: float = 0.01) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        if limit_bytes < 0:
            raise ValueError("limit_bytes: must be >= 0")
        if block_size <= 0:
            raise ValueError("block_size: must be > 0")
        if small_file < 0:
            raise ValueError("small_file: must be >= 0")
        self.limit_bytes = limit_bytes
        self.mode = mode
        self.small_file = small_file
        self.block_size = block_size
        self.hash_fn = hash_fn
        self._lock = threading.Lock()
        self.groups: dict[Hashable, Group] = {}
        # LRU entries, oldest first: (key, None) for a whole small-file group,
        # (key, j) for block j of a file cached by blocks
        self.lru: OrderedDict[tuple[Hashable, int | None], None] = OrderedDict()
        self.pool = CasPool()
        self._bloom_capacity, self._bloom_fp = bloom_capacity, bloom_fp
        self.bloom = Bloom(bloom_capacity, bloom_fp)
        self._bloom_stale = 0  # groups removed since the filter was built
        self.bloom_negatives = 0
        # counters
        self.lookups = self.hits = 0
        self.bytes_requested = self.bytes_hit = 0
        self.inserts = self.insert_bytes = 0  # sum of CDA_j
        self.logical_bytes = 0  # bytes the entries represent (before dedup)
        self.evictions = self.invalidations = 0
        self.latency_sum = 0.0  # sum of L_i
        self.requests = 0
        self.request_bytes = 0  # sum of DA_i
        self.client_time: dict[Hashable, float] = {}  # CT_k

    # ------------------------------------------------------------------ helpers
    def is_small(self, size: int) -> bool:
        return self.mode == "hybrid" and size < self.small_file

    @property
    def memory_bytes(self) -> int:
        return self.pool.stored_bytes + len(self.lru) * ENTRY_OVERHEAD

    def _has_group(self, key: Hashable) -> Group | None:
        if key not in self.bloom:
            self.bloom_negatives += 1
            return None
        return self.groups.get(key)

    def _drop_group(self, group: Group) -> None:
        if group.whole is not None:
            self.pool.release(group.whole)
            self.logical_bytes -= len(group.whole.data)
            self.lru.pop((group.key, None), None)
        for j, chunk in group.blocks.items():
            self.pool.release(chunk)
            self.logical_bytes -= len(chunk.data)
            self.lru.pop((group.key, None if group.small else j), None)
        group.blocks.clear()
        group.whole = None
        del self.groups[group.key]
        self._bloom_stale += 1
        if self._bloom_stale > max(1024, len(self.groups)):
            self._rebuild_bloom()

    def _rebuild_bloom(self) -> None:
        self.bloom = Bloom(max(self._bloom_capacity, 2 * len(self.groups)), self._bloom_fp)
        for key in self.groups:
            self.bloom.add(key)
        self._bloom_stale = 0

    def _current(self, key: Hashable, version: Any) -> Group | None:
        """The file's group if it holds ``version``; a group of another version is dropped."""
        group = self._has_group(key)
        if group is not None and group.version != version:
            self._drop_group(group)
            self.invalidations += 1
            return None
        return group

    def _evict_one(self) -> bool:
        """Algorithm 3 on the LRU end: a small file's whole group, or one block."""
        if not self.lru:
            return False
        (key, j), _ = self.lru.popitem(last=False)
        group = self.groups[key]
        self.evictions += 1
        if j is None:  # the whole group goes
            self.lru[(key, None)] = None  # _drop_group pops it again
            self._drop_group(group)
            return True
        chunk = group.blocks.pop(j)
        self.pool.release(chunk)
        self.logical_bytes -= len(chunk.data)
        if not group.blocks:
            self._drop_group(group)
        return True

    def _make_room(self, digest: bytes, data: bytes, new_entry: bool) -> bool:
        """Evict until ``data`` fits under the bound; False if it cannot fit at all."""
        while True:
            need = self.pool.cost(digest, data) + (ENTRY_OVERHEAD if new_entry else 0)
            if self.memory_bytes + need <= self.limit_bytes:
                return True
            if not self._evict_one():
                return False

    # ------------------------------------------------------------------ Algorithm 2
    def lookup(self, key: Hashable, version: Any, size: int, block: int) -> bytes | None:
        """Block ``block`` of the file (``block_size`` granularity; the last one may be
        short), or None on a miss."""
        with self._lock:
            self.lookups += 1
            group = self._current(key, version)
            data = None
            if group is not None:
                if group.small:
                    if group.whole is not None:
                        off = block * self.block_size
                        data = group.whole.data[off:off + self.block_size]
                    elif block in group.blocks:
                        data = group.blocks[block].data
                    if data is not None:
                        self.lru.move_to_end((key, None))  # the whole group moves
                elif block in group.blocks:
                    data = group.blocks[block].data
                    self.lru.move_to_end((key, block))
            if data is not None:
                self.hits += 1
            return data

    def peek(self, key: Hashable, version: Any, block: int) -> bool:
        """Whether block ``block`` of that version is cached (no counting, no LRU move)."""
        with self._lock:
            group = self.groups.get(key)
            if group is None or group.version != version:
                return False
            if group.whole is not None:
                return block * self.block_size < max(1, len(group.whole.data))
            return block in group.blocks

    def lookup_object(self, key: Hashable, version: Any, size: int) -> bytes | None:
        """A small file's whole content (hybrid mode), or None."""
        with self._lock:
            self.lookups += 1
            group = self._current(key, version)
            if group is None or group.whole is None:
                return None
            self.lru.move_to_end((key, None))
            self.hits += 1
            return group.whole.data

    def count_misses(self, n: int) -> None:
        """Lookups the caller knows will miss (no group of that version) and skipped."""
        with self._lock:
            self.lookups += n

    def account(self, nbytes: int, hit_bytes: int) -> None:
        """Byte hit ratio: a request of ``nbytes`` of which ``hit_bytes`` came from the cache."""
        with self._lock:
            self.bytes_requested += nbytes
            self.bytes_hit += hit_bytes

    # ------------------------------------------------------------------ Algorithm 1
    def insert(self, key: Hashable, version: Any, size: int, block: int, data: bytes) -> bool:
        """Insert block ``block`` of a file of ``size`` bytes.  False if it did not fit."""
        digest = self.hash_fn(data)
        with self._lock:
            self.inserts += 1
            self.insert_bytes += len(data)
            group = self._current(key, version)
            small = self.is_small(size)
            if group is not None and group.small != small:  # size class changed: start over
                self._drop_group(group)
                group = None
            if group is not None and group.small and group.whole is not None:
                self.lru.move_to_end((key, None))  # already complete
                return True
            entry = (key, None) if small else (key, block)
            while True:  # eviction may remove the entry itself: then it is new again
                new_entry = entry not in self.lru
                if not self._make_room(digest, data, new_entry):
                    return False
                if new_entry or entry in self.lru:
                    break
            group = self.groups.get(key)  # eviction may have removed it
            if group is None:
                group = Group(key, version, size, small)
                self.groups[key] = group
                self.bloom.add(key)
            old = group.blocks.get(block)
            chunk = self.pool.acquire(digest, data)  # before releasing old: same bytes stay
            if old is not None:
                self.pool.release(old)
                self.logical_bytes -= len(old.data)
            group.blocks[block] = chunk
            self.logical_bytes += len(data)
            self.lru[entry] = None
            self.lru.move_to_end(entry)
            return True

    def insert_object(self, key: Hashable, version: Any, data: bytes) -> bool:
        """A small file's whole content as one object (one LRU entry, one CAS object).
        In block mode, or for a file not small, it is inserted block by block."""
        size = len(data)
        if not self.is_small(size):
            ok = True
            for j in range(0, max(1, -(-size // self.block_size))):
                ok = self.insert(key, version, size, j, data[j * self.block_size:(j + 1) * self.block_size]) and ok
            return ok
        digest = self.hash_fn(data)
        with self._lock:
            self.inserts += 1
            self.insert_bytes += len(data)
            group = self._current(key, version)
            if group is not None and group.whole is not None:
                self.lru.move_to_end((key, None))
                return True
            if group is not None:  # partial blocks: replaced by the whole object
                self._drop_group(group)
            if not self._make_room(digest, data, True):
                return False
            group = Group(key, version, size, True)
            group.whole = self.pool.acquire(digest, data)
            self.groups[key] = group
            self.bloom.add(key)
            self.logical_bytes += len(data)
            self.lru[(key, None)] = None
            return True

    # ------------------------------------------------------------------ Algorithm 3 / invalidation
    def evict(self, key: Hashable, block: int) -> bool:
        """Algorithm 3 for a named block: a small file's whole group goes; a large file's
        block alone (its group when it was the last).  False if not cached (NON EXIST)."""
        with self._lock:
            group = self._has_group(key)
            if group is None:
                return False
            if group.small:
                if group.whole is None and block not in group.blocks:
                    return False
                self._drop_group(group)
            else:
                if block not in group.blocks:
                    return False
                self.lru.pop((key, block))
                chunk = group.blocks.pop(block)
                self.pool.release(chunk)
                self.logical_bytes -= len(chunk.data)
                if not group.blocks:
                    self._drop_group(group)
            self.evictions += 1
            return True

    def invalidate(self, key: Hashable, version: Any = None) -> bool:
        """Drop the file's entries (all of them, or only if they are not ``version``)."""
        with self._lock:
            group = self._has_group(key)
            if group is None or (version is not None and group.version == version):
                return False
            self._drop_group(group)
            self.invalidations += 1
            return True

    def version_of(self, key: Hashable) -> Any:
        with self._lock:
            group = self.groups.get(key)
            return None if group is None else group.version

    def clear(self) -> None:
        with self._lock:
            for group in list(self.groups.values()):
                self._drop_group(group)

    # ------------------------------------------------------------------ metrics
    def record_request(self, latency: float, nbytes: int, client: Hashable = 0) -> None:
        """One I/O request as the application saw it (for ECDAL and ECDAB)."""
        with self._lock:
            self.requests += 1
            self.latency_sum += latency
            self.request_bytes += nbytes
            self.client_time[client] = self.client_time.get(client, 0.0) + latency

    def abd(self, small_only: bool = True) -> float | None:
        """Definition 1, averaged over the files with at least two cached blocks: the
        LRU list is read block by block (a small file's group spans as many consecutive
        positions as it has blocks), D_1 and D_n are the positions of a file's first and
        last cached block, ABD = (D_n - D_1) / (n - 1)."""
        with self._lock:
            positions: dict[Hashable, list[int]] = {}
            pos = 0
            for key, j in self.lru:
                group = self.groups[key]
                n = len(group.cached_blocks(self.block_size)) if j is None else 1
                positions.setdefault(key, []).extend(range(pos, pos + n))
                pos += n
            values = []
            for key, ps in positions.items():
                group = self.groups[key]
                if len(ps) < 2 or (small_only and group.size >= self.small_file):
                    continue
                values.append((ps[-1] - ps[0]) / (len(ps) - 1))
            return sum(values) / len(values) if values else None

    def ecdal(self) -> float | None:
        """Definition 2: 1 / (sum of request latencies [s] * sum of inserted bytes)."""
        denom = self.latency_sum * self.insert_bytes
        return 1.0 / denom if denom > 0 else None

    def ecdab(self) -> float | None:
        """Definition 3: sum of request bytes / (max per-client I/O time [s] * sum of
        inserted bytes)."""
        ct = max(self.client_time.values(), default=0.0)
        denom = ct * self.insert_bytes
        return self.request_bytes / denom if denom > 0 else None

    def stats(self) -> dict[str, Any]:
        abd = self.abd()
        with self._lock:
            return {
                "mode": self.mode,
                "small_file_bytes": self.small_file,
                "block_size": self.block_size,
                "limit_bytes": self.limit_bytes,
                "memory_bytes": self.memory_bytes,
                "entries": len(self.lru),
                "files": len(self.groups),
                "lookups": self.lookups,
                "hits": self.hits,
                "hit_ratio": self.hits / self.lookups if self.lookups else None,
                "bytes_requested": self.bytes_requested,
                "bytes_hit": self.bytes_hit,
                "byte_hit_ratio": self.bytes_hit / self.bytes_requested if self.bytes_requested else None,
                "abd": abd,
                "ecdal": self.ecdal(),
                "ecdab": self.ecdab(),
                "inserts": self.inserts,
                "insert_bytes": self.insert_bytes,
                "requests": self.requests,
                "evictions": self.evictions,
                "invalidations": self.invalidations,
                "cas_lookups": self.pool.lookups,
                "cas_chunks": self.pool.chunks,
                "hash_collisions": self.pool.collisions,
                "logical_bytes": self.logical_bytes,
                "dedup_saved_bytes": max(0, self.logical_bytes + self.pool.chunks * CHUNK_OVERHEAD
                                         - self.pool.stored_bytes),
                "bloom_negatives": self.bloom_negatives,
            }

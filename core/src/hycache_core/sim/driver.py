"""The one cache driver: capacity accounting, pins, dirty data and byte counters.

Policies only decide; the driver applies their decisions to a model of a two-tier
node (a fast tier of ``capacity`` bytes in front of a slow tier that holds
everything) and counts what each decision costs.  Every policy — online, heuristic,
offline — runs through the same driver, so their numbers are comparable.

The model, per reference (whole files, as in the papers):

* read, resident (a *hit*): the file is read from the fast tier.
* read, not resident (a *miss*): the file is read from the slow tier; if the policy
  caches it, it is also written to the fast tier.
* write, resident (a hit): the new content goes to the fast tier; the file is dirty.
* write, not resident (a miss): if the policy caches it, it is written to the fast
  tier (dirty); otherwise it is written to the slow tier.
* evicting a dirty file writes it back: a fast-tier read and a slow-tier write.
  Evicting a clean file costs nothing (the slow tier has its bytes).
* a reference whose size differs from the resident copy's is a new version of the
  file: the stale copy is dropped without write-back and the reference is a miss.

Modelled time is the sum, over every device operation, of the device's latency plus
bytes / bandwidth (the devices do not overlap — the papers' model).  The slow-tier
share of it is reported separately: the papers' own analysis "ignores the time of
transferring data between the processor and the cache" and counts only the slow tier.

The driver raises :class:`CacheInvariantError` if a policy ever exceeds the capacity,
evicts a pinned or non-resident file or admits a file twice, so every simulation run
is also a check of the policies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields

MB = 1_000_000


class CacheInvariantError(AssertionError):
    """A policy asked the driver for something a real cache cannot do."""


@dataclass(frozen=True)
class CostModel:
    """Device parameters; defaults from Table 1 of ``000_…``: the SSD is an OCZ Octane
    (480 MB/s read, 330 MB/s write, 26,000 IOPS), the HDD a Hitachi Deskstar (144 MB/s
    read, 142 MB/s write, 360 IOPS).  Latency per whole-file operation is 1/IOPS."""

    fast_read_bw: float = 480 * MB   # bytes/s
    fast_write_bw: float = 330 * MB
    slow_read_bw: float = 144 * MB
    slow_write_bw: float = 142 * MB
    fast_latency: float = 1 / 26_000  # seconds per operation
    slow_latency: float = 1 / 360

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_bw") and not value > 0:
                raise ValueError(f"{f.name} must be positive, got {value}")
            if f.name.endswith("_latency") and not value >= 0:
                raise ValueError(f"{f.name} must not be negative, got {value}")


@dataclass
class Stats:
    refs: int = 0
    hits: int = 0
    misses: int = 0
    bytes_total: int = 0
    hit_bytes: int = 0
    read_refs: int = 0
    read_bytes: int = 0
    admissions: int = 0
    evictions: int = 0
    writebacks: int = 0
    fast_bytes_read: int = 0
    fast_bytes_written: int = 0
    slow_bytes_read: int = 0
    slow_bytes_written: int = 0
    fast_reads: int = 0   # operations
    fast_writes: int = 0
    slow_reads: int = 0
    slow_writes: int = 0
    peak_used: int = 0
    dirty_bytes_at_end: int = 0

    def slow_seconds(self, m: CostModel) -> float:
        return (
            self.slow_reads * m.slow_latency + self.slow_bytes_read / m.slow_read_bw
            + self.slow_writes * m.slow_latency + self.slow_bytes_written / m.slow_write_bw
        )

    def fast_seconds(self, m: CostModel) -> float:
        return (
            self.fast_reads * m.fast_latency + self.fast_bytes_read / m.fast_read_bw
            + self.fast_writes * m.fast_latency + self.fast_bytes_written / m.fast_write_bw
        )

    def modelled_seconds(self, m: CostModel) -> float:
        return self.slow_seconds(m) + self.fast_seconds(m)

    def as_dict(self, m: CostModel) -> dict[str, float | int]:
        d: dict[str, float | int] = {
            "hits": self.hits,
            "misses": self.misses,
            "hit_ratio": self.hits / self.refs if self.refs else 0.0,
            "byte_hit_ratio": self.hit_bytes / self.bytes_total if self.bytes_total else 0.0,
            "slow_bytes_read": self.slow_bytes_read,
            "slow_bytes_written": self.slow_bytes_written,
            "modelled_seconds": self.modelled_seconds(m),
            "slow_seconds": self.slow_seconds(m),
        }
        for f in fields(self):
            d.setdefault(f.name, getattr(self, f.name))
        return d


class Strategy:
    """What the driver calls; a strategy calls :meth:`CacheDriver.admit` /
    :meth:`CacheDriver.evict` to act.  ``pos`` is the reference's index."""

    def hit(self, pos: int, key: Hashable, size: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def miss(self, pos: int, key: Hashable, size: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def dropped(self, key: Hashable) -> None:
        """The driver dropped a stale copy of ``key`` (a new version was referenced)."""


class CacheDriver:
    """Applies a strategy's decisions to the two-tier model and counts (see module doc)."""

    def __init__(self, capacity: int, pinned: Iterable[Hashable] = (), record: bool = False) -> None:
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self._capacity = capacity
        self.used = 0
        self.resident: dict[Hashable, int] = {}
        self.dirty: set[Hashable] = set()
        self.pinned: frozenset[Hashable] = frozenset(pinned)
        self.stats = Stats()
        self.events: list[tuple[str, int, Hashable]] | None = [] if record else None
        self._pos = -1
        self._current: Hashable = None
        self._current_write = 0  # the reference being missed writes (non-zero) or reads
        self._admitted = False

    @property
    def capacity(self) -> int:
        return self._capacity

    def is_pinned(self, key: Hashable) -> bool:
        return key in self.pinned

    @property
    def writing(self) -> bool:
        """Is the reference being missed a write?"""
        return bool(self._current_write)

    # -- actions for strategies ------------------------------------------------------
    def admit(self, key: Hashable, size: int) -> None:
        """Store the file being referenced in the fast tier (only during its miss)."""
        if key != self._current or self._admitted:
            raise CacheInvariantError(f"admit({key!r}) outside the miss of that key")
        if key in self.resident:
            raise CacheInvariantError(f"admit({key!r}): already resident")
        used = self.used + size
        if used > self._capacity:
            raise CacheInvariantError(f"admit({key!r}, {size}): {used} bytes > capacity {self._capacity}")
        self.resident[key] = size
        self.used = used
        if used > self.stats.peak_used:
            self.stats.peak_used = used
        self._admitted = True
        st = self.stats
        st.admissions += 1
        st.fast_writes += 1
        st.fast_bytes_written += size
        if self._current_write:
            self.dirty.add(key)
        if self.events is not None:
            self.events.append(("admit", self._pos, key))

    def evict(self, key: Hashable) -> None:
        if key in self.pinned:
            raise CacheInvariantError(f"evict({key!r}): the file is pinned")
        size = self.resident.pop(key, None)
        if size is None:
            raise CacheInvariantError(f"evict({key!r}): not resident")
        self.used -= size
        st = self.stats
        st.evictions += 1
        if key in self.dirty:
            self.dirty.discard(key)
            st.writebacks += 1
            st.fast_reads += 1
            st.fast_bytes_read += size
            st.slow_writes += 1
            st.slow_bytes_written += size
        if self.events is not None:
            self.events.append(("evict", self._pos, key))

    def _drop_stale(self, i: int, key: Hashable, size: int, strategy: Strategy) -> None:
        """Reference ``i`` is a new version of ``key``: its cached copy (``size``) goes."""
        del self.resident[key]
        self.used -= size
        self.dirty.discard(key)
        strategy.dropped(key)
        if self.events is not None:
            self.events.append(("drop", i, key))

    # -- the replay loop -------------------------------------------------------------
    def run(
        self,
        keys: Sequence[Hashable],
        sizes: Sequence[int],
        writes: Sequence[int],
        strategy: Strategy,
        progress: Callable[[int], None] | None = None,
        chunk: int = 1 << 16,
    ) -> Stats:
        """Replay the references through ``strategy``; ``progress(done)`` per chunk.

        One loop with local counters, added to :attr:`stats` at the end: it runs once per
        reference (millions of them), so a hit or a miss makes no call but the strategy's."""
        n = len(keys)
        resident = self.resident
        st = self.stats
        hit_fn, miss_fn = strategy.hit, strategy.miss
        hits = misses = hit_bytes = total_bytes = read_refs = read_bytes = 0
        fr = fbr = fw = fbw = sr = sbr = sw = sbw = 0
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            for i in range(lo, hi):
                k = keys[i]
                s = sizes[i]
                w = writes[i]
                total_bytes += s
                if not w:
                    read_refs += 1
                    read_bytes += s
                rs = resident.get(k)
                if rs is not None and rs != s:  # new version: drop the stale copy
                    self._drop_stale(i, k, rs, strategy)
                    rs = None
                if rs is not None:
                    hits += 1
                    hit_bytes += s
                    if w:
                        fw += 1
                        fbw += s
                        self.dirty.add(k)
                    else:
                        fr += 1
                        fbr += s
                    self._pos = i
                    hit_fn(i, k, s)
                else:
                    misses += 1
                    self._pos = i
                    self._current = k
                    self._current_write = w
                    self._admitted = False
                    miss_fn(i, k, s)
                    self._current = None
                    if w:
                        if not self._admitted:
                            sw += 1
                            sbw += s
                    else:
                        sr += 1
                        sbr += s
            if progress is not None:
                progress(hi)
        counts = {"refs": n, "hits": hits, "misses": misses, "hit_bytes": hit_bytes, "bytes_total": total_bytes,
                  "read_refs": read_refs, "read_bytes": read_bytes,
                  "fast_reads": fr, "fast_bytes_read": fbr, "fast_writes": fw, "fast_bytes_written": fbw,
                  "slow_reads": sr, "slow_bytes_read": sbr, "slow_writes": sw, "slow_bytes_written": sbw}
        for name, v in counts.items():
            setattr(st, name, getattr(st, name) + v)
        st.dirty_bytes_at_end = sum(resident[k] for k in self.dirty)
        return st


@dataclass
class RunResult:
    """One policy's outcome."""

    name: str
    stats: Stats
    seconds: float = 0.0  # wall-clock time of the simulation itself
    extra: dict[str, object] = field(default_factory=dict)

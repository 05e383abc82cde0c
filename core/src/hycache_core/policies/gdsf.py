"""GDSF: Greedy-Dual-Size-Frequency (Cherkasova 1998), a size-aware online policy.

Each resident key has a priority ``H = L + frequency * cost(size) / size``; the key
with the lowest ``H`` is evicted first and the "inflation" value ``L`` rises to the
priority of each victim, so keys that are not accessed again age out.  With the
classic ``cost = 1`` the policy prefers to keep small, frequently used files (it
maximizes the object hit ratio); a cost proportional to the fetch time from the slow
tier (``latency + size / bandwidth``, see :func:`fetch_time_cost`) makes it aware of
the per-file latency too.

Implementation: the same lazily invalidated binary heap as :class:`LFUPolicy`;
admit/touch/remove are O(log n) amortized, :meth:`eviction_order` yields the first
``k`` victims in O(k log k).  Tie-break: equal priorities go oldest access first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator

from ._heap import iter_sorted
from .base import OnlinePolicy


def fetch_time_cost(latency_s: float, bandwidth_bps: float) -> Callable[[int], float]:
    """A GDSF cost: seconds to fetch a file of ``size`` bytes from the slow tier."""
    return lambda size: latency_s + size / bandwidth_bps


class GDSFPolicy(OnlinePolicy):
    """Lowest ``L + frequency * cost / size`` first; ties: least recently accessed first."""

    name = "gdsf"

    def __init__(self, cost: Callable[[int], float] | None = None) -> None:
        self._cost = cost
        self._inflation = 0.0
        self._entry: dict[Hashable, tuple[float, int, Hashable]] = {}  # key -> live item (H, seq, key)
        self._freq: dict[Hashable, int] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()

    def _push(self, key: Hashable, freq: int, size: int) -> None:
        value = freq if self._cost is None else freq * self._cost(size)
        prio = self._inflation + value / (size if size > 0 else 1)
        item = (prio, next(self._seq), key)
        self._entry[key] = item
        self._freq[key] = freq
        heapq.heappush(self._heap, item)
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = list(self._entry.values())
            heapq.heapify(self._heap)

    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        self._push(key, max(hits, 1), size)

    def touch(self, key: Hashable, size: int) -> None:
        self._push(key, self._freq.get(key, 0) + 1, size)

    def remove(self, key: Hashable) -> None:
        item = self._entry.get(key)
        if item is None:
            return
        # Drop stale items from the top so we can tell whether ``key`` is the
        # current minimum: then it is a victim and L rises to its priority.  (A
        # deleted key that is not the minimum leaves L alone.)
        heap, entry = self._heap, self._entry
        while heap and entry.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)
        if heap and heap[0] is item:
            self._inflation = max(self._inflation, item[0])
        del entry[key]
        del self._freq[key]

    def eviction_order(self) -> Iterator[Hashable]:
        entry, heap = self._entry, self._heap
        while heap and entry.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)  # stale items (victims, old priorities) gather at the top
        for item in iter_sorted(heap):
            if entry.get(item[2]) is item:
                yield item[2]

    def hits(self, key: Hashable) -> int:
        return self._freq.get(key, 0)

    @property
    def inflation(self) -> float:
        """The current aging value ``L``."""
        return self._inflation

    def __contains__(self, key: object) -> bool:
        return key in self._entry

    def __len__(self) -> int:
        return len(self._entry)

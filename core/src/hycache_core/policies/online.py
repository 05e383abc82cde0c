"""LRU and LFU: the online policies built into HyCache (O(1) and O(log n) per access)."""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator

from .base import OnlinePolicy


class LRUPolicy(OnlinePolicy):
    """Least recently used first.  An ``OrderedDict`` gives O(1) admit/touch/remove."""

    name = "lru"

    def __init__(self) -> None:
        self._queue: OrderedDict[Hashable, int] = OrderedDict()  # key -> hits

    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        self._queue[key] = hits
        self._queue.move_to_end(key)

    def touch(self, key: Hashable, size: int) -> None:
        if key in self._queue:
            self._queue[key] += 1
            self._queue.move_to_end(key)
        else:
            self.admit(key, size)

    def remove(self, key: Hashable) -> None:
        self._queue.pop(key, None)

    def eviction_order(self) -> Iterator[Hashable]:
        # Iterating an OrderedDict is lazy and O(1) per step; callers do not mutate it
        # while iterating (see OnlinePolicy.eviction_order).
        return iter(self._queue)

    def hits(self, key: Hashable) -> int:
        return self._queue.get(key, 0)

    def __contains__(self, key: object) -> bool:
        return key in self._queue

    def __len__(self) -> int:
        return len(self._queue)


class LFUPolicy(OnlinePolicy):
    """Least frequently used first; ties go to the least recently used (older first).

    A binary heap of ``(hits, last_access_seq, key)`` with lazy invalidation gives
    O(log n) touch/admit; :meth:`eviction_order` pops from a copy-free merge of the
    heap, skipping stale entries, so finding the first victim is O(log n) amortized.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._entry: dict[Hashable, tuple[int, int]] = {}  # key -> (hits, seq)
        self._heap: list[tuple[int, int, Hashable]] = []
        self._seq = itertools.count()

    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        entry = (hits, next(self._seq))
        self._entry[key] = entry
        heapq.heappush(self._heap, (entry[0], entry[1], key))
        self._compact()

    def touch(self, key: Hashable, size: int) -> None:
        hits = self._entry[key][0] + 1 if key in self._entry else 1
        self.admit(key, size, hits)

    def remove(self, key: Hashable) -> None:
        self._entry.pop(key, None)
        self._compact()

    def hits(self, key: Hashable) -> int:
        entry = self._entry.get(key)
        return entry[0] if entry else 0

    def _compact(self) -> None:
        # Stale heap entries are dropped once they outnumber live ones 2:1, which keeps
        # the heap O(n) in size and the amortized cost per operation O(log n).
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = [(h, s, k) for k, (h, s) in self._entry.items()]
            heapq.heapify(self._heap)

    def eviction_order(self) -> Iterator[Hashable]:
        heap = list(self._heap)  # O(n) copy, then O(log n) per victim taken
        while heap:
            hits, seq, key = heapq.heappop(heap)
            if self._entry.get(key) == (hits, seq):
                yield key

    def __contains__(self, key: object) -> bool:
        return key in self._entry

    def __len__(self) -> int:
        return len(self._entry)

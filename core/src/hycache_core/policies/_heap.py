"""Ordered, read-only traversal of a binary heap.

``heapq`` keeps a list in heap order but offers no way to walk it in sorted order
without popping.  :func:`iter_sorted` yields the items of a heap in increasing order
without copying or mutating it: a small frontier heap holds the children of the items
already yielded, so taking the first ``k`` items costs O(k log k) whatever the size of
the heap.  Policies use it to offer eviction candidates lazily (the caller usually
needs one or two victims from a cache with thousands of files).
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heappop, heappush
from typing import TypeVar

T = TypeVar("T")


def iter_sorted(heap: list[T]) -> Iterator[T]:
    """Items of ``heap`` (a list in ``heapq`` order) from the smallest up, lazily.

    The heap must not be modified while the iterator is in use.  Items are compared
    only with each other (ties between equal items are broken by their position in
    the list, so items need not be totally ordered beyond their own ``<``).
    """
    n = len(heap)
    if not n:
        return
    frontier: list[tuple[T, int]] = [(heap[0], 0)]
    while frontier:
        item, i = heappop(frontier)
        yield item
        child = 2 * i + 1
        if child < n:
            heappush(frontier, (heap[child], child))
            child += 1
            if child < n:
                heappush(frontier, (heap[child], child))

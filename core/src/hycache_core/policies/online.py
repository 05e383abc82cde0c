"""LRU and LFU: the online policies built into HyCache (O(1) per access)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator

from .base import OnlinePolicy, Usage


class LRUPolicy(OnlinePolicy):
    """Least recently used first.  An ``OrderedDict`` gives O(1) admit/touch/remove.

    No ties are possible: every admit/touch moves its key to the most recent end.
    """

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


class _Bucket:
    """All resident keys with one hit count, least recently accessed first."""

    __slots__ = ("hits", "keys", "prev", "next")

    def __init__(self, hits: int) -> None:
        self.hits = hits
        self.keys: OrderedDict[Hashable, None] = OrderedDict()
        self.prev: _Bucket | None = None
        self.next: _Bucket | None = None


class LFUPolicy(OnlinePolicy):
    """Least frequently used first; ties go to the least recently used (older first).

    The O(1) LFU of Shah, Mitra & Matani (2010): a linked list of buckets, one per
    distinct hit count in increasing order, each an ordered dict of its keys by last
    access.  A touch moves a key to the next bucket (created next to its old one if
    missing), so admit/touch/remove are O(1) (an admit with a restored hit count > 1
    walks the buckets once).  :meth:`eviction_order` walks the buckets from the
    lowest count, yielding each bucket's keys oldest first: O(1) per victim.

    Tie-break: among keys with equal hit counts the one whose last access (admit or
    touch) is oldest goes first.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._bucket: dict[Hashable, _Bucket] = {}
        self._head: _Bucket | None = None

    def _unlink_if_empty(self, b: _Bucket) -> None:
        if b.keys:
            return
        if b.prev is None:
            self._head = b.next
        else:
            b.prev.next = b.next
        if b.next is not None:
            b.next.prev = b.prev

    def _insert_after(self, prev: _Bucket | None, hits: int) -> _Bucket:
        """The bucket for ``hits`` right after ``prev`` (``None``: at the head)."""
        nxt = self._head if prev is None else prev.next
        if nxt is not None and nxt.hits == hits:
            return nxt
        b = _Bucket(hits)
        b.prev, b.next = prev, nxt
        if prev is None:
            self._head = b
        else:
            prev.next = b
        if nxt is not None:
            nxt.prev = b
        return b

    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        self.remove(key)
        prev = None
        b = self._head
        while b is not None and b.hits < hits:
            prev, b = b, b.next
        target = self._insert_after(prev, hits)
        target.keys[key] = None
        self._bucket[key] = target

    def touch(self, key: Hashable, size: int) -> None:
        b = self._bucket.get(key)
        if b is None:
            self.admit(key, size)
            return
        target = self._insert_after(b, b.hits + 1)
        del b.keys[key]
        target.keys[key] = None
        self._bucket[key] = target
        self._unlink_if_empty(b)

    def remove(self, key: Hashable) -> None:
        b = self._bucket.pop(key, None)
        if b is not None:
            del b.keys[key]
            self._unlink_if_empty(b)

    def hotter(self, a: Usage, b: Usage) -> bool:
        """More hits first; among equal counts the more recent (LFU's order)."""
        return (a.hits, a.last) > (b.hits, b.last)

    def hits(self, key: Hashable) -> int:
        b = self._bucket.get(key)
        return b.hits if b else 0

    def eviction_order(self) -> Iterator[Hashable]:
        b = self._head
        while b is not None:
            yield from b.keys
            b = b.next

    def __contains__(self, key: object) -> bool:
        return key in self._bucket

    def __len__(self) -> int:
        return len(self._bucket)

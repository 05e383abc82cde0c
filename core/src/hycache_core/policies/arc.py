"""ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), counted in bytes.

ARC keeps two LRU lists of resident keys — ``T1`` (seen once recently) and ``T2``
(seen at least twice) — and two "ghost" lists of recently evicted keys, ``B1`` and
``B2``.  A miss that hits a ghost list shows which list deserved more room, and moves
the target size ``p`` of ``T1`` accordingly.  The original algorithm counts pages of
one size; files differ in size, so here every list is measured in bytes, ``p`` is a
byte target, and the adaptation step is scaled by the size of the incoming file (the
usual byte generalisation).

The :class:`OnlinePolicy` interface does not tell a policy the cache's capacity, so
``c`` (the ghost-list budget) is the ``capacity`` given to the constructor or, if none
is given, the high-water mark of resident bytes — which is the capacity as soon as the
cache has been full once.  Every operation is O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator

from .base import OnlinePolicy


class ARCPolicy(OnlinePolicy):
    """Byte-counted ARC.  Eviction: LRU end of T1 while T1 exceeds its target, else T2."""

    name = "arc"

    def __init__(self, capacity: int | None = None) -> None:
        self._fixed_capacity = capacity
        self._high_water = 0
        self._t1: OrderedDict[Hashable, int] = OrderedDict()  # key -> size (LRU first)
        self._t2: OrderedDict[Hashable, int] = OrderedDict()
        self._b1: OrderedDict[Hashable, int] = OrderedDict()  # ghosts
        self._b2: OrderedDict[Hashable, int] = OrderedDict()
        self._t1_bytes = self._t2_bytes = self._b1_bytes = self._b2_bytes = 0
        self._hits: dict[Hashable, int] = {}
        self._p = 0.0  # target bytes of T1
        self._prepared: Hashable | None = None  # key whose ghost hit was already applied
        self._incoming_in_b2 = False

    # -- capacity and ghosts ---------------------------------------------------------
    @property
    def _c(self) -> int:
        return self._fixed_capacity if self._fixed_capacity is not None else self._high_water

    @property
    def target_t1(self) -> float:
        """ARC's adaptive target ``p`` (bytes)."""
        return self._p

    def _trim_ghosts(self) -> None:
        c = self._c
        while self._b1 and self._t1_bytes + self._b1_bytes > c:
            _, size = self._b1.popitem(last=False)
            self._b1_bytes -= size
        while self._b2 and self._t1_bytes + self._t2_bytes + self._b1_bytes + self._b2_bytes > 2 * c:
            _, size = self._b2.popitem(last=False)
            self._b2_bytes -= size

    def _adapt(self, key: Hashable, size: int) -> None:
        """Apply a ghost hit of ``key`` (at most once per miss)."""
        self._incoming_in_b2 = False
        if key in self._b1:
            step = size * max(1.0, self._b2_bytes / max(self._b1_bytes, 1))
            self._p = min(float(self._c), self._p + step)
        elif key in self._b2:
            step = size * max(1.0, self._b1_bytes / max(self._b2_bytes, 1))
            self._p = max(0.0, self._p - step)
            self._incoming_in_b2 = True
        self._prepared = key

    # -- OnlinePolicy ----------------------------------------------------------------
    def will_admit(self, key: Hashable, size: int) -> None:
        self._adapt(key, size)

    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        if key in self:
            self.touch(key, size)
            return
        if self._prepared != key:
            self._adapt(key, size)
        self._prepared = None
        self._incoming_in_b2 = False
        ghost = False
        if key in self._b1:
            self._b1_bytes -= self._b1.pop(key)
            ghost = True
        elif key in self._b2:
            self._b2_bytes -= self._b2.pop(key)
            ghost = True
        if ghost or hits > 1:
            self._t2[key] = size
            self._t2_bytes += size
        else:
            self._t1[key] = size
            self._t1_bytes += size
        self._hits[key] = max(hits, 1)
        self._high_water = max(self._high_water, self._t1_bytes + self._t2_bytes)
        self._trim_ghosts()

    def touch(self, key: Hashable, size: int) -> None:
        if key in self._t1:
            self._t1_bytes -= self._t1.pop(key)
        elif key in self._t2:
            self._t2_bytes -= self._t2.pop(key)
        else:
            self.admit(key, size)
            return
        self._t2[key] = size
        self._t2_bytes += size
        self._hits[key] += 1
        self._high_water = max(self._high_water, self._t1_bytes + self._t2_bytes)

    def remove(self, key: Hashable) -> None:
        """A resident key leaves: it becomes a ghost in B1 (from T1) or B2 (from T2)."""
        if key in self._t1:
            size = self._t1.pop(key)
            self._t1_bytes -= size
            self._b1[key] = size
            self._b1_bytes += size
        elif key in self._t2:
            size = self._t2.pop(key)
            self._t2_bytes -= size
            self._b2[key] = size
            self._b2_bytes += size
        else:
            return
        self._hits.pop(key, None)
        self._trim_ghosts()

    def eviction_order(self) -> Iterator[Hashable]:
        # ARC's REPLACE, repeated: take T1's LRU end while T1 is above its target (or
        # exactly at it when the incoming key is a B2 ghost), otherwise T2's.  The
        # byte counts are tentative copies; the lists are not touched.
        t1, t2 = iter(self._t1.items()), iter(self._t2.items())
        t1_bytes, p, in_b2 = self._t1_bytes, self._p, self._incoming_in_b2
        n1, n2 = len(self._t1), len(self._t2)
        while n1 or n2:
            if n1 and (t1_bytes > p or (in_b2 and t1_bytes == p) or not n2):
                key, size = next(t1)
                n1 -= 1
                t1_bytes -= size
            else:
                key, _size = next(t2)
                n2 -= 1
            yield key

    def hits(self, key: Hashable) -> int:
        return self._hits.get(key, 0)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

"""The cost/gain heuristic: Algorithms 4–5 of the HyCache journal paper (``000_…`` §5),
the same as Algorithms 2–3 of HyCache+ (``003_…`` §III-B).

The three rules, for a reference string ``R = (r_1 … r_m)`` known in advance:

1. Every fetch brings into the cache the very next file of the reference string if it
   is not in the cache yet (demand fetching; a file is never prefetched out of order).
2. Never fetch a file if the total cost of the files it would evict is greater than the
   gain of fetching it.
3. Evict in increasing order of cost until there is room for the new file; evict
   nothing if there is room already.

``cost(F) = Size(F) × (references to F after the current position)`` for a cached
file, ``gain = Size(F') × (references to F' after the fetch position)`` for the
candidate ``F'``, and a file that is not referenced again is never cached
(Algorithm 4, line 2).  Algorithm 5 walks the cached files in increasing cost,
accumulating the cost; it gives up (the file is read from the slow tier without being
cached) as soon as the accumulated cost is no longer strictly below the gain, and
succeeds as soon as the evicted set leaves room.

How this implementation meets the papers' complexity.  "References after the current
position" of a cached file that is not the one being accessed equals the number of
its references not yet made, so the state is one counter per file, computed once
from the reference string (the papers' "precomputed by dynamic programming") and
decremented at each access.  A cached file's cost therefore only changes when that
file is accessed, so the cached files live in a binary heap ordered by
``(cost, -size, last access)`` that is updated in O(log n) per access;
Algorithm 5 walks the heap in order without copying it, so a decision costs
O(k log k) for the ``k`` files it examines (k ≤ n, the papers' bound is O(n log n)).

Choices the papers leave open, stated here:

* Ties in cost: the larger file goes first (it frees more room for the same cost),
  then the one accessed least recently.
* A candidate larger than the whole cache cannot be cached (Algorithm 5 as printed
  would fall through its loop and report success; that only happens in this case).
* Pinned files are skipped by the walk: they cannot be evicted, and add no cost.
* Unplanned accesses — a file with no planned reference left, e.g. an application
  outside the manifest — are handed to an online fallback policy (LRU by default).
  Files cached that way have no planned reference, i.e. cost 0, so a planned fetch
  evicts them first (in the fallback's order).  An unplanned access may evict only
  unplanned files and planned files with no reference left; it never evicts a file
  the plan still needs.  In a simulator run every access is planned and the
  fallback is never used.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from .base import OnlinePolicy, make_room
from .online import LRUPolicy


class CacheView(Protocol):
    """What a planned policy needs to know about the cache it advises."""

    @property
    def capacity(self) -> int: ...

    @property
    def used(self) -> int: ...

    def is_pinned(self, key: Hashable) -> bool: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one access: a hit, or a miss that is cached after evicting
    ``victims`` (in this order), or a miss that bypasses the cache."""

    hit: bool
    admit: bool
    victims: tuple[Hashable, ...] = ()


HIT = Decision(True, False)
BYPASS = Decision(False, False)
ADMIT = Decision(False, True)


class HeuristicPolicy:
    """Algorithms 4–5 with precomputed occurrence counts and an online fallback.

    The policy mirrors the residency of the cache it advises: every :class:`Decision`
    it returns is already applied to its own state, so the caller must carry it out
    (evict the victims, then store the file if ``admit``).  Files that leave the
    cache for other reasons (deleted, invalidated) must be reported with
    :meth:`forget`.
    """

    name = "heuristic"

    def __init__(self, reference_string: Iterable[Hashable] = (), fallback: OnlinePolicy | None = None) -> None:
        self._remaining: dict[Hashable, int] = {}
        self._size: dict[Hashable, int] = {}  # every resident key -> size
        # planned-resident key -> its live heap item (cost, -size, seq, key); an item in
        # the heap is live iff it *is* the key's entry (stale items are skipped lazily).
        self._entry: dict[Hashable, tuple[int, int, int, Hashable]] = {}
        self._heap: list[tuple[int, int, int, Hashable]] = []
        self._seq = itertools.count()
        self.fallback: OnlinePolicy = fallback if fallback is not None else LRUPolicy()
        self.plan(reference_string)

    # -- the plan --------------------------------------------------------------------
    def plan(self, reference_string: Iterable[Hashable]) -> None:
        """Append references to the known future (e.g. a newly submitted manifest)."""
        remaining = self._remaining
        touched = set()
        for key in reference_string:
            remaining[key] = remaining.get(key, 0) + 1
            touched.add(key)
        for key in touched:
            if key in self.fallback:
                self.fallback.remove(key)
                self._set_planned(key, self._size[key])
            elif key in self._entry:
                self._set_planned(key, self._size[key])

    def remaining(self, key: Hashable) -> int:
        """Planned references to ``key`` not made yet."""
        return self._remaining.get(key, 0)

    def cost(self, key: Hashable) -> int:
        """Cost of evicting a resident ``key`` now: size × remaining references."""
        return self._size[key] * self._remaining.get(key, 0)

    # -- residency bookkeeping -------------------------------------------------------
    def _set_planned(self, key: Hashable, size: int) -> None:
        item = (size * self._remaining.get(key, 0), -size, next(self._seq), key)
        self._entry[key] = item
        heap = self._heap
        heapq.heappush(heap, item)
        if len(heap) > 2 * len(self._entry) + 64:
            self._heap = list(self._entry.values())
            heapq.heapify(self._heap)

    def add_resident(self, key: Hashable, size: int) -> None:
        """``key`` is in the cache already (``size`` bytes) before the first access: a
        census of the node the plan starts from.  It is held as a planned file, its
        cost from its remaining references."""
        self._size[key] = size
        self._set_planned(key, size)

    def forget(self, key: Hashable) -> None:
        """``key`` left the cache for a reason other than this policy's decision."""
        if self._size.pop(key, None) is not None:
            if self._entry.pop(key, None) is None:
                self.fallback.remove(key)

    def resident(self) -> dict[Hashable, int]:
        """Resident keys and sizes as this policy believes them (a copy)."""
        return dict(self._size)

    def __contains__(self, key: object) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    def _planned_order(self) -> Iterator[tuple[Hashable, int]]:
        entry, heap = self._entry, self._heap
        while heap and entry.get(heap[0][3]) is not heap[0]:
            heapq.heappop(heap)  # evicted files' items are the cheapest: they gather at the top
        # iter_sorted(heap), inlined: this is the hot loop of every planned miss.
        n = len(heap)
        if not n:
            return
        frontier = [(heap[0], 0)]
        pop, push = heapq.heappop, heapq.heappush
        while frontier:
            item, i = pop(frontier)
            if entry.get(item[3]) is item:
                yield item[3], item[0]
            c = 2 * i + 1
            if c < n:
                push(frontier, (heap[c], c))
                if c + 1 < n:
                    push(frontier, (heap[c + 1], c + 1))

    def cost_order(self) -> Iterator[tuple[Hashable, int]]:
        """Resident ``(key, cost)`` in Algorithm 5's order (increasing cost).

        Unplanned files (cost 0) come first in the fallback's order, then planned
        files by ``(cost, -size, last access)``.  Do not mutate the policy meanwhile.
        """
        for key in self.fallback.eviction_order():
            yield key, 0
        yield from self._planned_order()

    # -- Algorithm 4 -----------------------------------------------------------------
    def access(self, key: Hashable, size: int, cache: CacheView) -> Decision:
        """Process the next access, in reference order, and decide (Algorithm 4)."""
        rem = self._remaining.get(key, 0)
        planned = rem > 0
        if planned:
            rem -= 1
            if rem:
                self._remaining[key] = rem
            else:
                del self._remaining[key]

        if key in self._size:  # a hit: only the file's cost changes
            self._size[key] = size
            if planned:
                self._set_planned(key, size)
            elif key in self._entry:  # planned file used beyond its plan: now unplanned
                del self._entry[key]
                self.fallback.admit(key, size)
            else:
                self.fallback.touch(key, size)
            return HIT

        if planned:
            if rem == 0:  # Algorithm 4, line 2: not referenced again -> never cached
                return BYPASS
            victims = self.files_to_discard(size, size * rem, cache)
            if victims is None:
                return BYPASS
            for v in victims:
                self.forget(v)
            self._size[key] = size
            self._set_planned(key, size)
            return Decision(False, True, tuple(victims)) if victims else ADMIT

        # Unplanned access: the online fallback decides, within the limits above.
        if size > cache.capacity:
            return BYPASS
        self.fallback.will_admit(key, size)
        victims = self._unplanned_victims(size, cache)
        if victims is None:
            return BYPASS
        for v in victims:
            self.forget(v)
        self._size[key] = size
        self.fallback.admit(key, size)
        return Decision(False, True, tuple(victims)) if victims else ADMIT

    # -- Algorithm 5 -----------------------------------------------------------------
    def files_to_discard(self, size: int, gain: int, cache: CacheView) -> list[Hashable] | None:
        """GetFilesToDiscard: the files to evict to cache a file of ``size`` whose gain
        is ``gain``, in eviction order, or ``None`` if it must not be cached.

        Pure: the policy's state is not changed.
        """
        capacity, used = cache.capacity, cache.used
        if used + size <= capacity:  # lines 2-4
            return []
        if size > capacity:
            return None
        need = used + size - capacity
        is_pinned, sizes = cache.is_pinned, self._size
        cost = 0
        victims: list[Hashable] = []
        order = self.cost_order() if len(self.fallback) else self._planned_order()
        for key, c in order:  # lines 9-10: increasing cost
            if is_pinned(key):
                continue
            cost += c  # lines 11-12
            if cost >= gain:  # lines 13-17: Rule 2
                return None
            victims.append(key)
            need -= sizes[key]
            if need <= 0:  # lines 19-21: Rule 3, enough room
                return victims
        return None  # pinned (or foreign) files leave no room

    def _unplanned_victims(self, size: int, cache: CacheView) -> list[Hashable] | None:
        def candidates() -> Iterator[Hashable]:
            yield from self.fallback.eviction_order()
            for key, cost in self._planned_order():
                if cost > 0:
                    return
                yield key

        # pinned (or foreign) files may leave no room: None
        return make_room(cache.used + size - cache.capacity, candidates(), cache.is_pinned, self._size)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One step of a per-node plan: at ``position`` the reference to ``key`` is a
    ``hit``, or a ``fetch`` into the cache after evicting ``evict``, or a ``bypass``."""

    position: int
    key: Hashable
    action: str
    evict: tuple[Hashable, ...] = ()


class _PlanCache:
    def __init__(self, capacity: int, pinned: Iterable[Hashable]) -> None:
        self.capacity = capacity
        self.used = 0
        self.sizes: dict[Hashable, int] = {}
        self.pinned = frozenset(pinned)

    def is_pinned(self, key: Hashable) -> bool:
        return key in self.pinned


def plan_heuristic(
    references: Sequence[tuple[Hashable, int]],
    capacity: int,
    pinned: Iterable[Hashable] = (),
    resident: Iterable[tuple[Hashable, int]] = (),
) -> list[PlanStep]:
    """Layer 2 of 2LS: the heuristic's fetch/evict plan for one node's ordered
    ``(key, size)`` reference string, starting from the files already ``resident``
    (they must fit in ``capacity``).  A reference whose size differs from the cached
    copy's is a new version of the file: the stale copy is dropped first."""
    cache = _PlanCache(capacity, pinned)
    policy = HeuristicPolicy(key for key, _ in references)
    for key, size in resident:
        policy.add_resident(key, size)
        cache.sizes[key] = size
        cache.used += size
    if cache.used > capacity:
        raise ValueError(f"resident files ({cache.used} bytes) exceed the capacity ({capacity} bytes)")
    steps: list[PlanStep] = []
    for pos, (key, size) in enumerate(references):
        old = cache.sizes.get(key)
        if old is not None and old != size:  # a new version: the cached copy is stale
            policy.forget(key)
            cache.used -= cache.sizes.pop(key)
        d = policy.access(key, size, cache)
        if d.hit:
            steps.append(PlanStep(pos, key, "hit"))
            continue
        for v in d.victims:
            cache.used -= cache.sizes.pop(v)
        if d.admit:
            cache.sizes[key] = size
            cache.used += size
            steps.append(PlanStep(pos, key, "fetch", d.victims))
        else:
            steps.append(PlanStep(pos, key, "bypass"))
    return steps

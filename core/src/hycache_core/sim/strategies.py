"""Adapters that plug each kind of policy into the :class:`CacheDriver`."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence

from ..policies._heap import iter_sorted
from ..policies.base import OnlinePolicy, make_room
from ..policies.heuristic import HeuristicPolicy
from .driver import CacheDriver, Strategy


def _victims(d: CacheDriver, size: int, order: Iterable[Hashable]) -> list[Hashable] | None:
    """What to evict from ``d``, in ``order``, so that ``size`` more bytes fit
    (:func:`make_room`); None if they never fit."""
    if size > d.capacity:
        return None
    return make_room(d.used + size - d.capacity, order, d.is_pinned, d.resident)


class OnlineStrategy(Strategy):
    """An :class:`OnlinePolicy`: always caches a miss if it fits after evicting in the
    policy's order (skipping pinned files); reads the file from the slow tier without
    caching it otherwise."""

    def __init__(self, driver: CacheDriver, policy: OnlinePolicy) -> None:
        self.driver = driver
        self.policy = policy

    def hit(self, pos: int, key: Hashable, size: int) -> None:
        self.policy.touch(key, size)

    def miss(self, pos: int, key: Hashable, size: int) -> None:
        d, policy = self.driver, self.policy

        def order() -> Iterator[Hashable]:  # runs only when room must be made
            policy.will_admit(key, size)
            yield from policy.eviction_order()

        victims = _victims(d, size, order())
        if victims is None:
            return
        for v in victims:
            d.evict(v)
            policy.remove(v)
        d.admit(key, size)
        policy.admit(key, size)

    def dropped(self, key: Hashable) -> None:
        self.policy.remove(key)


class HeuristicStrategy(Strategy):
    """The planned heuristic: every reference goes through :meth:`HeuristicPolicy.access`."""

    def __init__(self, driver: CacheDriver, policy: HeuristicPolicy) -> None:
        self.driver = driver
        self.policy = policy

    def hit(self, pos: int, key: Hashable, size: int) -> None:
        self.policy.access(key, size, self.driver)

    def miss(self, pos: int, key: Hashable, size: int) -> None:
        d = self.policy.access(key, size, self.driver)
        if d.admit:
            driver = self.driver
            for v in d.victims:
                driver.evict(v)
            driver.admit(key, size)

    def dropped(self, key: Hashable) -> None:
        self.policy.forget(key)


class BeladyStrategy(Strategy):
    """Belady's rule with bypass, for files of any size: on a miss, evict the resident
    files whose next use is furthest, as long as it is further than the incoming
    file's; if that cannot make room, do not cache the incoming file.  Optimal (MIN)
    when all files have one size; a strong offline heuristic otherwise."""

    def __init__(self, driver: CacheDriver, nxt: Sequence[int]) -> None:
        self.driver = driver
        self.nxt = nxt
        self.never = len(nxt)
        self._entry: dict[Hashable, tuple[int, int, Hashable]] = {}  # key -> live item (-next, seq, key)
        self._heap: list[tuple[int, int, Hashable]] = []
        self._seq = itertools.count()

    def _set(self, key: Hashable, nxt: int) -> None:
        item = (-nxt, next(self._seq), key)
        self._entry[key] = item
        heapq.heappush(self._heap, item)
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = list(self._entry.values())
            heapq.heapify(self._heap)

    def hit(self, pos: int, key: Hashable, size: int) -> None:
        self._set(key, self.nxt[pos])

    def miss(self, pos: int, key: Hashable, size: int) -> None:
        mine = self.nxt[pos]
        if mine >= self.never:
            return
        d = self.driver

        def order() -> Iterator[Hashable]:
            """Resident files, furthest next use first, while that is after ``mine``."""
            entry, pinned, heap = self._entry, d.pinned, self._heap
            while heap and entry.get(heap[0][2]) is not heap[0]:
                heapq.heappop(heap)  # victims' items gather at the top: drop them
            for item in iter_sorted(heap):
                v = item[2]
                if entry.get(v) is not item or v in pinned:
                    continue
                if -item[0] <= mine:
                    return  # the incoming file is needed later than every candidate
                yield v

        victims = _victims(d, size, order())
        if victims is None:
            return
        for v in victims:
            d.evict(v)
            del self._entry[v]
        d.admit(key, size)
        self._set(key, mine)

    def dropped(self, key: Hashable) -> None:
        self._entry.pop(key, None)


class ScheduleStrategy(Strategy):
    """Replays an offline schedule: ``keep[i]`` says whether the file referenced at
    ``i`` stays resident until its next reference.  Files leave right after their
    last kept interval, so residency is exactly the schedule's."""

    def __init__(self, driver: CacheDriver, keep: Sequence[int]) -> None:
        self.driver = driver
        self.keep = keep

    def hit(self, pos: int, key: Hashable, size: int) -> None:
        if not self.keep[pos]:
            self.driver.evict(key)

    def miss(self, pos: int, key: Hashable, size: int) -> None:
        if self.keep[pos]:
            self.driver.admit(key, size)

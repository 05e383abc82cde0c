"""Adapters that plug each kind of policy into the :class:`CacheDriver`."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence

from ..policies._heap import iter_sorted
from ..policies.base import OnlinePolicy, Usage, make_room
from ..policies.heuristic import HeuristicPolicy
from .driver import CacheDriver, Strategy

ADMISSIONS = ("agent", "all")  # OnlineStrategy's admission of a miss


def _victims(d: CacheDriver, size: int, order: Iterable[Hashable]) -> list[Hashable] | None:
    """What to evict from ``d``, in ``order``, so that ``size`` more bytes fit
    (:func:`make_room`); None if they never fit."""
    if size > d.capacity:
        return None
    return make_room(d.used + size - d.capacity, order, d.is_pinned, d.resident)


class OnlineStrategy(Strategy):
    """An :class:`OnlinePolicy`.  ``admission`` ``"agent"`` (the default) runs a read miss
    as the agent's promotion on open (``promote_mode`` before-open) does; ``"all"`` is
    the papers' Algorithm 1: every miss is cached if it fits after evicting in the
    policy's order (skipping pinned files), else read from the slow tier uncached.

    The agent's way, per reference, with each file's usage (the agent's ``hits`` and
    ``last_access``: every open counts and takes the next sequence number):

    * a read miss whose room displaces files is cached only if
      :meth:`OnlinePolicy.admits` takes its usage *before* this access over the
      victims' (``declined`` counts the others); room is then made in the policy's
      order, the file admitted as the most recently used (a sequence number of its
      own) with its accumulated hits, and the access touches it;
    * a write miss is always cached if it fits (the agent writes new data to the fast
      tier); ``will_admit`` is not called (the agent does not).

    ``usage``: the files' usage before the trace, key -> (hits, last access), e.g. the
    opens that created them; sequence numbers continue after the largest."""

    def __init__(self, driver: CacheDriver, policy: OnlinePolicy, admission: str = "agent",
                 usage: Mapping[Hashable, tuple[int, int]] | None = None) -> None:
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        self.driver = driver
        self.policy = policy
        self.agent = admission == "agent"
        self.usage: dict[Hashable, list[int]] = {k: [h, last] for k, (h, last) in (usage or {}).items()}
        self.seq = max((u[1] for u in self.usage.values()), default=0)
        self.declined = 0

    def _opened(self, key: Hashable) -> None:
        """The agent's ``touch_access``: one more hit, the next sequence number."""
        self.seq += 1
        u = self.usage.get(key)
        if u is None:
            self.usage[key] = [1, self.seq]
        else:
            u[0] += 1
            u[1] = self.seq

    def hit(self, pos: int, key: Hashable, size: int) -> None:
        if self.agent:
            self._opened(key)
        self.policy.touch(key, size)

    def miss(self, pos: int, key: Hashable, size: int) -> None:
        if self.agent:
            self._agent_miss(key, size)
            return
        d, policy = self.driver, self.policy

        def order() -> Iterator[Hashable]:  # runs only when room must be made
            policy.will_admit(key, size)
            yield from policy.eviction_order()

        victims = _victims(d, size, order())
        if victims is None:
            return
        self._cache(key, size, victims, 1)

    def _cache(self, key: Hashable, size: int, victims: list[Hashable], hits: int) -> None:
        d, policy = self.driver, self.policy
        for v in victims:
            d.evict(v)
            policy.remove(v)
        d.admit(key, size)
        policy.admit(key, size, hits)

    def _agent_miss(self, key: Hashable, size: int) -> None:
        d, policy = self.driver, self.policy
        prior = self.usage.get(key, (0, 0))
        victims = _victims(d, size, policy.eviction_order())
        if victims is None:
            self._opened(key)
            return
        if victims and not d.writing and not policy.admits(
                Usage(prior[0], prior[1]), [Usage(*self.usage[v]) for v in victims]):
            self.declined += 1
            self._opened(key)
            return
        self.seq += 1  # the agent's promotion: admitted as the most recently used
        self.usage.setdefault(key, [0, 0])[1] = self.seq
        self._cache(key, size, victims, max(1, prior[0]))
        self._opened(key)
        if not d.writing:
            policy.touch(key, size)  # the open that waited for the promotion

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

"""The online cache-policy interface shared by the agent, the control plane and the simulator.

An *online* policy only orders resident objects for eviction; it never sees the future.
The caller (the agent's tiering engine, or the simulator's cache driver) owns capacity
accounting, pinning and the actual data movement, and asks the policy for victims in
eviction order.  Every method is O(1) or O(log n) in the number of resident keys.

Keys are opaque hashables (the agent uses inode numbers, the simulator file names).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class Usage:
    """What a policy ranks a file by: its accesses and its last one (a sequence number,
    larger is later).  A miss's candidate is ranked by its usage *before* the access
    that missed: where it would stand had it stayed resident."""

    hits: int
    last: int


def make_room(need: int, order: Iterable[Hashable], is_pinned: Callable[[Hashable], bool],
              sizes: Mapping[Hashable, int]) -> list[Hashable] | None:
    """The victims that free ``need`` bytes: the first keys of ``order`` (pinned ones
    skipped) whose ``sizes`` add up to it; ``[]`` if ``need <= 0`` (``order`` is then not
    iterated: a generator's side effects do not happen), None if ``order`` ends first."""
    victims: list[Hashable] = []
    if need <= 0:
        return victims
    for key in order:
        if is_pinned(key):
            continue
        victims.append(key)
        need -= sizes[key]
        if need <= 0:
            return victims
    return None


class OnlinePolicy(abc.ABC):
    """Orders resident objects; the first key yielded by :meth:`eviction_order` goes first."""

    name: ClassVar[str]

    @abc.abstractmethod
    def admit(self, key: Hashable, size: int, hits: int = 1) -> None:
        """``key`` became resident (its first access, or a restore with ``hits`` accesses).

        Admitting keys in increasing order of their last access rebuilds the policy's
        queue after a restart (the agent persists ``hits`` and the last-access order).
        """

    @abc.abstractmethod
    def touch(self, key: Hashable, size: int) -> None:
        """A resident ``key`` was accessed again (a hit); ``size`` is its current size."""

    @abc.abstractmethod
    def remove(self, key: Hashable) -> None:
        """``key`` is no longer resident (evicted or deleted).  Unknown keys are ignored."""

    @abc.abstractmethod
    def eviction_order(self) -> Iterator[Hashable]:
        """Resident keys from the best victim to the worst, lazily.

        The caller may skip keys (pinned, open) and stop early; it must not mutate the
        policy while iterating — collect victims first, then :meth:`remove` them.
        """

    @abc.abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def hits(self, key: Hashable) -> int:
        """Accesses recorded for a resident key (for persistence); 0 if unknown."""
        return 0

    def hotter(self, a: Usage, b: Usage) -> bool:
        """Does a file used as ``a`` rank above one used as ``b`` (``b`` goes first)?
        The default ranks by recency (LRU's order; ARC and GDSF keep it too)."""
        return a.last > b.last

    def admits(self, candidate: Usage, victims: Iterable[Usage]) -> bool:
        """Admission of a miss whose room displaces ``victims``: only if the candidate
        ranks above every one of them.  A file seen once in a scan larger than the cache
        ranks below the residents and is served from where it is; a file used again
        while it would still have been resident is admitted (its second access within
        the cache's window)."""
        return all(self.hotter(candidate, v) for v in victims)

    def will_admit(self, key: Hashable, size: int) -> None:  # noqa: B027 (an optional hook)
        """Optional hook: a miss on ``key`` is about to be admitted.

        Called before :meth:`eviction_order` for the room ``key`` needs, so that a
        policy whose choice of victim depends on the incoming key (ARC's ghost hits)
        can adapt first.  Callers that never call it still get a valid (if slightly
        less adaptive) order.  The default does nothing.
        """

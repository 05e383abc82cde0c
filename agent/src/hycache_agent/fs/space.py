"""The fast tier's accounting and its eviction queue, shared by the file operations
(:mod:`~hycache_agent.fs.engine`), the placement decisions
(:mod:`~hycache_agent.fs.placement`) and the moves (:mod:`~hycache_agent.fs.migrations`).

``used`` counts the logical bytes of fast-tier files, plus the reservations of promotions
and prefetches, plus the local copies of other nodes' files under fast/remote-cache/
(``remote_cache_used`` of it).  ``policy`` orders the fast tier's files for eviction: opens
touch it, creates and promotions admit, deletions and demotions remove; applying a new
policy replaces it (every part reads it here, never a copy).
"""

from __future__ import annotations

from hycache_core.policies import OnlinePolicy


class Space:
    def __init__(self, policy: OnlinePolicy) -> None:
        self.policy = policy
        self.capacity = 0  # the fast tier's bytes the agent may use (set at start-up)
        self.device_capacity = 0
        self.used = 0
        self.remote_cache_used = 0

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.capacity

    def remote_copy_added(self, nbytes: int) -> None:
        """A copy of another node's file landed in fast/remote-cache/: it takes fast-tier
        room like any fast-tier file (the evictor makes room among local files)."""
        self.used += nbytes
        self.remote_cache_used += nbytes

    def remote_copy_removed(self, nbytes: int) -> None:
        self.used -= nbytes
        self.remote_cache_used -= nbytes

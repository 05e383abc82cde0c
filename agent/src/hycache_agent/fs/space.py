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

import os
from collections.abc import Iterable

from hycache_core.policies import OnlinePolicy, load_policy

from hycache_agent.config import AgentConfig
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import Inode

# the share of the fast file system the write slack never fills (another tenant's files,
# the growth of files written through passthrough that the agent learns of on release)
FAST_RESERVE = 0.05


def spare(fast_vfs: os.statvfs_result) -> int:
    """The fast file system's free bytes beyond ``FAST_RESERVE`` of its size."""
    return fast_vfs.f_bavail * fast_vfs.f_frsize - int(FAST_RESERVE * fast_vfs.f_blocks * fast_vfs.f_frsize)


class Space:
    def __init__(self, policy: OnlinePolicy) -> None:
        self.policy = policy
        self.capacity = 0  # the fast tier's bytes the agent may use (set at start-up)
        self.device_capacity = 0
        self.used = 0
        self.remote_cache_used = 0
        # the most ``used`` may reach with writes while the evictor catches up: the
        # capacity plus the write slack the fast file system has room for (set_write_ceiling)
        self.write_ceiling = 0

    def size_up(self, config: AgentConfig, fast_vfs: os.statvfs_result, inodes: Iterable[Inode]) -> None:
        """(start-up) The capacity, the policy queue in last-access order and the bytes
        used, from the loaded (and recovered) files."""
        self.device_capacity = fast_vfs.f_blocks * fast_vfs.f_frsize
        resident = sorted((i for i in inodes if i.is_reg and i.tier == T.FAST), key=lambda i: i.last_access)
        if config.fast_capacity:
            self.capacity = config.fast_capacity
        else:
            # what the agent can really use: its own files plus the free space (another
            # tenant's files on the same file system are not ours to count)
            own = sum(i.size for i in resident)
            self.capacity = min(self.device_capacity, own + fast_vfs.f_bavail * fast_vfs.f_frsize)
        self.policy = load_policy(config.policy, capacity=self.capacity)  # size-aware ones want it
        for inode in resident:
            self.policy.admit(inode.ino, inode.size, max(1, inode.hits))
        self.used = sum(i.size for i in resident)
        self.set_write_ceiling(config.write_slack, fast_vfs)

    def set_write_ceiling(self, slack: float, fast_vfs: os.statvfs_result) -> None:
        """Writes may take ``slack`` × the capacity above it (a soft capacity: the evictor
        brings ``used`` back under the watermarks behind them), as far as the fast file
        system has that room free beyond ``FAST_RESERVE`` of its size, as measured now."""
        self.write_ceiling = max(self.capacity, min(self.capacity + int(slack * self.capacity),
                                                    self.used + spare(fast_vfs)))

    def write_room(self, nbytes: int) -> bool:
        """A write of ``nbytes`` more stays under the write ceiling."""
        return self.used + nbytes <= self.write_ceiling

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

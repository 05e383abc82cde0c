"""Prefetch, a plan step of the 2-layer scheduling: a file's bytes onto this node's fast
tier ahead of the job that reads it.  A local file is promoted (fs/placement.py); a file
whose primary is another node is fetched into this node's remote cache on the fast tier,
where a later open finds it (a fast-tier hit)."""

from __future__ import annotations

import errno
import os

from hycache_core.sizes import format_size

from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import FsError


class Prefetcher:
    def __init__(self, engine: TieringEngine, cluster=None) -> None:
        self.engine = engine
        self.cluster = cluster

    async def prefetch(self, path: str | bytes) -> str:
        """Room is made like for a promotion (closed, unpinned files are evicted) and never
        beyond the capacity.  Returns what was done; raises FsError (ENOENT: no such file,
        ENOSPC: no room, …) with the reason as its second argument."""
        raw = os.fsencode(path)
        try:
            return await self.engine.placement.prefetch(raw)
        except FsError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or self.cluster is None:
                raise
        return await self._prefetch_remote(raw)

    async def _prefetch_remote(self, raw: bytes) -> str:
        cluster, space, placement = self.cluster, self.engine.space, self.engine.placement
        meta = await cluster.query("get", raw, missing=None)
        if meta is cluster.UNREACHABLE:
            raise FsError(errno.EIO, "the metadata store is unreachable")
        if meta is None or (meta.primary == cluster.node_id and meta.kind != "dir"):
            raise FsError(errno.ENOENT, "no such file")
        if meta.kind != "file":
            raise FsError(errno.EINVAL, "not a regular file")
        node = cluster.remote_node(raw, meta)
        async with cluster.fetch_lock(raw):
            if cluster.has_copy(node):
                return "already fast (remote copy)"
            size = node.meta.size
            if size > space.capacity:
                raise FsError(errno.ENOSPC, f"{format_size(size)} is larger than the fast tier")
            if not await placement.room_for(size, None, wait_leaving=True):
                raise FsError(errno.ENOSPC, f"no room for {format_size(size)} on the fast tier "
                                            f"({format_size(space.used)} of {format_size(space.capacity)} "
                                            "used by pinned, open or moving files)")
            space.used += size  # reserved while fetching (the copy is counted once there)
            placement.fetching[raw] = placement.fetching.get(raw, 0) + size
            try:
                await cluster.fetch_locked(node)
            finally:
                space.used -= size
                if (left := placement.fetching.pop(raw, 0) - size) > 0:
                    placement.fetching[raw] = left
        return f"fast (fetched {format_size(node.cache_size)} from {meta.primary})"

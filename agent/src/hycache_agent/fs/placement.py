"""Where files go: room on the fast tier, the watermarks and the background evictor, the
eviction policy's settings and their persistence, pins and move requests, prefetch.

Placement decides; :mod:`hycache_agent.fs.migrations` moves.  The state it decides over is
the engine's and shared with the file operations: the fast tier's accounting
(``capacity``, ``fast_used``), the policy queue (``policy``: opens touch it, creates and
migrations admit, deletions remove), the namespace and the files' locks.
:meth:`Placement.attach` gives it the engine it works for.

* A write that does not fit first evicts closed, unpinned files in policy order
  (:meth:`Placement.room_for`, Algorithm 1 lines 2–5); if that is not enough the file
  being written spills (the engine, through the migrations).
* Above the high watermark the evictor moves files to the slow tier until the low one.
* A file a plan's prefetch staged (or found there) is no victim of either while the plan
  holds it — until the plan's ``unpin`` or evict (a demote, which still moves it) of it,
  or ``PLAN_HOLD_S`` without an open (:meth:`Placement.stage`): the plan counts on it
  being there for its jobs' reads, as it counts on the outputs it pins.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from hycache_core.policies import load_policy
from hycache_core.sizes import format_size

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError, Inode

if TYPE_CHECKING:
    from hycache_agent.fs.engine import TieringEngine

log = logging.getLogger(__name__)

POLICY_FILE = "policy.json"
PLAN_HOLD_S = 60.0  # a staged file unopened this long is evictable again (a plan that never unpins it)


class PolicyError(ValueError):
    """A policy setting that cannot be applied (unknown policy, bad watermarks)."""


def validate_policy(policy: str, high: float, low: float) -> None:
    from hycache_core.policies import available_policies

    if policy not in available_policies():
        raise PolicyError(f"policy: unknown policy {policy!r}; available: {', '.join(available_policies())}")
    if not (isinstance(high, (int, float)) and 0 < high <= 1):
        raise PolicyError(f"high_watermark: must be in (0, 1], got {high!r}")
    if not (isinstance(low, (int, float)) and 0 <= low < 1):
        raise PolicyError(f"low_watermark: must be in [0, 1), got {low!r}")
    if low >= high:
        raise PolicyError(f"low_watermark ({low}) must be below high_watermark ({high})")


def write_json_atomic(path: Path, obj: Any) -> None:
    """(blocking) Write ``obj`` as JSON to ``path``: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(obj, indent=1).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    T.fsync_dir(str(path))


class Placement:
    def __init__(self) -> None:
        self.engine: TieringEngine | None = None
        self._evict_wakeup = trio.Event()
        # remote copies a prefetch is fetching: path → bytes reserved on the fast tier
        # (the census of moves under way, counters.moving, reports them)
        self.fetching: dict[bytes, int] = {}
        # files a plan's prefetch staged: ino → (its last_access, until when); no victim
        # of the evictor or of another file's room until the plan's unpin or demote of it,
        # or PLAN_HOLD_S after it was staged or last opened, so its jobs find it there
        self.staged: dict[int, tuple[int, float]] = {}

    def attach(self, engine: TieringEngine) -> None:
        self.engine = engine
        self.config = engine.config

    # ------------------------------------------------------------------ room and watermarks
    def evictable(self, inode: Inode | None) -> bool:
        """May the evictor move this file now?  Not if pinned, open, being migrated or
        locked by a writer (checked again when a chosen victim's turn comes)."""
        e = self.engine
        return (inode is not None and inode.tier == T.FAST and not inode.pinned and not e.held(inode)
                and inode.migration is None and e.ns.inodes.get(inode.ino) is inode
                and not e.is_locked(inode.ino) and not self.is_staged(inode))

    def stage(self, inode: Inode) -> None:
        """A plan's prefetch put (or found) ``inode`` on the fast tier: keep it there until
        the plan unpins or demotes it, or PLAN_HOLD_S passes without an open."""
        now = time.monotonic()
        if len(self.staged) > 4096:  # files deleted or never opened: forget the expired
            self.staged = {i: v for i, v in self.staged.items() if v[1] > now}
        self.staged[inode.ino] = (inode.last_access, now + PLAN_HOLD_S)

    def is_staged(self, inode: Inode) -> bool:
        held = self.staged.get(inode.ino)
        if held is None:
            return False
        now = time.monotonic()
        if inode.last_access != held[0]:  # opened since: held on from this open
            self.staged[inode.ino] = (inode.last_access, now + PLAN_HOLD_S)
        elif now > held[1]:  # unopened for PLAN_HOLD_S: given up
            del self.staged[inode.ino]
            return False
        return True

    def eviction_candidates(self, exclude: Inode | None = None):
        e = self.engine
        for ino in e.policy.eviction_order():
            inode = e.ns.inodes.get(ino)
            if inode is not exclude and self.evictable(inode):
                yield inode

    async def room_for(self, nbytes: int, exclude: Inode | None, *, wait_leaving: bool = False) -> bool:
        """Make ``nbytes`` fit on the fast tier, evicting closed files if needed.

        ``wait_leaving`` (promotions and prefetches, never writes): files already being
        moved off the fast tier still take their room until their switch; when that room
        is what is missing, wait for those moves instead of evicting more or failing."""
        e = self.engine
        if e.fast_used + nbytes <= e.capacity:
            return True
        if nbytes > e.capacity:
            return False
        if wait_leaving:
            leaving = [m for m in e.active.values() if m.src == T.FAST and m.dst != T.FAST]
            for m in leaving:
                if e.fast_used + nbytes <= e.capacity:
                    break
                await m.done.wait()
            if e.fast_used + nbytes <= e.capacity:
                return True
        for victim in list(itertools.islice(self.eviction_candidates(exclude), 64)):
            if e.fast_used + nbytes <= e.capacity:
                break
            await e.migrations.migrate(victim, T.SLOW, reason="evict")
        return e.fast_used + nbytes <= e.capacity

    def check_watermark(self) -> None:
        if self.engine.fast_used > self.config.high_watermark * self.engine.capacity:
            self._evict_wakeup.set()

    def eviction_pending(self) -> bool:
        """The evictor was woken and has not taken the wake-up yet."""
        return self._evict_wakeup.is_set()

    async def evictor(self) -> None:
        e = self.engine
        while True:
            await self._evict_wakeup.wait()
            self._evict_wakeup = trio.Event()
            target = self.config.low_watermark * e.capacity
            failures = 0
            while e.fast_used > target:
                victim = next(self.eviction_candidates(), None)
                if victim is None:
                    break
                try:
                    moved = await e.migrations.migrate(victim, T.SLOW, reason="evict")
                except OSError as exc:  # the slow tier failed (EIO, vanished): keep serving
                    log.error("eviction of inode %d failed: %s", victim.ino, exc)
                    moved = False
                if moved:
                    failures = 0
                else:  # back off: a full or failing slow tier must not become a busy loop
                    failures += 1
                    await trio.sleep(min(2.0, 0.05 * 2 ** min(failures - 1, 6)))

    # ------------------------------------------------------------------ policy
    def load_saved_policy(self) -> dict[str, Any] | None:
        """(blocking, at start) The policy last applied from the control plane, if any."""
        path = self.config.state_dir / POLICY_FILE
        try:
            saved = json.loads(path.read_text())
            validate_policy(saved["policy"], saved["high_watermark"], saved["low_watermark"])
            saved["version"] = int(saved["version"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.error("ignoring the saved policy %s: %s", path, exc)
            return None
        return saved

    def apply_policy(self, policy: str, high: float, low: float, version: int | None = None) -> None:
        """Swap the eviction policy and the watermarks of the running engine (PolicyError
        if invalid; nothing changes then).  The fast tier's files are re-admitted in their
        recency order; pinned files stay pinned (the evictor skips them whatever the
        policy); the evictor runs if the fast tier is above the new high mark."""
        e = self.engine
        validate_policy(policy, high, low)
        if policy != e.policy.name:
            new = load_policy(policy, capacity=e.capacity)
            resident = sorted((i for i in e.ns.inodes.values() if i.is_reg and i.tier == T.FAST),
                              key=lambda i: i.last_access)
            for inode in resident:
                new.admit(inode.ino, inode.size, max(1, inode.hits, e.policy.hits(inode.ino)))
            e.policy = new
            self.config.policy = policy
        self.config.high_watermark = float(high)
        self.config.low_watermark = float(low)
        if version is not None:
            e.policy_version = version
        log.info("policy %s, watermarks %.2f/%.2f applied (version %s)", policy, high, low, version)
        self.check_watermark()

    def save_policy(self) -> None:
        """(blocking) Keep the applied policy in the state directory for the next start."""
        e = self.engine
        write_json_atomic(self.config.state_dir / POLICY_FILE, {
            "version": e.policy_version, "policy": e.policy.name,
            "high_watermark": self.config.high_watermark, "low_watermark": self.config.low_watermark})

    # ------------------------------------------------------------------ pins and moves
    # One implementation of the per-file controls, shared by the user.hycache.* xattrs,
    # the CLI (through the xattrs) and the control-plane link.
    def pin(self, inode: Inode, pinned: bool) -> None:
        inode.pinned = pinned
        if not pinned:  # a plan's unpin: it no longer counts on the file (staged or pinned)
            self.staged.pop(inode.ino, None)
        self.engine.ns.journal.inode(inode.ino)

    async def set_pinned(self, inode: Inode, pinned: bool) -> None:
        """Pin (never evict) or unpin a file, durably."""
        self.pin(inode, pinned)
        await self.engine.ns.journal.sync()

    def _check_move(self, inode: Inode, tier: str) -> None:
        if tier not in T.TIER_NAMES:
            raise FsError(errno.EINVAL, f"no tier named {tier!r}")
        if not inode.is_reg:
            raise FsError(errno.EINVAL, "not a regular file")
        if tier == T.FAST and inode.size > self.engine.capacity:
            raise FsError(errno.ENOSPC, f"{format_size(inode.size)} is larger than the fast tier")

    def request_move(self, inode: Inode, tier: str) -> bool:
        """Start moving a file to ``tier`` in the background (FsError if it cannot go)."""
        self._check_move(inode, tier)
        return self.engine.migrations.start_migration(inode, tier, "promote" if tier == T.FAST else "demote")

    async def move(self, inode: Inode, tier: str) -> str | None:
        """Move a file to ``tier`` and wait: None when it is there, else the reason."""
        self._check_move(inode, tier)
        if tier != T.FAST:
            self.staged.pop(inode.ino, None)  # the plan (or a user) demotes it: no longer staged
        return await self.engine.migrations.move_now(inode, tier, "promote" if tier == T.FAST else "demote")

    # ------------------------------------------------------------------ prefetch
    async def prefetch(self, path: str | bytes) -> str:
        """Bring a file's bytes onto this node's fast tier ahead of the job that reads it
        (a plan step of the 2-layer scheduling).  A local file on the slow tier is promoted
        (waited for); a file whose primary is another node is fetched into this node's
        remote cache on the fast tier, where a later open finds it (a fast-tier hit).  Room
        is made like for a promotion (closed, unpinned files are evicted) and never beyond
        the capacity.  Returns what was done; raises FsError (ENOENT: no such file, ENOSPC:
        no room, …) with the reason as its second argument."""
        raw = os.fsencode(path)
        try:
            inode = self.engine.local_inode(raw)
        except FsError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or self.engine.cluster is None:
                raise
            return await self._prefetch_remote(raw)
        if not inode.is_reg:
            raise FsError(errno.EINVAL, "not a regular file")
        if inode.tier == T.FAST:
            self.stage(inode)
            return "already fast"
        why = await self.move(inode, T.FAST)
        if why is not None:
            raise FsError(errno.ENOSPC, why)
        self.stage(inode)
        return T.FAST

    async def _prefetch_remote(self, raw: bytes) -> str:
        e = self.engine
        cluster = e.cluster
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
            if size > e.capacity:
                raise FsError(errno.ENOSPC, f"{format_size(size)} is larger than the fast tier")
            if not await self.room_for(size, None, wait_leaving=True):
                raise FsError(errno.ENOSPC, f"no room for {format_size(size)} on the fast tier "
                                            f"({format_size(e.fast_used)} of {format_size(e.capacity)} "
                                            "used by pinned, open or moving files)")
            e.fast_used += size  # reserved while fetching (the copy is counted once there)
            self.fetching[raw] = self.fetching.get(raw, 0) + size
            try:
                await cluster.fetch_locked(node)
            finally:
                e.fast_used -= size
                if (left := self.fetching.pop(raw, 0) - size) > 0:
                    self.fetching[raw] = left
        return f"fast (fetched {format_size(node.cache_size)} from {meta.primary})"

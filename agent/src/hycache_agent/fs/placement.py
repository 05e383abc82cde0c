"""Where files go: room on the fast tier, the watermarks and the background evictor, the
eviction policy's settings and their persistence, pins and move requests, prefetch.

Placement decides; :mod:`hycache_agent.fs.migrations` moves.  The state it decides over is
shared with the file operations and given to its constructor: the fast tier's accounting
and policy queue (:mod:`~hycache_agent.fs.space`), the namespace and the files' locks
(:mod:`~hycache_agent.fs.files`).

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
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import trio
from hycache_core.policies import Usage, load_policy
from hycache_core.sizes import format_size

from hycache_agent.config import AgentConfig
from hycache_agent.fs import tiers as T
from hycache_agent.fs.files import Files
from hycache_agent.fs.migrations import Migrations
from hycache_agent.fs.namespace import FsError, Inode, local_inode
from hycache_agent.fs.space import Space, spare

log = logging.getLogger(__name__)

POLICY_FILE = "policy.json"
# one group commit's victims (Migrations.evict_batch): at most this many files and, past
# the first, this many bytes; the batch costs one syncfs of the slow tier, so on a slow
# device files per commit, not bytes, set the eviction rate
EVICT_BATCH = 32
EVICT_BATCH_BYTES = 64 << 20
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


def load_saved_policy(state_dir: Path) -> dict[str, Any] | None:
    """(blocking, at start) The policy last applied from the control plane, if any."""
    path = state_dir / POLICY_FILE
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


class Placement:
    def __init__(self, config: AgentConfig, files: Files, space: Space, migrations: Migrations) -> None:
        self.config = config
        self.files = files
        self.space = space
        self.migrations = migrations
        self.policy_version = 0  # the control plane's policy version applied (0: none)
        self._nursery: trio.Nursery | None = None  # background moves (run)
        # told when the fast tier passes its high watermark (Backings.tier_filling)
        self.on_filling: Callable[[], None] | None = None
        self._evict_wakeup = trio.Event()
        self._evicting = False  # the evictor is bringing ``used`` down to the low watermark
        self._evicted = trio.Event()  # set after each of the evictor's batches (then renewed)
        # remote copies a prefetch is fetching: path → bytes reserved on the fast tier
        # (the census of moves under way, counters.moving, reports them)
        self.fetching: dict[bytes, int] = {}
        # files a plan's prefetch staged: ino → (its last_access, until when); no victim
        # of the evictor or of another file's room until the plan's unpin or demote of it,
        # or PLAN_HOLD_S after it was staged or last opened, so its jobs find it there
        self.staged: dict[int, tuple[int, float]] = {}

    async def run(self, nursery: trio.Nursery) -> None:
        """Serve: the evictor, and background moves in ``nursery``."""
        self._nursery = nursery
        nursery.start_soon(self.evictor)

    def stop(self) -> None:
        self._nursery = None

    # ------------------------------------------------------------------ room and watermarks
    def evictable(self, inode: Inode | None) -> bool:
        """May the evictor move this file now?  Not if pinned, open, being migrated or
        locked by a writer (checked again when a chosen victim's turn comes)."""
        f = self.files
        return (inode is not None and inode.tier == T.FAST and not inode.pinned and not f.held(inode)
                and inode.migration is None and f.live(inode)
                and not f.is_locked(inode.ino) and not self.is_staged(inode))

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
        inodes = self.files.ns.inodes
        for ino in self.space.policy.eviction_order():
            inode = inodes.get(cast(int, ino))  # (the policy's keys are inode numbers)
            if inode is not exclude and self.evictable(inode):
                yield inode

    async def room_for(self, nbytes: int, exclude: Inode | None, *, wait_leaving: bool = False,
                       slack: bool = False) -> bool:
        """Make ``nbytes`` fit on the fast tier, evicting closed files if needed.

        ``wait_leaving`` (promotions and prefetches, never writes): files already being
        moved off the fast tier still take their room until their switch; when that room
        is what is missing, wait for those moves instead of evicting more or failing.
        ``slack`` (writes): up to the write ceiling above the capacity
        (:meth:`~hycache_agent.fs.space.Space.write_room`) the write goes on at once and
        the evictor catches up behind it; past the ceiling it waits for evictions."""
        space = self.space

        def room() -> bool:
            return space.fits(nbytes) or slack and space.write_room(nbytes)

        if space.fits(nbytes):
            return True
        if nbytes > space.capacity:
            return False
        if room():
            self._evict_wakeup.set()
            return True
        if wait_leaving:
            # above the capacity (writes in the slack) bringing ``used`` down is the
            # evictor's work: a promotion waits for it rather than evicting the overage
            while space.used > space.capacity and self._evicting and not room():
                await self._evicted.wait()
            leaving = [m for m in self.migrations.active.values() if m.src == T.FAST and m.dst != T.FAST]
            for m in leaving:
                if room():
                    break
                await m.done.wait()
            if room():
                return True
        tried = 0
        while not room() and tried < 256:
            victims = self._victims(space.used + nbytes - space.capacity, exclude)
            if not victims:
                break
            tried += len(victims)
            await self._evict_batch(victims)
        return room()

    def _victims(self, nbytes: int, exclude: Inode | None) -> list[Inode]:
        """The next victims in policy order whose sizes add up to ``nbytes``, at most
        one batch of them (``EVICT_BATCH`` files, ``EVICT_BATCH_BYTES``)."""
        victims: list[Inode] = []
        total = 0
        for victim in self.eviction_candidates(exclude):
            if total >= nbytes or len(victims) >= EVICT_BATCH or victims and total >= EVICT_BATCH_BYTES:
                break
            victims.append(victim)
            total += victim.size
        return victims

    async def _evict_batch(self, victims: list[Inode]) -> int:
        """Evict those of ``victims`` still evictable (one may have been opened since it
        was chosen) with one group commit; returns how many moved.  A failed move is
        logged and counts as not moved (the slow tier failed: EIO, vanished, full)."""
        victims = [v for v in victims if self.evictable(v)]
        try:
            return await self.migrations.evict_batch(victims)
        except OSError as exc:
            log.error("eviction of %d files failed: %s", len(victims), exc)
            return 0

    async def _past_ceiling(self, nbytes: int) -> bool:
        """A writer's promotion that :meth:`room_for` found no room for, not even by
        evicting: every file left on the fast tier is held open (a database's tables), and
        a held file cannot leave.  It comes in past the write ceiling if the fast file
        system has the room beyond its reserve (as the kernel's writes to held files do);
        the evictor brings ``used`` back once they close.  (A file larger than the high
        watermark never gets here: :meth:`_promotes_on_open`.)"""
        if spare(await trio.to_thread.run_sync(self.migrations.tiers[T.FAST].statvfs)) < nbytes:
            return False
        self.migrations.counters.promotions_past_ceiling += 1
        log.info("promoting %s for a writer past the write ceiling: every fast-tier file is held open",
                 format_size(nbytes))
        return True

    async def refresh_write_ceiling(self) -> None:
        """Measure the fast file system's free space for the write ceiling (a thread)."""
        fast_vfs = await trio.to_thread.run_sync(self.migrations.tiers[T.FAST].statvfs)
        self.space.set_write_ceiling(self.config.write_slack, fast_vfs)

    def over_high_watermark(self) -> bool:
        return self.space.used > self.config.high_watermark * self.space.capacity

    def check_watermark(self) -> None:
        if self.over_high_watermark():
            self._evict_wakeup.set()
            if self.on_filling is not None:
                self.on_filling()

    def eviction_pending(self) -> bool:
        """The evictor was woken and has not taken the wake-up yet."""
        return self._evict_wakeup.is_set()

    async def evictor(self) -> None:
        while True:
            await self._evict_wakeup.wait()
            self._evict_wakeup = trio.Event()
            self._evicting = True
            try:
                await self._evict_to_low_watermark()
            finally:
                self._evicting = False
                self._evicted.set()
                self._evicted = trio.Event()

    async def _evict_to_low_watermark(self) -> None:
        space = self.space
        target = self.config.low_watermark * space.capacity
        failures = 0
        while space.used > target:
            await self.refresh_write_ceiling()
            victims = self._victims(int(space.used - target), None)
            if not victims:
                break
            moved = await self._evict_batch(victims)  # a failing slow tier: logged, keep serving
            self._evicted.set()
            self._evicted = trio.Event()
            if moved:
                failures = 0
            else:  # back off: a full or failing slow tier must not become a busy loop
                failures += 1
                await trio.sleep(min(2.0, 0.05 * 2 ** min(failures - 1, 6)))

    # ------------------------------------------------------------------ policy
    def restore_saved_policy(self) -> None:
        """(blocking, at start) Run the policy last applied from the control plane, if any."""
        saved = load_saved_policy(self.config.state_dir)
        if saved is None:
            return
        self.config.policy = saved["policy"]
        self.config.high_watermark = saved["high_watermark"]
        self.config.low_watermark = saved["low_watermark"]
        self.policy_version = saved["version"]
        log.info("running the saved control-plane policy version %d: %s, watermarks %.2f/%.2f",
                 self.policy_version, saved["policy"], saved["high_watermark"], saved["low_watermark"])

    def apply_policy(self, policy: str, high: float, low: float, version: int | None = None) -> None:
        """Swap the eviction policy and the watermarks of the running engine (PolicyError
        if invalid; nothing changes then).  The fast tier's files are re-admitted in their
        recency order; pinned files stay pinned (the evictor skips them whatever the
        policy); the evictor runs if the fast tier is above the new high mark."""
        space = self.space
        validate_policy(policy, high, low)
        if policy != space.policy.name:
            new = load_policy(policy, capacity=space.capacity)
            resident = sorted((i for i in self.files.ns.inodes.values() if i.is_reg and i.tier == T.FAST),
                              key=lambda i: i.last_access)
            for inode in resident:
                new.admit(inode.ino, inode.size, max(1, inode.hits, space.policy.hits(inode.ino)))
            space.policy = new
            self.config.policy = policy
        self.config.high_watermark = float(high)
        self.config.low_watermark = float(low)
        if version is not None:
            self.policy_version = version
        log.info("policy %s, watermarks %.2f/%.2f applied (version %s)", policy, high, low, version)
        self.check_watermark()

    def save_policy(self) -> None:
        """(blocking) Keep the applied policy in the state directory for the next start."""
        write_json_atomic(self.config.state_dir / POLICY_FILE, {
            "version": self.policy_version, "policy": self.space.policy.name,
            "high_watermark": self.config.high_watermark, "low_watermark": self.config.low_watermark})

    # ------------------------------------------------------------------ pins and moves
    # One implementation of the per-file controls, shared by the user.hycache.* xattrs,
    # the CLI (through the xattrs) and the control-plane link.
    def pin(self, inode: Inode, pinned: bool) -> None:
        """Pin (the evictor skips the file) or unpin.  A pin also takes the file back from
        an eviction that has not switched it yet (:meth:`take_back`): otherwise a file
        pinned while its batch was copying it would land on the slow tier pinned."""
        inode.pinned = pinned
        if pinned:
            self.take_back(inode)
        else:  # a plan's unpin: it no longer counts on the file (staged or pinned)
            self.staged.pop(inode.ino, None)
        self.files.ns.journal.inode(inode.ino)

    async def set_pinned(self, inode: Inode, pinned: bool) -> None:
        """Pin (never evict) or unpin a file, durably."""
        self.pin(inode, pinned)
        await self.files.ns.journal.sync()

    def _check_move(self, inode: Inode, tier: str) -> None:
        if tier not in T.TIER_NAMES:
            raise FsError(errno.EINVAL, f"no tier named {tier!r}")
        if not inode.is_reg:
            raise FsError(errno.EINVAL, "not a regular file")
        if tier == T.FAST and inode.size > self.space.capacity:
            raise FsError(errno.ENOSPC, f"{format_size(inode.size)} is larger than the fast tier")

    def request_move(self, inode: Inode, tier: str) -> bool:
        """Start moving a file to ``tier`` in the background (FsError if it cannot go)."""
        self._check_move(inode, tier)
        return self.start_migration(inode, tier, "promote" if tier == T.FAST else "demote")

    async def move(self, inode: Inode, tier: str) -> str | None:
        """Move a file to ``tier`` and wait: None when it is there, else the reason."""
        self._check_move(inode, tier)
        if tier != T.FAST:
            self.staged.pop(inode.ino, None)  # the plan (or a user) demotes it: no longer staged
        return await self.move_now(inode, tier, "promote" if tier == T.FAST else "demote")

    # ------------------------------------------------------------------ opens
    def _promotes_on_open(self, inode: Inode) -> bool:
        return (self.config.promote_on_open and inode.tier != T.FAST
                and inode.size <= self.config.high_watermark * self.space.capacity)

    def admits(self, inode: Inode, prior: Usage, *, count: bool = True) -> bool:
        """Admission of an on-open promotion (Algorithm 1 promotes every opened slow-tier
        file; the room it takes is what this rule weighs).  Room up to the high watermark
        is free; beyond it the file comes in only if every victim the room would displace
        (policy order, the evictor's choice) ranks below the file's ``prior`` usage by
        the policy's own :meth:`~hycache_core.policies.OnlinePolicy.admits`.  A file
        with fewer candidates than the room it needs is left to :meth:`room_for`.
        ``count``: a refusal counts in ``promotions_declined`` (once per open: an open
        asks again after :meth:`before_open` decided with ``count=False``)."""
        space = self.space
        need = space.used + inode.size - self.config.high_watermark * space.capacity
        if need <= 0:
            return True
        if space.used > space.capacity:  # writes use the slack: the evictor is behind
            self.migrations.counters.promotions_declined += 1
            return False
        victims: list[Usage] = []
        for victim in self.eviction_candidates(inode):
            victims.append(Usage(victim.hits, victim.last_access))
            need -= victim.size
            if need <= 0:
                break
        if space.policy.admits(prior, victims):
            return True
        if count:
            self.migrations.counters.promotions_declined += 1
        return False

    def _promotes_before_write(self, inode: Inode) -> bool:
        """A syncing writer's open through passthrough of an evicted file nobody holds
        (the engine passes ``syncing`` for O_SYNC / O_DSYNC opens and files fsync'ed
        before: writes that wait for the device; a plain append is absorbed by the page
        cache and costs the writer little on the slow tier, while its copy would cost a
        read and an eviction — PostMark's transactions took 2x as long): the blob it gets
        cannot move until the last close, so its writes and fsyncs would wait for the
        slow device all along (a database's recycled log segment, reopened for writing
        after the evictor took it as cold).  Up to ``promote_before_write_mb`` the copy
        comes first, and takes its room like the writes it stands for: within
        the write ceiling (:meth:`room_for` ``slack``; the evictor catches up once files
        close), without :meth:`admits`'s test of the file's past use — the write is the
        use, and the cost it saves (every write and fsync on the slow device for as long
        as the file stays open) is larger than a read miss's.  Files held open cannot be
        evicted, so a fast tier full of them (a database's tables) would otherwise leave
        no room for its log."""
        limit = self.config.promote_before_write_mb << 20
        return (0 < inode.size <= limit and not inode.open_count and inode.migration is None
                and self._promotes_on_open(inode))

    async def before_open(self, inode: Inode, passthrough: bool, *, syncing: bool = False) -> bool:
        """Before a local file's open: whether its promotion is to be waited for by the
        open (``promote_mode`` before-open, if :meth:`admits` takes it).  With
        ``passthrough`` the handle may get the blob as its backing file: an open arriving
        during a migration waits for the switch (and before-open promotes first, while
        nobody holds the file; so does a ``syncing`` writer's open of a file up to
        ``promote_before_write_mb``: :meth:`_promotes_before_write`)."""
        for_write = passthrough and syncing and self._promotes_before_write(inode)
        before = for_write or (self.config.promote_mode == "before-open" and self._promotes_on_open(inode)
                               and self.admits(inode, Usage(inode.hits, inode.last_access)))
        if not passthrough:
            return before
        if before and not inode.open_count and inode.migration is None:
            if for_write:
                self.migrations.counters.promotions_for_write += 1
            await self.background_migration(inode, T.FAST, "promote", slack=for_write)
        while inode.migration is not None and not self.take_back(inode):
            await inode.migration.done.wait()
        if not self.files.live(inode):
            raise FsError(errno.ENOENT)
        return False

    def take_back(self, inode: Inode) -> bool:
        """An open of a file whose eviction has not switched it yet takes the file back:
        the eviction is cancelled (its batch leaves the file where it is and removes its
        slow copy) and the open goes on with the fast copy at once, instead of waiting for
        the whole batch's commit on the slow device.  (No await between the batch's last
        check of ``cancelled`` and its switch of the tier: one of the two comes first.)"""
        mig = inode.migration
        if mig is None or mig.reason != "evict" or inode.tier != mig.src:
            return False
        mig.cancelled = True
        self.migrations.counters.evictions_taken_back += 1
        return True

    async def opened(self, inode: Inode, before_open: bool, prior: Usage) -> None:
        """A local file was opened: it is used now (the policy queue), or promoted
        (``prior``: its usage before this open, for :meth:`admits`)."""
        if inode.tier == T.FAST:
            self.space.policy.touch(inode.ino, inode.size)
        elif self._promotes_on_open(inode):
            if before_open:
                await self.background_migration(inode, T.FAST, "promote")
            # with passthrough: once the last handle is released; before-open asked already
            elif self.admits(inode, prior, count=self.config.promote_mode != "before-open"):
                self.start_migration(inode, T.FAST, "promote")

    # ------------------------------------------------------------------ moving in the background
    def start_migration(self, inode: Inode, dst: str, reason: str) -> bool:
        """Start a migration in the background (promotion on open, xattr/CLI requests)."""
        if not inode.is_reg or self._nursery is None:
            return False
        if inode.migration is not None:
            if inode.migration.dst == dst:
                return True  # already on its way
        elif inode.tier == dst:
            return False
        inode.move_wanted = dst
        self._nursery.start_soon(self.background_migration, inode, dst, reason)
        return True

    async def background_migration(self, inode: Inode, dst: str, reason: str, *, slack: bool = False) -> None:
        try:
            await self.move_now(inode, dst, reason, slack=slack)
        except Exception:
            log.exception("background migration of inode %d failed", inode.ino)
        finally:
            if inode.move_wanted == dst:
                inode.move_wanted = None

    async def move_now(self, inode: Inode, dst: str, reason: str, *, slack: bool = False) -> str | None:
        """Move a file to tier ``dst`` and wait for it: None once it is there, else why not.
        ``slack`` (a syncing writer's promotion): room up to the write ceiling
        (:meth:`room_for`), and past it when every fast-tier file is held (:meth:`_past_ceiling`)."""
        # a migration in flight the other way (e.g. the tail of a demotion when the
        # file is opened again) finishes first; then this one decides afresh
        while inode.migration is not None or self.migrations.passthrough["enabled"] and self.files.held(inode):
            if inode.migration is not None:
                await inode.migration.done.wait()
            else:  # passthrough: the blob moves only once the last handle is gone
                await self.files.idle_event(inode).wait()
            if not self.files.live(inode):
                return "the file was deleted"
        if not self.files.live(inode):
            return "the file was deleted"
        if inode.tier == dst:
            return None
        if dst == T.FAST and not await self.room_for(inode.size, inode, wait_leaving=True, slack=slack) and not (
                slack and await self._past_ceiling(inode.size)):
            log.info("not promoting inode %d (%s): no room on the fast tier", inode.ino,
                     format_size(inode.size))
            return f"no room on the fast tier for {format_size(inode.size)}"
        try:
            moved = await self.migrations.migrate(inode, dst, reason=reason)
        except OSError as exc:
            return f"migration failed: {exc}"
        self.check_watermark()
        if moved or inode.tier == dst:
            return None
        if inode.tier != dst and inode.migration is not None and inode.migration.dst == dst:
            await inode.migration.done.wait()  # another request moved it meanwhile
            return None if inode.tier == dst else "the file changed during the copy"
        return "no room on the " + dst + " tier, or the file changed during the copy"

    # ------------------------------------------------------------------ prefetch
    async def prefetch(self, path: str | bytes) -> str:
        """Bring a local file's bytes onto the fast tier ahead of the job that reads it (a
        plan step of the 2-layer scheduling): a file on the slow tier is promoted (waited
        for).  Room is made like for a promotion (closed, unpinned files are evicted) and
        never beyond the capacity.  Returns what was done; raises FsError (ENOENT: no such
        file here, ENOSPC: no room, …) with the reason as its second argument.  A file
        another node holds is fetched by the layer above (:mod:`hycache_agent.vfs.prefetch`)."""
        inode = local_inode(self.files.ns, path)
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

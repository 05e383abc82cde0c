"""What the engine counts and how it reports it: the cumulative counters (the control
plane's heartbeat ``counters``), the per-file info of ``user.hycache.info``, the census of
files per tier, ``status`` and ``statfs``.

Counting is plain integer increments on the event loop thread (negligible per request);
the engine keeps direct references to :class:`Counters` and :class:`IOStats` and bumps
their fields itself.  The rest are functions of what they are given, so the status shape
is tested without a mount (tests/agent/test_counters.py).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import Any

import pyfuse3
import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.kreads import KernelReads
from hycache_agent.fs.namespace import Inode

STATUS_SLICE = 20_000  # inodes counted by status() between two yields to the event loop
MOVING_MAX = 256  # moves listed by path in a status (the byte sums count them all)


@dataclass
class Counters:
    migrations_done: int = 0
    migrations_failed: int = 0
    migrations_abandoned: int = 0
    bytes_promoted: int = 0
    bytes_demoted: int = 0
    spills: int = 0
    evictions_taken_back: int = 0  # opens and pins that cancelled an eviction before its switch
    evictions: int = 0
    promotions: int = 0
    promotions_declined: int = 0  # on-open promotions the admission rule turned down
    promotions_for_write: int = 0  # writers' opens that waited for their file's promotion
    # of those, the ones that came in past the write ceiling: every fast-tier file was held
    # open (none could be evicted) and the fast file system had the room
    promotions_past_ceiling: int = 0


class TierIO:
    """Cumulative I/O of one tier since the agent started (plain integer increments on the
    event loop thread: negligible per read)."""

    # read_bytes and write_bytes include what the kernel read and wrote for passthrough
    # opens, as far as the agent learns it: ``kernel_read_bytes`` (traced, fs/kreads.py)
    # and ``grown_bytes`` (how much the files grew, seen when the agent fstat()s the blob:
    # an attribute request or the last close; overwrites in place are not seen)
    __slots__ = ("read_bytes", "write_bytes", "reads", "writes", "hits", "kernel_read_bytes", "grown_bytes")

    def __init__(self) -> None:
        self.read_bytes = self.write_bytes = self.reads = self.writes = self.hits = 0
        self.kernel_read_bytes = self.grown_bytes = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class IOStats:
    """The engine's measured counters (the control plane's heartbeat ``counters``).

    A *hit* is an open for reading of a file whose bytes are on the fast tier; a *miss*
    one whose bytes are on the slow tier or on another node (``tiers[slow].hits`` counts
    the slow-tier ones, ``remote_opens`` the others)."""

    __slots__ = ("tiers", "misses", "remote_read_bytes", "remote_opens", "metadata_ops")

    def __init__(self) -> None:
        self.tiers = {T.FAST: TierIO(), T.SLOW: TierIO()}
        self.misses = self.remote_read_bytes = self.remote_opens = self.metadata_ops = 0


def counters_dict(io: IOStats, counters: Counters, fetched: tuple[int, int] = (0, 0),
                  counting: dict[str, Any] | None = None) -> dict[str, Any]:
    """Cumulative counters since start, shaped as the heartbeat's ``counters``.
    ``fetched``: (fetches, bytes) of other nodes' files, in a cluster (the link counts them).
    ``counting``: what the byte counts include in the agent's mode (:func:`counting`)."""
    remote = {"read_bytes": io.remote_read_bytes, "fetches": fetched[0], "fetch_bytes": fetched[1],
              "opens": io.remote_opens}
    return {
        T.FAST: io.tiers[T.FAST].as_dict(),
        T.SLOW: io.tiers[T.SLOW].as_dict(),
        "remote": remote,
        "misses": io.misses,
        "metadata_ops": io.metadata_ops,
        "migrations": counters.migrations_done,
        "migration_bytes": counters.bytes_promoted + counters.bytes_demoted,
        "promoted_bytes": counters.bytes_promoted,
        "evicted_bytes": counters.bytes_demoted,
        "counting": counting,
    }


def take_kernel_reads(io: IOStats, by_tier: dict[str, int]) -> None:
    """Add what the kernel read from each tier's blobs (fs/kreads.py) to its read bytes."""
    for tier, n in by_tier.items():
        t = io.tiers[tier]
        t.read_bytes += n
        t.kernel_read_bytes += n


def grew(io: IOStats, tier: str | None, n: int) -> None:
    """A file on ``tier`` grew by ``n`` bytes the kernel wrote (passthrough; n <= 0: it
    did not grow, nothing counted)."""
    if n > 0 and tier is not None:
        t = io.tiers[tier]
        t.write_bytes += n
        t.grown_bytes += n


def engine_counters(io: IOStats, counters: Counters, kreads: KernelReads, passthrough: bool) -> dict[str, Any]:
    """The engine's :func:`counters_dict`, with the kernel's reads since the last call taken."""
    take_kernel_reads(io, kreads.drain())
    return counters_dict(io, counters, counting=counting(passthrough, kreads.status()))


def counting(passthrough: bool, kernel_reads: dict[str, Any]) -> dict[str, Any]:
    """What the per-tier byte counts include now: ``passthrough`` (the kernel moves the
    bytes of opens on the local tiers), ``reads``/``writes`` (how those are counted:
    "agent" — every byte, the agent served it; "traced" — the kernel's reads, from its
    trace point; "growth" — how much files grew, seen at attribute requests and the last
    close; "none") and the kernel tracer's state (``lost_events``: reads it missed)."""
    if not passthrough:
        return {"passthrough": False, "reads": "agent", "writes": "agent", "kernel_reads": kernel_reads}
    return {"passthrough": True, "reads": "traced" if kernel_reads.get("active") else "none",
            "writes": "growth", "kernel_reads": kernel_reads}


def file_info(inode: Inode, blob: str | None, agent_root: str, node_id: str | None) -> dict[str, Any]:
    """``user.hycache.info`` of a local inode (``blob``: its blob's path if regular;
    ``node_id``: this node's, in a cluster, where it is the file's primary)."""
    info: dict[str, Any] = {
        "ino": inode.ino,
        "type": "dir" if inode.is_dir else "file" if inode.is_reg else "symlink" if stat.S_ISLNK(inode.mode) else "special",
        "tier": inode.tier, "size": inode.size, "pinned": inode.pinned, "hits": inode.hits,
        "open": inode.open_count, "agent_root": agent_root,
    }
    if inode.is_reg:
        info["blob"] = blob
        if node_id is not None:
            info["primary"] = node_id
            info["replicas"] = list(inode.replicas)
    if inode.migration is not None:
        info["migration"] = inode.migration.as_dict()
    elif inode.move_wanted is not None:  # requested, waiting for the file's last close or a move the other way
        info["move_wanted"] = inode.move_wanted
    return info


def tier_vfs(tiers: dict[str, T.Tier]) -> tuple[os.statvfs_result, os.statvfs_result]:
    """(worker thread) statvfs of the fast and slow tiers: a hung slow tier (a lost NFS
    server) must never block the event loop."""
    return tiers[T.FAST].statvfs(), tiers[T.SLOW].statvfs()


class Census:
    """Files and bytes per tier, directories, other inodes, with the last count kept for
    callers that poll."""

    def __init__(self) -> None:
        self._census_cache: tuple[float, float, Any] | None = None  # (when, seconds taken, counts)

    async def count(self, inodes: dict[int, Inode], max_age: float) -> tuple[dict[str, list[int]], int, int]:
        """Files and bytes per tier, directories, other inodes: a walk of every inode
        (about 1.3 s for a million), so callers that poll (the control-plane link, the
        /metrics scrapes) accept one up to ``max_age`` seconds old — or older when the
        walk itself is slow (at most 5 % of the loop's time).  The walk yields to the
        loop between slices, so file system requests never wait for all of it."""
        cached = self._census_cache
        now = time.monotonic()
        if cached is not None and now - cached[0] < max(max_age, 20 * cached[1]) and max_age > 0:
            return cached[2]
        counts = {T.FAST: [0, 0, 0], T.SLOW: [0, 0, 0]}  # files, bytes, pinned bytes
        dirs = others = 0
        t0 = time.perf_counter()
        for n, inode in enumerate(list(inodes.values()), 1):
            if n % STATUS_SLICE == 0:
                await trio.lowlevel.checkpoint()
            if inode.is_reg:
                assert inode.tier is not None, "a regular file's bytes are on a tier"
                c = counts[inode.tier]
                c[0] += 1
                c[1] += inode.size
                if inode.pinned:
                    c[2] += inode.size
            elif inode.is_dir:
                dirs += 1
            else:
                others += 1
        result = (counts, dirs, others)
        self._census_cache = (now, time.perf_counter() - t0, result)
        return result


def requests_seen(io: IOStats) -> int:
    """The requests the node has served since start, as of now: what the native reader
    thread read (every request, answered by its table or queued for the event loop), else
    the metadata operations the event loop counted."""
    reader = getattr(pyfuse3, "reader_stats", None)
    if reader is not None:
        thread = reader()
        if thread["running"]:
            return thread["read"]
    return io.metadata_ops


# the patched pyfuse3's native request reader names its thread so (prctl PR_SET_NAME)
READER_THREAD_NAME = "hycache-reader"
_reader_tid: int | None = None


def reader_thread_id() -> int | None:
    """The thread id of the native request reader, found by its name in /proc/self/task;
    None while it does not run."""
    global _reader_tid
    tids = [str(_reader_tid)] if _reader_tid is not None else []
    try:
        tids += os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == READER_THREAD_NAME:
                    _reader_tid = int(tid)
                    return _reader_tid
        except OSError:
            continue
    _reader_tid = None
    return None


def reader_thread_nice() -> int | None:
    """The native reader thread's nice value (None while it does not run)."""
    tid = reader_thread_id()
    if tid is None:
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None


def request_loop(spin_us: float) -> dict[str, Any]:
    """The request loop's poll before it sleeps (``status`` -> ``request_loop``): how long,
    and since start how often it found the next request (``spin_hits``) or ran out and
    slept (``spin_misses``) — the polls of ``/dev/fuse`` by whichever reads it, the event
    loop or the reader thread; the counts are None with a pyfuse3 build without the poll.
    ``answer_table``: the requests answered from the reader's table, by kind, and what it holds.
    ``reader_thread``: what the native reader thread read, answered and queued for the event
    loop, its own polls, its waits for a free slot, its wake-ups of the event loop and its
    ``nice`` value (None: a build without it).  ``fuse_uring``: the io_uring transport."""
    spins = getattr(pyfuse3, "spins", None)
    answers = getattr(pyfuse3, "answers_stats", None)
    reader = getattr(pyfuse3, "reader_stats", None)
    uring = getattr(pyfuse3, "fuse_uring_stats", None)
    thread = reader() if reader is not None else None
    if thread is not None:
        thread = {**thread, "nice": reader_thread_nice()}
    hits = misses = None
    if spins is not None:
        hits, misses = spins[0], spins[1]
        if thread is not None:
            hits, misses = hits + thread["spin_hits"], misses + thread["spin_misses"]
    return {"spin_us": spin_us if spins is not None else 0.0,
            "spin_hits": hits,
            "spin_misses": misses,
            # what the reader's table answered without Python (fuse/answers.py); None: a
            # pyfuse3 build without it
            "answer_table": answers() if answers is not None else None,
            "reader_thread": thread,
            # FUSE over io_uring (--fuse-uring): asked for, offered by the kernel, running
            # (its per-CPU queues), and what its rings took, answered and handed on; None:
            # a pyfuse3 build without it
            "fuse_uring": uring() if uring is not None else None}


def moving(engine: Any) -> dict[str, Any]:
    """The fast tier's moves under way, as of now (never from a reused census): bytes
    entering it (promotions, and remote copies a prefetch is fetching: their room is
    already reserved) and bytes leaving it (demotions: the file keeps its room until the
    switch), and the first ``MOVING_MAX`` of those moves by path (``{"path", "to",
    "bytes"}``).  Layer 2 plans from these too: room that a move still occupies is not
    free yet."""
    into = out = 0
    items: list[dict[str, Any]] = []
    for m in list(engine.active.values()):
        if m.dst == T.FAST:
            into += m.total
        elif m.src == T.FAST:
            out += m.total
        else:
            continue
        if len(items) < MOVING_MAX and (path := engine.ns.path_of(m.ino)) is not None:
            items.append({"path": os.fsdecode(path), "to": m.dst, "bytes": m.total})
    for raw, n in engine.placement.fetching.items():
        into += n
        if len(items) < MOVING_MAX:
            items.append({"path": os.fsdecode(raw), "to": T.FAST, "bytes": n})
    return {"moving_in_bytes": into, "moving_out_bytes": out, "moving": items}


async def status(engine: Any, max_age: float = 0.0) -> dict[str, Any]:
    """The file system's part of the agent's state (``hycache-agent status --json``) of a
    running ``engine``; ``cluster``, ``control`` and ``hccache`` are None here (a standalone
    agent's answer) and filled in by the layers that know them (hycache_agent.vfs.status).
    ``max_age`` > 0: the file and directory counts may be that many seconds old (see
    :meth:`Census.count`)."""
    fast_vfs, slow_vfs = await trio.to_thread.run_sync(tier_vfs, engine.tiers)
    counts, dirs, others = await engine.census.count(engine.ns.inodes, max_age)
    return {
        "pid": os.getpid(),
        "mountpoint": str(engine.config.mountpoint),
        "root": str(engine.config.root),
        "uptime_seconds": round(time.time() - engine.started, 1),
        "policy": engine.policy.name,
        "policy_version": engine.policy_version,
        "watermarks": {"high": engine.config.high_watermark, "low": engine.config.low_watermark},
        "tiers": {
            T.FAST: {"path": str(engine.tiers[T.FAST].path), "capacity": engine.capacity,
                     "device_capacity": fast_vfs.f_blocks * fast_vfs.f_frsize,
                     "used": engine.space.used, "write_ceiling": engine.space.write_ceiling,
                     "files": counts[T.FAST][0], "bytes": counts[T.FAST][1],
                     "remote_cache_bytes": engine.space.remote_cache_used, "pinned_bytes": counts[T.FAST][2],
                     **moving(engine), "device_free": fast_vfs.f_bavail * fast_vfs.f_frsize},
            T.SLOW: {"path": str(engine.tiers[T.SLOW].path),
                     "capacity": slow_vfs.f_blocks * slow_vfs.f_frsize,
                     "device_capacity": slow_vfs.f_blocks * slow_vfs.f_frsize,
                     "used": counts[T.SLOW][1], "files": counts[T.SLOW][0], "bytes": counts[T.SLOW][1],
                     "device_free": slow_vfs.f_bavail * slow_vfs.f_frsize},
        },
        "counters": engine.counters_dict(),
        "directories": dirs,
        "other_inodes": others,
        "open_handles": len(engine.handles),
        "blob_pool": engine.blobs.status(),
        "request_loop": request_loop(engine.config.loop_spin_us),
        "passthrough": dict(engine.passthrough),
        "migrations": {**engine.counters.__dict__, "active": [m.as_dict() for m in engine.active.values()]},
        "cluster": None,
        "control": None,
        "hccache": None,
        "metadata": {"commits": engine.ns.journal.commits, "pending": engine.ns.journal.pending,
                     "error": None if engine.ns.journal.failed is None else str(engine.ns.journal.failed)},
    }


def statfs(capacity: int, fast_used: int, slow: os.statvfs_result, inodes: int) -> tuple[int, int, int, int]:
    """(total bytes, free bytes, total inodes, free inodes) of the whole mount: the fast
    tier's capacity and what is left of it, plus the slow tier's file system."""
    fast_free = max(0, capacity - fast_used)
    total = capacity + slow.f_blocks * slow.f_frsize
    free = fast_free + slow.f_bavail * slow.f_frsize
    files = max(slow.f_files, inodes + 1_000_000)
    return total, free, files, files - inodes

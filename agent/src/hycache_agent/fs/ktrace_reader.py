"""The kernel read trace's reader: a child process of the agent (fs/kreads.py starts it).

It reads the private tracefs instance's ``trace_pipe`` (the agent opens it and passes the
descriptor), parses ``filemap:mm_filemap_get_pages`` events, drops the agent's own reads
(``--me``), counts a read(2) once (a continuation — same thread, file and end, a later
start — adds nothing) and sums bytes per (device, inode).  Every ``--every`` seconds it
writes one batch to its stdout: a header ``<QI`` (events the ring buffer dropped so far,
entry count) and that many ``<QQQ`` entries (``st_dev``, inode, bytes).  Its own process
keeps the parsing off the agent's interpreter: the agent wakes once per batch.

It also reads ahead of sequential readers (:class:`Follower`): the agent names on its
stdin the blobs to follow (``+ ST_DEV INO PATH`` at a passthrough open for reading of a
fast-tier blob, ``- ST_DEV INO`` at its release); once a thread has read ``START`` bytes of
one in order, the child keeps the next ``--follow-mb`` MiB past that thread's position
asked for (more when the reader catches up with it: ``Follower.saw``; the blob's first
ask reaches ``--follow-first-mb`` past it) (``POSIX_FADV_WILLNEED``, ``CHUNK`` bytes a
request, on ``LANES`` worker threads), so several requests are in flight where the
kernel's read-ahead keeps one stream.  A reader of a few bytes, or one that jumps
around, costs nothing; a blob's last release stops it.  Here, and not in the agent,
because the events arrive here as the kernel emits them: the agent sees them only once
per batch.

It dies with the agent: ``PR_SET_PDEATHSIG`` (SIGKILL), and an EOF on its stdin (the
agent holds the other end) ends it too.  It runs at a lower priority (``--nice``),
except while it reads ahead of a reader (a follower that waits for a CPU falls behind its
reader, and the read-ahead is then no use; back to ``--nice`` a second after): when
the CPUs are busy the mount's readers and the agent come first, and the ring buffer
overflows (the events lost are counted) rather than a reader waiting.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import select
import signal
import struct
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# "comm-TID (TGID) [CPU] flags TS: mm_filemap_get_pages: dev=MAJ:MIN ino=HEX ofs=START-END"
LINE = re.compile(rb"-(\d+)\s+\(\s*(\d+)\)\s+\[\d+\][^\n]*? mm_filemap_get_pages: dev=(\d+):(\d+) "
                  rb"ino=([0-9a-f]+) ofs=(\d+)-(\d+)")
HEADER = struct.Struct("<QI")
ENTRY = struct.Struct("<QQQ")
PR_SET_PDEATHSIG = 1
MAX_THREADS = 4096  # continuations are tracked per thread; forgotten past this many
CHUNK = 8 << 20  # bytes of one read-ahead request
START = 2 << 20  # bytes a thread reads of a blob in order before it is read ahead of
SLACK = 1 << 20  # a read starting this far past the thread's last end is still in order
LANES = 4
GROWTH = 8  # a followed blob's window grows up to this many times the starting one
MAX_FOLLOWED = 4096
BLOCK = 4 << 20  # a slow-tier blob is read around in blocks of this many bytes (JuiceFS's default block)


class Followed:
    """A blob followed: its path, its opens, the end of what was asked ahead, the window
    kept asked past its readers, and per thread its last read's end and the bytes it read
    in order up to there; ``blocks``: a slow-tier blob read around in blocks, the blocks
    asked for so far (None: a fast-tier blob, read ahead of its sequential readers)."""

    __slots__ = ("path", "opens", "asked", "window", "threads", "blocks")

    def __init__(self, path: bytes, window: int, blocks: bool = False) -> None:
        self.path = path
        self.opens = 1
        self.asked = 0
        self.window = window
        self.threads: dict[int, tuple[int, int]] = {}
        self.blocks: set[int] | None = set() if blocks else None


def willneed(f: Followed, offset: int, length: int) -> None:
    """(a worker thread) Ask for ``length`` bytes of ``f`` at ``offset``, unless its last
    open is gone meanwhile; the blob is opened by its path for each request (a moved or
    removed blob is skipped; nothing is held open between requests)."""
    if f.opens <= 0:
        return
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _size(path: bytes) -> int:
    """The blob's size now (0 when it is gone): the first ask past the window stops at it."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class Follower:
    """Read-ahead of the followed blobs' sequential readers (see the module's doc).
    ``ahead``: bytes kept asked for past a sequential reader's position (0: off);
    ``first``: bytes asked for past it at once when a blob's first reader is seen reading
    in order (at least ``ahead``)."""

    def __init__(self, ahead: int, lanes: int = LANES, first: int = 0) -> None:
        self.ahead = max(ahead, CHUNK) if ahead else 0
        self.first = max(first, self.ahead)
        self.blobs: dict[tuple[int, int], Followed] = {}
        self.pool = ThreadPoolExecutor(lanes, thread_name_prefix="ahead") if ahead else None
        self.requests = 0  # read-ahead requests submitted
        self.reading = False  # a followed thread read in order since the flag was last cleared

    def command(self, line: bytes) -> None:
        """``+ ST_DEV INO PATH`` (a fast-tier blob: read ahead of its sequential readers),
        ``* ST_DEV INO PATH`` (a slow-tier blob: its random readers read around in blocks) or ``- ST_DEV INO``
        (one open fewer); malformed lines are ignored."""
        parts = line.split(b" ", 3)
        try:
            key = (int(parts[1]), int(parts[2]))
        except (IndexError, ValueError):
            return
        f = self.blobs.get(key)
        if parts[0] in (b"+", b"*") and len(parts) == 4 and self.pool is not None:
            if f is not None:
                f.opens += 1
            elif len(self.blobs) < MAX_FOLLOWED:
                self.blobs[key] = Followed(parts[3], self.ahead, blocks=parts[0] == b"*")
        elif parts[0] == b"-" and f is not None:
            f.opens -= 1
            if f.opens <= 0:
                del self.blobs[key]

    def saw(self, tid: int, key: tuple[int, int], start: int, end: int) -> None:
        """A read of bytes ``start``-``end`` of the followed blob ``key`` by thread ``tid``:
        once the thread has read ``START`` bytes in order, whole chunks up to the blob's
        window past ``end`` are asked for (those not asked already); the blob's first ask
        reaches ``first`` past ``end``, or the blob's end if that is nearer (the requests
        then run while the follower waits for the reader's next events, which come late
        when the CPUs are busy).  The window starts at ``ahead`` and doubles, up to
        ``GROWTH`` times, each time a reader is seen within a chunk of what was asked: it
        reads faster than this process follows."""
        f = self.blobs[key]
        seen = f.threads.get(tid)
        last, run = seen if seen is not None else (start, 0)
        in_order = last <= start <= last + SLACK
        if in_order:
            run += end - last
        elif not start < last == end:  # else the same read(2), its next pages
            run = end - start
        if len(f.threads) > MAX_THREADS:
            f.threads.clear()
        f.threads[tid] = (end, run)
        if f.blocks is not None:
            # a jump: the thread's first read past the start, or one away from its last end
            if (start > 0) if seen is None else not in_order:
                self._around(f, start, end)
            return
        if run < START:
            return
        self.reading = True
        if f.asked and end + CHUNK > f.asked:
            f.window = min(2 * f.window, GROWTH * self.ahead)
        off = max(f.asked, end)
        if f.asked:
            reach = end + f.window
        else:  # up to the chunk that holds the blob's last byte
            reach = max(end + f.window, min(end + self.first, _size(f.path) + CHUNK - 1))
        while off + CHUNK <= reach:
            assert self.pool is not None
            self.pool.submit(willneed, f, off, CHUNK)
            self.requests += 1
            off += CHUNK
        f.asked = off

    def _around(self, f: Followed, start: int, end: int) -> None:
        """A jump of a reader of a slow-tier blob: every ``BLOCK`` the read touches that was
        not asked for yet is asked for whole.  A random reader of a slow device (a
        database's 8 KiB pages) otherwise pays one seek per page, which the kernel does
        not read around; a block costs one seek and ~27 ms at 150 MB/s, and its other
        pages are then in the page cache — what JuiceFS's 4 MiB blocks give its readers
        (the papers' db row).  A reader in order is left to the kernel's read-ahead (its
        bytes are the same; more requests in flight on the slow device only compete with
        the promotion that copies the file meanwhile)."""
        assert f.blocks is not None and self.pool is not None
        last = (max(end, start + 1) - 1) // BLOCK
        for b in range(start // BLOCK, last + 1):
            if b not in f.blocks:
                f.blocks.add(b)
                self.pool.submit(willneed, f, b * BLOCK, BLOCK)
                self.requests += 1
                self.reading = True

    def close(self) -> None:
        for f in self.blobs.values():
            f.opens = 0
        self.blobs.clear()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class Summer:
    """Bytes per (st_dev, inode) of the events of other processes than ``me``; the
    events of followed blobs go to ``follower`` too."""

    def __init__(self, me: int, follower: Follower | None = None) -> None:
        self.me = me
        self.follower = follower
        self.sums: dict[tuple[int, int], int] = {}
        self._last: dict[int, tuple[int, int, int, int]] = {}  # tid -> (dev, ino, start, end)

    def feed(self, text: bytes) -> None:
        """Add the events of ``text`` (whole lines)."""
        me, last, sums = self.me, self._last, self.sums
        followed = self.follower.blobs if self.follower is not None else {}
        makedev = os.makedev
        for tid_s, tgid_s, major, minor, ino_hex, start_s, end_s in LINE.findall(text):
            if int(tgid_s) == me:
                continue
            dev = makedev(int(major), int(minor))
            ino = int(ino_hex, 16)
            start, end = int(start_s), int(end_s) + 1
            tid = int(tid_s)
            if followed and (dev, ino) in followed:
                self.follower.saw(tid, (dev, ino), start, end)  # type: ignore[union-attr]
            prev = last.get(tid)
            last[tid] = (dev, ino, start, end)
            if prev is not None and prev[3] == end and prev[0] == dev and prev[1] == ino and prev[2] < start < end:
                continue  # the same read(2), its next batch of pages
            key = (dev, ino)
            sums[key] = sums.get(key, 0) + end - start
        if len(last) > MAX_THREADS:
            last.clear()

    def take(self) -> dict[tuple[int, int], int]:
        out, self.sums = self.sums, {}
        return out


def encode(lost: int, sums: dict[tuple[int, int], int]) -> bytes:
    return HEADER.pack(lost, len(sums)) + b"".join(ENTRY.pack(d, i, n) for (d, i), n in sums.items())


def decode_entries(data: bytes) -> Iterable[tuple[int, int, int]]:
    return ENTRY.iter_unpack(data)


def lost_events(instance: Path) -> int | None:
    """Events the instance's ring buffer dropped (``overrun`` of each CPU's stats)."""
    lost = 0
    try:
        for stats in (instance / "per_cpu").glob("cpu*/stats"):
            for ln in stats.read_text().splitlines():
                if ln.startswith("overrun:"):
                    lost += int(ln.split()[1])
    except (OSError, ValueError):
        return None
    return lost


def _die_with(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the stdin EOF still ends it
    if os.getppid() != parent:  # the agent died before the prctl
        sys.exit(0)


class Priority:
    """The process's niceness: ``idle`` (its own), ``busy`` while a follower reads ahead
    and ``HOLD`` seconds after (the kernel refuses a lower niceness without CAP_SYS_NICE:
    it stays as it is)."""

    HOLD = 1.0

    def __init__(self, idle: int, busy: int = 0) -> None:
        self.idle, self.busy = idle, busy
        self.now = idle
        self.until = 0.0

    def update(self, follower: Follower | None, now: float) -> None:
        if follower is not None and follower.reading:
            follower.reading = False
            self.until = now + self.HOLD
        want = self.busy if now < self.until else self.idle
        if want != self.now:
            try:  # every thread's (Linux: a niceness per thread): the follower's workers too
                for tid in os.listdir("/proc/self/task"):
                    os.setpriority(os.PRIO_PROCESS, int(tid), want)
                self.now = want
            except OSError:
                self.until = 0.0 if want == self.busy else self.until


def run(fd: int, instance: Path, me: int, every: float, out: int, control: int,
        follower: Follower | None = None, priority: Priority | None = None) -> None:
    """Read, sum and report until ``control`` (the agent's pipe) reaches EOF; the lines
    the agent writes there go to ``follower``."""
    summer = Summer(me, follower)
    buf = commands = b""
    lost = reported_lost = 0
    sent = time.monotonic()
    ended = False
    while not ended:
        ready, _, _ = select.select([fd, control], [], [], every)
        if control in ready:
            got = os.read(control, 1 << 16)
            ended = not got
            commands += got
            if follower is not None and b"\n" in commands:
                *lines, commands = commands.split(b"\n")
                for line in lines:
                    follower.command(line)
        if fd in ready:
            try:
                chunk = os.read(fd, 1 << 18)
            except BlockingIOError:
                chunk = b""
            if chunk:
                buf += chunk
                cut = buf.rfind(b"\n") + 1
                if cut:
                    summer.feed(buf[:cut])
                    buf = buf[cut:]
        now = time.monotonic()
        if priority is not None:
            priority.update(follower, now)
        if now - sent >= every or ended:
            sent = now
            n = lost_events(instance)
            if n is not None:
                lost = n
            if summer.sums or lost != reported_lost:
                reported_lost = lost
                data = encode(lost, summer.take())
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hycache_agent.fs.ktrace_reader")
    p.add_argument("--fd", type=int, required=True, help="the instance's trace_pipe, opened by the agent")
    p.add_argument("--instance", type=Path, required=True)
    p.add_argument("--me", type=int, required=True, help="the agent's process id as the trace shows it")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--nice", type=int, default=0, help="added to its niceness")
    p.add_argument("--follow-mb", type=int, default=0,
                   help="MiB kept asked for ahead of a followed blob's sequential reader (0: off)")
    p.add_argument("--follow-first-mb", type=int, default=0,
                   help="MiB asked for at once ahead of a followed blob's first sequential reader "
                        "(at least --follow-mb)")
    a = p.parse_args(argv)
    _die_with(a.parent)
    idle = os.nice(a.nice)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's ^C is the agent's to handle
    follower = Follower(a.follow_mb << 20, first=a.follow_first_mb << 20) if a.follow_mb else None
    try:
        run(a.fd, a.instance, a.me, a.every, sys.stdout.fileno(), sys.stdin.fileno(), follower,
            Priority(idle, idle - a.nice) if follower is not None else None)
    except BrokenPipeError:
        pass  # the agent is gone
    finally:
        if follower is not None:
            follower.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

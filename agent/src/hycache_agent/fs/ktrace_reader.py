"""The kernel read trace's reader: a child process of the agent (fs/kreads.py starts it).

It reads the private tracefs instance's ``trace_pipe`` (the agent opens it and passes the
descriptor), parses ``filemap:mm_filemap_get_pages`` events, drops the agent's own reads
(``--me``), counts a read(2) once (a continuation — same thread, file and end, a later
start — adds nothing) and sums bytes per (device, inode).  Every ``--every`` seconds it
writes one batch to its stdout: a header ``<QI`` (events the ring buffer dropped so far,
entry count) and that many ``<QQQ`` entries (``st_dev``, inode, bytes).  Its own process
keeps the parsing off the agent's interpreter: the agent wakes once per batch.

It dies with the agent: ``PR_SET_PDEATHSIG`` (SIGKILL), and an EOF on its stdin (the
agent holds the other end) ends it too.  It runs at a lower priority (``--nice``): when
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
from pathlib import Path

# "comm-TID (TGID) [CPU] flags TS: mm_filemap_get_pages: dev=MAJ:MIN ino=HEX ofs=START-END"
LINE = re.compile(rb"-(\d+)\s+\(\s*(\d+)\)\s+\[\d+\][^\n]*? mm_filemap_get_pages: dev=(\d+):(\d+) "
                  rb"ino=([0-9a-f]+) ofs=(\d+)-(\d+)")
HEADER = struct.Struct("<QI")
ENTRY = struct.Struct("<QQQ")
PR_SET_PDEATHSIG = 1
MAX_THREADS = 4096  # continuations are tracked per thread; forgotten past this many


class Summer:
    """Bytes per (st_dev, inode) of the events of other processes than ``me``."""

    def __init__(self, me: int) -> None:
        self.me = me
        self.sums: dict[tuple[int, int], int] = {}
        self._last: dict[int, tuple[int, int, int, int]] = {}  # tid -> (dev, ino, start, end)

    def feed(self, text: bytes) -> None:
        """Add the events of ``text`` (whole lines)."""
        me, last, sums = self.me, self._last, self.sums
        makedev = os.makedev
        for tid_s, tgid_s, major, minor, ino_hex, start_s, end_s in LINE.findall(text):
            if int(tgid_s) == me:
                continue
            dev = makedev(int(major), int(minor))
            ino = int(ino_hex, 16)
            start, end = int(start_s), int(end_s) + 1
            tid = int(tid_s)
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


def run(fd: int, instance: Path, me: int, every: float, out: int, control: int) -> None:
    """Read, sum and report until ``control`` (the agent's pipe) reaches EOF."""
    summer = Summer(me)
    buf = b""
    lost = reported_lost = 0
    sent = time.monotonic()
    ended = False
    while not ended:
        ready, _, _ = select.select([fd, control], [], [], every)
        ended = control in ready and not os.read(control, 4096)
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
    a = p.parse_args(argv)
    _die_with(a.parent)
    os.nice(a.nice)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's ^C is the agent's to handle
    try:
        run(a.fd, a.instance, a.me, a.every, sys.stdout.fileno(), sys.stdin.fileno())
    except BrokenPipeError:
        pass  # the agent is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Blocking file helpers of the peer data service, run in worker threads."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import trio

from hycache_agent.transport import bulk

WRITEBACK_KICK = 8 << 20  # a received replica's write-back is started every this many bytes


def open_for_read(blob: str, sequential: bool) -> int:
    fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    if sequential:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
    return fd


def read_small(blob: str, offset: int, n: int, times: list[float] | None = None) -> tuple[bytes, str | None]:
    """``n`` bytes of ``blob`` at ``offset`` (open, pread, close: one worker-thread hop),
    and what went wrong with the blob, if anything (None: all of it).  ``times`` gets the
    thread's start, the open's end and the read's end (time.monotonic)."""
    if times is not None:
        times.append(time.monotonic())
    try:
        fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        return b"", f"cannot open blob {blob}: {e}"
    if times is not None:
        times.append(time.monotonic())
    try:
        data = os.pread(fd, n, offset)
        while 0 < len(data) < n:  # (a short read: the rest, if the file still has it)
            more = os.pread(fd, n - len(data), offset + len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
        if times is not None:
            times.append(time.monotonic())
    if len(data) < n:
        return b"", f"{blob} shrank to {offset + len(data)} bytes while serving it"
    return data, None


def pread_into(fd: int, buf: bytearray, n: int, offset: int) -> int:
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            break
        got += k
    return got


def write_behind(fd: int, pieces: list[bytes], kicked: int, written: int) -> tuple[int, int]:
    """Append ``pieces``; once WRITEBACK_KICK bytes are written since the last kick, start
    their write-back (POSIX_FADV_DONTNEED writes dirty pages back without waiting, then
    drops them: a replica is not read here), so the final fsync finds little left to do
    and the disk works while the network does.  Returns (bytes written, new kick mark)."""
    n = bulk.write_all(fd, pieces)
    return n, kick_writeback(fd, kicked, written + n)


def kick_writeback(fd: int, kicked: int, written: int) -> int:
    """Start the write-back of ``fd``'s bytes [kicked, written) once WRITEBACK_KICK of
    them have gathered; the new kick mark."""
    if written - kicked < WRITEBACK_KICK:
        return kicked
    try:
        os.posix_fadvise(fd, kicked, written - kicked, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    return written


def splice_body(sock_fd: int, fd: int, offset: int, count: int, timeout: float, pipe: tuple[int, int],
                kicked: int, check: Callable[[], None] | None = None) -> tuple[bulk.Received, int]:
    """(blocking) A whole request body of ``count`` bytes from the socket into ``fd`` at
    ``offset`` (``bulk.splice_in`` in pieces of ``bulk.HOP``), the write-back of every
    WRITEBACK_KICK bytes started between pieces: one worker-thread job for the body, so
    the loop is woken once, not once per piece (on a loaded machine every wake-up of a
    thread is a wait in the run queue).  Returns what arrived (``error``: what ended it
    early) and the new kick mark."""
    out = bulk.Received()
    while out.n < count:
        r = bulk.splice_in(sock_fd, fd, offset + out.n, min(bulk.HOP, count - out.n), timeout, pipe, check)
        out.n += r.n
        kicked = kick_writeback(fd, kicked, offset + out.n)
        if r.error is not None:
            out.error = r.error
            break
        (check or trio.from_thread.check_cancelled)()
    return out, kicked


class FileBody:
    """A body h11 counts (its length) but never sees: the bytes go by sendfile."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def close_pipe(pipe: tuple[int, int]) -> None:
    for p in pipe:
        os.close(p)


def fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)




def make_temp(staging_dir: str, sender: str) -> tuple[int, str]:
    fd, name = tempfile.mkstemp(prefix=f".peer-{sender}-", suffix=".part", dir=staging_dir)
    return fd, name

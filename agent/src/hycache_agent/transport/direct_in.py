"""A request body received past the page cache (``O_DIRECT``): the replica side of a push.

A received replica is not read on the node that keeps it (it serves only when its primary
is gone), so caching its bytes costs the holder a copy into page-cache pages, their
write-back and the final ``fsync``'s wait for it, for nothing.  Here the body goes from
the socket into an aligned buffer (``recv_into``: the one copy out of the socket) and from
there to the device with ``O_DIRECT`` writes of whole buffers; the final ``fsync`` only
has the metadata and a tail of less than one block to write.

* Offsets and lengths of ``O_DIRECT`` writes are multiples of ``ALIGN`` (the page size,
  which covers every logical block size Linux supports) and the buffer is an anonymous
  ``mmap`` (page aligned).  The body's last ``size % ALIGN`` bytes are written through the
  ordinary descriptor, after the direct writes before them.
* A file system that refuses ``O_DIRECT`` (the open fails, or the first write does with
  ``EINVAL``) gets the same bytes through the ordinary descriptor: the receive never fails
  for want of direct I/O.
* The body's first bytes, read by h11 with the request head, fill the buffer's start, so
  every direct write starts at an aligned offset.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
from collections.abc import Callable

import trio

from hycache_agent.transport import bulk

ALIGN = 4096  # offsets, lengths and buffer addresses of direct writes are multiples of this
DIRECT_HOP = 4 << 20  # bytes received between two direct writes (the buffer's size)


def open_direct(path: str) -> int:
    """(blocking) A write descriptor of ``path`` that bypasses the page cache; -1 where
    the file system refuses ``O_DIRECT``."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return -1
        raise


def _recv_full(sock_fd: int, view: memoryview, timeout: float, check: Callable[[], None]) -> int:
    """Fill ``view`` from the (non-blocking) socket; fewer bytes only at end of stream."""
    got = 0
    while got < len(view):
        try:
            k = os.readv(sock_fd, [view[got:]])
        except BlockingIOError:
            bulk.wait_fd(sock_fd, select.POLLIN, timeout, check)
            continue
        if k == 0:
            break
        got += k
    return got


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    while view:
        k = os.pwrite(fd, view, offset)
        view, offset = view[k:], offset + k


class _Sink:
    """Writes of the body at increasing offsets: direct for whole blocks while the file
    system takes them, through ``fd`` otherwise."""

    def __init__(self, fd: int, dfd: int) -> None:
        self.fd = fd
        self.dfd = dfd
        self.direct_bytes = 0

    def write(self, view: memoryview, offset: int) -> None:
        aligned = len(view) - len(view) % ALIGN if self.dfd >= 0 else 0
        if aligned:
            try:
                _write_at(self.dfd, view[:aligned], offset)
                self.direct_bytes += aligned
            except OSError as e:
                if e.errno != errno.EINVAL or self.direct_bytes:
                    raise
                self.dfd, aligned = -1, 0  # (refused at the first write: buffered from here on)
        if aligned < len(view):
            _write_at(self.fd, view[aligned:], offset + aligned)


def direct_body(sock_fd: int, fd: int, dfd: int, head: list[bytes], count: int, timeout: float,
                check: Callable[[], None] | None = None, offset: int = 0) -> tuple[bulk.Received, int]:
    """(blocking) A whole request body of ``count`` bytes into the file ``fd`` from
    ``offset`` (a multiple of ALIGN): ``head`` (the bytes h11 read with the request head),
    then the socket's.  ``dfd`` is ``fd``'s file opened by :func:`open_direct` (-1: none).
    Returns what was written (``error``: what ended the body early) and how many bytes
    went direct."""
    check = check or trio.from_thread.check_cancelled
    buf = mmap.mmap(-1, DIRECT_HOP)
    view = memoryview(buf)
    out = bulk.Received()
    sink = _Sink(fd, dfd)
    try:
        filled = 0
        for piece in head:
            view[filled:filled + len(piece)] = piece
            filled += len(piece)
        while out.n < count:
            want = min(DIRECT_HOP, count - out.n)
            got = filled + _recv_full(sock_fd, view[filled:want], timeout, check) if filled < want else filled
            if got < want:
                out.error = bulk.Broken(f"connection closed {count - out.n - got} bytes before the end of the body")
            # (a cut body is dropped whole by the caller: what arrived is written only if complete)
            if out.error is None:
                sink.write(view[:got], offset + out.n)
                out.n += got
            filled = 0
            if out.error is not None:
                break
            check()
    except OSError as e:
        if not bulk.peer_cut(e):
            raise
        out.error = e
    finally:
        view.release()
        buf.close()
    return out, sink.direct_bytes

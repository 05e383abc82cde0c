"""Read-ahead of a passthrough reader's blob at open, in parallel.

With passthrough the kernel reads a blob for the opener through its own read-ahead: one
stream per open, a window at a time (the backing file's; the agent's descriptor has its
own read-ahead state, so an fadvise on it does not widen the reader's).  On a disk shared
with other I/O one stream gets a small share of it (measured for issue 31 on a loaded VM: four
streams over one 256 MiB file read it 2-9x faster than one stream).  An
open for reading (not O_DIRECT) of a file on the fast tier may therefore ask for the first
``limit`` bytes of its blob ahead of the reader, ``CHUNK`` bytes a request
(``POSIX_FADV_WILLNEED``), spread over ``LANES`` worker threads: the page cache the
requests fill is the one the kernel's passthrough reads are served from.  Each request
opens the blob by its path (the registration's descriptor may be closed meanwhile); a
blob moved or removed meanwhile is skipped.  Off (``limit`` 0) by default: a reader of a
few bytes of a large file costs ``limit`` bytes of device reads.

The read-ahead that follows the reader instead (``--follow-prefetch-mb``, on by default):
such an open's blob is named to the kernel read trace's reader (fs/kreads.py), which asks
for a few chunks just past each thread that reads it in order, and stops at the blob's
last release (fs/ktrace_reader.py, ``Follower``).
"""

from __future__ import annotations

import os

from hycache_agent.fs.kreads import KernelReads
from hycache_agent.fs.lane import Lane

CHUNK = 8 << 20
LANES = 4
# A reader of a file up to this size gets it from the kernel's own read-ahead in a few
# windows: nothing for the read-ahead here to add (no open of it needs the agent: a
# registration of such a file may be lent, fs/passthrough.py, Backings.lender)
SMALL = 1 << 20


def willneed(path: str, offset: int, length: int) -> int:
    """(blocking) Ask the kernel to read ``length`` bytes of ``path`` at ``offset`` into the
    page cache: the file's size (0 when it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, offset, min(length, max(0, size - offset)), os.POSIX_FADV_WILLNEED)
        return size
    except OSError:
        return 0
    finally:
        os.close(fd)


class OpenPrefetch:
    """``limit``: bytes of a blob asked for at an open (0: off); ``lanes``: the worker
    threads the requests are spread over (the engine runs and closes them); ``kreads``:
    the kernel read trace, whose reader follows the opens named to it (when it runs with
    a follow window)."""

    def __init__(self, limit: int, lanes: list[Lane], kreads: KernelReads | None = None) -> None:
        self.limit = limit
        self.lanes = lanes
        self.kreads = kreads
        self.opens = 0  # opens that asked for read-ahead
        self.bytes = 0  # bytes asked for
        self.followed: dict[int, tuple[int, int]] = {}  # open handle -> its blob's (st_dev, st_ino)

    def follow(self, fh: int, key: tuple[int, int] | None, path: str, *, blocks: bool = False) -> None:
        """The open ``fh`` reads the blob ``path`` (``key``: its device and inode, None when
        its reads are not traced): have the trace's reader follow it until :meth:`unfollow`
        (``blocks``: a slow-tier blob, read around in blocks; ktrace_reader.Follower)."""
        if key is None or self.kreads is None or not self.kreads.following:
            return
        if self.kreads.follow(key, path, blocks=blocks):
            self.followed[fh] = key

    def wants_opens(self, size: int) -> bool:
        """Whether a reader's open of a fast-tier file of ``size`` bytes is to reach the
        agent, which reads ahead of it (at open, or following its reads)."""
        following = self.kreads is not None and self.kreads.following
        return size > SMALL and (bool(self.limit and self.lanes) or following)

    def unfollow(self, fh: int) -> None:
        key = self.followed.pop(fh, None)
        if key is not None and self.kreads is not None:
            self.kreads.unfollow(key)

    def start(self, path: str) -> None:
        """Ask for the first ``limit`` bytes of the blob ``path``, without waiting: its first
        chunk at once, the others once that request has learnt the blob's size (the size
        the agent holds may predate a writer's last RELEASE)."""
        if not self.limit or not self.lanes:
            return
        self.opens += 1
        self.lanes[0].submit(willneed, path, 0, min(CHUNK, self.limit),
                             then=lambda size, error: self._rest(path, size if error is None else 0))

    def _rest(self, path: str, size: int) -> None:
        length = min(size, self.limit)
        self.bytes += length
        for i, off in enumerate(range(CHUNK, length, CHUNK), start=1):
            self.lanes[i % len(self.lanes)].submit(willneed, path, off, min(CHUNK, length - off))

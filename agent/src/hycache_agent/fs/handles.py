"""Open handles of local files and their I/O on the blobs: a handle's descriptor follows
its file across migrations (tier and blob generation), and every blocking call runs in a
worker thread, except a read the page cache answers at once."""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field

import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import Inode

O_ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
_HAVE_NOWAIT = hasattr(os, "RWF_NOWAIT") and hasattr(os, "preadv")


@dataclass(eq=False)
class Handle:
    inode: Inode
    flags: int
    uid: int
    tier: str | None = None
    fd: int = -1
    blob_gen: int = -1  # the inode's blob generation when fd was opened
    # Descriptors replaced after a migration stay open until release: a worker thread
    # may still be reading through one, and a closed number could be reused at once.
    stale_fds: list[int] = field(default_factory=list)
    reopen_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def writable(self) -> bool:
        return (self.flags & O_ACCMODE) != os.O_RDONLY

    def fd_for(self, path: str, tier: str, gen: int) -> int:
        """(worker thread) The descriptor for the blob at ``path``, opened on first use
        and re-opened when the file moved to another tier or blob generation."""
        with self.reopen_lock:
            if self.fd < 0 or self.tier != tier or self.blob_gen != gen:
                mode = os.O_RDWR if self.writable else os.O_RDONLY
                fd = os.open(path, mode | os.O_CLOEXEC)
                if self.fd >= 0:
                    self.stale_fds.append(self.fd)
                self.fd, self.tier, self.blob_gen = fd, tier, gen
            return self.fd

    def close_all(self) -> None:
        """(worker thread, at release)"""
        for fd in [self.fd, *self.stale_fds]:
            if fd >= 0:
                os.close(fd)
        self.fd = -1
        self.stale_fds = []


def read_cached(h: Handle, off: int, size: int, blob_gen: int) -> bytes | None:
    """Read on the event loop thread only if the bytes are already in the page cache
    (``RWF_NOWAIT`` fails with EAGAIN instead of waiting for the disk), so the loop
    never blocks; None means "go to a worker thread".  ``blob_gen``: the inode's blob
    generation now."""
    inode = h.inode
    if (not _HAVE_NOWAIT or h.fd < 0 or h.tier != inode.tier
            or h.blob_gen != blob_gen):
        return None
    buf = bytearray(size)
    try:
        n = os.preadv(h.fd, [buf], off, os.RWF_NOWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    if n < size and off + n < inode.size:  # partly cached: a short reply would read as EOF
        return None
    return bytes(memoryview(buf)[:n])

async def blob_io(h: Handle, tiers: dict[str, T.Tier], blob_gens: dict[int, int], fn, *args):
    """Run ``fn(fd, *args)`` in a worker thread on the handle's descriptor for the
    blob that holds the file now: one thread hop, including a (re)open after a
    migration moved the file.  Reads take no lock: a migration may switch and remove
    the chosen blob before the worker opens it (ENOENT); then the current one serves."""
    inode = h.inode
    while True:
        tier, gen = inode.tier, blob_gens.get(inode.ino, 0)
        assert tier is not None, "a regular file's bytes are on a tier"
        path = tiers[tier].blob(inode.ino)

        def job(path=path, tier=tier, gen=gen):
            return fn(h.fd_for(path, tier, gen), *args)

        try:
            return await trio.to_thread.run_sync(job)
        except FileNotFoundError:
            if (inode.tier, blob_gens.get(inode.ino, 0)) == (tier, gen):
                raise  # not moved meanwhile: a real ENOENT

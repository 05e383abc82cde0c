"""Kernel passthrough for whole fast-tier copies of remote files.

A remote file whose current version is copied whole on this node's fast tier (fetched at
open, kept from an earlier read, fetched ahead by a plan, or a small file's HCCache
second level) is read by the kernel straight from the copy, as a local file is
(``fs/passthrough.py``): the open answers with a backing id and reads never reach the
agent.  A remote inode is one version of the file, and its copy never changes, so the
registration needs none of the size bookkeeping of local files.

The kernel keeps one io mode per inode: while an open served by the agent (an HCCache
handle, or one that got no backing id) is there, no open of the inode may carry a backing
id, and while a backed open is there, every open must carry the same one; either mistake
fails the open with EIO.  So an inode with opens keeps its mode.  The agent releases its
counts after the kernel dropped its own (RELEASE comes after the kernel's close), so the
counts can only err towards "still open", which is safe.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

import pyfuse3
import trio

from hycache_agent.fs.passthrough import parked_limit

log = logging.getLogger(__name__)

# Registrations kept after the last release of a remote inode (``RemoteBackings.parked``).
MAX_PARKED = 4096


@dataclass(eq=False)
class _Backed:
    fd: int
    backing_id: int
    refs: int


def _register(path: str) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd, pyfuse3.passthrough_open(fd)
    except BaseException:
        os.close(fd)
        raise


def _unregister(fd: int, backing_id: int) -> None:
    try:
        pyfuse3.passthrough_close(backing_id)
    except OSError as exc:  # the kernel keeps its own reference to the file anyway
        log.debug("closing backing id %d: %s", backing_id, exc)
    os.close(fd)


class RemoteBackings:
    """Backing ids of remote inodes (by kernel inode number) and their agent-served opens."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.by_ino: dict[int, _Backed] = {}
        self.served: dict[int, int] = {}  # ino -> opens answered without a backing id
        # Parked registrations: the last release of a remote inode keeps its registration
        # (least recently released first) instead of dropping it, so the next open of the
        # inode is answered without a thread hop (an open(2) + ioctl to register, another
        # hop to drop), as for local files (fs/passthrough.py).  A remote inode is one
        # version and its copy never changes; the kernel forgetting the inode drops it
        # (``forget``).  Parked, it holds no open: the inode's io mode is free.
        self.parked: OrderedDict[int, _Backed] = OrderedDict()
        self.max_parked = min(MAX_PARKED, parked_limit() // 2)  # beside the local files' own
        self._gates: dict[int, trio.Lock] = {}
        self.stats = {"backed_opens": 0, "served_opens": 0, "refused": 0}

    @property
    def enabled(self) -> bool:
        return bool(self.engine.passthrough.get("enabled"))

    async def open(self, ino: int, copy: str | None) -> int:
        """A new open of remote inode ``ino``: its backing id (the whole copy ``copy``
        registered), or 0 when it must be served by the agent (no copy, passthrough off,
        or the inode already has agent-served opens).  Every open is paired with one
        :meth:`release` with the same answer."""
        gate = self._gates.setdefault(ino, trio.Lock())
        async with gate:
            b = self.by_ino.get(ino)
            if b is None and not self.served.get(ino):
                b = self.parked.pop(ino, None)
                if b is not None:
                    self.by_ino[ino] = b
            if b is not None:
                b.refs += 1
                self.stats["backed_opens"] += 1
                return b.backing_id
            if copy is not None and self.enabled and not self.served.get(ino):
                try:
                    fd, bid = await trio.to_thread.run_sync(_register, copy)
                except OSError as exc:
                    self.stats["refused"] += 1
                    log.warning("passthrough for the copy %s refused (%s): served by the agent", copy, exc)
                else:
                    self.by_ino[ino] = _Backed(fd, bid, 1)
                    self.stats["backed_opens"] += 1
                    return bid
            self.served[ino] = self.served.get(ino, 0) + 1
            self.stats["served_opens"] += 1
            return 0

    async def release(self, ino: int, backing_id: int) -> None:
        if not backing_id:
            left = self.served.get(ino, 0) - 1
            if left > 0:
                self.served[ino] = left
            else:
                self.served.pop(ino, None)
                self._drop_gate(ino)
            return
        b = self.by_ino.get(ino)
        if b is None or b.backing_id != backing_id:
            return
        b.refs -= 1
        if b.refs > 0:
            return
        del self.by_ino[ino]
        self._drop_gate(ino)
        self.parked[ino] = b
        while len(self.parked) > self.max_parked:
            _ino, old = self.parked.popitem(last=False)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unregister, old.fd, old.backing_id)

    async def park_copy(self, ino: int, copy: str) -> None:
        """A whole copy of remote inode ``ino`` was just written (HCCache's second level,
        behind a read the agent served): register it now, off any open's path, parked for
        the next open, which then costs no thread hop."""
        if not self.enabled:
            return
        gate = self._gates.setdefault(ino, trio.Lock())
        async with gate:
            if ino in self.by_ino or ino in self.parked:
                return
            try:
                fd, bid = await trio.to_thread.run_sync(_register, copy)
            except OSError:
                return  # the next open tries (and logs) again
            self.parked[ino] = _Backed(fd, bid, 0)
        self._drop_gate(ino)
        while len(self.parked) > self.max_parked:
            _ino, old = self.parked.popitem(last=False)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unregister, old.fd, old.backing_id)

    async def forget(self, ino: int) -> None:
        """The kernel forgot remote inode ``ino``: its parked registration goes."""
        b = self.parked.pop(ino, None)
        if b is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unregister, b.fd, b.backing_id)

    def _drop_gate(self, ino: int) -> None:
        gate = self._gates.get(ino)
        if gate is not None and not gate.locked() and ino not in self.by_ino and not self.served.get(ino):
            del self._gates[ino]

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
from dataclasses import dataclass

import pyfuse3
import trio

log = logging.getLogger(__name__)


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
        del self.by_ino[ino]  # before the hop: a new open registers afresh
        self._drop_gate(ino)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_unregister, b.fd, b.backing_id)

    def _drop_gate(self, ino: int) -> None:
        gate = self._gates.get(ino)
        if gate is not None and not gate.locked() and ino not in self.by_ino and not self.served.get(ino):
            del self._gates[ino]

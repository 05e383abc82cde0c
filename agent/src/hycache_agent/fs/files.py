"""The files' run-time state shared by the file operations, the placement decisions and
the moves: the namespace (loaded at start-up), the files' locks, which files are held
(open, or their blob registered with the kernel: passthrough), and the waits for a
file's last release."""

from __future__ import annotations

import trio

from hycache_agent.fs.namespace import Inode, Namespace


class Files:
    # made by TieringEngine.start (the metadata loaded); read only once it has run
    ns: Namespace

    def __init__(self) -> None:
        self.locks: dict[int, trio.Lock] = {}
        self.idle: dict[int, trio.Event] = {}  # ino -> set when its last handle is released
        self.backed: set[int] = set()  # inodes whose blob the kernel holds (a backing id)

    def lock(self, inode: Inode) -> trio.Lock:
        lock = self.locks.get(inode.ino)
        if lock is None:
            lock = self.locks[inode.ino] = trio.Lock()
        return lock

    def is_locked(self, ino: int) -> bool:
        """A writer (or a migration's switch) holds the file's lock now."""
        lock = self.locks.get(ino)
        return lock is not None and lock.locked()

    def held(self, inode: Inode) -> bool:
        """Open, or (passthrough) its blob still registered with the kernel: its final size
        is known only once the FUSE layer has dropped the backing."""
        return bool(inode.open_count) or inode.ino in self.backed

    def idle_event(self, inode: Inode) -> trio.Event:
        ev = self.idle.get(inode.ino)
        if ev is None:
            ev = self.idle[inode.ino] = trio.Event()
        return ev

    def now_free(self, inode: Inode) -> None:
        ev = self.idle.pop(inode.ino, None)
        if ev is not None:
            ev.set()

    def live(self, inode: Inode) -> bool:
        """Still the namespace's inode of its number (not deleted since it was chosen)."""
        return self.ns.inodes.get(inode.ino) is inode

"""The in-memory namespace: inodes, directory entries and their POSIX rules.

Pure bookkeeping, no I/O: every change is recorded in the :class:`MetaJournal` and the
caller awaits ``journal.sync()`` before acknowledging it.  Errors are :class:`FsError`
carrying an errno; the FUSE layer turns them into replies.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hycache_agent.fs import redolog
from hycache_agent.fs.metastore import MetaJournal, Snapshot

log = logging.getLogger(__name__)

ROOT_INO = 1
NAME_MAX = 255
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class FsError(Exception):
    def __init__(self, err: int, message: str = "") -> None:
        super().__init__(err, message or errno.errorcode.get(err, str(err)))
        self.errno = err


def now_ns() -> int:
    return time.time_ns()


#: an inode's names are kept in a tuple up to this many, in a set beyond
LINKS_IN_A_TUPLE = 8

#: the extended attributes of every inode that has none (read-only: Inode.set_xattr replaces it)
NO_XATTRS: Mapping[bytes, bytes] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class Inode:
    ino: int
    mode: int
    uid: int
    gid: int
    nlink: int = 1
    size: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    rdev: int = 0
    target: bytes | None = None  # symlink target
    tier: str | None = None  # regular files: which tier holds the bytes
    pinned: bool = False
    hits: int = 0
    last_access: int = 0
    # Few files have extended attributes, hard links or replicas: those three fields hold a
    # shared empty mapping and tuples until they do (see :meth:`set_xattr`, :meth:`add_link`).
    # A dict, a set and a list per inode were three more objects the cyclic garbage collector
    # traversed in every collection of the generation holding them — for each created file
    # until it is removed (docs/benchmarks.md, "The garbage collector paced by the event loop").
    xattrs: Mapping[bytes, bytes] = field(default_factory=lambda: NO_XATTRS)
    # runtime only
    # (parent, name) of every name: a tuple, a set beyond LINKS_IN_A_TUPLE names (a file
    # with thousands of hard links must not copy a tuple per link)
    links: tuple[tuple[int, bytes], ...] | set[tuple[int, bytes]] = ()
    lookups: int = 0
    open_count: int = 0
    data_gen: int = 0  # bumped by every change of the bytes (migrations check it)
    migration: Any = None
    move_wanted: str | None = None  # a requested background move's tier until it starts or is refused
    synced: bool = False  # a writer fsync'ed it since the agent started (a log, a database's file)
    # in a cluster: the global namespace has acknowledged this inode's name (inodes loaded
    # at start count as published; a new one is not until its first put is applied)
    published: bool = False
    replicas: tuple[str, ...] = ()  # nodes holding a copy of the current bytes
    replicated_gen: int = -1  # data_gen the replicas were made from
    # the journal sequence number of the last change that gave this inode a name (create,
    # link): a writer's close waits until it is committed (MetaJournal.sync(upto=...));
    # 0 when the change is in the redo log (safe from a crash already: nothing to wait for)
    name_seq: int = 0

    def set_xattr(self, name: bytes, value: bytes) -> None:
        xattrs = dict(self.xattrs)  # (copied: rare, and the shared empty one stays empty)
        xattrs[name] = value
        self.xattrs = xattrs

    def remove_xattr(self, name: bytes) -> None:
        """KeyError if the inode has no such attribute."""
        xattrs = dict(self.xattrs)
        del xattrs[name]
        self.xattrs = xattrs or NO_XATTRS

    def add_link(self, parent: int, name: bytes) -> None:
        link = (parent, name)
        links = self.links
        if isinstance(links, set):
            links.add(link)
        elif link not in links:
            self.links = (*links, link) if len(links) < LINKS_IN_A_TUPLE else {*links, link}

    def drop_link(self, parent: int, name: bytes) -> None:
        link = (parent, name)
        links = self.links
        if isinstance(links, set):
            links.discard(link)
        elif link in links:
            self.links = tuple(other for other in links if other != link)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)

    def row(self) -> tuple[Any, ...]:
        return (self.ino, self.mode, self.uid, self.gid, self.nlink, self.size, self.atime_ns,
                self.mtime_ns, self.ctime_ns, self.rdev, self.target, self.tier, int(self.pinned),
                self.hits, self.last_access, ",".join(self.replicas))


def join_path(parent: bytes, name: bytes) -> bytes:
    return parent.rstrip(b"/") + b"/" + name


def check_name(name: bytes) -> None:
    if len(name) > NAME_MAX:
        raise FsError(errno.ENAMETOOLONG)
    if not name or b"/" in name or b"\0" in name:
        raise FsError(errno.EINVAL)


class Namespace:
    """Inodes by number, directory entries by (parent, name)."""

    def __init__(self, journal_factory) -> None:
        self.inodes: dict[int, Inode] = {}
        self.children: dict[int, dict[bytes, int]] = {}
        self.parent: dict[int, int] = {}  # directories only
        self.next_ino = ROOT_INO + 1
        self.access_seq = 0
        self.journal: MetaJournal = journal_factory(self._row)
        # Name events for the global namespace, in order: ("put", ino, path),
        # ("take", ino, path, old holder), ("delete", None, path),
        # ("rename", ino, old path, new path).  None = standalone.
        self.events: list[tuple] | None = None
        # the name events of the redo log's replay at start-up (the cluster link, attached
        # after it, publishes them: a replayed unlink must reach the global namespace too)
        self.replayed_events: list[tuple] = []

    def child_path(self, parent: int, name: bytes) -> bytes | None:
        base = self.path_of(parent)
        return None if base is None else join_path(base, name)

    def _row(self, ino: int):
        inode = self.inodes.get(ino)
        return inode.row() if inode is not None else None

    # -- loading ------------------------------------------------------------------------
    def load(self, snap: Snapshot, root_uid: int, root_gid: int) -> None:
        for row in snap.inodes:
            (ino, mode, uid, gid, nlink, size, at, mt, ct, rdev, target, tier, pinned, hits, last, reps) = row
            inode = self.inodes[ino] = Inode(ino, mode, uid, gid, nlink, size, at, mt, ct, rdev, target, tier,
                                             bool(pinned), hits, last, published=True)
            if reps:
                inode.replicas, inode.replicated_gen = tuple(reps.split(",")), 0
            if stat.S_ISDIR(mode):
                self.children[ino] = {}
        for parent, name, ino in snap.dentries:
            self.children.setdefault(parent, {})[bytes(name)] = ino
            if ino in self.inodes:
                self.inodes[ino].add_link(parent, bytes(name))
            if ino in self.children:
                self.parent[ino] = parent
        for ino, name, value in snap.xattrs:
            if ino in self.inodes:
                self.inodes[ino].set_xattr(bytes(name), bytes(value))
        self.next_ino = max(snap.counters.get("next_ino", 0), max(self.inodes, default=ROOT_INO) + 1)
        self.access_seq = max([snap.counters.get("access_seq", 0)] + [i.last_access for i in self.inodes.values()])
        if ROOT_INO not in self.inodes:
            t = now_ns()
            self.inodes[ROOT_INO] = Inode(ROOT_INO, stat.S_IFDIR | 0o755, root_uid, root_gid, 2,
                                          atime_ns=t, mtime_ns=t, ctime_ns=t)
            self.children[ROOT_INO] = {}
            self.journal.inode(ROOT_INO)
        self.parent[ROOT_INO] = ROOT_INO

    # -- queries ------------------------------------------------------------------------
    def get(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise FsError(errno.ENOENT) from None

    def dir(self, ino: int) -> dict[bytes, int]:
        entries = self.children.get(ino)
        if entries is None:
            if ino in self.inodes:
                raise FsError(errno.ENOTDIR)
            raise FsError(errno.ENOENT)
        return entries

    def lookup(self, parent: int, name: bytes) -> Inode:
        if name == b".":
            return self.get(parent)
        if name == b"..":
            self.dir(parent)
            return self.get(self.parent.get(parent, ROOT_INO))
        if len(name) > NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        ino = self.dir(parent).get(name)
        if ino is None:
            raise FsError(errno.ENOENT)
        return self.inodes[ino]

    def path_of(self, ino: int) -> bytes | None:
        """One path of an inode (the smallest of its names), O(depth); None if nameless."""
        parts = []
        seen = set()
        while ino != ROOT_INO:
            inode = self.inodes.get(ino)
            if inode is None or not inode.links or ino in seen:
                return None
            seen.add(ino)
            parent, name = min(inode.links)
            parts.append(name)
            ino = parent
        return b"/" + b"/".join(reversed(parts))

    def paths_of(self, inode: Inode) -> list[bytes]:
        """Every path of an inode (hard links have several)."""
        out = []
        for parent, name in sorted(inode.links):
            path = self.child_path(parent, name)
            if path is not None:
                out.append(path)
        return out

    def resolve(self, path: bytes) -> Inode:
        """The inode at an absolute path (FsError ENOENT/ENOTDIR as a lookup would)."""
        inode = self.inodes[ROOT_INO]
        for part in path.split(b"/"):
            if part:
                inode = self.lookup(inode.ino, part)
        return inode

    def touch_access(self, inode: Inode) -> None:
        self.access_seq += 1
        inode.last_access = self.access_seq
        inode.hits += 1
        self.journal.usage(inode.ino)

    # -- changes ------------------------------------------------------------------------
    def _dir_changed(self, dir_inode: Inode, t: int) -> None:
        dir_inode.mtime_ns = dir_inode.ctime_ns = t
        self.journal.inode(dir_inode.ino)

    def new_inode(self, parent: int, name: bytes, mode: int, uid: int, gid: int, *,
                  rdev: int = 0, target: bytes | None = None, tier: str | None = None,
                  ino: int | None = None, taken_from: str | None = None, t: int | None = None,
                  logged: bool = False) -> Inode:
        """Create an inode and its entry (the caller made any blob first, for the number
        it got from :meth:`allocate_ino`).  ``taken_from``: the file was held by that
        node, which this one takes it over from (published as a takeover).  ``t``: its
        times (a replayed create), else now.  ``logged``: the redo log holds the record
        already (the FUSE reader's)."""
        check_name(name)
        pdir = self.get(parent)
        entries = self.dir(parent)
        if name in entries:
            raise FsError(errno.EEXIST)
        if pdir.mode & stat.S_ISGID:
            gid = pdir.gid
            if stat.S_ISDIR(mode):
                mode |= stat.S_ISGID
        if t is None:
            t = now_ns()
        if ino is None:
            ino = self.allocate_ino()
        inode = Inode(ino, mode, uid, gid, 2 if stat.S_ISDIR(mode) else 1, atime_ns=t, mtime_ns=t,
                      ctime_ns=t, rdev=rdev, target=target, tier=tier)
        if target is not None:
            inode.size = len(target)
        self.inodes[ino] = inode
        entries[name] = ino
        inode.add_link(parent, name)
        if self.events is not None:
            path = self.child_path(parent, name)
            self.events.append(("put", ino, path) if taken_from is None else ("take", ino, path, taken_from))
        if stat.S_ISDIR(mode):
            self.children[ino] = {}
            self.parent[ino] = parent
            pdir.nlink += 1
        self._dir_changed(pdir, t)
        self.journal.inode(ino)
        self.journal.link(parent, name, ino)
        self.journal.counter("next_ino", self.next_ino)
        if taken_from is None and (logged or self.journal.redo_append(
                redolog.create(parent, name, ino, mode, uid, gid, rdev, target, tier, t))):
            inode.name_seq = 0
        else:  # (a takeover is not logged: its publication must name the old holder)
            if taken_from is not None:
                self.journal.redo_skip()
            inode.name_seq = self.journal.seq
        return inode

    def allocate_ino(self) -> int:
        ino = self.next_ino
        self.next_ino += 1
        self.journal.counter("next_ino", self.next_ino)
        return ino

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        check_name(name)
        inode = self.get(ino)
        if inode.is_dir:
            raise FsError(errno.EPERM)
        entries = self.dir(parent)
        if name in entries:
            raise FsError(errno.EEXIST)
        if inode.nlink == 0:
            raise FsError(errno.ENOENT)
        t = now_ns()
        entries[name] = ino
        inode.add_link(parent, name)
        if self.events is not None:
            self.events.append(("put", ino, self.child_path(parent, name)))
        inode.nlink += 1
        inode.ctime_ns = t
        self._dir_changed(self.inodes[parent], t)
        self.journal.inode(ino)
        self.journal.link(parent, name, ino)
        inode.name_seq = 0 if self.journal.redo_append(redolog.link(ino, parent, name)) else self.journal.seq
        return inode

    def _drop_name(self, parent: int, name: bytes, inode: Inode, t: int) -> None:
        if self.events is not None:
            self.events.append(("delete", None, self.child_path(parent, name)))
        del self.children[parent][name]
        inode.drop_link(parent, name)
        self.journal.unlink(parent, name)
        if inode.is_dir:
            inode.nlink = 0
            self.inodes[parent].nlink -= 1
            del self.children[inode.ino]
            self.parent.pop(inode.ino, None)
        else:
            inode.nlink -= 1
        inode.ctime_ns = t
        self.journal.inode(inode.ino)

    def unlink(self, parent: int, name: bytes, *, rmdir: bool, t: int | None = None,
               logged: bool = False) -> Inode:
        """Remove an entry; returns the inode (its nlink may now be 0).  ``t``: when (else
        now); ``logged``: the redo log holds the record already (the FUSE reader's)."""
        inode = self.lookup(parent, name) if name not in (b".", b"..") else None
        if inode is None:
            raise FsError(errno.EINVAL if rmdir else errno.EISDIR)
        if rmdir:
            if not inode.is_dir:
                raise FsError(errno.ENOTDIR)
            if self.children[inode.ino]:
                raise FsError(errno.ENOTEMPTY)
        elif inode.is_dir:
            raise FsError(errno.EISDIR)
        if t is None:
            t = now_ns()
        self._drop_name(parent, name, inode, t)
        self._dir_changed(self.inodes[parent], t)
        if not logged:
            self.journal.redo_append(redolog.unlink(parent, name, rmdir))
        return inode

    def is_ancestor(self, maybe_ancestor: int, ino: int) -> bool:
        while True:
            if ino == maybe_ancestor:
                return True
            if ino == ROOT_INO:
                return False
            ino = self.parent[ino]

    def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes,
               flags: int) -> Inode | None:
        """POSIX rename (with RENAME_NOREPLACE / RENAME_EXCHANGE).  Returns the inode that
        lost its name by being replaced (nlink may now be 0), or None."""
        check_name(new_name)
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise FsError(errno.EINVAL)
        if old_name in (b".", b"..") or new_name in (b".", b".."):
            raise FsError(errno.EBUSY)
        src = self.lookup(old_parent, old_name)
        dst_entries = self.dir(new_parent)
        dst_ino = dst_entries.get(new_name)
        dst = self.inodes[dst_ino] if dst_ino is not None else None
        if src.is_dir and self.is_ancestor(src.ino, new_parent):
            raise FsError(errno.EINVAL)
        t = now_ns()
        old_path = new_path = None
        if self.events is not None:
            old_path, new_path = self.child_path(old_parent, old_name), self.child_path(new_parent, new_name)
        if flags & RENAME_EXCHANGE:
            if dst is None:
                raise FsError(errno.ENOENT)
            if dst.is_dir and self.is_ancestor(dst.ino, old_parent):
                raise FsError(errno.EINVAL)
            if self.events is not None:  # the store has no exchange: three renames
                assert old_path is not None, "a name's parent directory has a path"
                temp = old_path + b".hycache-exchange-%d" % src.ino
                self.events += [("rename", src.ino, old_path, temp), ("rename", dst.ino, new_path, old_path),
                                ("rename", src.ino, temp, new_path)]
            self.children[old_parent][old_name] = dst.ino
            dst_entries[new_name] = src.ino
            src.drop_link(old_parent, old_name)
            src.add_link(new_parent, new_name)
            dst.drop_link(new_parent, new_name)
            dst.add_link(old_parent, old_name)
            for inode, parent in ((src, new_parent), (dst, old_parent)):
                if inode.is_dir and self.parent[inode.ino] != parent:
                    self.inodes[self.parent[inode.ino]].nlink -= 1
                    self.inodes[parent].nlink += 1
                    self.parent[inode.ino] = parent
                inode.ctime_ns = t
                self.journal.inode(inode.ino)
            self.journal.link(old_parent, old_name, dst.ino)
            self.journal.link(new_parent, new_name, src.ino)
            self._dir_changed(self.inodes[old_parent], t)
            self._dir_changed(self.inodes[new_parent], t)
            self.journal.redo_append(redolog.rename(old_parent, old_name, new_parent, new_name, flags))
            return None
        if dst is not None:
            if flags & RENAME_NOREPLACE:
                raise FsError(errno.EEXIST)
            if dst is src:  # two names of one inode: POSIX says do nothing
                return None
            if src.is_dir and not dst.is_dir:
                raise FsError(errno.ENOTDIR)
            if not src.is_dir and dst.is_dir:
                raise FsError(errno.EISDIR)
            if dst.is_dir and self.children[dst.ino]:
                raise FsError(errno.ENOTEMPTY)
            self._drop_name(new_parent, new_name, dst, t)
        if self.events is not None:
            self.events.append(("rename", src.ino, old_path, new_path))
        del self.children[old_parent][old_name]
        self.journal.unlink(old_parent, old_name)
        dst_entries[new_name] = src.ino
        src.drop_link(old_parent, old_name)
        src.add_link(new_parent, new_name)
        self.journal.link(new_parent, new_name, src.ino)
        if src.is_dir and old_parent != new_parent:
            self.inodes[old_parent].nlink -= 1
            self.inodes[new_parent].nlink += 1
            self.parent[src.ino] = new_parent
        src.ctime_ns = t
        self.journal.inode(src.ino)
        self._dir_changed(self.inodes[old_parent], t)
        self._dir_changed(self.inodes[new_parent], t)
        self.journal.redo_append(redolog.rename(old_parent, old_name, new_parent, new_name, flags))
        return dst

    def replay(self, records: list[tuple[int, bytes]]) -> int:
        """(start-up, before recovery) Apply the redo log's records past the checkpoint,
        in order, through the operations that made them; one whose effect is already
        here is skipped (idempotent).  Returns how many changed something."""
        applied = 0
        for seq, payload in records:
            rec = redolog.decode(payload)
            op = rec[0]
            try:
                if op == "create":
                    _, parent, name, ino, mode, uid, gid, rdev, target, tier, t = rec
                    entries = self.children.get(parent)
                    if ino in self.inodes or entries is None:
                        if entries is None:
                            log.error("redo record %d: create %r in directory %d, which is gone", seq, name, parent)
                        continue
                    if name in entries:  # replaced meanwhile by a change not logged
                        self._drop_name(parent, name, self.inodes[entries[name]], t)
                    self.new_inode(parent, name, mode, uid, gid, rdev=rdev, target=target, tier=tier, ino=ino, t=t)
                    self.next_ino = max(self.next_ino, ino + 1)
                    self.journal.counter("next_ino", self.next_ino)
                elif op == "link":
                    _, ino, parent, name = rec
                    if self.children.get(parent, {}).get(name) == ino or ino not in self.inodes:
                        continue
                    self.link(ino, parent, name)
                elif op == "unlink":
                    _, parent, name, rmdir = rec
                    if name not in self.children.get(parent, {}):
                        continue
                    self.unlink(parent, name, rmdir=rmdir)
                else:
                    _, old_parent, old_name, new_parent, new_name, flags = rec
                    if old_name not in self.children.get(old_parent, {}):
                        continue
                    self.rename(old_parent, old_name, new_parent, new_name, flags)
            except FsError as exc:
                log.error("redo record %d (%s): %s; skipped", seq, op, exc)
                continue
            applied += 1
        return applied

    def forget_inode(self, inode: Inode) -> None:
        """Drop an inode that has no name, no open handle and no kernel reference."""
        self.inodes.pop(inode.ino, None)
        self.journal.inode(inode.ino)  # row() is None now: deleted in the next commit


def local_inode(ns: Namespace, path: str | bytes) -> Inode:
    """The inode this node holds at an absolute path of the mount (FsError ENOENT)."""
    raw = os.fsencode(path)
    if not raw.startswith(b"/") or b"\0" in raw:
        raise FsError(errno.EINVAL, "the path must be absolute, without NUL")
    return ns.resolve(raw)

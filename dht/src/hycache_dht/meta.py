"""The metadata store contract: what the DHT holds per path, the operations, the errors.

Two engines implement :class:`MetaStore`: :class:`~hycache_dht.redis_store.RedisClusterStore`
(the global namespace on Redis Cluster) and :class:`~hycache_dht.local_store.LocalStore`
(one SQLite file, for a standalone agent or several agents on one host). The API is
blocking: the agent calls it from worker threads, never from the trio loop thread.

Paths are absolute, normalised bytes (``b"/a/b"``); names may be any bytes except ``/``
and NUL. The root ``b"/"`` always exists as a directory.

Semantics shared by both engines (``tests/dht/test_contract.py`` holds them):

* ``version`` is the CAS token of an entry: every change made through ``create``/``put``/
  ``rename`` gives the entry a new, larger version (unique within its directory). Lease
  changes (``acquire_write``/``release_write``) do not change it, and ``put`` keeps the
  stored lease (``meta.writer``/``meta.lease_until`` given to ``put`` are ignored): the
  write flag has its own compare-and-swap.
* ``expect_version``: ``None`` = unconditional; ``0`` = only if the entry does not exist;
  ``n > 0`` = only if the entry exists with version ``n``.
* A ``put`` may not turn a directory into a non-directory or back (``IsADirectoryError`` /
  ``NotADirectoryError``); ``delete`` of a non-empty directory raises ``OSError(ENOTEMPTY)``.
* Writes need their parent directory: ``create``/``put`` under a missing, removed or
  renamed-away directory (or under a non-directory) raise ``FileNotFoundError``, so a
  publisher sends parents before children (``apply`` keeps the order).

docs/dht.md has the rest: key layout, protocols, fsck, failover.
"""

from __future__ import annotations

import abc
import errno
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Self

import msgpack

if TYPE_CHECKING:
    from .invalidations import InvalidationFeed

KINDS = ("file", "dir", "symlink", "special")

#: version of the value layout written by :func:`pack_body` (2 added ``pinned``; bodies
#: of format 1 still read, as not pinned)
BODY_FORMAT = 2


@dataclass
class EntryMeta:
    """What the DHT holds per path."""

    kind: str  # "file" | "dir" | "symlink" | "special"
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    primary: str | None = None  # node id holding the primary copy (files)
    replicas: list[str] = field(default_factory=list)
    tier: str | None = None  # "fast" / "slow" on the primary
    target: bytes | None = None  # symlink target
    rdev: int = 0
    version: int = 0  # bumped by the store on every change (CAS token)
    writer: str | None = None  # write flag: node holding the write lease
    lease_until: float = 0.0  # unix time the lease expires (no lock survives a dead holder)
    pinned: bool = False  # the primary keeps it on its fast tier (never evicted)

    def copy(self, **changes: Any) -> EntryMeta:
        changes.setdefault("replicas", list(self.replicas))
        return replace(self, **changes)


def dir_meta(mode: int = 0o755, uid: int = 0, gid: int = 0, now_ns: int | None = None) -> EntryMeta:
    """A directory entry (``mode`` gets ``S_IFDIR`` added)."""
    t = time.time_ns() if now_ns is None else now_ns
    return EntryMeta("dir", 0o040000 | (mode & 0o7777), uid, gid, 0, t, t, t)


def root_meta() -> EntryMeta:
    """What ``get(b"/")`` answers before anyone stored the root's metadata."""
    return EntryMeta("dir", 0o040755, 0, 0, 0, 0, 0, 0)


def check_meta(meta: EntryMeta) -> None:
    if meta.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {meta.kind!r}")
    if meta.target is not None and not isinstance(meta.target, bytes):
        raise TypeError("symlink target must be bytes")


def pack_body(meta: EntryMeta) -> bytes:
    """The stored body: every field but kind and the store-managed ones (msgpack array)."""
    body: bytes = msgpack.packb(
        [
            BODY_FORMAT, meta.mode, meta.uid, meta.gid, meta.size,
            meta.atime_ns, meta.mtime_ns, meta.ctime_ns,
            meta.primary, list(meta.replicas), meta.tier, meta.target, meta.rdev, meta.pinned,
        ],
        use_bin_type=True,
    )
    return body


def unpack_body(
    kind: str, body: bytes, version: int = 0, writer: str | None = None, lease_until: float = 0.0
) -> EntryMeta:
    a = msgpack.unpackb(body, raw=False)
    if a[0] not in (1, BODY_FORMAT):
        raise ValueError(f"unknown metadata format {a[0]}")
    return EntryMeta(
        kind=kind, mode=a[1], uid=a[2], gid=a[3], size=a[4],
        atime_ns=a[5], mtime_ns=a[6], ctime_ns=a[7],
        primary=a[8], replicas=list(a[9]), tier=a[10], target=a[11], rdev=a[12],
        version=version, writer=writer or None, lease_until=lease_until,
        pinned=bool(a[13]) if len(a) > 13 else False,
    )


@dataclass
class Op:
    """One queued update for :meth:`MetaStore.apply`."""

    op: str  # "put" | "delete" | "create" | "acquire" | "release"
    path: bytes
    meta: EntryMeta | None = None
    expect_version: int | None = None
    owners: tuple[str, ...] | None = None  # put: the owner guard (see MetaStore.put)
    node: str | None = None  # acquire/release: the node taking or giving up the write flag
    lease_seconds: float = 0.0  # acquire: the lease


    @classmethod
    def put(cls, path: bytes, meta: EntryMeta, expect_version: int | None = None,
            owners: tuple[str, ...] | None = None) -> Op:
        return cls("put", path, meta, expect_version, owners)

    @classmethod
    def create(cls, path: bytes, meta: EntryMeta) -> Op:
        return cls("create", path, meta)

    @classmethod
    def delete(cls, path: bytes, expect_version: int | None = None) -> Op:
        return cls("delete", path, None, expect_version)

    @classmethod
    def acquire(cls, path: bytes, node: str, lease_seconds: float) -> Op:
        """``acquire_write`` in a batch: its result is True (held) or False (another
        node holds it); FileNotFoundError when the entry is missing."""
        return cls("acquire", path, node=node, lease_seconds=lease_seconds)

    @classmethod
    def release(cls, path: bytes, node: str) -> Op:
        """``release_write`` in a batch: its result is None (also when the entry is
        missing or another node holds the flag)."""
        return cls("release", path, node=node)

    def check(self) -> None:
        if self.op not in ("put", "delete", "create", "acquire", "release"):
            raise ValueError(f"unknown op {self.op!r}")
        if self.op in ("acquire", "release"):
            if not self.node or "|" in self.node:
                raise ValueError(f"bad node id {self.node!r}")
            return
        if self.op != "delete":
            if self.meta is None:
                raise ValueError(f"{self.op} needs meta")
            check_meta(self.meta)

    def entry(self) -> EntryMeta:
        """The entry a ``put`` or ``create`` writes (:meth:`check` makes sure it has one)."""
        if self.meta is None:
            raise ValueError(f"{self.op} needs meta")
        return self.meta

    def holder(self) -> str:
        """The node an ``acquire`` or ``release`` acts for (:meth:`check` makes sure it has one)."""
        if not self.node:
            raise ValueError(f"bad node id {self.node!r}")
        return self.node


# -- errors -------------------------------------------------------------------------------


class DHTError(Exception):
    """Base of the store's own errors (POSIX-like outcomes use the builtin OSError types)."""


class DHTUnavailable(DHTError, ConnectionError):
    """The metadata service could not be reached within the operation's deadline."""


class DHTAuthError(DHTUnavailable):
    """Redis refused the client's credentials (wrong user or password, or none given to
    a cluster that requires them): retrying cannot help."""


class NotDurable(DHTUnavailable):
    """The write was applied on a master but no replica confirmed it within the deadline."""


class NotPrimary(PermissionError):
    """A guarded ``put`` found the entry held by another node (``primary``): someone took
    the file over."""

    def __init__(self, path: bytes, primary: str, version: int) -> None:
        super().__init__(errno.EPERM, f"held by node {primary}", path)
        self.primary = primary
        self.version = version


def owners_arg(owners: tuple[str, ...] | list[str] | None) -> str:
    """The owner guard as the engines store it: '' = none, else '|a|b|'."""
    if owners is None:
        return ""
    for node in owners:
        if not node or "|" in node:
            raise ValueError(f"bad node id {node!r}")
    return "|" + "|".join(owners) + "|"


class DHTBusy(DHTError, BlockingIOError):
    """A rename kept the directory or entry locked past the operation's deadline."""

    def __init__(self, message: str = "busy: a rename holds this entry") -> None:
        super().__init__(errno.EBUSY, message)


class RenameAborted(DHTError):
    """This rename's intent was taken over by fsck (it exceeded its deadline)."""


def not_empty(path: bytes) -> OSError:
    return OSError(errno.ENOTEMPTY, "directory not empty", path)


def invalid(path: bytes, why: str) -> OSError:
    return OSError(errno.EINVAL, why, path)


def check_destination(s: EntryMeta, d: EntryMeta | None, dst: bytes, replace: bool) -> None:
    """POSIX rules for a rename of ``s`` onto an existing ``d`` (None: ``dst`` is free)."""
    if d is None:
        return
    if not replace:
        raise FileExistsError(errno.EEXIST, "destination exists", dst)
    if s.kind == "dir" and d.kind != "dir":
        raise NotADirectoryError(errno.ENOTDIR, "destination is not a directory", dst)
    if s.kind != "dir" and d.kind == "dir":
        raise IsADirectoryError(errno.EISDIR, "destination is a directory", dst)


# -- fsck report ---------------------------------------------------------------------------

#: report keys that count problems found (``report["problems"]`` is their sum)
PROBLEMS = ("intents", "tombstones", "headerless", "stale_freezes", "stale_pins", "orphan_dirs",
            "unlabelled")


#: what ``fsck`` returns: counts by name (and ``repaired``)
FsckReport = dict[str, int]


def new_report(repair: bool) -> FsckReport:
    """The dict ``fsck`` returns: problems found (PROBLEMS), what was done about them
    (``rolled_forward``, ``rolled_back``, ``resurrected_dirs``), intents left alone because
    their owner is alive (``busy``), and totals (``dirs``, ``entries``)."""
    rep: FsckReport = {n: 0 for n in (*PROBLEMS, "busy", "rolled_forward", "rolled_back",
                                 "resurrected_dirs", "dirs", "entries", "problems")}
    rep["repaired"] = repair
    return rep


# -- the interface ------------------------------------------------------------------------

#: called with the name of each step of a multi-step protocol (crash injection in tests)
StepHook = Callable[[str], None]


class MetaStore(abc.ABC):
    """BLOCKING metadata store API (the agent calls it from worker threads)."""

    #: optional hook called after each protocol step (tests raise from it to simulate a crash)
    step_hook: StepHook | None = None

    def _step(self, name: str) -> None:
        hook = self.step_hook
        if hook is not None:
            hook(name)

    @abc.abstractmethod
    def get(self, path: bytes) -> EntryMeta | None:
        """The entry at ``path``, or None."""

    @abc.abstractmethod
    def create(self, path: bytes, meta: EntryMeta) -> bool:
        """Atomic O(1) insert into the parent directory; False if the name exists."""

    @abc.abstractmethod
    def put(self, path: bytes, meta: EntryMeta, expect_version: int | None = None,
            owners: tuple[str, ...] | None = None) -> int | None:
        """Upsert (or CAS on version); the new version, None if the CAS failed.

        ``owners`` is the owner guard of a node publishing its own files: if the entry
        exists, is not a directory and names a primary that is not in ``owners``, nothing
        is written and :class:`NotPrimary` is raised (another node took the file over)."""

    @abc.abstractmethod
    def delete(self, path: bytes, expect_version: int | None = None) -> bool:
        """Remove the entry; False if absent (or CAS failed). ENOTEMPTY for a full directory."""

    def list_dir(self, path: bytes) -> Iterator[tuple[bytes, EntryMeta]]:
        """Stream ``(name, meta)`` of a directory in pages (never O(n) in one call)."""
        m = self.get(path)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        if m.kind != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        return self._entries(path)

    @abc.abstractmethod
    def _entries(self, path: bytes) -> Iterator[tuple[bytes, EntryMeta]]:
        """The ``(name, meta)`` stream of ``list_dir`` (``path`` is a directory)."""

    @abc.abstractmethod
    def rename(self, src: bytes, dst: bytes, *, replace: bool = True) -> None:
        """Crash-safe rename (POSIX rules); FileExistsError / FileNotFoundError."""

    @abc.abstractmethod
    def acquire_write(self, path: bytes, node: str, lease_seconds: float) -> bool:
        """CAS the write flag; True if ``node`` holds it now (renewal by the holder is ok)."""

    @abc.abstractmethod
    def release_write(self, path: bytes, node: str) -> None:
        """Clear the write flag if ``node`` holds it."""

    @abc.abstractmethod
    def apply(self, ops: list[Op]) -> list[object]:
        """Pipelined batch: per op the result its method would return, or the exception."""

    @abc.abstractmethod
    def fsck(self, repair: bool = False) -> FsckReport:
        """Find (and with ``repair`` fix) what interrupted multi-step operations left."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """True if the backing service answers."""

    def invalidation_feed(self) -> InvalidationFeed | None:
        """A :class:`~hycache_dht.invalidations.InvalidationFeed` of the paths whose
        entries change (announced by every write), or None when the engine has none
        (callers then re-read entries on their own schedule)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

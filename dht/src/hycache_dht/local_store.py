"""The metadata store in one SQLite file: a standalone agent, or several agents on one host.

Same semantics as the Redis engine (one contract test suite runs against both), with
SQLite transactions in place of the intent log: every operation, including a directory
rename that re-keys its whole subtree, is one ``BEGIN IMMEDIATE`` transaction, so a crash
at any point leaves the state before or after it. WAL mode; one connection per thread
(readers run concurrently, writers take turns); several processes may share the file.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import paths
from .meta import (
    PROBLEMS,
    EntryMeta,
    FsckReport,
    MetaStore,
    NotPrimary,
    Op,
    check_destination,
    check_meta,
    dir_meta,
    invalid,
    new_report,
    not_empty,
    owners_arg,
    pack_body,
    root_meta,
    unpack_body,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    parent BLOB NOT NULL, name BLOB NOT NULL,
    kind TEXT NOT NULL, version INTEGER NOT NULL,
    writer TEXT NOT NULL DEFAULT '', lease_until REAL NOT NULL DEFAULT 0,
    body BLOB NOT NULL,
    PRIMARY KEY (parent, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('version', 0);
"""

_COLS = "kind, version, writer, lease_until, body"


def _row_meta(row: tuple[Any, ...]) -> EntryMeta:
    kind, version, writer, lease_until, body = row
    return unpack_body(kind, body, version, writer or None, lease_until)


def _below(path: bytes) -> tuple[bytes, bytes]:
    """Key range of every parent strictly below ``path`` (``/`` is 0x2f, ``0`` is 0x30)."""
    return path + b"/", path + b"0"


class LocalStore(MetaStore):
    #: the steps of a rename transaction (the hook sees them; raising rolls it back)
    RENAME_STEPS = ("dst", "src", "rekey", "commit")

    def __init__(self, path: str | Path, *, timeout: float = 30.0, synchronous: str = "NORMAL",
                 page_size: int = 1000) -> None:
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF/NORMAL/FULL/EXTRA, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.synchronous = synchronous.upper()
        self.page_size = max(10, int(page_size))
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        c = self._conn()
        c.executescript(SCHEMA)

    # -- connections and transactions -----------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            if self._closed:
                raise ValueError("store is closed")
            c = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(f"PRAGMA synchronous={self.synchronous}")
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    @staticmethod
    def _next_version(c: sqlite3.Connection) -> int:
        version: int = c.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'version' RETURNING value"
        ).fetchone()[0]
        return version

    @staticmethod
    def _row(c: sqlite3.Connection, path: bytes) -> tuple[Any, ...] | None:
        parent, name = paths.split(path)
        row: tuple[Any, ...] | None = c.execute(
            f"SELECT {_COLS} FROM entries WHERE parent = ? AND name = ?", (parent, name)
        ).fetchone()
        return row

    def _meta(self, c: sqlite3.Connection, path: bytes) -> EntryMeta | None:
        row = self._row(c, path)
        if row is None:
            return root_meta() if path == paths.ROOT else None
        return _row_meta(row)

    @staticmethod
    def _has_children(c: sqlite3.Connection, path: bytes) -> bool:
        return c.execute("SELECT 1 FROM entries WHERE parent = ? LIMIT 1", (path,)).fetchone() is not None

    @staticmethod
    def _insert(c: sqlite3.Connection, path: bytes, meta: EntryMeta, version: int, writer: str, lease: float) -> None:
        parent, name = paths.split(path)
        c.execute(
            "INSERT OR REPLACE INTO entries (parent, name, kind, version, writer, lease_until, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (parent, name, meta.kind, version, writer, lease, pack_body(meta)),
        )

    @staticmethod
    def _remove(c: sqlite3.Connection, path: bytes) -> None:
        parent, name = paths.split(path)
        c.execute("DELETE FROM entries WHERE parent = ? AND name = ?", (parent, name))

    # -- operations (inside a transaction) ------------------------------------------------

    def _check_parent(self, c: sqlite3.Connection, path: bytes) -> None:
        """Writes need an existing parent directory (as in the Redis engine, where the
        parent's hash header says so)."""
        parent = paths.split(path)[0]
        if parent in (paths.ROOT, paths.ROOT_PARENT):
            return
        row = self._row(c, parent)
        if row is None or row[0] != "dir":
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)

    def _create(self, c: sqlite3.Connection, path: bytes, meta: EntryMeta) -> bool:
        check_meta(meta)
        if path == paths.ROOT or self._row(c, paths.check(path)) is not None:
            return False
        self._check_parent(c, path)
        self._insert(c, path, meta, self._next_version(c), "", 0.0)
        return True

    def _put(self, c: sqlite3.Connection, path: bytes, meta: EntryMeta, expect_version: int | None,
             owners: tuple[str, ...] | None = None) -> int | None:
        check_meta(meta)
        row = self._row(c, paths.check(path))
        if path == paths.ROOT and meta.kind != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "the root is a directory", path)
        writer, lease = "", 0.0
        if row is None:
            if expect_version not in (None, 0):
                return None
            self._check_parent(c, path)
        else:
            if expect_version is not None and expect_version != row[1]:
                return None
            if owners and owners_arg(owners) and row[0] != "dir":
                primary = _row_meta(row).primary
                if primary and primary not in owners:
                    raise NotPrimary(path, primary, row[1])
            if (row[0] == "dir") != (meta.kind == "dir"):
                if row[0] == "dir":
                    raise IsADirectoryError(errno.EISDIR, "is a directory", path)
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
            writer, lease = row[2], row[3]
        v = self._next_version(c)
        self._insert(c, path, meta, v, writer, lease)
        return v

    def _delete(self, c: sqlite3.Connection, path: bytes, expect_version: int | None) -> bool:
        if paths.check(path) == paths.ROOT:
            raise OSError(errno.EBUSY, "cannot remove the root", path)
        row = self._row(c, path)
        if row is None or (expect_version is not None and expect_version != row[1]):
            return False
        if row[0] == "dir" and self._has_children(c, path):
            raise not_empty(path)
        self._remove(c, path)
        return True

    def _do(self, c: sqlite3.Connection, op: Op) -> object:
        op.check()
        if op.op == "create":
            return self._create(c, op.path, op.entry())
        if op.op == "put":
            return self._put(c, op.path, op.entry(), op.expect_version, op.owners)
        if op.op == "acquire":
            return self._acquire(c, op.path, op.holder(), op.lease_seconds)
        if op.op == "release":
            self._release(c, op.path, op.holder())
            return None
        return self._delete(c, op.path, op.expect_version)

    # -- the API --------------------------------------------------------------------------

    def get(self, path: bytes) -> EntryMeta | None:
        return self._meta(self._conn(), paths.check(path))

    def create(self, path: bytes, meta: EntryMeta) -> bool:
        with self._tx() as c:
            return self._create(c, path, meta)

    def put(self, path: bytes, meta: EntryMeta, expect_version: int | None = None,
            owners: tuple[str, ...] | None = None) -> int | None:
        with self._tx() as c:
            return self._put(c, path, meta, expect_version, owners)

    def delete(self, path: bytes, expect_version: int | None = None) -> bool:
        with self._tx() as c:
            return self._delete(c, path, expect_version)

    def _entries(self, path: bytes) -> Iterator[tuple[bytes, EntryMeta]]:
        after = None
        while True:
            c = self._conn()
            if after is None:
                rows = c.execute(
                    f"SELECT name, {_COLS} FROM entries WHERE parent = ? ORDER BY name LIMIT ?",
                    (path, self.page_size)).fetchall()
            else:
                rows = c.execute(
                    f"SELECT name, {_COLS} FROM entries WHERE parent = ? AND name > ?"
                    " ORDER BY name LIMIT ?", (path, after, self.page_size)).fetchall()
            for row in rows:
                yield row[0], _row_meta(row[1:])
            if len(rows) < self.page_size:
                return
            after = rows[-1][0]

    def acquire_write(self, path: bytes, node: str, lease_seconds: float) -> bool:
        if not node or "|" in node:
            raise ValueError(f"bad node id {node!r}")
        with self._tx() as c:
            return self._acquire(c, path, node, lease_seconds)

    def _acquire(self, c: sqlite3.Connection, path: bytes, node: str, lease_seconds: float) -> bool:
        row = self._row(c, paths.check(path))
        if row is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        now = time.time()
        if row[2] and row[2] != node and row[3] > now:
            return False
        parent, name = paths.split(path)
        c.execute("UPDATE entries SET writer = ?, lease_until = ? WHERE parent = ? AND name = ?",
                  (node, now + max(0.001, lease_seconds), parent, name))
        return True

    def release_write(self, path: bytes, node: str) -> None:
        with self._tx() as c:
            self._release(c, path, node)

    @staticmethod
    def _release(c: sqlite3.Connection, path: bytes, node: str) -> None:
        parent, name = paths.split(paths.check(path))
        c.execute("UPDATE entries SET writer = '', lease_until = 0"
                  " WHERE parent = ? AND name = ? AND writer = ?", (parent, name, node))

    def apply(self, ops: list[Op]) -> list[object]:
        """One transaction for the whole batch; per op its result or its exception."""
        out: list[object] = []
        with self._tx() as c:
            for op in ops:
                try:
                    out.append(self._do(c, op))
                except (OSError, ValueError, TypeError) as e:
                    out.append(e)
        return out

    def rename(self, src: bytes, dst: bytes, *, replace: bool = True) -> None:
        paths.check(src)
        paths.check(dst)
        if src == paths.ROOT or dst == paths.ROOT:
            raise OSError(errno.EBUSY, "cannot rename the root", src)
        with self._tx() as c:
            row = self._row(c, src)  # not the root: its row is its entry
            if row is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            s = _row_meta(row)
            if src == dst:
                return
            if paths.is_within(dst, src):
                raise invalid(src, "cannot move a directory into itself")
            d = self._meta(c, dst)
            check_destination(s, d, dst, replace)
            if d is not None and d.kind == "dir" and self._has_children(c, dst):
                raise not_empty(dst)
            dp = paths.split(dst)[0]
            pm = self._meta(c, dp)
            if pm is None or pm.kind != "dir":
                raise FileNotFoundError(errno.ENOENT, "destination directory missing", dp)
            self._insert(c, dst, s, self._next_version(c), row[2], row[3])
            self._step("dst")
            self._remove(c, src)
            self._step("src")
            if s.kind == "dir":
                self._rekey(c, src, dst)
                self._step("rekey")
        self._step("commit")

    def _rekey(self, c: sqlite3.Connection, src: bytes, dst: bytes) -> None:
        """Move every entry below ``src`` to below ``dst``: O(subtree)."""
        lo, hi = _below(src)
        rows = c.execute(
            "SELECT parent, name, kind, version, writer, lease_until, body FROM entries"
            " WHERE parent = ? OR (parent >= ? AND parent < ?)", (src, lo, hi)).fetchall()
        c.execute("DELETE FROM entries WHERE parent = ? OR (parent >= ? AND parent < ?)",
                  (src, lo, hi))
        c.executemany(
            "INSERT INTO entries (parent, name, kind, version, writer, lease_until, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(paths.rebase(r[0], src, dst), *r[1:]) for r in rows])

    def fsck(self, repair: bool = False) -> FsckReport:
        """Transactions leave nothing half done and writes check their parent, so this
        only finds entries whose directory is missing if something else wrote the file."""
        rep = new_report(repair)
        c = self._conn()
        parents = [r[0] for r in c.execute("SELECT DISTINCT parent FROM entries")]
        rep["entries"] = c.execute("SELECT count(*) FROM entries WHERE parent != ''").fetchone()[0]
        for p in parents:
            if p == paths.ROOT_PARENT:
                continue
            rep["dirs"] += 1
            m = self._meta(c, p)
            if m is not None and m.kind == "dir":
                continue
            rep["orphan_dirs"] += 1
            if repair:
                with self._tx() as tc:
                    q = p
                    missing = []
                    while q != paths.ROOT and self._row(tc, q) is None:
                        missing.append(q)
                        q = paths.split(q)[0]
                    for q in reversed(missing):
                        self._insert(tc, q, dir_meta(0o755), self._next_version(tc), "", 0.0)
                        rep["resurrected_dirs"] += 1
        rep["problems"] = sum(rep[n] for n in PROBLEMS)
        return rep

    def ping(self) -> bool:
        try:
            return bool(self._conn().execute("SELECT 1").fetchone() == (1,))
        except sqlite3.Error:
            return False

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
            self._closed = True
        for c in conns:
            c.close()

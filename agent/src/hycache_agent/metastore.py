"""The local metadata store: the namespace's durable state in SQLite, with group commit.

The namespace lives in memory (every lookup and getattr is a dictionary access); this
module makes each change durable before the operation that made it is acknowledged.
Changes are recorded on the trio thread as *intents* (inode X is dirty, entry (P, name)
now points to Y, ...). :meth:`MetaJournal.sync` turns every pending intent into one SQLite
transaction and commits it on a worker thread, so concurrent operations share a commit
(group commit) and no SQLite call ever runs on the event loop thread.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives a
crash of the agent process (SIGKILL); an fsync on a file also checkpoints durability for a
power failure via :meth:`MetaJournal.sync` with ``durable=True``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
# upgrades from an older user_version (each step brings the schema one version up)
MIGRATIONS = {1: "ALTER TABLE inodes ADD COLUMN replicas TEXT NOT NULL DEFAULT ''"}

SCHEMA = """
CREATE TABLE IF NOT EXISTS inodes (
    ino INTEGER PRIMARY KEY,
    mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
    nlink INTEGER NOT NULL, size INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    rdev INTEGER NOT NULL DEFAULT 0,
    target BLOB,
    tier TEXT,
    pinned INTEGER NOT NULL DEFAULT 0,
    hits INTEGER NOT NULL DEFAULT 0,
    last_access INTEGER NOT NULL DEFAULT 0,
    replicas TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS dentries (
    parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,
    PRIMARY KEY (parent, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xattrs (
    ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY, value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL, path BLOB NOT NULL, path2 BLOB, meta BLOB
);
"""
# The outbox holds namespace changes not yet published to the global namespace (the
# DHT). Rows are written in the same transaction as the change itself (transactional
# outbox), so a change is never acknowledged without its publication being queued.

INODE_COLUMNS = (
    "ino", "mode", "uid", "gid", "nlink", "size", "atime_ns", "mtime_ns", "ctime_ns",
    "rdev", "target", "tier", "pinned", "hits", "last_access", "replicas",
)
_UPSERT_INODE = (
    f"INSERT OR REPLACE INTO inodes ({', '.join(INODE_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(INODE_COLUMNS))})"
)


@dataclass
class Snapshot:
    """Everything the store holds, as loaded at start-up."""

    inodes: list[tuple[Any, ...]] = field(default_factory=list)
    dentries: list[tuple[int, bytes, int]] = field(default_factory=list)
    xattrs: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)


class SQLiteStore:
    """Blocking SQLite access.  Only ever called from worker threads (or before the loop)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            version = SCHEMA_VERSION
        while version in MIGRATIONS:
            log.info("%s: upgrading the metadata schema from version %d", path, version)
            self._db.execute(MIGRATIONS[version])
            version += 1
            self._db.execute(f"PRAGMA user_version={version}")
        if version != SCHEMA_VERSION:
            raise RuntimeError(f"{path}: metadata schema version {version}, this agent supports {SCHEMA_VERSION}")

    def load(self) -> Snapshot:
        with self._lock:
            snap = Snapshot()
            snap.inodes = self._db.execute(f"SELECT {', '.join(INODE_COLUMNS)} FROM inodes").fetchall()
            snap.dentries = self._db.execute("SELECT parent, name, ino FROM dentries").fetchall()
            snap.xattrs = self._db.execute("SELECT ino, name, value FROM xattrs").fetchall()
            snap.counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            return snap

    def apply(self, batch: Iterable[tuple[str, tuple[Any, ...]]], durable: bool = False) -> None:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in batch:
                    cur.execute(sql, params)
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
            if durable:
                # WAL + synchronous=NORMAL syncs at checkpoint; force the log to disk now.
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def outbox_head(self, limit: int) -> list[tuple[int, str, bytes, bytes | None, bytes | None]]:
        with self._lock:
            return self._db.execute(
                "SELECT seq, op, path, path2, meta FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()

    def outbox_done(self, upto_seq: int) -> int:
        """Delete the rows applied up to ``upto_seq``; returns how many are left."""
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE seq <= ?", (upto_seq,))
            return self._db.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def outbox_size(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()


class MetaJournal:
    """Pending namespace changes, made durable in group commits off the event loop."""

    def __init__(self, store: SQLiteStore, inode_row: Callable[[int], tuple[Any, ...] | None]) -> None:
        self.store = store
        self._inode_row = inode_row  # current state of an inode, or None if it is gone
        self._dirty_inodes: set[int] = set()
        self._ops: list[tuple[str, tuple[Any, ...]]] = []
        self._counters: dict[str, int] = {}
        self._recorded = 0  # sequence number of the last recorded change
        self._durable_upto = 0
        self._lock = trio.Lock()
        self.commits = 0
        self.failed: BaseException | None = None
        # set by the cluster link: turns the batch's changes into outbox rows
        # (op, path, path2, meta) given the dirty inodes; called on the trio thread
        self.outbox_hook: Callable[[set[int]], list[tuple[str, bytes, bytes | None, bytes | None]]] | None = None
        self.on_commit: Callable[[], None] | None = None
        self._outbox_retry: list = []
        self._outbox_taken: list = []

    # -- recording (trio thread, synchronous, O(1)) ---------------------------------
    def inode(self, ino: int) -> None:
        self._dirty_inodes.add(ino)
        self._recorded += 1

    def link(self, parent: int, name: bytes, ino: int) -> None:
        self._ops.append(("INSERT OR REPLACE INTO dentries (parent, name, ino) VALUES (?, ?, ?)", (parent, name, ino)))
        self._recorded += 1

    def unlink(self, parent: int, name: bytes) -> None:
        self._ops.append(("DELETE FROM dentries WHERE parent = ? AND name = ?", (parent, name)))
        self._recorded += 1

    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        self._ops.append(("INSERT OR REPLACE INTO xattrs (ino, name, value) VALUES (?, ?, ?)", (ino, name, value)))
        self._recorded += 1

    def del_xattr(self, ino: int, name: bytes) -> None:
        self._ops.append(("DELETE FROM xattrs WHERE ino = ? AND name = ?", (ino, name)))
        self._recorded += 1

    def touch(self) -> None:
        """Something for the next commit that is neither an inode nor an entry (an
        outbox row queued by the cluster link)."""
        self._recorded += 1

    def counter(self, name: str, value: int) -> None:
        self._counters[name] = value
        self._recorded += 1

    @property
    def pending(self) -> int:
        return self._recorded - self._durable_upto

    def _take_batch(self) -> tuple[list[tuple[str, tuple[Any, ...]]], list[tuple[str, tuple[Any, ...]]], set[int]]:
        """(the whole batch, its entry/xattr operations, its dirty inodes) — the last two
        are what a failed commit puts back for the next attempt."""
        ops = self._ops
        self._ops = []
        batch = list(ops)
        dirty = self._dirty_inodes
        for ino in dirty:
            row = self._inode_row(ino)
            if row is None:
                batch.append(("DELETE FROM inodes WHERE ino = ?", (ino,)))
                batch.append(("DELETE FROM xattrs WHERE ino = ?", (ino,)))
            else:
                batch.append((_UPSERT_INODE, row))
        self._dirty_inodes = set()
        for name, value in self._counters.items():
            batch.append(("INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)", (name, value)))
        self._counters = {}
        rows, self._outbox_retry = self._outbox_retry, []
        if self.outbox_hook is not None:
            rows.extend(self.outbox_hook(dirty))
        for row in rows:
            batch.append(("INSERT INTO outbox (op, path, path2, meta) VALUES (?, ?, ?, ?)", row))
        self._outbox_taken = rows
        return batch, ops, dirty

    # -- committing ------------------------------------------------------------------
    async def sync(self, durable: bool = False) -> None:
        """Return once every change recorded before this call is committed."""
        target = self._recorded
        async with self._lock:
            if self._durable_upto >= target and not durable:
                return
            upto = self._recorded
            batch, ops, dirty = self._take_batch()
            try:
                await trio.to_thread.run_sync(self.store.apply, batch, durable)
            except Exception as exc:  # keep the changes so the next sync retries them
                self._ops[:0] = ops
                self._dirty_inodes |= dirty
                self._outbox_retry = self._outbox_taken + self._outbox_retry
                self.failed = exc
                log.error("metadata commit failed (%d changes kept for retry): %s", len(batch), exc)
                raise
            self.failed = None
            self.commits += 1
            self._durable_upto = upto
            if self.on_commit is not None:
                self.on_commit()

    def sync_blocking(self) -> None:
        """Commit everything from the calling thread (start-up and shutdown only)."""
        self.store.apply(self._take_batch()[0], True)
        self._durable_upto = self._recorded

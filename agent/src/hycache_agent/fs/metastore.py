"""The local metadata store: the namespace's durable state in SQLite, with group commit.

The namespace lives in memory (every lookup and getattr is a dictionary access); this
module makes its changes durable.  Changes are recorded on the trio thread as *intents*
(inode X is dirty, entry (P, name) now points to Y, ...).  A commit turns every pending
intent into one SQLite transaction (group commit), built on the trio thread and applied
by the journal's own committer thread, in order, so no SQLite call ever runs on the event
loop thread.  :meth:`MetaJournal.commit_soon` hands a batch over and returns at once (the
commit overlaps with whatever the application does next); :meth:`MetaJournal.sync` waits
for one.  The committer wakes the event loop only when somebody waits.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives a
crash of the agent process (SIGKILL); an fsync on a file also checkpoints durability for a
power failure via :meth:`MetaJournal.sync` with ``durable=True``.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from hycache_agent.fs.lane import Lane
from hycache_agent.fs.redolog import RedoLog

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
# the committer thread's nice value (weight 335 against a request thread's 1024)
JOURNAL_NICE = 5
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

    def apply(self, batch: Iterable[tuple[str, tuple[Any, ...]]], durable: bool = False,
              outbox_seq: bool = False) -> int | None:
        """One transaction.  ``outbox_seq``: return the outbox's last sequence number as of
        this commit (the batch queued outbox rows)."""
        last = None
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                # runs of the same statement as one executemany (fewer calls into SQLite,
                # each of which hands the GIL over); the order is kept
                for sql, group in itertools.groupby(batch, key=lambda op: op[0]):
                    cur.executemany(sql, [params for _, params in group])
                if outbox_seq:
                    last = cur.execute("SELECT max(seq) FROM outbox").fetchone()[0]
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
            if durable:
                # WAL + synchronous=NORMAL syncs at checkpoint; force the log to disk now.
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return last

    def outbox_head(self, limit: int) -> list[tuple[int, str, bytes, bytes | None, bytes | None]]:
        with self._lock:
            return self._db.execute(
                "SELECT seq, op, path, path2, meta FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()

    def outbox_done(self, upto_seq: int) -> int:
        """Delete the rows applied up to ``upto_seq``; returns how many are left (from the
        sequence numbers, O(log n): rows are added in order and removed from the head, and
        the count is exactly 0 when none is left)."""
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE seq <= ?", (upto_seq,))
            last = self._db.execute("SELECT max(seq) FROM outbox").fetchone()[0]
            return 0 if last is None else last - upto_seq

    def outbox_published_upto(self) -> int:
        """The sequence number below the outbox's first row (all before it are published)."""
        with self._lock:
            first = self._db.execute("SELECT min(seq) FROM outbox").fetchone()[0]
            if first is not None:
                return first - 1
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'").fetchone()
            return row[0] if row else 0

    def outbox_size(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()


@dataclass(eq=False)
class _Batch:
    upto: int  # the journal sequence number this batch makes durable
    sql: list[tuple[str, tuple[Any, ...]]]
    durable: bool  # also checkpoint the WAL (fsync, fsyncdir)
    outbox_rows: int
    redo_upto: int = 0  # the last redo record this batch covers (its checkpoint)


@dataclass(eq=False)
class _Waiter:
    target: int
    durable: bool
    event: trio.Event
    error: BaseException | None = None


class JournalWatcher(Protocol):
    """Told of every change the journal records, as it is recorded."""

    def inode(self, ino: int) -> None: ...

    def link(self, parent: int, name: bytes, ino: int) -> None: ...

    def unlink(self, parent: int, name: bytes) -> None: ...

    def xattr(self, ino: int) -> None: ...


class MetaJournal:
    """Pending namespace changes, made durable in group commits off the event loop."""

    RETRY_SECONDS = 0.5  # after a failed commit (disk full, I/O error): the batch is retried

    def __init__(self, store: SQLiteStore, inode_row: Callable[[int], tuple[Any, ...] | None]) -> None:
        self.store = store
        self._inode_row = inode_row  # current state of an inode, or None if it is gone
        self._dirty_inodes: set[int] = set()
        self._ops: list[tuple[str, tuple[Any, ...]]] = []
        self._counters: dict[str, int] = {}
        self._recorded = 0  # sequence number of the last recorded change
        self._queued_upto = 0  # ... of the last one handed to the committer
        self._durable_upto = 0  # ... of the last one committed (written by the committer)
        self._checkpointed_upto = 0  # ... committed with durable=True
        self.commits = 0
        self.failed: BaseException | None = None
        # set by the cluster link: turns the batch's changes into outbox rows
        # (op, path, path2, meta) given the dirty inodes; called on the trio thread
        self.outbox_hook: Callable[[set[int]], list[tuple[str, bytes, bytes | None, bytes | None]]] | None = None
        # called on the trio thread after a commit that queued outbox rows, with the
        # outbox's last sequence number then
        self.on_commit: Callable[[int], None] | None = None
        # the committer: batches applied in order on the lane's thread; a failed batch is
        # retried before the next, so nothing recorded is ever dropped or reordered
        # niced: a commit nobody waits for takes the cores the requests leave (while the
        # cores are busy the commits grow, fewer and larger); a sync() waits for it as before
        self.lane = Lane("journal", hold=False, nice=JOURNAL_NICE)  # a commit is a batch already (group commit)
        self._unapplied: deque[_Batch] = deque()  # handed over, not committed yet
        self._deferred = False  # commit_soon() came while a commit was in flight
        self._waiters: list[_Waiter] = []
        # the redo log (fs/redolog.py): name changes safe from a crash before their commit;
        # None: every writer's close waits for its name's commit
        self.redo: RedoLog | None = None
        # no redo record until every change recorded up to this journal sequence number
        # is committed: a change was not logged (the ring was full, or a takeover), and a
        # record replayed after it could depend on it
        self._redo_blocked = 0
        # told of every change as it is recorded (trio thread): the FUSE adapter's answer
        # table drops what it holds of it (fuse/answers.py)
        self.watcher: JournalWatcher | None = None

    # -- the redo log (trio thread) ----------------------------------------------------
    def redo_append(self, payload: bytes) -> bool:
        """Log one name change just recorded (fs/redolog.py).  True: it survives a crash of
        the agent from now on; False: only once committed (nobody waits for it unless it
        must: a writer's close, through ``Inode.name_seq``)."""
        redo = self.redo
        if redo is None:
            return False
        if self._redo_blocked > self._durable_upto or redo.append(payload) is None:
            self._redo_blocked = self._recorded
            redo.reader_may_log(False)
            return False
        return True

    def logged_so_far(self) -> bool:
        """Whether every name change recorded so far survives a crash without its commit
        (the redo log took each one): then nobody needs the commit at once, and it may
        wait for the next changes' company."""
        return self.redo is not None and self._redo_blocked <= self._durable_upto

    def redo_skip(self) -> None:
        """A name change that is not logged: later ones are not either until it is committed."""
        if self.redo is not None:
            self._redo_blocked = self._recorded
            self.redo.reader_may_log(False)

    def share_redo(self) -> bool:
        """Let the FUSE reader log the name changes it answers itself in the redo log
        (``RedoLog.share``); it does while :meth:`logged_so_far`."""
        if self.redo is None or not self.redo.share():
            return False
        self.redo.reader_may_log(self.logged_so_far())
        return True

    # -- recording (trio thread, synchronous, O(1)) ---------------------------------
    def inode(self, ino: int) -> None:
        if self.watcher is not None:
            self.watcher.inode(ino)
        self.usage(ino)

    def usage(self, ino: int) -> None:
        """An inode's usage counts changed (hits, last access): its row is written with
        the next commit; the watcher is not told (they are no attributes).  (Also the
        second half of :meth:`inode`.)"""
        self._dirty_inodes.add(ino)
        self._recorded += 1

    def link(self, parent: int, name: bytes, ino: int) -> None:
        if self.watcher is not None:
            self.watcher.link(parent, name, ino)
        self._ops.append(("INSERT OR REPLACE INTO dentries (parent, name, ino) VALUES (?, ?, ?)", (parent, name, ino)))
        self._recorded += 1

    def unlink(self, parent: int, name: bytes) -> None:
        if self.watcher is not None:
            self.watcher.unlink(parent, name)
        self._ops.append(("DELETE FROM dentries WHERE parent = ? AND name = ?", (parent, name)))
        self._recorded += 1

    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        if self.watcher is not None:
            self.watcher.xattr(ino)
        self._ops.append(("INSERT OR REPLACE INTO xattrs (ino, name, value) VALUES (?, ?, ?)", (ino, name, value)))
        self._recorded += 1

    def del_xattr(self, ino: int, name: bytes) -> None:
        if self.watcher is not None:
            self.watcher.xattr(ino)
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

    @property
    def seq(self) -> int:
        """The sequence number of the last recorded change: ``sync(upto=seq)`` returns once
        it is committed (commits are in order, so everything recorded before it is too)."""
        return self._recorded

    def is_durable(self, seq: int) -> bool:
        return self._durable_upto >= seq

    def _take_batch(self, durable: bool = False) -> _Batch:
        """(trio thread) Every pending intent as one transaction."""
        batch, self._ops = self._ops, []
        dirty, self._dirty_inodes = self._dirty_inodes, set()
        for ino in dirty:
            row = self._inode_row(ino)
            if row is None:
                batch.append(("DELETE FROM inodes WHERE ino = ?", (ino,)))
                batch.append(("DELETE FROM xattrs WHERE ino = ?", (ino,)))
            else:
                batch.append((_UPSERT_INODE, row))
        for name, value in self._counters.items():
            batch.append(("INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)", (name, value)))
        self._counters = {}
        rows = self.outbox_hook(dirty) if self.outbox_hook is not None else []
        for row in rows:
            batch.append(("INSERT INTO outbox (op, path, path2, meta) VALUES (?, ?, ?, ?)", row))
        redo_upto = 0
        if self.redo is not None:  # the checkpoint: committed with what it covers
            redo_upto = self.redo.covered
            batch.append(("INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)", ("redo_upto", redo_upto)))
        self._queued_upto = self._recorded
        return _Batch(self._recorded, batch, durable, len(rows), redo_upto)

    # -- committing ------------------------------------------------------------------
    def commit_soon(self) -> None:
        """(trio thread) Commit everything recorded so far, in the background: handed to
        the committer at once, or, while a commit is in flight, with the next one (group
        commit: concurrent operations share a transaction)."""
        if self._recorded <= self._queued_upto:
            return
        if self._unapplied:
            self._deferred = True
            return
        self._submit()

    def _submit(self, durable: bool = False) -> None:
        self._deferred = False
        batch = self._take_batch(durable)
        self._unapplied.append(batch)
        self.lane.submit(self._apply, batch, then=self._committed)

    async def sync(self, durable: bool = False, upto: int | None = None) -> None:
        """Return once every change recorded before this call (or up to sequence number
        ``upto``) is committed; a commit in flight that covers them is waited for, not
        repeated.  ``durable``: also forced to disk (fsync).  Raises the commit's error
        if it failed (the changes stay queued and are retried)."""
        target = self._recorded if upto is None else upto
        if not durable and self._durable_upto >= target:
            return
        if target > self._queued_upto or durable:
            self._submit(durable)
        waiter = _Waiter(target, durable, trio.Event())
        self._waiters.append(waiter)
        try:
            with self.lane.watching():
                if not self._reached(waiter) and waiter.error is None:
                    await waiter.event.wait()
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        if waiter.error is not None and not self._reached(waiter):
            raise waiter.error

    def _reached(self, w: _Waiter) -> bool:
        return (self._checkpointed_upto if w.durable else self._durable_upto) >= w.target

    def _apply(self, batch: _Batch) -> int | None:
        """(committer thread) Apply one batch; a failure is retried (everything after it
        waits: commits stay in order) and reported to whoever waits meanwhile."""
        while True:
            try:
                last_seq = self.store.apply(batch.sql, batch.durable, outbox_seq=batch.outbox_rows > 0)
            except Exception as exc:
                log.error("metadata commit failed (%d changes kept for retry): %s", len(batch.sql), exc)
                self.failed = exc
                self.lane.call_soon(self._fail_waiters, exc)
                if self.lane.closing:  # sync_blocking() takes it from here
                    raise
                time.sleep(self.RETRY_SECONDS)
                continue
            self._unapplied.popleft()
            self.failed = None
            self.commits += 1
            self._durable_upto = batch.upto
            redo = self.redo
            if redo is not None:
                if batch.redo_upto > redo.checkpoint:
                    redo.checkpoint = batch.redo_upto
                redo.prefault()  # the next records' pages writable, off the loop thread
            if batch.durable:
                self._checkpointed_upto = batch.upto
            return last_seq

    def _committed(self, last_seq: int | None, error: BaseException | None) -> None:
        """(trio thread)"""
        if last_seq is not None and self.on_commit is not None:
            self.on_commit(last_seq)
        if self.redo is not None:  # an unlogged change committed: the reader logs again
            self.redo.reader_may_log(self.logged_so_far())
        if self._deferred and not self._unapplied and self.lane.running:
            self._submit()  # (stopped: sync_blocking commits what was deferred itself)
        for w in [w for w in self._waiters if self._reached(w)]:
            self._waiters.remove(w)
            w.event.set()

    def _fail_waiters(self, error: BaseException) -> None:
        """(trio thread)"""
        for w in self._waiters:
            w.error = error
            w.event.set()
        self._waiters.clear()

    def sync_blocking(self) -> None:
        """Commit everything from the calling thread (start-up and shutdown only: the
        committer is stopped first)."""
        self.lane.close()
        while self._unapplied:  # left by a failing committer: in order, before the rest
            self.store.apply(self._unapplied[0].sql, True)
            self._unapplied.popleft()
        batch = self._take_batch(True)
        self.store.apply(batch.sql, True)
        self._durable_upto = self._checkpointed_upto = self._recorded
        if self.redo is not None:
            self.redo.checkpoint = max(self.redo.checkpoint, batch.redo_upto)

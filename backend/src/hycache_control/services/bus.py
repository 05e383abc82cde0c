"""What several control-plane processes on one PostgreSQL database tell each other.

* ``Bus``: PostgreSQL LISTEN/NOTIFY on one channel.  A notification is sent inside the
  transaction that made the change (``notify(session, kind, data)``), so it is delivered
  at commit and only then; every process (itself included, which ignores its own) gets it
  on a listening connection read by one thread, and the handler of its kind runs there.
  Kinds: ``e`` a new event id (the stream's replay), ``a`` an action item's new view,
  ``p`` a node's policy row changed, ``w`` items became deliverable to nodes, ``j`` a job
  was placed online on a node (the tie-break of ``POST /placements``), ``h`` a process
  says hello every ``HELLO_PERIOD`` (so each knows whether it is alone: a process alone
  shares no liveness through the database).
* ``Leader``: one process holds a session-level advisory lock and does what must happen
  once per cluster (record node transitions, downsample); when its process dies the lock
  goes with its connection and another process takes over within a monitor tick.

On SQLite (one process by construction) both are inert: ``notify`` does nothing and the
process is always the leader.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from ..db import Database

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

CHANNEL = "hycache_control"
LEADER_LOCK = 0x48794361  # "HyCa": the advisory lock key of the leader
EVENTS_LOCK = 0x48794345  # serialises event inserts: ids commit in order, so a resume misses none
MAX_PAYLOAD = 7900  # PostgreSQL's bound on a notification is 8000 bytes
HELLO_PERIOD = 2.0
PEER_TIMEOUT = 3 * HELLO_PERIOD


def own_connection(db: Database) -> psycopg.Connection[Any]:
    """A psycopg connection outside the pool (autocommit), for what lives as long as the
    process: the listener, the leader's lock."""
    import psycopg
    url = db.engine.url
    return psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password,
                           dbname=url.database, autocommit=True, connect_timeout=10)


class Bus:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.enabled = db.dialect == "postgresql"
        self.origin = uuid.uuid4().hex[:12]  # this process
        self.handlers: dict[str, Callable[[Any], None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.peers: dict[str, float] = {}  # other processes: origin -> when last heard (monotonic)

    def others(self) -> bool:
        """Does another process serve this database now (heard within PEER_TIMEOUT)?"""
        now = time.monotonic()
        return any(now - t < PEER_TIMEOUT for t in list(self.peers.values()))

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        self.handlers[kind] = handler

    def notify(self, session, kind: str, data: Any) -> None:
        """Queue a notification in ``session``'s transaction (sent at its commit)."""
        if not self.enabled:
            return
        payload = json.dumps([self.origin, kind, data], separators=(",", ":"), default=str)
        if len(payload.encode()) > MAX_PAYLOAD:
            log.warning("bus: a %s notification of %d bytes is too large; dropped", kind, len(payload))
            return
        session.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": payload})

    def notify_now(self, kind: str, data: Any) -> None:
        """Send a notification in a transaction of its own (blocking)."""
        if self.enabled:
            with self.db.session() as s:
                self.notify(s, kind, data)

    # -- listening ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bus", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _connect(self):
        conn = own_connection(self.db)
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _run(self) -> None:
        conn = None
        next_hello = 0.0
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    self._dispatch_resync()
                if time.monotonic() >= next_hello:
                    next_hello = time.monotonic() + HELLO_PERIOD
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps([self.origin, "h", None])))
                for n in conn.notifies(timeout=0.5):
                    self._dispatch(n.payload)
            except Exception as e:  # the database went away: reconnect, and resync what may be missed
                log.warning("bus: listening failed, reconnecting: %s", e)
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = None
                self._stop.wait(1.0)
        if conn is not None:
            conn.close()

    def _dispatch(self, payload: str) -> None:
        try:
            origin, kind, data = json.loads(payload)
        except (ValueError, TypeError):
            return
        self.received += 1
        if origin == self.origin:
            return
        self.peers[origin] = time.monotonic()
        h = self.handlers.get(kind)
        if h is not None:
            try:
                h(data)
            except Exception:
                log.exception("bus: handler of %s failed", kind)

    def _dispatch_resync(self) -> None:
        h = self.handlers.get("resync")
        if h is not None:
            try:
                h(None)
            except Exception:
                log.exception("bus: resync failed")


class Leader:
    """Who does the once-per-cluster work: the holder of an advisory lock on a connection
    of its own (released by PostgreSQL when that process dies)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn: psycopg.Connection[Any] | None = None
        self.is_leader = db.dialect != "postgresql"
        self.pid = os.getpid()

    def check(self) -> bool:
        """Try to become (or stay) the leader; blocking, one round trip."""
        if self.db.dialect != "postgresql":
            return True
        try:
            if self._conn is None:
                self._conn = own_connection(self.db)
            if self.is_leader:
                self._conn.execute("SELECT 1")  # the connection (and so the lock) is still there
            else:
                row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
                if row is None:
                    raise RuntimeError("pg_try_advisory_lock returned no row")
                self.is_leader = bool(row[0])
                if self.is_leader:
                    log.info("this process (pid %d) leads the cluster's once-only work", self.pid)
        except Exception as e:
            log.warning("leader check failed: %s", e)
            self.is_leader = False
            self.close()
        return self.is_leader

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

"""Announcements of changed entries, heard through Redis Cluster's sharded pub/sub.

Every write of an entry (``put``/``create``/``delete`` and their batches, ``rename``) is
followed on the same master by ``SPUBLISH`` of the path on its directory's channel
(:func:`keys.inval_channel`): in a batch from inside its script, right after the write.  A reader that keeps entries of a
directory subscribes to its channel (``SSUBSCRIBE``) and hears of every later change of
them, so it can keep what it read without asking again.

What a subscriber may rely on, and what it may not:

* A channel covers the entries of its directory read *after* its subscription was
  confirmed (the ``ssubscribe`` reply), until the feed reports it lost.
* Pub/sub is at most once: a dropped connection loses what was published meanwhile.
  Every confirmation of a channel is therefore reported (``"active"``), also the ones a
  reconnection makes behind the caller's back (redis-py resubscribes silently), so the
  caller restarts the channel's coverage then; a slot that moved (``sunsubscribe`` from the
  server) and any connection error are reported as ``"lost"``.

:class:`InvalidationFeed` is blocking and owned by one thread: it calls
:meth:`subscribe` and :meth:`poll` and nothing else touches it.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
from typing import TYPE_CHECKING

from redis import exceptions as rex

from . import keys
from .cluster_client import RETRIABLE

if TYPE_CHECKING:
    from redis.cluster import ClusterPubSub

    from .redis_base import RedisBase

log = logging.getLogger(__name__)

UNREAD_POLLS_MAX = 64  # then the connections are dropped (FeedLost) rather than spun on


class FeedLost(Exception):
    """The feed's connections failed: everything it covered may have missed changes."""


class InvalidationFeed:
    def __init__(self, store: RedisBase) -> None:
        self._store = store
        self._ns = store.ns
        self._pubsub: ClusterPubSub | None = None
        self.channels: dict[bytes, bytes] = {}  # channel -> directory path
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._unread_polls = 0  # polls in a row a connection was readable and nothing was read

    def channel(self, dirpath: bytes) -> bytes:
        return keys.inval_channel(self._ns, dirpath)

    def wake(self) -> None:
        """(any thread) Make a :meth:`poll` in progress return now."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def subscribe(self, dirpaths: list[bytes]) -> None:
        """SSUBSCRIBE to the directories' channels (confirmed later, by :meth:`poll`)."""
        if self._pubsub is None:
            self._pubsub = self._store.c.rc.pubsub()
        new = []
        for d in dirpaths:
            ch = self.channel(d)
            if ch not in self.channels:
                self.channels[ch] = d
                new.append(ch)
        try:
            for ch in new:  # one per call: channels of different slots may be on one node
                self._pubsub.ssubscribe(ch)
        except (*RETRIABLE, rex.RedisError) as e:
            raise self._lost(f"subscribing: {e!r}") from e  # every channel is subscribed afresh

    def unsubscribe(self, dirpaths: list[bytes]) -> None:
        chans = [self.channel(d) for d in dirpaths if self.channel(d) in self.channels]
        for ch in chans:
            del self.channels[ch]
        if self._pubsub is not None and chans:
            try:
                for ch in chans:
                    self._pubsub.sunsubscribe(ch)
            except (*RETRIABLE, rex.RedisError) as e:
                raise self._lost(f"unsubscribing: {e!r}") from e

    def poll(self, timeout: float) -> list[tuple[str, bytes]]:
        """Events within ``timeout`` seconds (or until :meth:`wake`): ``("changed",
        path)``, ``("active", dirpath)`` (a channel's subscription confirmed),
        ``("lost", dirpath)`` (the server dropped it: its slot moved).  Raises FeedLost
        when a connection failed (every channel is dropped: subscribe again)."""
        ps = self._pubsub
        waits: list[int | socket.socket] = [self._wake_r]  # the wake pipe, then the connections
        if ps is not None:
            for node_ps in list(ps.node_pubsub_mapping.values()):
                conn = node_ps.connection
                if conn is not None and conn._sock is not None:
                    waits.append(conn._sock)
        try:
            ready, _, _ = select.select(waits, [], [], timeout)
        except (OSError, ValueError) as e:  # a socket closed under us
            raise self._lost(f"waiting: {e!r}") from e
        try:
            while True:
                os.read(self._wake_r, 64)
        except BlockingIOError:
            pass
        events: list[tuple[str, bytes]] = []
        if ps is None:
            return events
        read = 0
        try:
            for _ in range(10000):  # what is buffered, in order; bounded per poll
                if not ps.node_pubsub_mapping:
                    break
                msg = ps.get_sharded_message(timeout=0.0)
                if msg is None:
                    break
                read += 1
                kind = msg["type"]
                kind = kind.decode() if isinstance(kind, bytes) else kind
                ch = msg["channel"]
                ch = ch.encode() if isinstance(ch, str) else ch
                d = self.channels.get(ch)
                if d is None:
                    continue
                if kind == "smessage":
                    data = msg["data"]
                    events.append(("changed", data.encode() if isinstance(data, str) else data))
                elif kind == "ssubscribe":
                    events.append(("active", d))
                elif kind == "sunsubscribe":  # the server's: the slot moved (ours are dropped above)
                    del self.channels[ch]
                    events.append(("lost", d))
        except (*RETRIABLE, rex.RedisError, StopIteration) as e:  # (StopIteration: redis-py's
            raise self._lost(f"{e!r}") from e                     # round robin of its nodes ended)
        # A connection readable with nothing the client reads (a node's subscriber the client
        # keeps but no longer reads from, with bytes pending) would make every wait return at
        # once: a thread spinning on a core.  Many such polls in a row drop the connections.
        if read == 0 and any(w is not self._wake_r for w in ready):
            self._unread_polls += 1
            if self._unread_polls >= UNREAD_POLLS_MAX:
                raise self._lost(f"a connection stayed readable through {UNREAD_POLLS_MAX} polls "
                                 "with nothing read from it")
        else:
            self._unread_polls = 0
        return events

    def _lost(self, why: str) -> FeedLost:
        """The connections dropped (every channel is subscribed afresh): what to raise."""
        self.close_pubsub()
        return FeedLost(why)

    def close_pubsub(self) -> None:
        """Drop the connections and every subscription (a new subscribe starts afresh)."""
        ps, self._pubsub = self._pubsub, None
        self.channels.clear()
        self._unread_polls = 0
        if ps is not None:
            try:
                ps.reset()
            except Exception:
                pass

    def close(self) -> None:
        self.close_pubsub()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def wait_active(feed: InvalidationFeed, dirpaths: list[bytes], timeout: float = 5.0) -> None:
    """(tests, tools) Subscribe and wait for the confirmations."""
    feed.subscribe(dirpaths)
    want = set(dirpaths)
    deadline = time.monotonic() + timeout
    while want and time.monotonic() < deadline:
        for kind, d in feed.poll(0.05):
            if kind == "active":
                want.discard(d)
    if want:
        raise TimeoutError(f"no confirmation for {sorted(want)}")

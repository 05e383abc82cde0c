"""The connection to the metadata store: connecting, the link's state (connecting, ok,
degraded) and one guarded way to ask the store anything.  Every store call runs in a
worker thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from hycache_dht import registry
from hycache_dht.meta import DHTError, DHTUnavailable, EntryMeta, MetaStore

from hycache_agent.cluster.entries import UNREACHABLE

log = logging.getLogger("hycache_agent.cluster.dht_link")  # one log for all the parts of the link

# After the mount comes up, questions to the store wait up to this long for the first
# connection (a rebooted node whose Redis Cluster is still failing over), instead of
# answering at once as if the namespace held only this node's names; past it, the link
# is degraded and lookups serve local names only (as during any outage).
CONNECT_GRACE_SECONDS = 15.0


@dataclass
class LinkStatus:
    state: str = "connecting"  # connecting | ok | degraded
    since: float = field(default_factory=time.time)
    last_error: str | None = None
    published_ops: int = 0
    publish_batches: int = 0
    coalesced: int = 0  # queued ops folded into a newer put of the same path, or dropped (below)
    never_published: int = 0  # files made and removed before their publication: nothing sent of them
    conflicts: int = 0
    remote_fetches: int = 0
    remote_bytes: int = 0
    backlog: int = 0
    # batches that waited for a storm of requests to pass (Publisher.storm_rate), and how
    # long they waited in all
    publish_yields: int = 0
    publish_yielded_seconds: float = 0.0
    # reads of remote copies still filling (remote/copy.py): served from the copy before it
    # was whole, made to wait for the stream, served by a range GET of their own
    filling_reads: int = 0
    filling_waits: int = 0
    filling_ranged: int = 0


class StoreLink:
    """The store, once connected.  ``node_meta`` gives this node's registry entry, written
    before anything else (a peer that sees one of our names must find our address);
    ``on_connected`` is called once the store is there."""

    def __init__(self, store_factory: Callable[[], MetaStore], *, node_meta: Callable[[], EntryMeta],
                 on_connected: Callable[[], None]) -> None:
        self._store_factory = store_factory
        self._node_meta = node_meta
        self._on_connected = on_connected
        self._store: MetaStore | None = None
        self._connected = trio.Event()
        self._connect_grace_until = time.monotonic() + CONNECT_GRACE_SECONDS
        self.status = LinkStatus()

    @property
    def store(self) -> MetaStore:
        if self._store is None:
            raise DHTUnavailable("not connected to the metadata store yet")
        return self._store

    @property
    def is_connected(self) -> bool:
        return self._store is not None

    @property
    def connected(self) -> trio.Event:
        return self._connected

    async def connect(self) -> None:
        backoff = 0.2
        while self._store is None:
            try:
                store = await trio.to_thread.run_sync(self._store_factory)
                await trio.to_thread.run_sync(registry.beat, store, self._node_meta())
                self._store = store
                self._connected.set()
            except Exception as exc:
                self.degraded(exc)
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
        self._on_connected()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    @property
    def reachable(self) -> bool:
        """While degraded, the global view is skipped (names held elsewhere are not
        shown) instead of making every lookup wait for the store's timeout; the
        publisher finds out when the store is back."""
        return self._store is not None and self.status.state != "degraded"

    async def query(self, fn, *args, missing, kwargs=None):
        """One call of the store in a worker thread: ``fn`` is the name of a store method
        or a callable.  ``missing`` when the path is not there; UNREACHABLE before the
        store is connected, while the link is degraded (no call is made) or when the call
        fails (which marks the link degraded).  Other errors (EEXIST, ENOTEMPTY, ...)
        propagate."""
        if self._store is None:
            await self._first_connection()
        if not self.reachable:
            return UNREACHABLE
        if isinstance(fn, str):
            fn = getattr(self.store, fn)
        try:
            if kwargs:
                return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))
            return await trio.to_thread.run_sync(fn, *args)
        except (FileNotFoundError, NotADirectoryError):
            return missing
        except (DHTError, ConnectionError, TimeoutError) as exc:
            self.degraded(exc)
            return UNREACHABLE

    async def _first_connection(self) -> None:
        """Wait (within the grace after start) for the store's first connection: a
        name held by another node must not look absent only because this agent has
        not reached the global namespace yet."""
        remaining = self._connect_grace_until - time.monotonic()
        if remaining > 0:
            with trio.move_on_after(remaining):
                await self._connected.wait()

    async def store_get(self, path: bytes) -> EntryMeta | None:
        meta = await self.query("get", path, missing=None)
        return None if meta is UNREACHABLE else meta

    def degraded(self, exc: BaseException) -> None:
        if self.status.state != "degraded":
            log.warning("global namespace unreachable (%s): serving local files, queueing updates", exc)
            self.status.since = time.time()
        self.status.state = "degraded"
        self.status.last_error = f"{type(exc).__name__}: {exc}"

    def ok(self) -> None:
        if self.status.state != "ok":
            log.info("global namespace reachable%s", " again: backlog drained" if self.status.state == "degraded" else "")
            self.status.since = time.time()
        self.status.state = "ok"

    async def set_state_from_ping(self) -> None:
        try:
            ok = await trio.to_thread.run_sync(self.store.ping)
        except Exception as exc:
            self.degraded(exc)
            return
        if ok:
            self.ok()

"""Publication: every namespace change becomes an *outbox* row in the same SQLite commit
as the change (see :mod:`metastore`); a publisher task sends the rows to the metadata
store in pipelined batches and deletes them once applied.  While the store is unreachable
the agent keeps serving local files, the outbox grows, and the status shows the link as
degraded; when it is back the backlog drains in order.  Nothing acknowledged is lost,
because the outbox is durable."""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from hycache_dht.meta import DHTError, NotPrimary, Op

from hycache_agent.cluster.entries import entry_meta, pack_row_meta, unpack_row_meta
from hycache_agent.cluster.store_link import StoreLink
from hycache_agent.fs.namespace import ROOT_INO, FsError, Inode
from hycache_agent.fs.namespace import join_path as join
from hycache_agent.transport.idle import BackgroundThreads

log = logging.getLogger("hycache_agent.cluster.dht_link")  # one log for all the parts of the link

PUBLISH_BATCH = 512
# the batch after a yield to a storm of requests: what the storm changed, in one pipelined
# batch as far as it goes (files made and removed within it go nowhere: _Batch.delete)
PUBLISH_BATCH_AFTER_STORM = 16384
PUBLISH_LINGER_SECONDS = 0.05  # before each batch: the next commits' rows join it (and coalesce)
STORM_SAMPLE_SECONDS = 0.05  # while yielding to a storm of requests: the rate is sampled over this (shorter: noise)
STORM_SAMPLE_MAX_AGE = 0.25  # an older sample of the request count is not the rate of now
# a yield ends when the rate over this long is below the storm's: one sample's lull (a
# scheduler slice on a loaded machine) is not the end of a storm
STORM_END_SECONDS = 0.25
_STORE_ERRORS = (DHTError, ConnectionError, TimeoutError)

Row = tuple[str, bytes, bytes | None, bytes | None]
T = TypeVar("T")


def _signature(inode: Inode) -> tuple:
    return (inode.mode, inode.uid, inode.gid, inode.size, inode.mtime_ns, inode.ctime_ns, inode.tier,
            inode.target, tuple(inode.replicas), inode.pinned)


class _Batch:
    """(worker thread) Outbox rows applied in order: runs of put/delete/lease acquire and
    release as one pipelined store call, inbox messages together, renames one by one.
    Collects the paths whose puts were applied (``acked``), those refused because another
    node holds them now (``superseded``), those whose write flag another node holds
    (``lost``), and those made and removed within one run, of which nothing went to the
    store (``dropped``)."""

    def __init__(self, store, ownership, status) -> None:
        self.store = store
        self.ownership = ownership
        self.status = status
        self.run: list[Op | None] = []  # (None: dropped)
        self.latest: dict[bytes, int] = {}  # path -> index of its put in ``run``
        # path -> indexes in ``run`` of the ops of a file created in this run (its put and
        # the write flag taken right after it, as only a create's is): nothing of it was
        # in the store before, so its removal in the same run drops them all
        self.created: dict[bytes, list[int]] = {}
        self.messages: list[tuple[bytes, bytes, bytes]] = []
        self.acked: list[bytes] = []
        self.superseded: list[tuple[bytes, NotPrimary]] = []
        self.lost: list[bytes] = []
        self.dropped: list[bytes] = []

    def put(self, path: bytes, meta: bytes, owners: tuple[str, ...]) -> None:
        i = self.latest.get(path)
        if i is not None:
            # a newer put of a path already in this run (a create, then its size at
            # close): one put with the newest metadata, at the first one's place
            first = self.run[i]
            assert first is not None
            owners = tuple(dict.fromkeys((first.owners or ()) + owners))
            self.run[i] = Op.put(path, unpack_row_meta(meta), owners=owners)
            self.status.coalesced += 1
        else:
            self.latest[path] = len(self.run)
            self.run.append(Op.put(path, unpack_row_meta(meta), owners=owners))

    def acquire(self, path: bytes, node: str, seconds: float) -> None:
        i = self.latest.get(path)
        if i is not None and i == len(self.run) - 1 and path not in self.created:
            self.created[path] = [i, i + 1]  # right after the path's first put: a create's
        elif path in self.created:
            self.created[path].append(len(self.run))
        self.run.append(Op.acquire(path, node, seconds))

    def release(self, path: bytes, node: str) -> None:
        if path in self.created:
            self.created[path].append(len(self.run))
        self.run.append(Op.release(path, node))

    def delete(self, path: bytes) -> None:
        self.latest.pop(path, None)
        made = self.created.pop(path, None)
        if made is not None:  # created in this run: neither goes to the store
            for i in made:
                self.run[i] = None
            self.dropped.append(path)
            self.status.coalesced += len(made) + 1
            self.status.never_published += 1
            return
        self.run.append(Op.delete(path))

    def message(self, path: bytes, target: bytes, packed: bytes) -> None:
        """An inbox message: after the run before it, with the messages next to it."""
        if self.run:
            self.flush()
        self.messages.append((path, target, packed))

    def rename(self, path: bytes, path2: bytes, meta: bytes | None) -> None:
        self.flush()
        try:
            self.store.rename(path, path2, replace=True)
        except FileNotFoundError:  # never published under the old name
            if meta is not None:
                self.store.put(path2, unpack_row_meta(meta))
        except _STORE_ERRORS:
            raise
        except OSError as exc:
            self.status.conflicts += 1
            log.warning("global namespace: rename %r → %r not applied: %s", path, path2, exc)

    def flush(self) -> None:
        if self.run:
            run = [op for op in self.run if op is not None]
            if run:
                for op, result in zip(run, self.store.apply(run)):
                    self._result(op, result)
            self.run.clear()
            self.latest.clear()
            self.created.clear()
        if self.messages:
            self.ownership.send_messages(self.store, self.messages)
            self.messages.clear()

    def _result(self, op: Op, result) -> None:
        if op.op in ("acquire", "release"):
            if result is False:
                self.lost.append(op.path)
            elif isinstance(result, _STORE_ERRORS):
                raise result
            # a missing entry (removed, or renamed in the same batch): nothing to hold
        elif isinstance(result, NotPrimary):
            self.superseded.append((op.path, result))
        elif isinstance(result, BaseException):
            if isinstance(result, _STORE_ERRORS):
                raise result
            self.status.conflicts += 1
            log.warning("global namespace: %s %r not applied: %s", op.op, op.path, result)
        elif op.op == "put":
            self.acked.append(op.path)


class Publisher:
    """The outbox's two ends: rows out of each group commit (:meth:`outbox_rows`), and
    the task that publishes them (:meth:`run`)."""

    def __init__(self, engine, link: StoreLink, ownership, *, node_id: str) -> None:
        self.engine = engine
        self.link = link
        self.ownership = ownership
        self.node_id = node_id
        self.status = link.status
        self._wakeup = trio.Event()
        self._published_sig: dict[int, tuple] = {}
        self._unacked: dict[bytes, int] = {}  # path -> ino of a new name not yet published
        self._published_upto = 0  # the outbox's sequence number published so far (attach)
        # (last outbox sequence number, monotonic time) of each commit not published yet:
        # the age of the oldest change waiting (the lag a storm may add, and the status's)
        self._commits: deque[tuple[int, float]] = deque()
        # Publication yields to a storm of requests: while the node serves more than
        # ``storm_rate`` requests a second, a batch waits — the publisher's thread and the
        # Redis servers it keeps busy would take the cores the requests need — but never
        # once its oldest change is ``yield_max`` seconds old: the global namespace lags a
        # busy node by at most that (plus the batches' own time), and a storm that never
        # ends is published behind it as before.  ``requests``: how many requests the node
        # has served since start (None: publication never yields); its last sample (count,
        # monotonic time); an urgent drain (drain_outbox: a change to a name another node
        # holds waits for ours) that does not yield.
        self.requests: Callable[[], int] | None = None
        self.storm_rate = 4000.0
        self.yield_max = 1.0
        self._sample: tuple[int, float] | None = None
        self._urgent = 0
        # the outbox's reads and the Redis pipelines on a niced thread of their own: the
        # requests the agent serves (and the processes making them) get the cores first,
        # and publication takes what is left (its backlog and tails are reported)
        self._thread = BackgroundThreads("hycache-publisher", count=1)

    def attach(self) -> None:
        journal = self.engine.ns.journal
        journal.outbox_hook = self.outbox_rows
        journal.on_commit = self.committed
        self._published_upto = self.engine.store.outbox_published_upto()

    def wake(self) -> None:
        self._wakeup.set()

    # ------------------------------------------------------------------ rows of a commit
    def outbox_rows(self, dirty: set[int]) -> list[Row]:
        """(trio thread, inside a group commit) this batch's changes as outbox rows."""
        ns = self.engine.ns
        rows: list[Row] = []
        tail: list[Row] = []  # after this batch's puts
        put_now: set[int] = set()
        # names whose put found the inode gone already (removed before this commit), and
        # of those the files created here (a create's put is followed by its write flag's
        # acquire): never in the store, so neither the flag nor the removal goes there
        gone: set[bytes] = set()
        made_gone: set[bytes] = set()
        for event in ns.events:
            op = event[0]
            if op in ("put", "take"):
                if not self._put_row(rows, put_now, event) and op == "put" and event[2] is not None:
                    gone.add(event[2])
            elif op == "acquire":  # right after the create's put (before a rename of it)
                if event[1] in gone:
                    gone.discard(event[1])
                    made_gone.add(event[1])
                    continue
                rows.append((op, event[1], None, None))
            elif op in ("release", "notify"):
                tail.append((op, event[1], event[2], event[3]))
            elif op == "delete":
                if event[2] in made_gone:
                    made_gone.discard(event[2])
                    self.status.never_published += 1
                elif event[2] is not None:
                    rows.append(("delete", event[2], None, None))
            elif op == "rename":
                made_gone.discard(event[2])
                self._rename_rows(rows, *event[1:])
        ns.events.clear()
        self._dirty_rows(rows, dirty, put_now)
        rows += tail
        return rows  # counted into the backlog when the commit succeeds (committed)

    def _put_row(self, rows: list[Row], put_now: set[int], event: tuple) -> bool:
        """The put of a "put" or "take" event; False if there is none (the inode is gone)."""
        op, ino, path = event[0], event[1], event[2]
        inode = self.engine.ns.inodes.get(ino)
        if inode is None or path is None:
            return False
        # a takeover's put admits the old holder in the owner guard
        extra = event[3].encode() if op == "take" and event[3] else None
        rows.append(("put", path, extra, pack_row_meta(entry_meta(inode, self.node_id))))
        self._published_sig[ino] = _signature(inode)
        put_now.add(ino)
        if not inode.published:
            self._unacked[path] = ino
        return True

    def _rename_rows(self, rows: list[Row], ino: int, old: bytes | None, new: bytes | None) -> None:
        inode = self.engine.ns.inodes.get(ino)
        if old is None or new is None:
            return
        fallback = pack_row_meta(entry_meta(inode, self.node_id)) if inode is not None else None
        if inode is not None and not inode.is_dir:
            if rows and rows[-1] == ("delete", new, None, None):
                # the name it replaces (dropped just before, fs/namespace.py rename): the
                # store's rename replaces it in one step, so the name is never missing
                rows.pop()
            sig = _signature(inode)
            if self._published_sig.get(ino) != sig:
                # changed since its last put (a write closed in this same batch, then the
                # rename: write a temp name, rename it over the file): the entry goes out
                # under the old name first, so the rename moves the current size and the
                # new name never shows the old entry
                rows.append(("put", old, None, fallback))
                if len(inode.links) == 1:  # (a hard link's other names: put below)
                    self._published_sig[ino] = sig
        rows.append(("rename", old, new, fallback))

    def _dirty_rows(self, rows: list[Row], dirty: set[int], put_now: set[int]) -> None:
        """A put of every name of an inode whose entry changed and was not put above."""
        ns = self.engine.ns
        for ino in dirty:
            if ino in put_now or ino == ROOT_INO:
                continue
            inode = ns.inodes.get(ino)
            if inode is None:
                self._published_sig.pop(ino, None)
                continue
            sig = _signature(inode)
            if self._published_sig.get(ino) == sig or not inode.links:
                continue
            self._published_sig[ino] = sig
            packed = pack_row_meta(entry_meta(inode, self.node_id))
            for path in ns.paths_of(inode):
                rows.append(("put", path, None, packed))

    def committed(self, last_seq: int) -> None:
        """A commit queued outbox rows, up to ``last_seq``: wake the publisher.  (The
        callback may come after the publisher already sent them: the backlog counts from
        what it has published, never twice.)"""
        self.status.backlog = max(self.status.backlog, last_seq - self._published_upto)
        if last_seq > self._published_upto and (not self._commits or last_seq > self._commits[-1][0]):
            self._commits.append((last_seq, time.monotonic()))
        self._wakeup.set()

    def lag(self) -> float:
        """Seconds since the oldest change not published yet was committed (0: none)."""
        commits, upto = self._commits, self._published_upto
        while commits and commits[0][0] <= upto:
            commits.popleft()
        return time.monotonic() - commits[0][1] if commits else 0.0

    def _sample_now(self) -> tuple[int, float]:
        """The node's request count now, kept as the last sample."""
        assert self.requests is not None
        self._sample = (self.requests(), time.monotonic())
        return self._sample

    def _storming(self, then: tuple[int, float], now: tuple[int, float]) -> bool:
        """Whether the node served requests faster than ``storm_rate`` between two samples."""
        return now[1] > then[1] and now[0] - then[0] > self.storm_rate * (now[1] - then[1])

    def _storm(self) -> bool | None:
        """Whether the node served requests faster than ``storm_rate`` since the last sample
        (a fresh one is taken); None if that sample is missing or older than
        STORM_SAMPLE_MAX_AGE (it would average the rate of now with an idle past)."""
        if self.requests is None or self.yield_max <= 0:
            return False
        last, now = self._sample, self._sample_now()
        if last is None or now[1] - last[1] > STORM_SAMPLE_MAX_AGE:
            return None
        return self._storming(last, now)

    async def _yield_to_storm(self) -> bool:
        """Before a batch: wait while the node serves a storm of requests, until its oldest
        change is ``yield_max`` seconds old (see ``storm_rate``).  Whether it waited."""
        if self._urgent:
            return False
        storm = self._storm()
        if storm is None:  # the rate of now first
            await trio.sleep(STORM_SAMPLE_SECONDS)
            storm = self._storm()
        if not storm:
            return False
        t0 = time.monotonic()
        self.status.publish_yields += 1
        assert self._sample is not None  # (taken by _storm)
        window = deque([self._sample])  # the samples of the last STORM_END_SECONDS and one older
        try:
            while not self._urgent and self.lag() < self.yield_max:
                await trio.sleep(STORM_SAMPLE_SECONDS)
                window.append(self._sample_now())
                while len(window) > 2 and window[-1][1] - window[1][1] >= STORM_END_SECONDS:
                    window.popleft()
                if window[-1][1] - window[0][1] >= STORM_END_SECONDS and not self._storming(window[0], window[-1]):
                    break
        finally:
            self.status.publish_yielded_seconds += time.monotonic() - t0
        return True

    async def republish_all(self) -> None:
        """At start: queue a put of every local name (idempotent), so the store holds
        whatever this node changed while it was down or before it joined."""
        ns = self.engine.ns
        count = 0
        stack = [(ROOT_INO, b"/")]
        while stack:
            ino, path = stack.pop()
            for name, child in list(ns.children.get(ino, {}).items()):
                inode = ns.inodes.get(child)
                if inode is None:
                    continue
                ns.events.append(("put", child, join(path, name)))
                count += 1
                if inode.is_dir:
                    stack.append((child, join(path, name)))
                if count % 10000 == 0:
                    await ns.journal.sync()
                    log.info("republishing the local namespace: %d names queued", count)
        await ns.journal.sync()
        log.info("republished %d local names to the global namespace", count)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the publisher's thread."""
        return await self._thread.run(lambda *a: fn(*a[:-1]), *args)

    # ------------------------------------------------------------------ the publisher task
    async def run(self) -> None:
        backoff = 0.1
        store_db = self.engine.store
        rows = await self._off_loop(store_db.outbox_head, PUBLISH_BATCH)
        self.status.backlog = await self._off_loop(store_db.outbox_size)  # rows left by the previous run
        while True:
            if rows is None:
                rows = await self._off_loop(store_db.outbox_head, PUBLISH_BATCH)
            if not self.link.is_connected or not rows:
                await self._idle(bool(rows))
                rows = None
                continue
            if await self._yield_to_storm():
                rows = await self._off_loop(store_db.outbox_head, PUBLISH_BATCH_AFTER_STORM)
            try:
                acked, superseded, lost, dropped = await self._off_loop(self._apply_rows, rows)
            except (*_STORE_ERRORS, OSError) as exc:
                self.link.degraded(exc)
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                rows = None
                continue
            backoff = 0.1
            rows = await self._published(rows)
            await self._settle(acked, superseded, lost, dropped)

    async def _idle(self, pending: bool) -> None:
        """Wait for a commit's wake-up (at most a second): not connected yet (``pending``:
        with rows to send), or nothing to send."""
        if not self.link.is_connected:
            with trio.move_on_after(1.0):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            return
        if self.status.state != "ok":
            await self.link.set_state_from_ping()
        with trio.move_on_after(1.0):
            await self._wakeup.wait()
        self._wakeup = trio.Event()
        if self.requests is not None:  # the linger is the first sample of the request rate
            self._sample = (self.requests(), time.monotonic())
        # pipelined publication: what the next few commits queue goes out in the
        # same batch (one pipeline per hash slot) instead of one batch each
        await trio.sleep(PUBLISH_LINGER_SECONDS)

    async def _published(self, rows: list) -> list:
        """``rows`` are in the store: drop them from the outbox; the next rows."""
        store_db = self.engine.store
        published = len(rows)

        def done_and_next(upto: int) -> tuple[int, list]:
            return store_db.outbox_done(upto), store_db.outbox_head(PUBLISH_BATCH)

        if published < PUBLISH_BATCH:
            # under a steady stream of changes, too: the next batch gathers what the
            # next commits queue (a create and its size at close, the parent's mtime:
            # one put each per batch)
            await trio.sleep(PUBLISH_LINGER_SECONDS)
        # the count from the outbox itself (commits add to it in between), and the
        # next rows, in one hop
        self._published_upto = rows[-1][0]
        self.lag()  # (drops the commits published now)
        self.status.backlog, rows = await self._off_loop(done_and_next, rows[-1][0])
        self.status.published_ops += published
        self.status.publish_batches += 1
        self.link.ok()
        return rows

    async def _settle(self, acked: list[bytes], superseded: list[tuple[bytes, NotPrimary]],
                      lost: list[bytes], dropped: list[bytes]) -> None:
        inodes = self.engine.ns.inodes
        for path in acked:
            ino = self._unacked.pop(path, None)
            inode = inodes.get(ino) if ino is not None else None
            if inode is not None:
                inode.published = True
        for path in dropped:  # made and removed before publication (a newer file of the name waits)
            ino = self._unacked.get(path)
            inode = inodes.get(ino) if ino is not None else None
            if inode is None or inode.nlink <= 0:
                self._unacked.pop(path, None)
        for path in lost:
            self.ownership.lease_lost(path)
        for path, exc in superseded:
            try:
                await self.ownership.superseded(path, f"taken by {exc.primary}")
            except FsError as err:
                log.warning("%r: held by %s, local copy not reconciled yet: %s", path, exc.primary, err)

    def _apply_rows(self, rows) -> tuple[list[bytes], list[tuple[bytes, NotPrimary]], list[bytes], list[bytes]]:
        """(worker thread) Apply outbox rows in order (see :class:`_Batch`).  Puts carry the
        owner guard: this node (and, for a takeover, the old holder)."""
        batch = _Batch(self.link.store, self.ownership, self.status)
        me = self.node_id
        for _seq, op, path, path2, meta in rows:
            path = bytes(path)
            if op == "notify":
                batch.message(path, bytes(path2), bytes(meta))
                continue
            if batch.messages:
                batch.flush()
            if op == "put":
                batch.put(path, bytes(meta), (me,) if path2 is None else (me, bytes(path2).decode()))
            elif op == "delete":
                batch.delete(path)
            elif op == "acquire":
                batch.acquire(path, me, self.ownership.idle_seconds)
            elif op == "release":
                batch.release(path, me)
            elif op == "rename":
                batch.rename(path, bytes(path2), meta if meta is None else bytes(meta))
        batch.flush()
        return batch.acked, batch.superseded, batch.lost, batch.dropped

    async def drain_outbox(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far is published (before changing names held
        by other nodes directly in the store: our own changes must be there first)."""
        await self.engine.ns.journal.sync()
        self._urgent += 1  # (no yield to a storm meanwhile)
        try:
            with trio.move_on_after(timeout):
                while self.status.backlog > 0 and self.link.reachable:
                    self._wakeup.set()
                    await trio.sleep(0.01)
                if self.link.reachable:
                    return
        finally:
            self._urgent -= 1
        raise FsError(errno.EIO, "the metadata store is unreachable")

"""The agent's link to the global namespace (the DHT) and to its peers.

* **Publication.** Every namespace change becomes an *outbox* row in the same SQLite
  commit as the change (see :mod:`metastore`); a publisher task sends the rows to the
  metadata store in pipelined batches and deletes them once applied.  While the store is
  unreachable the agent keeps serving local files, the outbox grows, and the status shows
  the link as degraded; when it is back the backlog drains in order.  Nothing acknowledged
  is lost, because the outbox is durable.
* **The global view.** A name that is not in the local namespace is looked up in the
  store; names held by other nodes appear as *remote nodes* (an overlay beside the local
  namespace, never written to the local database).  Directory listings merge the local
  entries with the store's.
* **Remote reads.** Opening a remote file fetches it from the node holding the primary
  copy (authenticated peer service, :mod:`peer_client`) into a local cache on the fast
  tier; reads are served from there; the copy is refetched when the store's version
  changes.
* **Serving peers.** :class:`LocalPeerFiles` lets the peer service stream local files.
* **Node registry.** Each agent heartbeats an entry ``/.hycache-nodes/<node-id>`` (kind
  "special", target = its peer address); the directory is hidden from the mount.

Every store call runs in a worker thread.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from hycache_dht import registry
from hycache_dht.meta import (
    DHTError,
    DHTUnavailable,
    EntryMeta,
    MetaStore,
    NotPrimary,
    Op,
    pack_body,
    unpack_body,
)
from hycache_dht.registry import HIDDEN_ROOT_NAMES, NODE_TTL_SECONDS, NODES_DIR, node_info

from hycache_agent.cluster.invalidation import Invalidations
from hycache_agent.cluster.ownership import INBOX_POLL_SECONDS, Ownership
from hycache_agent.cluster.rebalance import Rebalancer
from hycache_agent.cluster.replicas import ReplicaStore, Replicator
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import ROOT_INO, FsError, Inode
from hycache_agent.fs.namespace import join_path as join
from hycache_agent.remote.copy import StreamCopy
from hycache_agent.remote.reader import RemoteReader

log = logging.getLogger(__name__)
LATER = object()  # what ClusterLink.lookup_now answers when the store must be asked (lookup)

REMOTE_INO_BASE = 1 << 48
HEARTBEAT_SECONDS = 2.0
META_TTL_SECONDS = 1.0
PUBLISH_BATCH = 512
PUBLISH_LINGER_SECONDS = 0.05  # before each batch: the next commits' rows join it (and coalesce)
SMALL_DIR = 1024
# A directory whose names are being looked up fast (a burst of creates) is listed whole
# if it has at most this many entries per lookup of the last listing period: one listing
# a second costs less than a store round trip (and a thread hop) per name.  It was 8:
# with 4 writers each directory sees a quarter of the lookups, so fs_bench's directories
# of 2,000 files fell back to a round trip per name past ~1,300 entries (~170 lookups/s
# each) and LOOKUP took 30 % of a create's request time (docs/benchmarks.md, issue 17).
# Measured on the local cluster: a listing costs ~4-10 us per entry, one get ~90-100 us
# (22 entries' worth) before the agent's thread hop, which about doubles it.  32 keeps
# a directory of 2,000 listed down to ~63 lookups a second.
LIST_PER_LOOKUP = 32
UNREACHABLE = object()  # what ClusterLink.query answers when the store cannot be asked
# After the mount comes up, questions to the store wait up to this long for the first
# connection (a rebooted node whose Redis Cluster is still failing over), instead of
# answering at once as if the namespace held only this node's names; past it, the link
# is degraded and lookups serve local names only (as during any outage).
CONNECT_GRACE_SECONDS = 15.0

KIND_OF_MODE = {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFLNK: "symlink"}


def same_bytes(old: EntryMeta, new: EntryMeta) -> bool:
    """Whether a file's new DHT entry still describes the bytes of the old one.  The store
    bumps the version on every change of the entry, also when only its holder's tier, its
    replica list or its write flag changed; a remote reader that took each of those for
    new bytes threw its copy away and fetched the file again (a replica push right after
    a read, or the holder evicting the file to its slow tier, was enough).  Writes change
    the size or the mtime, and chmod/chown/rename-over the ctime."""
    return old.kind == new.kind == "file" and (old.size, old.mtime_ns, old.ctime_ns, old.mode) == \
        (new.size, new.mtime_ns, new.ctime_ns, new.mode)


def kind_of(mode: int) -> str:
    return KIND_OF_MODE.get(stat.S_IFMT(mode), "special")


def _pack_row_meta(meta: EntryMeta) -> bytes:
    return meta.kind.encode() + b"\0" + pack_body(meta)


def _unpack_row_meta(data: bytes) -> EntryMeta:
    kind, _, body = data.partition(b"\0")
    return unpack_body(kind.decode(), body)


@dataclass(eq=False)
class RemoteNode:
    """A name of the global namespace that this node does not hold."""

    ino: int
    path: bytes
    meta: EntryMeta
    fetched: float
    lookups: int = 0
    cache_blob: str | None = None  # local copy of a remote file's bytes
    cache_version: int = -1
    cache_etag: str | None = None  # the holder's version token of cache_blob
    superseded: bool = False  # the store has a newer version (a new inode for the path)
    # HCCache: the holder ETag every read of this inode is served from (the kernel's page
    # cache is per inode, so all handles of the node must serve one version of the bytes)
    pinned_etag: str | None = None
    cache_size: int = 0  # bytes of cache_blob, counted in the engine's fast-tier use
    open_count: int = 0
    local: Inode | None = None  # taken over by this node: the local inode now holding it
    read_at: float = float("-inf")  # when the read of ``meta`` started (cluster/invalidation.py)

    @property
    def is_dir(self) -> bool:
        return self.meta.kind == "dir"


@dataclass
class LinkStatus:
    state: str = "connecting"  # connecting | ok | degraded
    since: float = field(default_factory=time.time)
    last_error: str | None = None
    published_ops: int = 0
    publish_batches: int = 0
    coalesced: int = 0  # queued puts folded into a newer put of the same path (one batch)
    conflicts: int = 0
    remote_fetches: int = 0
    remote_bytes: int = 0
    backlog: int = 0


class ClusterLink:
    UNREACHABLE = UNREACHABLE

    def __init__(self, engine, store_factory, *, node_id: str, advertise: str, peer_client,
                 secret: bytes, lease_seconds: float = 10.0, lease_wait: float = 30.0,
                 replicas: int = 0, replica_mode: str = "async", rebalance_interval: float = 0.0,
                 rebalance_rounds: int = 3, hccache=None, hccache_second_level: bool = True,
                 copies=None, on_invalidate=None) -> None:
        self.engine = engine
        self.secret = secret  # for the peer service this node runs
        self._store_factory = store_factory
        self._store: MetaStore | None = None
        self._connected = trio.Event()
        self._connect_grace_until = time.monotonic() + CONNECT_GRACE_SECONDS
        self.node_id = node_id
        self.advertise = advertise
        self.peers = peer_client
        self.status = LinkStatus()
        self._wakeup = trio.Event()
        self._published_sig: dict[int, tuple] = {}
        self.remote: dict[int, RemoteNode] = {}
        self._remote_by_path: dict[bytes, RemoteNode] = {}
        self._next_remote = itertools.count(REMOTE_INO_BASE)
        self._fetch_locks: dict[bytes, trio.Lock] = {}
        self._streams: dict[tuple[bytes, int], StreamCopy] = {}  # copies streaming in for readers
        self._nursery: trio.Nursery | None = None
        self._listings: dict[bytes, tuple[float, dict[bytes, EntryMeta] | None]] = {}
        self._list_lookups: dict[bytes, int] = {}  # directory -> lookups since its last listing
        self._dir_sizes: dict[bytes, int] = {}  # directory -> entries (at least) at its last listing
        self.cache_dir = engine.tiers[T.FAST].path / "remote-cache"
        self._copy_seq = itertools.count()  # copy_dest: a new name per fetch
        self._unacked: dict[bytes, int] = {}  # path -> ino of a new name not yet published
        self._published_upto = 0  # the outbox's sequence number published so far (attach)
        # the node registry as of the last heartbeat: id -> {addr, load, age, alive}
        self.known_nodes: dict[str, dict[str, Any]] = {}
        self.rebalancer = Rebalancer(self, interval=rebalance_interval, rounds=rebalance_rounds)
        self.ownership = Ownership(self, lease_seconds=lease_seconds, lease_wait=lease_wait)
        # the FUSE layer's: forget the kernel's entry (parent ino, name)
        self.ownership.on_invalidate = on_invalidate
        self.replica_store = ReplicaStore(str(engine.tiers[T.SLOW].path / "replicas"))
        self.replicator = Replicator(self, replicas, replica_mode)
        self.local_files = LocalPeerFiles(engine, self.replica_store)
        # remote reads through HCCache (None: whole-file fetch to the fast tier)
        self.reader = RemoteReader(self, hccache, second_level=hccache_second_level) \
            if hccache is not None else None
        self.inval = Invalidations(self)  # remote entries kept valid by announced changes
        # the kernel's passthrough of whole copies (remote.backing.RemoteBackings, shared
        # with the vfs layer): a copy written is registered ahead of the next open, a
        # dropped one's registration goes
        self._copies = copies
        self.on_copy = self._park_copy if copies is not None else None  # async (ino, copy path)
        self.on_copy_dropped = copies.forget if copies is not None else None  # async (ino)
        self.meta_ttl = META_TTL_SECONDS

    async def _park_copy(self, ino: int, copy: str) -> None:
        if ino in self.remote:  # (not forgotten by the kernel meanwhile)
            await self._copies.park_copy(ino, copy)

    # ------------------------------------------------------------------ wiring
    def attach(self) -> None:
        """Hook into the namespace and journal (before the event loop starts)."""
        ns = self.engine.ns
        ns.events, ns.replayed_events = ns.replayed_events, []  # (the redo log's replay)
        ns.journal.outbox_hook = self._outbox_rows
        ns.journal.on_commit = self._committed
        self.engine.on_file_created = self.ownership.created
        self._published_upto = self.engine.store.outbox_published_upto()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.cache_dir):  # a remote cache does not survive a restart
            os.unlink(entry.path)
        self.replica_store.load()

    def _wake(self) -> None:
        self._wakeup.set()

    @property
    def store(self) -> MetaStore:
        if self._store is None:
            raise DHTUnavailable("not connected to the metadata store yet")
        return self._store

    async def _connect(self) -> None:
        backoff = 0.2
        while self._store is None:
            try:
                store = await trio.to_thread.run_sync(self._store_factory)
                # register before publishing anything: a peer that sees one of our names
                # must be able to find our address
                await trio.to_thread.run_sync(self._beat, self._node_meta(), store)
                self._store = store
                self._connected.set()
            except Exception as exc:
                self._degraded(exc)
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
        self._wake()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    async def run(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self._connect)
        nursery.start_soon(self._publisher)
        nursery.start_soon(self._heartbeat)
        nursery.start_soon(self._inbox_loop)
        nursery.start_soon(self.ownership.renew_leases)
        nursery.start_soon(self.replicator.run)
        nursery.start_soon(self.rebalancer.run)
        nursery.start_soon(self._republish_all)
        nursery.start_soon(self.inval.run)
        if self.reader is not None:
            nursery.start_soon(self.reader.run)

    # ------------------------------------------------------------------ publication
    def entry_meta(self, inode: Inode) -> EntryMeta:
        return EntryMeta(
            kind=kind_of(inode.mode), mode=inode.mode, uid=inode.uid, gid=inode.gid, size=inode.size,
            atime_ns=inode.atime_ns, mtime_ns=inode.mtime_ns, ctime_ns=inode.ctime_ns,
            primary=self.node_id if inode.is_reg else None, replicas=list(inode.replicas), tier=inode.tier,
            target=inode.target, rdev=inode.rdev, pinned=inode.pinned,
        )

    @staticmethod
    def _signature(inode: Inode) -> tuple:
        return (inode.mode, inode.uid, inode.gid, inode.size, inode.mtime_ns, inode.ctime_ns, inode.tier,
                inode.target, tuple(inode.replicas), inode.pinned)

    def _outbox_rows(self, dirty: set[int]) -> list[tuple[str, bytes, bytes | None, bytes | None]]:
        """(trio thread, inside a group commit) this batch's changes as outbox rows."""
        ns = self.engine.ns
        rows: list[tuple[str, bytes, bytes | None, bytes | None]] = []
        tail: list[tuple[str, bytes, bytes | None, bytes | None]] = []  # after this batch's puts
        put_now: set[int] = set()
        for event in ns.events:
            op = event[0]
            if op in ("put", "take"):
                ino, path = event[1], event[2]
                inode = ns.inodes.get(ino)
                if inode is not None and path is not None:
                    # a takeover's put admits the old holder in the owner guard
                    extra = event[3].encode() if op == "take" and event[3] else None
                    rows.append(("put", path, extra, _pack_row_meta(self.entry_meta(inode))))
                    self._published_sig[ino] = self._signature(inode)
                    put_now.add(ino)
                    if not inode.published:
                        self._unacked[path] = ino
            elif op == "acquire":  # right after the create's put (before a rename of it)
                rows.append((op, event[1], None, None))
            elif op in ("release", "notify"):
                tail.append((op, event[1], event[2], event[3]))
            elif op == "delete":
                if event[2] is not None:
                    rows.append(("delete", event[2], None, None))
            elif op == "rename":
                _, ino, old, new = event
                inode = ns.inodes.get(ino)
                if old is not None and new is not None:
                    fallback = _pack_row_meta(self.entry_meta(inode)) if inode is not None else None
                    if inode is not None and not inode.is_dir and rows and rows[-1] == ("delete", new, None, None):
                        # the name it replaces (dropped just before, fs/namespace.py rename): the
                        # store's rename replaces it in one step; deleted first, the name was
                        # missing for a moment (a reader sent by the delete's announcement: ENOENT)
                        rows.pop()
                    if inode is not None and not inode.is_dir:
                        sig = self._signature(inode)
                        if self._published_sig.get(ino) != sig:
                            # changed since its last put (a write closed in this same batch,
                            # then the rename: write a temp name, rename it over the file):
                            # the entry goes out under the old name first, so the rename moves
                            # the current size.  Put after it, the new name showed the old
                            # entry (a temp file's size 0) until the put, and the rename's
                            # announcement sent every reader of the name to read it just then
                            rows.append(("put", old, None, fallback))
                            if len(inode.links) == 1:  # (a hard link's other names: put below)
                                self._published_sig[ino] = sig
                    rows.append(("rename", old, new, fallback))
        ns.events.clear()
        for ino in dirty:
            if ino in put_now or ino == ROOT_INO:
                continue
            inode = ns.inodes.get(ino)
            if inode is None:
                self._published_sig.pop(ino, None)
                continue
            sig = self._signature(inode)
            if self._published_sig.get(ino) == sig or not inode.links:
                continue
            self._published_sig[ino] = sig
            packed = _pack_row_meta(self.entry_meta(inode))
            for path in ns.paths_of(inode):
                rows.append(("put", path, None, packed))
        rows += tail
        return rows  # counted into the backlog when the commit succeeds (_committed)

    def _committed(self, last_seq: int) -> None:
        """A commit queued outbox rows, up to ``last_seq``: wake the publisher.  (The
        callback may come after the publisher already sent them: the backlog counts from
        what it has published, never twice.)"""
        self.status.backlog = max(self.status.backlog, last_seq - self._published_upto)
        self._wakeup.set()

    async def _republish_all(self) -> None:
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

    async def _publisher(self) -> None:
        backoff = 0.1
        store_db = self.engine.store
        first = True
        rows = None
        while True:
            if rows is None:
                rows = await trio.to_thread.run_sync(store_db.outbox_head, PUBLISH_BATCH)
            if first:  # rows left by the previous run
                self.status.backlog = await trio.to_thread.run_sync(store_db.outbox_size)
                first = False
            if self._store is None:
                with trio.move_on_after(1.0):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                rows = None
                continue
            if not rows:
                if self.status.state != "ok":
                    await self._set_state_from_ping()
                with trio.move_on_after(1.0):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                # pipelined publication: what the next few commits queue goes out in the
                # same batch (one pipeline per hash slot) instead of one batch each
                await trio.sleep(PUBLISH_LINGER_SECONDS)
                rows = None
                continue
            try:
                acked, superseded, lost = await trio.to_thread.run_sync(self._apply_rows, rows)
            except (DHTError, ConnectionError, TimeoutError, OSError) as exc:
                self._degraded(exc)
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                rows = None
                continue
            backoff = 0.1
            published = len(rows)

            def done_and_next(upto: int) -> tuple[int, list]:
                return store_db.outbox_done(upto), store_db.outbox_head(PUBLISH_BATCH)

            if published < PUBLISH_BATCH:
                # under a steady stream of changes, too: the next batch gathers what the
                # next commits queue (a create and its size at close, the parent's mtime:
                # one put each per batch) instead of going out with whatever the last
                # round trip left behind
                await trio.sleep(PUBLISH_LINGER_SECONDS)
            # the count from the outbox itself (commits add to it in between), and the
            # next rows, in one hop
            self._published_upto = rows[-1][0]
            self.status.backlog, rows = await trio.to_thread.run_sync(done_and_next, rows[-1][0])
            self.status.published_ops += published
            self.status.publish_batches += 1
            self._ok()
            for path in acked:
                ino = self._unacked.pop(path, None)
                inode = self.engine.ns.inodes.get(ino) if ino is not None else None
                if inode is not None:
                    inode.published = True
            for path in lost:
                self.ownership.lease_lost(path)
            for path, exc in superseded:
                try:
                    await self.ownership.superseded(path, f"taken by {exc.primary}")
                except FsError as err:
                    log.warning("%r: held by %s, local copy not reconciled yet: %s", path, exc.primary, err)

    def _apply_rows(self, rows) -> tuple[list[bytes], list[tuple[bytes, NotPrimary]], list[bytes]]:
        """(worker thread) Apply outbox rows in order: runs of put/delete/lease acquire
        and release as one pipelined batch, renames and inbox messages one by one.
        Returns the paths whose puts were applied, those refused because another node
        holds them now, and those whose write flag (taken after a create) another node
        holds.  Puts carry the owner guard: this node (and, for a takeover, the old holder)."""
        run: list[Op] = []
        latest: dict[bytes, int] = {}  # path -> index of its put in ``run``
        acked: list[bytes] = []
        superseded: list[tuple[bytes, NotPrimary]] = []
        lost: list[bytes] = []
        messages: list[tuple[bytes, bytes, bytes]] = []
        me = self.node_id

        def flush() -> None:
            if run:
                results = self.store.apply(run)
                for op, result in zip(run, results):
                    if op.op in ("acquire", "release"):
                        if result is False:
                            lost.append(op.path)
                        elif isinstance(result, (DHTError, ConnectionError, TimeoutError)):
                            raise result
                        # a missing entry (removed, or renamed in the same batch): nothing to hold
                    elif isinstance(result, NotPrimary):
                        superseded.append((op.path, result))
                    elif isinstance(result, BaseException):
                        if isinstance(result, (DHTError, ConnectionError, TimeoutError)):
                            raise result
                        self.status.conflicts += 1
                        log.warning("global namespace: %s %r not applied: %s", op.op, op.path, result)
                    elif op.op == "put":
                        acked.append(op.path)
                run.clear()
                latest.clear()
            if messages:
                self.ownership.send_messages(self.store, messages)
                messages.clear()

        for _seq, op, path, path2, meta in rows:
            path = bytes(path)
            if op == "notify":
                if run:
                    flush()
                messages.append((path, bytes(path2), bytes(meta)))
                continue
            if messages:
                flush()
            if op == "put":
                owners = (me,) if path2 is None else (me, bytes(path2).decode())
                i = latest.get(path)
                if i is not None:
                    # a newer put of a path already in this run (a create, then its size at
                    # close): one put with the newest metadata, at the first one's place
                    owners = tuple(dict.fromkeys(run[i].owners + owners))
                    run[i] = Op.put(path, _unpack_row_meta(bytes(meta)), owners=owners)
                    self.status.coalesced += 1
                else:
                    latest[path] = len(run)
                    run.append(Op.put(path, _unpack_row_meta(bytes(meta)), owners=owners))
            elif op == "delete":
                latest.pop(path, None)
                run.append(Op.delete(path))
            elif op == "acquire":
                run.append(Op.acquire(path, me, self.ownership.idle_seconds))
            elif op == "release":
                run.append(Op.release(path, me))
            elif op == "rename":
                flush()
                try:
                    self.store.rename(path, bytes(path2), replace=True)
                except FileNotFoundError:  # never published under the old name
                    if meta is not None:
                        self.store.put(bytes(path2), _unpack_row_meta(bytes(meta)))
                except (DHTError, ConnectionError, TimeoutError):
                    raise
                except OSError as exc:
                    self.status.conflicts += 1
                    log.warning("global namespace: rename %r → %r not applied: %s", path, path2, exc)
        flush()
        return acked, superseded, lost

    def _degraded(self, exc: BaseException) -> None:
        if self.status.state != "degraded":
            log.warning("global namespace unreachable (%s): serving local files, queueing updates", exc)
            self.status.since = time.time()
        self.status.state = "degraded"
        self.status.last_error = f"{type(exc).__name__}: {exc}"

    def _ok(self) -> None:
        if self.status.state != "ok":
            log.info("global namespace reachable%s", " again: backlog drained" if self.status.state == "degraded" else "")
            self.status.since = time.time()
        self.status.state = "ok"

    async def _set_state_from_ping(self) -> None:
        try:
            ok = await trio.to_thread.run_sync(self.store.ping)
        except Exception as exc:
            self._degraded(exc)
            return
        if ok:
            self._ok()

    # ------------------------------------------------------------------ node registry
    async def _heartbeat(self) -> None:
        while True:
            if self._store is None:
                await trio.sleep(0.2)
                continue
            try:
                self.known_nodes = await trio.to_thread.run_sync(self._beat_and_list, self._node_meta(), self._store)
            except Exception as exc:
                self._degraded(exc)
            await trio.sleep(HEARTBEAT_SECONDS)

    def _beat_and_list(self, meta: EntryMeta, store: MetaStore) -> dict[str, dict[str, Any]]:
        self._beat(meta, store)
        return self.nodes_blocking(store)

    async def _inbox_loop(self) -> None:
        while True:
            await trio.sleep(INBOX_POLL_SECONDS)
            if self.reachable:
                await self.ownership.drain_inbox()

    def _node_meta(self) -> EntryMeta:
        return registry.node_entry(self.node_id, self.advertise, self.rebalancer.load())

    @staticmethod
    def _beat(meta: EntryMeta, store: MetaStore) -> None:
        registry.beat(store, meta)

    @staticmethod
    def nodes_blocking(store: MetaStore) -> dict[str, dict[str, Any]]:
        return registry.list_nodes(store)

    async def address_of(self, node_id: str) -> str:
        known = self.known_nodes.get(node_id)
        if known is not None and known["alive"]:
            return known["addr"]
        meta = await trio.to_thread.run_sync(self.store.get, join(NODES_DIR, node_id.encode()))
        if meta is None or not meta.target:
            raise FsError(errno.EHOSTUNREACH, f"node {node_id} is not registered")
        if time.time() - meta.mtime_ns / 1e9 > NODE_TTL_SECONDS:
            log.warning("node %s missed its heartbeats; trying it anyway", node_id)
        return node_info(meta)["addr"]

    # ------------------------------------------------------------------ the global view
    def path_of(self, ino: int) -> bytes | None:
        node = self.remote.get(ino)
        if node is not None:
            return node.path
        return self.engine.ns.path_of(ino)

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
            self._degraded(exc)
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

    @property
    def connected(self) -> trio.Event:
        return self._connected

    def remote_by_path(self, path: bytes) -> RemoteNode | None:
        return self._remote_by_path.get(path)

    def remote_files_in(self, dirpath: bytes | None) -> list[RemoteNode]:
        """The remote file nodes of directory ``dirpath`` (None: all of them)."""
        return [n for n in self._remote_by_path.values() if n.meta.kind == "file"
                and (dirpath is None or (n.path.rpartition(b"/")[0] or b"/") == dirpath)]

    def forget_kernel_entry(self, path: bytes) -> None:
        """The kernel forgets the name ``path`` (kept for a covered entry's lease)."""
        parent, _, name = path.rpartition(b"/")
        parent = parent or b"/"
        try:
            ino = self.engine.ns.resolve(parent).ino
        except FsError:
            node = self._remote_by_path.get(parent)
            ino = node.ino if node is not None and node.is_dir else None
        if ino is not None and self.ownership.on_invalidate is not None:
            self.ownership.on_invalidate(ino, name)

    def remote_node(self, path: bytes, meta: EntryMeta, read_at: float | None = None) -> RemoteNode:
        """The overlay node for a remote name.  A file gets a new inode number for every
        version: with the writeback cache the kernel keeps its own idea of a regular
        file's size and ignores sizes the agent reports later, so a changed file must
        look like a new inode (the old one lives on until the kernel forgets it)."""
        node = self._remote_by_path.get(path)
        if node is not None and node.meta.version != meta.version and same_bytes(node.meta, meta):
            meta = meta.copy(version=node.meta.version)  # the same bytes: the same inode and copy
        if node is None or (meta.kind != "dir" and node.meta.version != meta.version) \
                or node.meta.kind != meta.kind:
            node = RemoteNode(next(self._next_remote), path, meta, time.monotonic())
            if self.reader is not None and meta.kind == "file":
                self.reader.learn_version(path, meta.version)
            self.remote[node.ino] = node
            self._remote_by_path[path] = node
        else:
            node.meta, node.fetched = meta, time.monotonic()
        # when the read began (None: unknown, so not covered by announcements)
        node.read_at = float("-inf") if read_at is None else read_at
        if meta.kind == "file":
            self.inval.watch(path.rpartition(b"/")[0] or b"/")
        return node

    def lookup_now(self, parent_ino: int, name: bytes) -> RemoteNode | None | object:
        """:meth:`lookup` answered from memory (the directory's listing is cached and
        fresh; counted as a lookup made in it), or LATER when the store must be asked
        (nothing counted: :meth:`lookup` does it)."""
        parent = self.path_of(parent_ino)
        if parent is None or (parent == b"/" and name in HIDDEN_ROOT_NAMES):
            return None
        cached = self._listings.get(parent)
        if cached is None or cached[1] is None or time.monotonic() - cached[0] >= META_TTL_SECONDS:
            return LATER
        self._list_lookups[parent] = self._list_lookups.get(parent, 0) + 1
        path = join(parent, name)
        return self._found(path, *self._listed(path, cached[1].get(name), cached[0]))

    async def lookup(self, parent_ino: int, name: bytes) -> RemoteNode | None:
        """A name not held locally: ask the global namespace."""
        found = self.lookup_now(parent_ino, name)
        if found is not LATER:
            return found
        parent = self.path_of(parent_ino)
        path = join(parent, name)
        read_at = time.monotonic()
        listing = await self._small_listing(parent)
        if listing is not None:
            meta = listing.get(name)
            meta, read_at = self._listed(path, meta, self._listings.get(parent, (float("-inf"),))[0])
        else:
            meta = await self.store_get(path)
        return self._found(path, meta, read_at)

    def _listed(self, path: bytes, meta: EntryMeta | None, listed_at: float) -> tuple[EntryMeta | None, float]:
        """What a directory listing taken at ``listed_at`` says of ``path`` (its entry and
        when it was read), unless this node learnt of the file after the listing was
        taken (e.g. a 2LS prefetch fetched it): then what it learnt."""
        known = self._remote_by_path.get(path) if meta is None else None
        if known is not None and known.fetched > listed_at:
            return known.meta, known.read_at
        return meta, listed_at

    def _found(self, path: bytes, meta: EntryMeta | None, read_at: float) -> RemoteNode | None:
        """The node for what the store said of ``path`` (``read_at``: when that read
        began, for cluster/invalidation.py), None where no other node holds it."""
        if meta is None or meta.primary == self.node_id and meta.kind != "dir":
            return None  # ours but deleted locally (publication pending) — not there
        return self.remote_node(path, meta, read_at)

    async def _small_listing(self, dirpath: bytes) -> dict[bytes, EntryMeta] | None:
        """The store's entries of a directory, cached for META_TTL_SECONDS, so that a
        burst of creates (each preceded by a lookup of the new name) costs one listing
        per second instead of one store round trip per name.  Listed when it has at most
        SMALL_DIR entries, or LIST_PER_LOOKUP per lookup made in it since its last
        listing (a large directory being filled fast); otherwise None (names are looked
        up one by one), also when the store is unreachable.  The staleness is the same as
        the kernel's entry cache."""
        now = time.monotonic()
        lookups = self._list_lookups.get(dirpath, 0) + 1
        self._list_lookups[dirpath] = lookups
        cached = self._listings.get(dirpath)
        if cached is not None and now - cached[0] < META_TTL_SECONDS:
            return cached[1]
        limit = max(SMALL_DIR, LIST_PER_LOOKUP * lookups)
        self._list_lookups[dirpath] = 0
        if self._dir_sizes.get(dirpath, 0) > limit:  # too large the last time: no scan
            entries = None
        else:
            entries = await self.query(self._list_up_to, dirpath, limit, missing={})
            if entries is UNREACHABLE:
                return None
            self._dir_sizes[dirpath] = limit + 1 if entries is None else len(entries)
        if len(self._listings) > 4096:
            self._listings.clear()
            self._list_lookups.clear()
            self._dir_sizes.clear()
        self._listings[dirpath] = (now, entries)
        return entries

    def _list_up_to(self, dirpath: bytes, limit: int) -> dict[bytes, EntryMeta] | None:
        """The store's listing of ``dirpath`` (run by ``query`` in a worker thread), or None
        when it holds more than ``limit`` names."""
        out = {}
        for name, meta in self.store.list_dir(dirpath):
            if len(out) >= limit:
                return None
            out[name] = meta
        return out

    async def dir_has_entries(self, path: bytes) -> bool:
        """Whether the store lists any name in directory ``path`` once our own queued
        changes are published (rmdir of a directory other nodes hold names in)."""
        def first() -> bool:
            return next(iter(self.store.list_dir(path)), None) is not None

        has = await self.query(first, missing=False)
        if has is True:  # maybe only our own removals, not published yet
            await self.drain_outbox()
            has = await self.query(first, missing=False)
        return has is True  # unreachable: local rules only (the store refuses it later)

    def relist_soon(self, dirpath: bytes) -> None:
        """The announcements of ``dirpath`` are heard from now on (its subscription was just
        confirmed): what was read of it before is not covered (an announcement may have
        been missed), so its listing is read once more, in the background, and the remote
        files it still describes (the same version, or the same bytes) are covered from
        that read on (cluster/invalidation.py): their entries get the lease at the next
        lookup or stat instead of an attribute timeout of 0 until a refresh."""
        if self._nursery is not None and (dirpath in self._listings or self.remote_files_in(dirpath)):
            self._nursery.start_soon(self._relist, dirpath)

    async def _relist(self, dirpath: bytes) -> None:
        if self._dir_sizes.get(dirpath, 0) > SMALL_DIR:  # a large directory: not listed whole
            return
        read_at = time.monotonic()
        entries = await self.query(self._list_up_to, dirpath, SMALL_DIR, missing={})
        if entries is UNREACHABLE or entries is None or not self.inval.heard_since(dirpath, read_at):
            return  # unreachable, too large, or changed meanwhile (read again at the next lookup)
        self.inval.stats["relists"] += 1
        cached = self._listings.get(dirpath)
        if cached is None or cached[0] < read_at:
            self._listings[dirpath] = (read_at, entries)
            self._dir_sizes[dirpath] = len(entries)
        now = time.monotonic()
        for node in self.remote_files_in(dirpath):
            meta = entries.get(node.path.rpartition(b"/")[2])
            if meta is None or node.superseded or node.read_at >= read_at:
                continue
            if meta.version != node.meta.version:
                if not same_bytes(node.meta, meta):
                    continue  # a new version: a new inode at the next lookup
                meta = meta.copy(version=node.meta.version)
            node.meta, node.fetched, node.read_at = meta, now, read_at

    def unlisted(self, path: bytes) -> None:
        """``path`` was removed or renamed away here and its delete is queued: it leaves the
        cached listing of its directory now, not when that listing is read again. A
        directory removed here and made again at once was found in the stale listing
        (another node's, for all this node knew) and the kernel answered EEXIST."""
        parent, _, name = path.rpartition(b"/")
        cached = self._listings.get(parent or b"/")
        if cached is not None and cached[1] is not None:
            cached[1].pop(name, None)

    def forget_listing(self, dirpath: bytes | None) -> None:
        """Our view of a directory changed: the next lookup asks the store again."""
        if dirpath is not None:
            self._listings.pop(dirpath, None)

    async def drain_outbox(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far is published (before changing names held
        by other nodes directly in the store: our own changes must be there first)."""
        await self.engine.ns.journal.sync()
        with trio.move_on_after(timeout):
            while self.status.backlog > 0 and self.reachable:
                self._wakeup.set()
                await trio.sleep(0.01)
            if self.reachable:
                return
        raise FsError(errno.EIO, "the metadata store is unreachable")

    def fetch_lock(self, path: bytes) -> trio.Lock:
        return self._fetch_locks.setdefault(path, trio.Lock())

    def stale(self, node: RemoteNode) -> bool:
        """Whether :meth:`refresh` asks the store (else it returns the node as it is):
        its attributes are older than META_TTL_SECONDS and no announcement of changes to
        it would be heard (an entry covered by a confirmed subscription is kept)."""
        if time.monotonic() - node.fetched <= META_TTL_SECONDS:
            return False
        if self.inval.covers(node):
            self.inval.stats["kept_refreshes"] += 1  # no round trip: announcements keep it
            return False
        return True

    async def drop_copy(self, path: bytes) -> int | None:
        """Drop this node's copy of a remote file from its fast tier (a plan's ``evict`` of
        a prefetched copy: the control plane's ``demote`` of a path another node holds).
        Returns the bytes freed (0: no copy here), or None when the copy is in use (open,
        or being fetched or streamed): it stays."""
        node = self._remote_by_path.get(path)
        if node is None or not node.cache_blob:
            return 0
        lock = self._fetch_locks.get(path)
        if (node.open_count or (lock is not None and lock.locked())
                or any(key[0] == path for key in self._streams)):
            return None
        blob, size = node.cache_blob, node.cache_size
        node.cache_blob, node.cache_size, node.cache_version, node.cache_etag = None, 0, -1, None
        self.engine.remote_copy_removed(size)
        if self.on_copy_dropped is not None:  # a parked registration would keep the bytes
            await self.on_copy_dropped(node.ino)
        await trio.to_thread.run_sync(T.remove_blob, blob)
        return size

    async def refresh(self, node: RemoteNode) -> RemoteNode:
        """Fresh attributes for a directory, or for a file still at the same version
        (a newer version is a new inode, found by the next lookup)."""
        if self.stale(node):
            read_at = time.monotonic()
            meta = await self.store_get(node.path)
            if meta is not None and meta.version != node.meta.version and same_bytes(node.meta, meta):
                meta = meta.copy(version=node.meta.version)  # the same bytes (see same_bytes)
            if meta is not None and (node.is_dir or meta.version == node.meta.version):
                node.meta, node.fetched, node.read_at = meta, time.monotonic(), read_at
            elif meta is not None and meta.kind == "file":
                log.debug("%r superseded: %s -> %s", node.path, node.meta, meta)
                node.superseded = True
                self.forget_listing(node.path.rpartition(b"/")[0] or b"/")  # the next lookup finds it
                if self.reader is not None:
                    self.reader.learn_version(node.path, meta.version)
        return node

    async def list_remote(self, path: bytes) -> list[tuple[bytes, RemoteNode]]:
        read_at = time.monotonic()
        entries = await self.query(lambda: list(self.store.list_dir(path)), missing=[])
        if entries is UNREACHABLE:
            return []
        out = []
        for name, meta in entries:
            if path == b"/" and name in HIDDEN_ROOT_NAMES:
                continue
            out.append((name, self.remote_node(join(path, name), meta, read_at)))
        return out

    async def forget(self, ino: int, n: int) -> bool:
        node = self.remote.get(ino)
        if node is None:
            return False
        node.lookups = max(0, node.lookups - n)
        if node.lookups == 0 and node.open_count == 0:
            log.debug("the kernel forgot %r (ino %d, version %d, copy %s)", node.path, ino, node.meta.version,
                      node.cache_version if node.cache_blob else None)
            del self.remote[ino]
            if self._remote_by_path.get(node.path) is node:
                del self._remote_by_path[node.path]
                lock = self._fetch_locks.get(node.path)
                if lock is not None and not lock.locked():
                    del self._fetch_locks[node.path]
            if node.cache_blob:
                await trio.to_thread.run_sync(T.remove_blob, node.cache_blob)
                self.engine.remote_copy_removed(node.cache_size)
                node.cache_blob, node.cache_size = None, 0
        return True

    # ------------------------------------------------------------------ remote reads
    def has_copy(self, node: RemoteNode) -> bool:
        """Whether this node's fast tier already holds the node's current version."""
        return bool(node.cache_blob) and node.cache_version == node.meta.version

    async def open_remote(self, node: RemoteNode) -> str:
        """A local copy of a remote file's current version (fetched if needed)."""
        if node.meta.kind != "file":
            raise FsError(errno.EISDIR if node.is_dir else errno.ENXIO)
        await self.refresh(node)
        async with self.fetch_lock(node.path):
            return await self.fetch_locked(node)

    def _copy_dest(self, node: RemoteNode) -> str:
        return self.copy_dest(node.path, node.meta.version)

    def copy_dest(self, path: bytes, version: int) -> str:
        """A new file name in the remote cache for a copy of ``path`` at ``version``:
        unique per fetch, so that removing an old copy — a forgotten inode's, which runs
        in a worker thread after the node is gone — can never remove a newer copy of the
        same version fetched meanwhile for a new lookup of the same path."""
        return str(self.cache_dir / f"{hashlib.sha1(path).hexdigest()}.{version}.{next(self._copy_seq)}")

    async def stream_remote(self, node: RemoteNode) -> str:
        """The whole local copy of a remote file's current version, streamed in with one
        GET if there is none yet (remote/copy.py; one stream per version, shared)."""
        if node.meta.kind != "file":
            raise FsError(errno.EISDIR if node.is_dir else errno.ENXIO)
        await self.refresh(node)
        if self.has_copy(node):
            return node.cache_blob
        key = (node.path, node.meta.version)
        sc = self._streams.get(key)
        if sc is None:
            if self._nursery is None or self.fetch_lock(node.path).locked():  # a whole fetch is on: wait for it
                return await self.open_remote(node)
            sc = self._streams[key] = StreamCopy(self, node, self._copy_dest(node))
            self._nursery.start_soon(sc.run)
        await sc.wait()
        if self.has_copy(node):
            return node.cache_blob
        return await self.open_remote(node)  # (the node moved on meanwhile: a plain fetch)

    def stream_done(self, sc: StreamCopy, etag: str, holder: str, seconds: float) -> None:
        """A stream copy is whole: it becomes the node's copy (counted in the fast tier's
        use) if the node still wants this version, else it goes."""
        node = sc.node
        if self._streams.get((node.path, sc.version)) is sc:
            del self._streams[(node.path, sc.version)]
        self.status.remote_fetches += 1
        self.status.remote_bytes += sc.size
        log.info("streamed %r (%d bytes, version %d) from %s in %.3f s", node.path, sc.size, sc.version, holder,
                 seconds)
        if node.meta.version == sc.version and self.remote.get(node.ino) is node and not node.superseded:
            if node.cache_blob and node.cache_blob != sc.dest:
                self._nursery.start_soon(trio.to_thread.run_sync, T.remove_blob, node.cache_blob)
            self.engine.remote_copy_removed(node.cache_size if node.cache_blob else 0)
            self.engine.remote_copy_added(sc.size)
            node.cache_blob, node.cache_version, node.cache_etag = sc.dest, sc.version, etag
            node.cache_size = sc.size
        elif node.cache_blob != sc.dest:
            log.info("stream copy of %r not kept (version %d now %d, known %s, superseded %s)", node.path,
                     sc.version, node.meta.version, self.remote.get(node.ino) is node, node.superseded)
            self._nursery.start_soon(trio.to_thread.run_sync, T.remove_blob, sc.dest)

    def stream_failed(self, sc: StreamCopy) -> None:
        if self._streams.get((sc.node.path, sc.version)) is sc:
            del self._streams[(sc.node.path, sc.version)]
        if sc.node.cache_blob != sc.dest:
            self._nursery.start_soon(trio.to_thread.run_sync, T.remove_blob, sc.dest)

    async def fetch_locked(self, node: RemoteNode) -> str:
        """(holding the path's fetch lock) the local copy of ``node.meta``'s version."""
        sc = self._streams.get((node.path, node.meta.version))
        if sc is not None:  # being streamed for a reader: that is the copy
            try:
                await sc.wait()
            except FsError:
                pass  # fetched again below
        if node.cache_blob and node.cache_version == node.meta.version:
            return node.cache_blob
        holders = [node.meta.primary, *node.meta.replicas]
        dest = self._copy_dest(node)
        last: BaseException | None = None
        for holder in [h for h in holders if h]:
            try:
                addr = await self.address_of(holder)
                t0 = time.monotonic()
                etag = await self.peers.fetch_to_file(addr, node.path, dest)
            except Exception as exc:
                last = exc
                log.warning("fetching %r from %s failed: %s", node.path, holder, exc)
                continue
            size = (await trio.to_thread.run_sync(os.stat, dest)).st_size
            self.status.remote_fetches += 1
            self.status.remote_bytes += size
            log.info("fetched %r (%d bytes) from %s in %.3f s", node.path, size, holder, time.monotonic() - t0)
            if node.cache_blob and node.cache_blob != dest:
                await trio.to_thread.run_sync(T.remove_blob, node.cache_blob)
            self.engine.remote_copy_removed(node.cache_size if node.cache_blob else 0)
            self.engine.remote_copy_added(size)
            node.cache_blob, node.cache_version, node.cache_etag = dest, node.meta.version, etag
            node.cache_size = size
            return dest
        log.error("no holder of %r could serve it (%s)", node.path, last)
        raise FsError(errno.EIO)

    def status_dict(self) -> dict[str, Any]:
        d = dict(self.status.__dict__)
        d["node_id"] = self.node_id
        d["advertise"] = self.advertise
        d["remote_nodes_cached"] = len(self.remote)
        d["nodes_alive"] = sorted(n for n, info in self.known_nodes.items() if info["alive"])
        d["ownership"] = self.ownership.status()
        d["replication"] = self.replicator.status()
        d["replicas_kept"] = len(self.replica_store.index)
        d["rebalance"] = self.rebalancer.status()
        d["remote_read"] = "hccache" if self.reader is not None else "whole-file"
        d["invalidations"] = self.inval.status()
        return d


@dataclass(eq=False)
class _OpenedForPeer:
    blob: str
    size: int
    etag: str
    inode: Inode
    engine: Any

    async def close(self) -> None:
        self.inode.open_count -= 1
        await self.engine.maybe_free(self.inode)


@dataclass(eq=False)
class _OpenedReplica:
    blob: str
    size: int
    etag: str

    async def close(self) -> None:
        pass


class LocalPeerFiles:
    """The engine side of the peer data service: stream local files (and the replicas
    this node keeps) to other nodes, and keep the replicas they push."""

    def __init__(self, engine, replica_store: ReplicaStore | None = None) -> None:
        self.engine = engine
        self.replica_store = replica_store
        self.staging_dir = str(engine.tiers[T.SLOW].path / "peer-staging")
        os.makedirs(self.staging_dir, exist_ok=True)

    def _resolve(self, path: bytes) -> Inode:
        try:
            inode = self.engine.ns.resolve(path)
        except FsError as exc:
            if exc.errno == errno.ENOTDIR:
                raise NotADirectoryError(path) from None
            raise FileNotFoundError(path) from None
        if inode.is_dir:
            raise IsADirectoryError(path)
        if not inode.is_reg:
            raise FileNotFoundError(path)
        return inode

    async def open_for_peer(self, path: bytes):
        try:
            inode = self._resolve(path)
        except FileNotFoundError:
            rec = self.replica_store.index.get(path) if self.replica_store is not None else None
            if rec is None:
                raise
            return _OpenedReplica(rec.data, rec.size, "r-" + rec.etag)
        inode.open_count += 1  # keeps the blob from being freed; evictions skip open files
        try:
            while inode.migration is not None:  # wait for a switch in flight, then read the winner
                await inode.migration.done.wait()
        except BaseException:  # cancelled: give the count back
            inode.open_count -= 1
            raise
        return _OpenedForPeer(self.engine.blob(inode), inode.size,
                              f"{inode.ino}-{inode.data_gen}-{inode.size}", inode, self.engine)

    async def receive_replica(self, path: bytes, temp_blob: str, headers: dict[str, str]) -> None:
        if self.replica_store is None:
            raise PermissionError("this node keeps no replicas")
        await self.replica_store.adopt(path, temp_blob, headers)

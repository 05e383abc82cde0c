"""The agent's link to the global namespace (the DHT) and to its peers.

:class:`ClusterLink` composes the parts, each in a module of its own:

* **Publication** (:mod:`publisher`): namespace changes go out through the durable outbox.
* **The store** (:mod:`store_link`): connecting, the link's state, guarded store calls.
* **Node registry** (:mod:`nodes`): this node's heartbeat entry and the others' addresses.
* **The global view** (:mod:`remote_view`): remote nodes, cached directory listings.
* **Remote reads** (:mod:`copies`, and ``remote/``): whole copies on the fast tier, or
  HCCache (:class:`RemoteReader`).
* **Serving peers** (:mod:`local_files`): what the peer data service streams and keeps.
* Ownership and leases, replicas, rebalance and invalidations, each its own class.

The other parts, and the FUSE layer, reach these through the link.  Every store call
runs in a worker thread.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio
from hycache_dht.meta import EntryMeta, MetaStore

from hycache_agent.cluster.copies import RemoteCopies
from hycache_agent.cluster.entries import LATER, UNREACHABLE, RemoteNode
from hycache_agent.cluster.invalidation import Invalidations
from hycache_agent.cluster.kept import KeptCopies
from hycache_agent.cluster.local_files import LocalPeerFiles
from hycache_agent.cluster.nodes import NodeRegistry
from hycache_agent.cluster.ownership import INBOX_POLL_SECONDS, Ownership
from hycache_agent.cluster.publisher import Publisher
from hycache_agent.cluster.rebalance import Rebalancer
from hycache_agent.cluster.remote_view import META_TTL_SECONDS, RemoteView
from hycache_agent.cluster.replicas import ReplicaStore, Replicator
from hycache_agent.cluster.store_link import StoreLink
from hycache_agent.cluster.tasks import Background
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError
from hycache_agent.remote.copy import Filling
from hycache_agent.remote.reader import RemoteReader

log = logging.getLogger(__name__)

__all__ = ["LATER", "META_TTL_SECONDS", "UNREACHABLE", "ClusterLink", "LocalPeerFiles", "RemoteNode"]


class ClusterLink:
    UNREACHABLE = UNREACHABLE

    def __init__(self, engine, store_factory, *, node_id: str, advertise: str, peer_client,
                 secret: bytes, lease_seconds: float = 10.0, lease_wait: float = 30.0,
                 replicas: int = 0, replica_mode: str = "async", rebalance_interval: float = 0.0,
                 rebalance_rounds: int = 3, hccache=None, hccache_second_level: bool = True,
                 copies=None, on_invalidate=None) -> None:
        self.engine = engine
        self.secret = secret  # for the peer service this node runs
        self.node_id = node_id
        self.advertise = advertise
        self.peers = peer_client
        self.tasks = Background()
        self.rebalancer = Rebalancer(self, interval=rebalance_interval, rounds=rebalance_rounds)
        self.store_link = StoreLink(store_factory, node_meta=lambda: self.registry.node_meta(),
                              on_connected=lambda: self.publisher.wake())
        self.status = self.store_link.status
        self.registry = NodeRegistry(self.store_link, node_id=node_id, advertise=advertise, load=self.rebalancer.load)
        self.ownership = Ownership(self, lease_seconds=lease_seconds, lease_wait=lease_wait,
                                   on_invalidate=on_invalidate)
        self.publisher = Publisher(engine, self.store_link, self.ownership, node_id=node_id)
        self.replica_store = ReplicaStore(str(engine.tiers[T.SLOW].path / "replicas"))
        self.replicator = Replicator(self, replicas, replica_mode)
        self.local_files = LocalPeerFiles(engine, self.replica_store)
        # remote reads through HCCache (None: whole-file fetch to the fast tier)
        self.reader = RemoteReader(self, hccache, second_level=hccache_second_level) \
            if hccache is not None else None
        self.inval = Invalidations(self)  # remote entries kept valid by announced changes
        self.kept = KeptCopies(engine.space)
        self.view = RemoteView(engine.ns, self.store_link, node_id=node_id, inval=self.inval, reader=self.reader,
                               kept=self.kept, drain_outbox=self.publisher.drain_outbox, spawn=self.tasks.spawn)
        self.remote: dict[int, RemoteNode] = self.view.remote
        self.cache_dir = engine.tiers[T.FAST].path / "remote-cache"
        self.copies = RemoteCopies(engine, self.view, status=self.status, peers=peer_client,
                                   address_of=self.registry.address_of, reader=self.reader,
                                   cache_dir=self.cache_dir, tasks=self.tasks, copy_dropped=self._copy_dropped)
        # the kernel's passthrough of whole copies (remote.backing.RemoteBackings, shared
        # with the vfs layer): a copy written is registered ahead of the next open, a
        # dropped one's registration goes
        self._backings = copies
        self.on_copy = self._park_copy if copies is not None else None  # async (ino, copy path)
        self.on_copy_dropped = copies.forget if copies is not None else None  # async (ino)
        self.meta_ttl = META_TTL_SECONDS

    async def _park_copy(self, ino: int, copy: str) -> None:
        if ino in self.remote:  # (not forgotten by the kernel meanwhile)
            await self._backings.park_copy(ino, copy)

    # ------------------------------------------------------------------ lifecycle
    def attach(self) -> None:
        """Hook into the namespace and journal (before the event loop starts)."""
        ns = self.engine.ns
        ns.events, ns.replayed_events = ns.replayed_events, []  # (the redo log's replay)
        self.publisher.attach()
        self.engine.on_file_created = self.ownership.created
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.cache_dir):  # a remote cache does not survive a restart
            os.unlink(entry.path)
        self.replica_store.load()

    def close(self) -> None:
        self.store_link.close()

    async def run(self, nursery: trio.Nursery) -> None:
        self.tasks.start(nursery)
        nursery.start_soon(self.store_link.connect)
        nursery.start_soon(self.publisher.run)
        nursery.start_soon(self.registry.heartbeat)
        nursery.start_soon(self._inbox_loop)
        nursery.start_soon(self.ownership.renew_leases)
        nursery.start_soon(self.replicator.run)
        nursery.start_soon(self.rebalancer.run)
        nursery.start_soon(self.publisher.republish_all)
        nursery.start_soon(self.inval.run)
        if self.reader is not None:
            nursery.start_soon(self.reader.run)

    async def _inbox_loop(self) -> None:
        while True:
            await trio.sleep(INBOX_POLL_SECONDS)
            if self.reachable:
                await self.ownership.drain_inbox()

    def status_dict(self) -> dict[str, Any]:
        d = dict(self.status.__dict__)
        d["publish_yielded_seconds"] = round(self.status.publish_yielded_seconds, 3)
        d["publish_lag_seconds"] = round(self.publisher.lag(), 3)  # the oldest change not published
        d["node_id"] = self.node_id
        d["advertise"] = self.advertise
        d["remote_nodes_cached"] = len(self.remote)
        d["nodes_alive"] = sorted(n for n, info in self.known_nodes.items() if info["alive"])
        d["ownership"] = self.ownership.status()
        d["replication"] = self.replicator.status()
        d["replicas_kept"] = len(self.replica_store.index)
        d["rebalance"] = self.rebalancer.status()
        d["remote_read"] = "hccache" if self.reader is not None else "whole-file"
        d["copies_filling"] = self.copies.filling
        d["copies_kept"] = self.kept.status()
        d["invalidations"] = self.inval.status()
        return d

    # ------------------------------------------------------------------ the store and the registry
    @property
    def store(self) -> MetaStore:
        return self.store_link.store

    @property
    def connected(self) -> trio.Event:
        return self.store_link.connected

    @property
    def reachable(self) -> bool:
        return self.store_link.reachable

    async def query(self, fn, *args, missing, kwargs=None):
        return await self.store_link.query(fn, *args, missing=missing, kwargs=kwargs)

    async def store_get(self, path: bytes) -> EntryMeta | None:
        return await self.store_link.store_get(path)

    async def drain_outbox(self, timeout: float = 10.0) -> None:
        await self.publisher.drain_outbox(timeout)

    @property
    def known_nodes(self) -> dict[str, dict[str, Any]]:
        """The node registry as of the last heartbeat: id -> {addr, load, age, alive}."""
        return self.registry.known_nodes

    nodes_blocking = staticmethod(NodeRegistry.nodes_blocking)

    async def address_of(self, node_id: str) -> str:
        return await self.registry.address_of(node_id)

    # ------------------------------------------------------------------ the global view
    def path_of(self, ino: int) -> bytes | None:
        return self.view.path_of(ino)

    def remote_by_path(self, path: bytes) -> RemoteNode | None:
        return self.view.remote_by_path(path)

    def remote_files_in(self, dirpath: bytes | None) -> list[RemoteNode]:
        return self.view.remote_files_in(dirpath)

    def remote_node(self, path: bytes, meta: EntryMeta, read_at: float | None = None) -> RemoteNode:
        return self.view.remote_node(path, meta, read_at)

    def lookup_now(self, parent_ino: int, name: bytes) -> RemoteNode | None | object:
        return self.view.lookup_now(parent_ino, name)

    async def lookup(self, parent_ino: int, name: bytes) -> RemoteNode | None:
        return await self.view.lookup(parent_ino, name)

    def listed_names(self, parent_ino: int):
        return self.view.listed_names(parent_ino)

    def count_lookups(self, parent_ino: int, n: int) -> None:
        self.view.count_lookups(parent_ino, n)

    async def dir_has_entries(self, path: bytes) -> bool:
        return await self.view.dir_has_entries(path)

    def relist_soon(self, dirpath: bytes) -> None:
        self.view.relist_soon(dirpath)

    def unlisted(self, path: bytes) -> None:
        self.view.unlisted(path)

    def forget_listing(self, dirpath: bytes | None) -> None:
        self.view.forget_listing(dirpath)

    def stale(self, node: RemoteNode) -> bool:
        return self.view.stale(node)

    async def refresh(self, node: RemoteNode) -> RemoteNode:
        return await self.view.refresh(node)

    async def list_remote(self, path: bytes) -> list[tuple[bytes, RemoteNode]]:
        return await self.view.list_remote(path)

    async def forget(self, ino: int, n: int) -> bool:
        """The kernel forgets ``n`` lookups of a remote inode; False if it is not one."""
        node = self.remote.get(ino)
        if node is None:
            return False
        current = self.view.release(node, n)
        if current is not None:
            await self.copies.forgotten(node, current)
        return True

    def forget_kernel_entry(self, path: bytes) -> None:
        """The kernel forgets the name ``path`` (kept for a covered entry's lease)."""
        parent, _, name = path.rpartition(b"/")
        parent = parent or b"/"
        try:
            ino = self.engine.ns.resolve(parent).ino
        except FsError:
            node = self.view.remote_by_path(parent)
            ino = node.ino if node is not None and node.is_dir else None
        if ino is not None and self.ownership.on_invalidate is not None:
            self.ownership.on_invalidate(ino, name)

    # ------------------------------------------------------------------ remote reads
    def has_copy(self, node: RemoteNode) -> bool:
        return self.copies.has_copy(node)

    def fetch_lock(self, path: bytes) -> trio.Lock:
        return self.copies.fetch_lock(path)

    async def fetch_locked(self, node: RemoteNode) -> str:
        return await self.copies.fetch_locked(node)

    async def open_remote(self, node: RemoteNode) -> str:
        return await self.copies.open_remote(node)

    async def stream_remote(self, node: RemoteNode) -> str:
        return await self.copies.stream_remote(node)

    async def stream_open(self, node: RemoteNode) -> str | Filling:
        return await self.copies.stream_open(node)

    def copy_dest(self, path: bytes, version: int) -> str:
        return self.copies.copy_dest(path, version)

    async def drop_copy(self, path: bytes) -> int | None:
        return await self.copies.drop_copy(path)

    async def _copy_dropped(self, ino: int) -> None:
        if self.on_copy_dropped is not None:
            await self.on_copy_dropped(ino)


"""The node registry: each agent heartbeats an entry ``/.hycache-nodes/<node-id>`` (kind
"special", target = its peer address) and reads the others'; the directory is hidden
from the mount."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from hycache_dht import registry
from hycache_dht.meta import EntryMeta, MetaStore
from hycache_dht.registry import NODE_TTL_SECONDS, NODES_DIR, node_info

from hycache_agent.cluster.store_link import StoreLink
from hycache_agent.fs.namespace import FsError
from hycache_agent.fs.namespace import join_path as join

log = logging.getLogger("hycache_agent.cluster.dht_link")  # one log for all the parts of the link

HEARTBEAT_SECONDS = 2.0


class NodeRegistry:
    """This node's entry (``load`` gives the load it reports) and the others' as of the
    last heartbeat (``known_nodes``: id -> {addr, load, age, alive})."""

    def __init__(self, link: StoreLink, *, node_id: str, advertise: str, load: Callable[[], Any]) -> None:
        self.link = link
        self.node_id = node_id
        self.advertise = advertise
        self._load = load
        self.known_nodes: dict[str, dict[str, Any]] = {}

    def node_meta(self) -> EntryMeta:
        return registry.node_entry(self.node_id, self.advertise, self._load())

    async def heartbeat(self) -> None:
        while True:
            if not self.link.is_connected:
                await trio.sleep(0.2)
                continue
            try:
                self.known_nodes = await trio.to_thread.run_sync(self._beat_and_list, self.node_meta(),
                                                                 self.link.store)
            except Exception as exc:
                self.link.degraded(exc)
            await trio.sleep(HEARTBEAT_SECONDS)

    def _beat_and_list(self, meta: EntryMeta, store: MetaStore) -> dict[str, dict[str, Any]]:
        registry.beat(store, meta)
        return self.nodes_blocking(store)

    @staticmethod
    def nodes_blocking(store: MetaStore) -> dict[str, dict[str, Any]]:
        return registry.list_nodes(store)

    async def address_of(self, node_id: str) -> str:
        known = self.known_nodes.get(node_id)
        if known is not None and known["alive"]:
            return known["addr"]
        meta = await trio.to_thread.run_sync(self.link.store.get, join(NODES_DIR, node_id.encode()))
        if meta is None or not meta.target:
            raise FsError(errno.EHOSTUNREACH, f"node {node_id} is not registered")
        if time.time() - meta.mtime_ns / 1e9 > NODE_TTL_SECONDS:
            log.warning("node %s missed its heartbeats; trying it anyway", node_id)
        return node_info(meta)["addr"]

"""What placement reads of the live cluster: the live nodes, each node's fast-tier
capacity and census (its last heartbeat), and where the files are (the DHT)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import Invalid
from .namespace import NamespaceService
from .nodes import NodeService
from .steps import ns_path


class ClusterState:
    def __init__(self, namespace: NamespaceService, nodes: NodeService) -> None:
        self.namespace = namespace
        self.nodes = nodes

    def live_nodes(self) -> list[str]:
        return [n.id for n in self.nodes.snapshot() if n.state in ("up", "degraded")]

    def target_nodes(self, nodes: list[str] | None, loc: tuple[str, ...], what: str) -> list[str]:
        """``nodes`` when every one is known, else the live nodes when none are given;
        Invalid at ``loc`` otherwise (``what`` is placed: "the manifest", "the job")."""
        if nodes is None:
            nodes = self.live_nodes()
            if not nodes:
                raise Invalid(loc, f"no live nodes to place {what} on (and none given)")
            return nodes
        unknown = [n for n in nodes if not self.nodes.known(n)]
        if unknown:
            raise Invalid(loc, f"unknown node(s): {', '.join(unknown)}")
        return nodes

    def fast_status(self, nodes: list[str]) -> dict[str, dict[str, Any] | None]:
        """Each node's fast-tier census from its last heartbeat (``tiers.fast``)."""
        out: dict[str, dict[str, Any] | None] = {}
        for n in nodes:
            live = self.nodes.get(n)
            out[n] = ((live.status or {}).get("tiers") or {}).get("fast") if live is not None else None
        return out

    def capacity(self, nodes: list[str]) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for n, fast in self.fast_status(nodes).items():
            cap = (fast or {}).get("capacity")
            out[n] = int(cap) if isinstance(cap, (int, float)) and cap > 0 else None
        return out

    def locations(self, files: Iterable[str]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The files' primary nodes (file → node), and the census of those that exist
        (file → ``{"node", "tier", "size", "pinned"}``, the DHT's entries): where each
        one is, on which tier, for layer 2's starting state."""
        out: dict[str, str] = {}
        census: dict[str, dict[str, Any]] = {}
        if not self.namespace.configured:
            return out, census
        names = list(files)
        metas: list = []
        for k in range(0, len(names), 1024):  # pipelined, a bounded batch at a time
            metas.extend(self.namespace.get_many([ns_path(f) for f in names[k:k + 1024]]))
        for f, meta in zip(names, metas):
            if meta is not None and meta.kind == "file" and meta.primary:
                out[f] = meta.primary
                census[f] = {"node": meta.primary, "tier": meta.tier, "size": meta.size, "pinned": bool(meta.pinned)}
        return out, census

    def sizes_and_primaries(self, paths: Iterable[str]) -> tuple[dict[str, int], dict[str, str]]:
        """Each path's size (0 when it is not a file yet) and its primary node, one lookup each."""
        sizes: dict[str, int] = {}
        locations: dict[str, str] = {}
        for path in paths:
            meta = self.namespace.get(path) if self.namespace.configured else None
            sizes[path] = int(meta.size) if meta is not None and meta.kind == "file" else 0
            if meta is not None and meta.kind == "file" and meta.primary:
                locations[path] = meta.primary
        return sizes, locations

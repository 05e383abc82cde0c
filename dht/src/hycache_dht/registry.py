"""The reserved names of the global namespace: the node registry and the node inboxes.

Every agent heartbeats an entry ``/.hycache-nodes/<node-id>`` (kind ``special``; its
``target`` holds msgpack ``{"addr": peer address, "load": {...}}``, its ``mtime`` is the
last beat).  ``/.hycache-inbox/<node-id>/`` holds messages to a node.  Both live at the
root and are hidden from the mount and from namespace listings.  The agent writes them;
the control plane reads them — both through this module, so the layout has one home.
"""

from __future__ import annotations

import stat
import time
from typing import Any

import msgpack

from .meta import EntryMeta, MetaStore
from .paths import join

NODES_DIR = b"/.hycache-nodes"
INBOX_DIR = b"/.hycache-inbox"
#: names at the root that belong to HyCache itself, never shown as files
HIDDEN_ROOT_NAMES = frozenset({NODES_DIR[1:], INBOX_DIR[1:]})
#: a node whose registry entry is older than this is not alive
NODE_TTL_SECONDS = 10.0


def hidden(dirpath: bytes, name: bytes) -> bool:
    """Whether ``dirpath/name`` is one of HyCache's own reserved names."""
    return dirpath == b"/" and name in HIDDEN_ROOT_NAMES


def node_path(node_id: str) -> bytes:
    return join(NODES_DIR, node_id.encode())


def node_info(meta: EntryMeta) -> dict[str, Any]:
    """A registry entry's payload: ``{"addr": ..., "load": {...}}`` (msgpack in the
    entry's target; a bare address from agents before load reporting)."""
    raw = meta.target or b""
    if raw[:1] and raw[0] >= 0x80:
        info: dict[str, Any] = msgpack.unpackb(raw, raw=False)
        return info
    return {"addr": raw.decode(), "load": None}


def node_entry(node_id: str, addr: str, load: dict[str, Any] | None) -> EntryMeta:
    """The registry entry a heartbeat writes (its mtime is the beat)."""
    now = time.time_ns()
    info = msgpack.packb({"addr": addr, "load": load})
    return EntryMeta("special", stat.S_IFREG | 0o444, 0, 0, 0, now, now, now, primary=node_id, target=info)


def beat(store: MetaStore, meta: EntryMeta) -> None:
    """(blocking) Write a heartbeat entry, creating the registry directory if needed."""
    if store.get(NODES_DIR) is None:
        now = time.time_ns()
        store.create(NODES_DIR, EntryMeta("dir", stat.S_IFDIR | 0o755, 0, 0, 0, now, now, now))
    if meta.primary is None:
        raise ValueError("a heartbeat entry names its node (primary): see node_entry")
    store.put(join(NODES_DIR, meta.primary.encode()), meta)


def list_nodes(store: MetaStore, now: float | None = None) -> dict[str, dict[str, Any]]:
    """(blocking) Every registered node: id -> ``{addr, load, age, alive, last_beat}``."""
    out: dict[str, dict[str, Any]] = {}
    now = time.time() if now is None else now
    try:
        entries = list(store.list_dir(NODES_DIR))
    except FileNotFoundError:
        return out
    for name, meta in entries:
        last = meta.mtime_ns / 1e9
        age = now - last
        out[name.decode()] = {**node_info(meta), "age": round(age, 1), "alive": age < NODE_TTL_SECONDS,
                              "last_beat": last}
    return out

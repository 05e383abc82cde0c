"""The one-key plumbing of the Redis engine, under both halves of
:class:`~hycache_dht.redis_store.RedisClusterStore` (single-slot operations in
redis_store.py, the protocols across slots in redis_protocols.py): the connection and
namespace, the layout of a stored entry and of a directory hash's header, a directory's
key, a script run on one key (waiting while a rename holds it), reads, and the error of a
script's status.
"""

from __future__ import annotations

import errno
import os
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import msgpack

from . import keys, lua, paths
from .cluster_client import ClientConfig, ClusterClient, Item
from .lua import (
    ST_BUSY,
    ST_GONE,
    ST_ISDIR,
    ST_NOPARENT,
    ST_NOTDIR,
    ST_NOTEMPTY,
    ST_NOTFOUND,
    ST_NOTPRIMARY,
)
from .meta import (
    DHTBusy,
    EntryMeta,
    MetaStore,
    NotPrimary,
    not_empty,
    root_meta,
    unpack_body,
)

# positions in a stored entry (lua.py)
E_VER, E_WRITER, E_LEASE, E_KIND, E_RID, E_BODY, E_PIN = range(7)


def decode_entry(raw: bytes) -> EntryMeta:
    e = msgpack.unpackb(raw, raw=True)
    return unpack_body(
        e[E_KIND].decode(), e[E_BODY], e[E_VER], e[E_WRITER].decode() or None, e[E_LEASE] / 1000.0
    )


def fields(raw: bytes) -> list[Any]:
    f: list[Any] = msgpack.unpackb(raw, raw=True)
    return f


def header(raw: bytes | None) -> tuple[bytes | None, str, str, int, int]:
    """(path, state, owner id, server ms of the last change, extra) of a directory hash's
    header; state ``none`` when there is no header (no such directory)."""
    if raw is None:
        return None, "none", "", 0, 0
    h = msgpack.unpackb(raw, raw=True)
    return h[0], h[1].decode(), h[2].decode(), int(h[3]), int(h[4])


def new_id() -> str:
    return uuid.uuid4().hex


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBase(MetaStore):
    """A namespace on Redis Cluster and the one-key plumbing both halves of the engine use.

    ``namespace`` prefixes every key (several file systems, or test runs, share a cluster).
    ``config`` (or its fields as keywords: ``op_timeout``, ``durable_replicas``, ...) tunes
    deadlines, durability (``WAIT``) and backoff. ``intent_timeout`` is how long a
    cross-slot operation may go without a heartbeat before another client's fsck may take
    it over.
    """

    def __init__(
        self,
        startup_nodes: Sequence[tuple[str, int]],
        *,
        namespace: str = "hc",
        config: ClientConfig | None = None,
        intent_timeout: float = 30.0,
        scan_count: int = 1000,
        **config_kw: Any,
    ) -> None:
        self.ns = keys.check_namespace(namespace)
        cfg = config or ClientConfig(**config_kw)
        self.c = ClusterClient(startup_nodes, cfg, lua.SOURCES)
        self.cfg = self.c.config
        self.intent_timeout = max(0.1, float(intent_timeout))
        self.scan_count = max(10, int(scan_count))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._active: set[str] = set()  # multi-step operations running in this instance
        self._mine: set[str] = set()  # ... and those it started and did not finish
        self._rec_key = keys.intent_records_key(self.ns)
        self._own_key = keys.intent_owners_key(self.ns)
        self._sc("mkhdr", self._dkey(paths.ROOT), paths.ROOT)  # the root always exists

    def _dkey(self, dirpath: bytes) -> bytes:
        return keys.dir_key(self.ns, dirpath)

    def _loc(self, path: bytes) -> tuple[bytes, bytes, bytes]:
        """(hash key, field, parent path) of ``path``'s entry."""
        parent, name = paths.split(paths.check(path))
        return self._dkey(parent), name, parent

    def _deadline(self) -> float:
        return time.monotonic() + self.cfg.op_timeout

    def _sc(self, name: str, key: bytes, *argv: Any, wait_busy: bool = True,
            deadline: float | None = None) -> tuple[list[Any], bool]:
        """Run script ``name`` on ``key``; while it answers BUSY (a rename holds the
        directory or entry) wait and repeat. Returns (reply, ambiguous)."""
        deadline = deadline or self._deadline()
        attempt = 0
        ambiguous = False
        while True:
            it = self.c.one(key, self.c.script_args(name, key, *argv), deadline=deadline)
            ambiguous = ambiguous or it.ambiguous
            reply: list[Any] = it.result
            if reply[0] != ST_BUSY or not wait_busy:
                return reply, ambiguous
            attempt += 1
            self.c.stats["busy_wait"] += 1
            if time.monotonic() >= deadline:
                raise DHTBusy()
            time.sleep(self.c.backoff(attempt))

    def _read(self, key: bytes, *args: Any) -> Any:
        """The reply of one read command (its shape is the command's)."""
        return self.c.one(key, args, write=False).result

    def _hscan(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Non-reserved fields of a hash, one page per round trip."""
        cursor = 0
        while True:
            cursor, page = self._read(key, "HSCAN", key, cursor, "COUNT", self.scan_count)
            for name, raw in page.items():
                if not keys.is_reserved_field(name):
                    yield name, raw
            if int(cursor) == 0:
                return

    def _raw_entry(self, path: bytes) -> tuple[bytes | None, str]:
        """(stored entry, state of its directory's hash)."""
        key, name, _ = self._loc(path)
        raw, h = self._read(key, "HMGET", key, name, keys.HEADER)
        return raw, header(h)[1]

    def _raise(self, status: int, path: bytes, reply: Sequence[Any] | None = None) -> NoReturn:
        if status == ST_NOTPRIMARY:
            assert reply is not None  # the script's NOTPRIMARY reply names the primary
            raise NotPrimary(path, _text(reply[2]), int(reply[1]))
        if status in (ST_GONE, ST_NOTFOUND, ST_NOPARENT):
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        if status == ST_ISDIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if status == ST_NOTDIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        if status == ST_NOTEMPTY:
            raise not_empty(path)
        if status == ST_BUSY:
            raise DHTBusy()
        raise RuntimeError(f"unexpected script status {status} for {path!r}")

    def _error(self, status: int, path: bytes, reply: Sequence[Any] | None = None) -> BaseException:
        try:
            self._raise(status, path, reply)
        except Exception as e:
            return e
        raise AssertionError("unreachable")

    # -- reads ----------------------------------------------------------------------------

    def get(self, path: bytes) -> EntryMeta | None:
        return self.get_many([path])[0]

    def get_many(self, paths_: list[bytes]) -> list[EntryMeta | None]:
        """Several ``get`` in one pipelined round trip per master."""
        items = []
        for p in paths_:
            key, name, _ = self._loc(p)
            items.append(Item(key, ("HMGET", key, name, keys.HEADER), write=False))
        self.c.run(items)
        out: list[EntryMeta | None] = []
        for p, it in zip(paths_, items):
            if isinstance(it.result, BaseException):
                raise it.result
            raw, h = it.result
            if raw is None or header(h)[1] == "gone":
                out.append(root_meta() if p == paths.ROOT else None)
            else:
                out.append(decode_entry(raw))
        return out

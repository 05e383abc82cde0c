"""The global namespace, read from the DHT with the agents' own store (hycache_dht)."""

from __future__ import annotations

import base64
import binascii
import threading
from typing import Any

from hycache_dht import registry
from hycache_dht.meta import DHTUnavailable, EntryMeta
from hycache_dht.paths import join

from .errors import Invalid, NotFound, Unavailable

PATH_LOC = ("query", "path")


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def entry_view(path: bytes, name: bytes, m: EntryMeta) -> dict[str, Any]:
    return {"name": _name(name) if path != b"/" else "", "path": _name(path), "kind": m.kind, "size": m.size,
            "mtime": m.mtime_ns / 1e9, "primary": m.primary, "tier": m.tier, "replicas": list(m.replicas),
            "pinned": m.pinned, "version": m.version}


def encode_cursor(position: tuple[int, int]) -> str:
    """The opaque ``next_cursor`` of a listing: where the store's page walk resumes."""
    return base64.urlsafe_b64encode(f"{position[0]}.{position[1]}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        scan, _, skip = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition(".")
        position = int(scan), int(skip)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise Invalid(("query", "cursor"), "not a cursor of this listing") from None
    if position[0] < 0 or position[1] < 0:
        raise Invalid(("query", "cursor"), "not a cursor of this listing")
    return position


class NamespaceService:
    """``store_factory()`` builds a ``RedisClusterStore`` on the agents' seeds and namespace
    (None when no Redis is configured)."""

    def __init__(self, store_factory) -> None:
        self.store_factory = store_factory
        self._store = None
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        return self.store_factory is not None

    def store(self):
        if self.store_factory is None:
            raise Unavailable(("query", "path"), "no Redis Cluster configured (--redis)")
        with self._lock:
            if self._store is None:
                try:
                    self._store = self.store_factory()
                except Exception as e:
                    raise Unavailable(("query", "path"), f"the DHT is unreachable: {e}") from e
            return self._store

    def ping(self) -> bool:
        return self.store().ping()

    def nodes(self) -> dict[str, dict]:
        return registry.list_nodes(self.store())

    def get(self, path: str) -> EntryMeta | None:
        p = path.encode()
        if self._reserved(p):
            return None
        try:
            return self.store().get(p)
        except DHTUnavailable as e:
            raise Unavailable(PATH_LOC, f"the DHT is unreachable: {e}") from e

    def get_many(self, paths: list[str]) -> list[EntryMeta | None]:
        """Several :meth:`get` in one pipelined round trip per master."""
        raw = [p.encode() for p in paths]
        asked = [p for p in raw if not self._reserved(p)]
        try:
            store = self.store()
            many = getattr(store, "get_many", None)  # Redis Cluster: pipelined; other stores one by one
            got = dict(zip(asked, many(asked) if many else [store.get(p) for p in asked])) if asked else {}
        except DHTUnavailable as e:
            raise Unavailable(PATH_LOC, f"the DHT is unreachable: {e}") from e
        return [got.get(p) for p in raw]

    @staticmethod
    def _reserved(p: bytes) -> bool:
        parts = p.split(b"/")
        return len(parts) > 1 and registry.hidden(b"/", parts[1])

    def info(self, path: str) -> dict[str, Any]:
        m = self.get(path)
        if m is None:
            raise NotFound(PATH_LOC, f"no such file or directory: {path}")
        p = path.encode()
        return entry_view(p, p.rsplit(b"/", 1)[-1], m)

    def list(self, path: str, cursor: str | None, limit: int,
             prefix: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a directory (``RedisClusterStore.list_page``: never the whole
        directory; a directory that fits one batch pages in name order, a large one in
        its hash's order), names starting with ``prefix`` only, after ``cursor`` (the
        ``next_cursor`` of the previous page).  A page may hold fewer than ``limit``
        entries and still have a ``next_cursor`` (a rare prefix, hidden entries)."""
        p = path.encode()
        position = decode_cursor(cursor) if cursor else None
        if self._reserved(p):
            raise NotFound(PATH_LOC, f"no such file or directory: {path}")
        try:
            entries, nxt = self.store().list_page(p, position, limit, (prefix or "").encode())
        except FileNotFoundError:
            raise NotFound(PATH_LOC, f"no such file or directory: {path}") from None
        except NotADirectoryError:
            raise Invalid(PATH_LOC, f"not a directory: {path} (use /files/info)", "not_a_directory") from None
        except DHTUnavailable as e:
            raise Unavailable(PATH_LOC, f"the DHT is unreachable: {e}") from e
        items = [entry_view(join(p, n), n, m) for n, m in entries if not registry.hidden(p, n)]
        return items, encode_cursor(nxt) if nxt is not None else None

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

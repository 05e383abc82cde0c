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


def encode_cursor(name: bytes) -> str:
    return base64.urlsafe_b64encode(name).decode().rstrip("=")


def decode_cursor(cursor: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise Invalid(("query", "cursor"), "not a cursor of this listing") from None


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

    def list(self, path: str, cursor: str | None, limit: int) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a directory, in name order, after ``cursor`` (the last name of the
        previous page).  The directory is read in the store's pages (HSCAN) and sorted here:
        O(entries) per page, but a page is stable while names come and go."""
        p = path.encode()
        after = decode_cursor(cursor) if cursor else None
        if self._reserved(p):
            raise NotFound(PATH_LOC, f"no such file or directory: {path}")
        try:
            entries = self.store().list_dir(p)
            names = sorted(((n, m) for n, m in entries if not registry.hidden(p, n) and (after is None or n > after)),
                           key=lambda e: e[0])
        except FileNotFoundError:
            raise NotFound(PATH_LOC, f"no such file or directory: {path}") from None
        except NotADirectoryError:
            raise Invalid(PATH_LOC, f"not a directory: {path} (use /files/info)", "not_a_directory") from None
        except DHTUnavailable as e:
            raise Unavailable(PATH_LOC, f"the DHT is unreachable: {e}") from e
        page = names[:limit]
        nxt = encode_cursor(page[-1][0]) if len(names) > limit else None
        return [entry_view(join(p, n), n, m) for n, m in page], nxt

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

"""The peer protocol's wire format: addresses, request targets, Range, ETags, and the
engine-side interfaces the data service serves (:class:`PeerFiles`).

Protocol (see ``docs/peer.md``)::

    GET  /v1/health                 no authentication; node id and version
    GET  /v1/files?path=<pct-bytes> the file's bytes; Range: bytes=a-b → 206; ETag; If-Range
    HEAD /v1/files?path=...         the same headers, no body
    PUT  /v1/files?path=...         a replica's full bytes; X-HyCache-* metadata headers → 201
    PUT  /v1/parts?path=...         one byte range of a replica pushed in parts (X-HyCache-Part:
                                    <push id> <count>, Content-Range) → 201 once every part is in

Every request except health is signed (:mod:`hycache_agent.transport.auth`).  Errors are
JSON objects ``{"error": "...", "status": N}``.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Protocol, runtime_checkable
from urllib.parse import quote_from_bytes, unquote_to_bytes

API = "v1"
CHUNK = 1 << 20  # file read / write unit
PART_HEADER = "x-hycache-part"  # "<push id> <count>": a part of a push in byte ranges (transport/parts.py)
PUSH_HEADER = "x-hycache-push"  # "background": a replica push nobody waits for (received at a low priority)
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ETAG_RE = re.compile(r"[\x21\x23-\x7e]{1,200}\Z")  # RFC 9110 etagc, no quote
FILES = b"/" + API.encode() + b"/files"
PARTS = b"/" + API.encode() + b"/parts"
HEALTH = b"/" + API.encode() + b"/health"
METRICS = b"/metrics"


def agent_version() -> str:
    try:
        return metadata.version("hycache-agent")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


# ---------------------------------------------------------------------------- the engine side
@runtime_checkable
class PeerFile(Protocol):
    """A file opened for a peer.  ``blob`` is a local path the server reads ``size`` bytes
    from; ``etag`` is the file's version token.  The engine keeps the blob valid (not
    migrated away, not removed) until :meth:`close`, which the server always awaits when
    the response ends, however it ends."""

    blob: str
    size: int
    etag: str

    async def close(self) -> None: ...


@runtime_checkable
class PeerFiles(Protocol):
    """What the data service needs from the engine.

    ``open_for_peer`` raises FileNotFoundError for unknown paths (also IsADirectoryError,
    NotADirectoryError → 404; PermissionError → 403).  ``receive_replica`` adopts
    ``temp_blob``, a complete, fsync'd file the server wrote in ``staging_dir``; after it
    returns, the temp file belongs to the engine; if it raises, the server removes it.
    ValueError → 400, FileExistsError → 409, ENOSPC/EDQUOT → 507, anything else → 500.
    ``headers`` holds the request's ``x-hycache-*`` headers (lower-case names), plus
    ``content-length`` and ``x-hycache-from`` (the authenticated sender's node id)."""

    staging_dir: str

    async def open_for_peer(self, path: bytes) -> PeerFile: ...

    async def receive_replica(self, path: bytes, temp_blob: str, headers: dict[str, str]) -> None: ...

def parse_addr(addr: str | tuple[str, int], default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT``, ``:PORT`` or a (host, port) tuple → (host, port)."""
    if isinstance(addr, tuple):
        return addr[0], int(addr[1])
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or default_host, int(port)


def files_target(path: bytes, endpoint: str = "files") -> str:
    """The request-target of ``/v1/files`` (or ``endpoint``) for a path (every byte but
    unreserved ones and '/' percent-encoded, so non-UTF-8 names travel intact)."""
    return f"/{API}/{endpoint}?path={quote_from_bytes(path, safe='/')}"


def parse_query(query: bytes) -> dict[str, bytes]:
    """Percent-decode ``k=v&...`` into bytes values ('+' is a literal plus, not a space)."""
    out: dict[str, bytes] = {}
    for part in query.split(b"&"):
        if not part:
            continue
        k, _, v = part.partition(b"=")
        out[unquote_to_bytes(k).decode("utf-8", "replace")] = unquote_to_bytes(v)
    return out


class RangeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_range(value: str, size: int) -> tuple[int, int]:
    """One ``bytes=`` range → (first, last) inclusive, clipped to the file.  Raises
    RangeError(400) for a malformed or multi-range header, (416) for an unsatisfiable one."""
    unit, sep, spec = value.strip().partition("=")
    if not sep or unit.strip().lower() != "bytes":
        raise RangeError(400, f"unsupported Range {value!r} (want bytes=FIRST-LAST)")
    if "," in spec:
        raise RangeError(400, "multiple ranges are not supported")
    a, sep, b = spec.strip().partition("-")
    a, b = a.strip(), b.strip()
    if not sep or (a and not (a.isascii() and a.isdigit())) or (b and not (b.isascii() and b.isdigit())) \
            or (not a and not b):
        raise RangeError(400, f"malformed Range {value!r}")
    if not a:  # suffix: the last b bytes
        n = int(b)
        if n == 0 or size == 0:
            raise RangeError(416, f"range {value!r} not satisfiable for size {size}")
        return max(0, size - n), size - 1
    first = int(a)
    last = int(b) if b else size - 1
    if b and last < first:
        raise RangeError(400, f"malformed Range {value!r} (last < first)")
    if first >= size:
        raise RangeError(416, f"range {value!r} not satisfiable for size {size}")
    return first, min(last, size - 1)


def unquote_etag(value: str) -> str:
    value = value.strip()
    value = value.removeprefix("W/")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value


"""ASGI middlewares: the request-body bound (413; gzip bodies decompressed within it) and
the audit log of mutating requests."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping

import anyio

log = logging.getLogger(__name__)

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


async def _send_json(send, status: int, body: dict) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


def _too_large(limit: int) -> dict:
    return {"detail": [{"loc": ["body"], "msg": f"request body larger than {limit} bytes", "type": "too_large"}]}


def _gunzip(data: bytes, limit: int) -> bytes | None:
    """``data`` decompressed (gzip), or None when that would exceed ``limit`` bytes.
    Raises ``zlib.error`` on a corrupt stream."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        return None
    if not d.eof:
        raise zlib.error("truncated gzip stream")
    return out


class BodyLimit:
    """413 for a body over its bound: ``limit`` bytes, or ``routes[(method, path)]`` for
    the requests named there (e.g. manifests: real workflow instances run to tens of MB);
    by its Content-Length, or while it streams in.  A body with ``Content-Encoding:
    gzip`` is read within the bound, decompressed in a worker thread within the same
    bound (413 past it) and handed on as a plain body; any other encoding gets 415."""

    def __init__(self, app, limit: int, routes: Mapping[tuple[str, str], int] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.routes = dict(routes or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.routes.get((scope.get("method", ""), scope.get("path", "").rstrip("/")), self.limit)
        headers = scope.get("headers", [])
        encoding = b"identity"
        for k, v in headers:
            if k == b"content-encoding":
                encoding = v.strip().lower()
        if encoding not in (b"identity", b"gzip", b""):
            return await _send_json(send, 415, {"detail": [{"loc": ["header", "Content-Encoding"],
                                                            "msg": "only gzip or identity", "type": "value_error"}]})
        for k, v in headers:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await _send_json(send, 400, {"detail": [{"loc": ["header", "Content-Length"],
                                                                     "msg": "not a number", "type": "value_error"}]})
                if n > limit:
                    return await _send_json(send, 413, _too_large(limit))
        if encoding != b"gzip" and any(k == b"content-length" for k, _ in headers):
            return await self.app(scope, receive, send)  # the server holds the body to its length
        # a streamed (chunked) or compressed body: read it up to the bound before the app sees it
        chunks, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            body = msg.get("body", b"")
            seen += len(body)
            if seen > limit:
                return await _send_json(send, 413, _too_large(limit))
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        whole = b"".join(chunks)
        if encoding == b"gzip":
            try:
                plain = await anyio.to_thread.run_sync(_gunzip, whole, limit)
            except zlib.error as e:
                return await _send_json(send, 400, {"detail": [{"loc": ["body"], "msg": f"not a gzip stream: {e}",
                                                                 "type": "value_error"}]})
            if plain is None:
                return await _send_json(send, 413, _too_large(limit))
            whole = plain
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in headers if k not in (b"content-encoding", b"content-length")]
            scope["headers"].append((b"content-length", str(len(whole)).encode()))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Audit:
    """Records every mutating /api/v1 request (but the agents' heartbeats and the online
    placement queries) as an ``audit``
    event: token name, method and path, status."""

    def __init__(self, app, control_getter) -> None:
        self.app = app
        self.control_getter = control_getter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in MUTATING or not scope["path"].startswith("/api/v1/") \
                or scope["path"].endswith(("/heartbeats", "/placements")):
            return await self.app(scope, receive, send)
        status = 500

        async def tracking_send(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            actor = (scope.get("state") or {}).get("actor")
            control = self.control_getter()
            if control is not None:
                try:
                    await anyio.to_thread.run_sync(lambda: control.events.record(
                        "audit", f"{scope['method']} {scope['path']}"[:200], str(status), actor=actor))
                except Exception as e:
                    log.warning("audit record failed: %s", e)

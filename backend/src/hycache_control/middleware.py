"""ASGI middlewares: the request-body bound (413) and the audit log of mutating requests."""

from __future__ import annotations

import json
import logging

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


class BodyLimit:
    """413 for a body over ``limit`` bytes: by its Content-Length, or while it streams in."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await _send_json(send, 400, {"detail": [{"loc": ["header", "Content-Length"],
                                                                     "msg": "not a number", "type": "value_error"}]})
                if n > self.limit:
                    return await _send_json(send, 413, _too_large(self.limit))
        if any(k == b"content-length" for k, _ in scope.get("headers", [])):
            return await self.app(scope, receive, send)  # the server holds the body to its length
        # a streamed (chunked) body: read it up to the bound before the app sees it
        chunks, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            body = msg.get("body", b"")
            seen += len(body)
            if seen > self.limit:
                return await _send_json(send, 413, _too_large(self.limit))
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        whole = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Audit:
    """Records every mutating /api/v1 request (but the agents' heartbeats) as an ``audit``
    event: token name, method and path, status."""

    def __init__(self, app, control_getter) -> None:
        self.app = app
        self.control_getter = control_getter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in MUTATING or not scope["path"].startswith("/api/v1/") \
                or scope["path"].endswith("/heartbeats"):
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

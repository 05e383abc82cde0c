"""A replica pushed in several byte ranges at once (``PUT /v1/parts``): the sender's side.

One loopback TCP stream is bound by the one core that runs it (the sender's thread pays
the receive path too), so a push a writer waits for goes in ``streams`` parts, each a
``sendfile`` of its byte range on a connection and a worker thread of its own.  The
holder writes each part at its offset into one staged file and adopts the replica when
all of them arrived (transport/parts.py).  The rules kept here:

* part boundaries are multiples of ``direct_in.DIRECT_HOP`` (the holder's aligned direct
  writes), so only the last part has an unaligned tail;
* each part asks ``Expect: 100-continue``: a peer that does not know ``/v1/parts``
  answers 404 before any body byte (:class:`NoParts`: the caller pushes in one stream);
* the answers are read once every part's body is sent (the holder answers a part only
  when all are in, so no part times out waiting for a slower one);
* one failed part fails the push: the other parts are cancelled (their connections
  closed, so the holder drops the staged file) and the caller retries the whole push
  under a new push id.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.blob_io import FileBody
from hycache_agent.transport.direct_in import DIRECT_HOP
from hycache_agent.transport.errors import PeerAuthError, PeerError, PeerNotFound
from hycache_agent.transport.wire import PART_HEADER, files_target

PARTS_MIN = 16 << 20  # a push in parts from this size (smaller: one stream)


class NoParts(Exception):
    """The peer does not know ``/v1/parts`` (an older agent)."""


class PartRetry(PeerError):
    """A retryable answer (503) to a part."""


def split(size: int, streams: int) -> list[tuple[int, int]]:
    """(first, length) of each part: ``streams`` ranges of whole DIRECT_HOP buffers but the
    last (fewer parts if the file is too small for that many)."""
    per = -(-size // streams)
    per = -(-per // DIRECT_HOP) * DIRECT_HOP
    return [(first, min(per, size - first)) for first in range(0, size, per)]


class PartPusher:
    """Pushes in parts over connections of ``pool`` (see the module).  ``sign(target)`` is
    the Authorization of a PUT, ``thread`` runs a blocking call on a worker thread."""

    def __init__(self, pool: bulk.Pool, *, streams: int, sign: Callable[[bytes], str],
                 thread: Callable[..., Awaitable[Any]], timeout: float, stats: Any) -> None:
        self.pool = pool
        self.streams = max(1, streams)
        self.sign = sign
        self.thread = thread
        self.timeout = timeout
        self.stats = stats
        self.one_stream: set[tuple[str, int]] = set()  # peers that answered 404 to /v1/parts

    def wanted(self, host: str, port: int) -> bool:
        return self.streams > 1 and (host, port) not in self.one_stream

    async def push(self, host: str, port: int, path: bytes, fd: int, size: int,
                   extra: list[tuple[str, str]]) -> dict[str, Any]:
        """``size`` bytes of ``fd`` pushed as ``path``'s replica in parts; the holder's answer."""
        ranges = split(size, self.streams)
        push_id = secrets.token_hex(8)
        target = files_target(path, "parts").encode("ascii")
        answers: dict[int, dict[str, Any]] = {}
        errors: list[Exception] = []
        all_sent = trio.Event()
        sent = 0

        async def one(first: int, length: int, nursery: trio.Nursery) -> None:
            nonlocal sent
            try:
                conn = await self.pool.get(host, port)
            except Exception as e:
                errors.append(e)
                nursery.cancel_scope.cancel()
                return
            try:
                hdrs = [*extra, ("content-length", str(length)),
                        ("content-range", f"bytes {first}-{first + length - 1}/{size}"),
                        (PART_HEADER, f"{push_id} {len(ranges)}"), ("expect", "100-continue"),
                        ("content-type", "application/octet-stream"), ("authorization", self.sign(target))]
                await self._send(conn, target, hdrs, fd, first, length, host, port, path)
                sent += 1
                if sent == len(ranges):
                    all_sent.set()
                await all_sent.wait()
                answers[first] = await self._answer(conn, host, port, path)
            except Exception as e:
                errors.append(e)
                nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await self.pool.put(conn, False)  # (the holder closes a part's connection)

        async with trio.open_nursery() as nursery:
            for first, length in ranges:
                nursery.start_soon(one, first, length, nursery)
        if errors:
            raise next((e for e in errors if isinstance(e, NoParts)), errors[0])
        return answers[0]

    async def _send(self, conn: bulk.Conn, target: bytes, hdrs: list[tuple[str, str]], fd: int, first: int,
                    length: int, host: str, port: int, path: bytes) -> None:
        """The part's head, the holder's 100 Continue, then its body by sendfile."""
        await bulk.send_head(conn, "PUT", target, hdrs)
        event = await bulk.read_event(conn, self.timeout)
        if isinstance(event, h11.Response):  # answered before the body: refused
            body = await bulk.read_small_body(conn, self.timeout)
            if event.status_code == 404:
                self.one_stream.add((host, port))
                raise NoParts(f"{host}:{port} answered 404 to PUT /v1/parts")
            raise self._error(event, body, host, port, path)
        if not isinstance(event, h11.InformationalResponse):
            raise bulk.Broken(f"connection ended before the answer to a part ({event!r})")
        n = await self.thread(bulk.sendfile_out, conn.fd, fd, first, length, self.timeout)
        self.stats.bytes_sent += n
        if n < length:
            raise PeerError(f"the source of {path!r} shrank while pushing it", addr=f"{host}:{port}", path=path)
        # h11 counts the body it did not see
        conn.h.send_with_data_passthrough(h11.Data(data=FileBody(length)))  # type: ignore[arg-type]  # h11 passes any sized body through; its annotation says bytes
        conn.h.send(h11.EndOfMessage())

    async def _answer(self, conn: bulk.Conn, host: str, port: int, path: bytes) -> dict[str, Any]:
        resp = await bulk.read_response(conn, self.timeout)
        body = await bulk.read_small_body(conn, self.timeout)
        if resp.status_code != 201:
            raise self._error(resp, body, host, port, path)
        answer: dict[str, Any] = json.loads(body)
        return answer

    @staticmethod
    def _error(resp: h11.Response, body: bytes, host: str, port: int, path: bytes) -> PeerError:
        status = resp.status_code
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            message = body[:200].decode("utf-8", "replace") or resp.reason.decode("latin-1")
        cls = {503: PartRetry, 404: PeerNotFound, 401: PeerAuthError}.get(status, PeerError)
        return cls(f"{host}:{port} {path!r}: HTTP {status} to a part: {message}", addr=f"{host}:{port}",
                   path=path, status=status)

"""One connection of the peer data service: h11's state, reading requests, sending responses."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
from collections.abc import AsyncGenerator, Iterable
from dataclasses import asdict, dataclass
from urllib.parse import quote_from_bytes

import h11
import trio

log = logging.getLogger(__name__)

RECV = 256 << 10  # socket receive unit
MAX_SMALL_BODY = 64 << 10  # bodies of requests that should have none (GET, HEAD) are drained up to this


@dataclass
class PeerStats:
    connections: int = 0
    requests: int = 0
    responses_2xx: int = 0
    responses_4xx: int = 0
    responses_5xx: int = 0
    range_requests: int = 0
    auth_failures: int = 0
    aborted: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_received_direct: int = 0  # of those, written past the page cache (replicas: transport/direct_in.py)
    active_transfers: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def count(self, status: int) -> None:
        if status < 300:
            self.responses_2xx += 1
        elif status < 500:
            self.responses_4xx += 1
        else:
            self.responses_5xx += 1


class Abort(Exception):
    """The response cannot be completed (the file shrank, a read failed): drop the
    connection so the peer sees a broken transfer rather than wrong bytes."""


class Stalled(Exception):
    """A request stopped arriving mid-way (not an OSError, unlike TimeoutError)."""


def error_status(e: BaseException) -> int:
    """The HTTP status an engine-side error answers (see :class:`PeerFiles`)."""
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return 404
    if isinstance(e, PermissionError):
        return 403
    if isinstance(e, FileExistsError):
        return 409
    if isinstance(e, ValueError):
        return 400
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return 507
    return 500


def describe(e: BaseException, path: bytes) -> str:
    what = quote_from_bytes(path, safe="/")
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return f"no such file: {what}"
    if isinstance(e, OSError):
        return f"{what}: {e.strerror or e}"
    return f"{what}: {e}"


class Conn:
    """One client connection: reads h11 events (an idle keep-alive connection times out
    quietly, a stalled request raises :class:`Stalled`) and sends responses, every one
    tagged with this node's id and counted in ``stats``."""

    __slots__ = ("close_after", "h", "idle_timeout", "marks", "node_id", "peer", "stats", "stream")

    def __init__(self, stream: trio.SocketStream, *, node_id: str, idle_timeout: float, stats: PeerStats) -> None:
        self.stream = stream
        self.node_id = node_id
        self.idle_timeout = idle_timeout
        self.stats = stats
        self.close_after = False  # a body went around h11: no next request on this connection
        self.marks: list[tuple[str, float]] = []  # a request's steps (name, time.monotonic), for the debug log
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=16 << 10)
        try:
            host, port = stream.socket.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"

    async def next_event(self):
        """The next h11 event, reading from the socket as needed; None on idle timeout."""
        while True:
            event = self.h.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = b""
            with trio.move_on_after(self.idle_timeout) as cs:
                data = await self.stream.receive_some(RECV)
            if cs.cancelled_caught:
                if self.h.their_state is h11.IDLE:
                    return None  # idle keep-alive connection: close quietly
                raise Stalled(f"no data from {self.peer} for {self.idle_timeout:.0f} s")
            self.h.receive_data(data)

    async def protocol_error(self, e: h11.RemoteProtocolError) -> None:
        log.debug("bad HTTP from %s: %s", self.peer, e)
        if self.h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await self.send_json(e.error_status_hint or 400, {"error": f"bad request: {e}"}, close=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
                pass

    async def send(self, event) -> None:
        for piece in self.h.send_with_data_passthrough(event) or ():  # (None: ConnectionClosed)
            await self.stream.send_all(piece)

    def response(self, status: int, headers: Iterable[tuple[str, str]], close: bool = False) -> h11.Response:
        hdrs = [("x-hycache-node", self.node_id), *headers]
        if close or self.close_after:
            hdrs.append(("connection", "close"))
        self.stats.count(status)
        return h11.Response(status_code=status, headers=hdrs)

    async def send_head(self, status: int, headers: Iterable[tuple[str, str]], close: bool = False) -> None:
        await self.send(self.response(status, headers, close))

    async def send_json(self, status: int, obj: dict, *, head: bool = False, close: bool = False,
                        extra: Iterable[tuple[str, str]] = ()) -> None:
        extra = list(extra)
        if "error" in obj:
            obj = {**obj, "status": status}
            # also as a header, for HEAD requests (no body); ASCII only
            extra.append(("x-hycache-error", str(obj["error"]).encode("ascii", "replace").decode()[:500]))
        body = json.dumps(obj).encode()
        await self.send_head(status, [("content-type", "application/json"),
                                      ("content-length", str(len(body))), *extra], close=close)
        if not head and body:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def method_not_allowed(self, allow: str, method: str) -> None:
        await self.send_json(405, {"error": f"method {method} not allowed"},
                             head=method == "HEAD", close=method == "PUT", extra=[("allow", allow)])

    async def body(self) -> AsyncGenerator[bytes, None]:
        """The pieces of the request body, until its end (stalls and hang-ups raise)."""
        while True:
            event = await self.next_event()
            if event is None:
                raise Stalled("request body stalled")
            if isinstance(event, h11.Data):
                yield event.data
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("peer closed the connection mid-body")

    async def drain(self) -> bool:
        """Read the rest of a request body we do not want; False if it is too big (the
        connection must then close after the response)."""
        seen = 0
        async with contextlib.aclosing(self.body()) as body:
            async for data in body:
                seen += len(data)
                if seen > MAX_SMALL_BODY:
                    return False
        return True

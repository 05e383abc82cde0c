"""Bulk bodies of the peer protocol moved in the kernel (the client's side).

A whole-file GET and a replica PUT carry the file's bytes and nothing else; parsing them
with h11 in Python (httpx/httpcore) and writing them from worker threads costs more CPU
than the copy itself.  Here the request and the response *head* go through h11 as
everywhere else, and the body goes between the socket and the file in the kernel:

* a GET body: ``splice`` socket → pipe → file at its offset (no copy through user
  space; ``recv_into`` + ``write`` when the destination is not a regular file);
* a PUT body: ``sendfile`` from the source blob to the socket.

The syscalls run in worker threads (a cold file blocks on the disk), a bounded number of
bytes per hop, so the trio loop only sees one wake-up per hop and a cancelled transfer
stops within one hop (``trio.from_thread.check_cancelled`` between polls).

Connections are plain trio TCP streams kept alive per peer (a body received exactly to
its Content-Length leaves the connection at a message boundary); one h11 connection
object per request.  Integrity is the protocol's, as before: the signed request, the
status, Content-Length / Content-Range and the ETag (version token) are checked by the
caller, and a body that ends early is a broken transfer (resumed with Range/If-Range).
The protocol has no per-block checksum; TCP's checksum covers the wire, as it did for the
httpx path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import trio

RECV = 256 << 10  # socket reads for response heads
HOP = 4 << 20  # body bytes per worker-thread hop (progress is reported per hop)
SEND_HOP = 8 << 20  # body bytes per hop of a sendfile transfer
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
BULK_LOWAT = 4 << 20  # a bulk socket counts as writable below this much unsent data
TRIO_LOWAT = 16 << 10  # trio's own setting for its SocketStreams (it would drain the socket between polls)
PIPE_SIZE = 1 << 20  # the splice pipe's capacity (fs.pipe-max-size permitting)
POLL_SLICE = 0.25  # seconds between cancellation checks while a socket waits
IDLE_KEEP = 4  # idle connections kept per peer
IDLE_EXPIRY = 30.0  # seconds an idle connection is kept (the server drops them after 60)


class Broken(Exception):
    """The connection ended before the body did (retryable)."""


def wait_fd(fd: int, events: int, timeout: float, check: Callable[[], None] | None = None) -> None:
    """Until ``fd`` is ready for ``events``; TimeoutError after ``timeout`` seconds of
    nothing.  Calls ``check`` every POLL_SLICE, which raises to stop; by default trio's
    cancellation check (worker threads of ``trio.to_thread.run_sync`` only)."""
    p = select.poll()
    p.register(fd, events | select.POLLERR | select.POLLHUP)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no progress on fd {fd} for {timeout:.0f} s")
        if p.poll(min(left, POLL_SLICE) * 1000):
            return
        (check or trio.from_thread.check_cancelled)()


def set_notsent_lowat(sock, value: int) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, value)
    except OSError:
        pass


def is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def write_all(fd: int, pieces: list[bytes]) -> int:
    """(blocking) Every byte of ``pieces`` written at ``fd``'s offset: one ``writev``,
    finished with plain writes after a short one (rare on regular files)."""
    total = sum(len(p) for p in pieces)
    done = os.writev(fd, pieces) if pieces else 0
    if done < total:
        rest = memoryview(b"".join(pieces))[done:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return total


def make_pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # the default 64 KiB pipe works, in smaller steps
    return r, w


@dataclass
class Received:
    n: int = 0  # bytes written to the file
    error: BaseException | None = None  # what ended the hop early (None: all of it arrived)


def splice_in(sock_fd: int, fd: int, offset: int, count: int, timeout: float,
              pipe: tuple[int, int] | None, check: Callable[[], None] | None = None) -> Received:
    """Move ``count`` bytes from the (non-blocking) socket into ``fd`` at ``offset``:
    ``splice`` through ``pipe`` for a regular file, ``recv_into`` + ``write`` without a
    pipe.  Stops early on end of stream or a socket error (in ``error``; the bytes
    before it are written)."""
    out = Received()
    buf = bytearray(0 if pipe is not None else min(count, 1 << 20))  # (used without a pipe)
    try:
        while out.n < count:
            want = count - out.n
            try:
                if pipe is not None:
                    k = os.splice(sock_fd, pipe[1], min(want, PIPE_SIZE),
                                  flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
                else:
                    k = os.readv(sock_fd, [memoryview(buf)[:min(want, len(buf))]])
            except BlockingIOError:
                wait_fd(sock_fd, select.POLLIN, timeout, check)
                continue
            if k == 0:
                out.error = Broken(f"connection closed {count - out.n} bytes before the end of the body")
                return out
            if pipe is not None:
                left = k
                while left:  # drain the pipe into the file (blocking: the pipe holds k bytes)
                    m = os.splice(pipe[0], fd, left, offset_dst=offset + out.n, flags=os.SPLICE_F_MOVE)
                    left -= m
                    out.n += m
            else:
                view = memoryview(buf)[:k]
                while view:
                    m = os.write(fd, view)
                    view = view[m:]
                out.n += k
    except OSError as e:
        if not peer_cut(e):
            raise
        out.error = e
    return out


def peer_cut(e: OSError) -> bool:
    """A transfer's error that is the peer's or the network's: recorded on the transfer,
    not raised (a local failure, e.g. ENOSPC or EIO on the file, is raised)."""
    return isinstance(e, (ConnectionError, TimeoutError)) or e.errno in (errno.ECONNRESET, errno.EPIPE,
                                                                         errno.ETIMEDOUT)


def sendfile_out(sock_fd: int, fd: int, offset: int, count: int, timeout: float,
                 check: Callable[[], None] | None = None) -> int:
    """Send ``count`` bytes of ``fd`` at ``offset`` to the (non-blocking) socket; fewer
    only if the file ends first.  ``check`` as in :func:`wait_fd`, also after every
    ``sendfile`` call."""
    sent = 0
    while sent < count:
        try:
            k = os.sendfile(sock_fd, fd, offset + sent, count - sent)
        except BlockingIOError:
            wait_fd(sock_fd, select.POLLOUT, timeout, check)
            continue
        if k == 0:  # end of file
            break
        sent += k
        (check or trio.from_thread.check_cancelled)()  # (a socket that never fills: stop all the same)
    return sent


# --------------------------------------------------------------------------- connections
@dataclass
class Conn:
    stream: trio.SocketStream
    key: tuple[str, int]
    reused: bool = False
    h: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))

    @property
    def fd(self) -> int:
        return self.stream.socket.fileno()


class Pool:
    """Idle keep-alive connections per (host, port)."""

    def __init__(self, connect_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple[str, int], list[tuple[trio.SocketStream, float]]] = {}

    async def get(self, host: str, port: int) -> Conn:
        key = (host, port)
        idle = self._idle.get(key, [])
        now = time.monotonic()
        while idle:
            stream, since = idle.pop()
            if now - since < IDLE_EXPIRY:
                return Conn(stream, key, reused=True)
            await trio.aclose_forcefully(stream)
        with trio.fail_after(self.connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
        set_notsent_lowat(stream.socket, BULK_LOWAT)
        return Conn(stream, key)

    async def put(self, conn: Conn, reusable: bool) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if reusable and len(idle) < IDLE_KEEP:
            idle.append((conn.stream, time.monotonic()))
        else:
            await trio.aclose_forcefully(conn.stream)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for streams in idle.values():
            for stream, _ in streams:
                await trio.aclose_forcefully(stream)


async def send_head(conn: Conn, method: str, target: bytes, headers: list[tuple[str, str]]) -> None:
    host, port = conn.key
    hdrs = [("host", f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"), *headers]
    await conn.stream.send_all(conn.h.send(h11.Request(method=method, target=target, headers=hdrs)))


async def read_event(conn: Conn, timeout: float):
    """The next h11 event of the response, reading the socket as needed."""
    while True:
        event = conn.h.next_event()
        if event is not h11.NEED_DATA:
            return event
        with trio.fail_after(timeout):
            data = await conn.stream.receive_some(RECV)
        conn.h.receive_data(data)


async def read_response(conn: Conn, timeout: float) -> h11.Response:
    while True:
        event = await read_event(conn, timeout)
        if isinstance(event, h11.Response):
            return event
        if isinstance(event, h11.ConnectionClosed):
            raise Broken("connection closed before the response")
        # InformationalResponse (100 Continue): keep reading


async def read_small_body(conn: Conn, timeout: float, limit: int = 65536) -> bytes:
    body = b""
    while len(body) <= limit:
        event = await read_event(conn, timeout)
        if isinstance(event, h11.Data):
            body += bytes(event.data)
        else:
            break
    return body


async def read_body(conn: Conn, timeout: float, limit: int) -> bytes:
    """The whole body of a response of at most ``limit`` bytes (a range GET's block or
    small file), read on the loop: a body that small comes in one or two socket reads, so
    a worker-thread hop would cost more than it saves.  Broken if the connection ends
    first; h11 stops at the Content-Length."""
    pieces: list[bytes] = []
    n = 0
    while True:
        event = await read_event(conn, timeout)
        if isinstance(event, h11.Data):
            pieces.append(bytes(event.data))
            n += len(event.data)
            if n > limit:
                raise h11.RemoteProtocolError(f"a body of more than the {limit} bytes asked for")
        elif isinstance(event, h11.EndOfMessage):
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        elif isinstance(event, h11.ConnectionClosed):
            raise Broken(f"connection closed after {n} bytes of the body")


def buffered_body(conn) -> tuple[list[bytes], bool]:
    """The body bytes h11 already holds (read with the head), and whether the body ended.
    ``conn`` is anything with an ``h`` (h11.Connection): a client Conn or the server's."""
    pieces: list[bytes] = []
    while True:
        event = conn.h.next_event()
        if isinstance(event, h11.Data):
            pieces.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return pieces, True
        else:  # NEED_DATA: the rest is still in the socket
            return pieces, False


def header(resp: h11.Response, name: bytes) -> str | None:
    for k, v in resp.headers:
        if k == name:
            return v.decode("latin-1")
    return None

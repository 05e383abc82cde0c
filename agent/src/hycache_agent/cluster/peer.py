"""The agent-to-agent data service: authenticated HTTP/1.1 inside the agent's trio loop.

Peers (and later the control plane) fetch file bytes from the node that holds them and
push replicas to other nodes.  The server is :mod:`h11` driven directly on
``trio.serve_listeners``: one task per connection, keep-alive, no framework.  It does not
know the tiering engine; it talks to a :class:`PeerFiles` object that opens files for
reading and adopts received replicas.  Nothing blocking runs on the event loop: opening,
reading, writing, fsync and removing files go through ``trio.to_thread.run_sync`` (on a
limiter of its own, so a burst of peer transfers cannot starve the FUSE operations of
worker threads).

Protocol (see ``docs/peer.md``)::

    GET  /v1/health                 no authentication; node id and version
    GET  /v1/files?path=<pct-bytes> the file's bytes; Range: bytes=a-b → 206; ETag; If-Range
    HEAD /v1/files?path=...         the same headers, no body
    PUT  /v1/files?path=...         a replica's full bytes; X-HyCache-* metadata headers → 201

Every request except health carries ``Authorization: HyCache <node>:<unix-time>:<hex mac>``
with mac = HMAC-SHA256(cluster secret, METHOD "\\n" request-target "\\n" node "\\n" time),
request-target being the exact bytes of the path and query on the request line.  Errors
are JSON objects ``{"error": "...", "status": N}``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Protocol, runtime_checkable
from urllib.parse import quote_from_bytes, unquote_to_bytes

import h11
import trio

from hycache_agent.cluster import bulk
from hycache_agent.fs.tiers import remove_blob
from hycache_agent.secretfile import read_protected

log = logging.getLogger(__name__)

API = "v1"
AUTH_SCHEME = "HyCache"
MAX_SKEW = 60  # seconds between the signer's clock and ours
CHUNK = 1 << 20  # file read / write unit
RECV = 256 << 10  # socket receive unit
WRITEBACK_KICK = 8 << 20  # a received replica's write-back is started every this many bytes
IDLE_TIMEOUT = 60.0  # an idle keep-alive connection, or a stalled request, is dropped after this
MAX_SMALL_BODY = 64 << 10  # bodies of requests that should have none (GET, HEAD) are drained up to this
MIN_SECRET = 16  # bytes
SENDFILE_MIN = 1 << 20  # bodies from this size go by os.sendfile (smaller: one pread + send)
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ETAG_RE = re.compile(r"[\x21\x23-\x7e]{1,200}\Z")  # RFC 9110 etagc, no quote
FILES = b"/" + API.encode() + b"/files"
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


# ---------------------------------------------------------------------------- authentication
class SecretFileError(Exception):
    """The cluster secret file is missing, unsafe or unusable."""


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the shared cluster secret (the bytes of the file, surrounding whitespace
    stripped).  Refuses a file that other users can access (any of o+rwx), one that is not
    a regular file, and a secret shorter than 16 bytes.  Blocking: call it at start-up or
    through ``trio.to_thread.run_sync``."""
    path = os.fspath(path)
    data = read_protected(path, what="cluster secret file", error=SecretFileError, forbidden=0o007,
                          refusal="{what} {path} is accessible by other users (mode {mode}); run: "
                                  "chmod o-rwx {path}   (0600, or 0640 to share it with a group)")
    secret = data.strip()
    if len(secret) < MIN_SECRET:
        raise SecretFileError(
            f"cluster secret in {path} is {len(secret)} bytes; need at least {MIN_SECRET} "
            f"(e.g. head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path})")
    return secret


def _as_bytes(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8")


def sign(secret: bytes, method: str, target: str | bytes, node_id: str, ts: int) -> str:
    """Hex HMAC-SHA256 of ``METHOD\\ntarget\\nnode\\nts``; ``target`` is the request-target
    (path and query) exactly as it appears on the request line."""
    msg = b"\n".join((method.upper().encode("ascii"), _as_bytes(target), node_id.encode("ascii"),
                      str(int(ts)).encode("ascii")))
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def authorization(secret: bytes, node_id: str, method: str, target: str | bytes,
                  now: float | None = None) -> str:
    """The ``Authorization`` header value for one request."""
    if not NODE_ID_RE.match(node_id):
        raise ValueError(f"invalid node id {node_id!r} (letters, digits, '.', '_', '-'; at most 64)")
    ts = int(time.time() if now is None else now)
    return f"{AUTH_SCHEME} {node_id}:{ts}:{sign(secret, method, target, node_id, ts)}"


class AuthError(Exception):
    pass


def verify_authorization(secret: bytes, value: str | None, method: str, target: bytes,
                         now: float, max_skew: float = MAX_SKEW) -> str:
    """Check an ``Authorization`` header; return the signer's node id or raise AuthError."""
    if not value:
        raise AuthError("missing Authorization header")
    scheme, _, cred = value.strip().partition(" ")
    if scheme.lower() != AUTH_SCHEME.lower():
        raise AuthError(f"Authorization scheme must be {AUTH_SCHEME}")
    parts = cred.strip().split(":")
    if len(parts) != 3:
        raise AuthError("malformed credentials (want <node-id>:<unix-time>:<hex-hmac>)")
    node, ts_s, mac = parts
    if not NODE_ID_RE.match(node) or not ts_s.isascii() or not ts_s.isdigit() or len(ts_s) > 12:
        raise AuthError("malformed credentials (want <node-id>:<unix-time>:<hex-hmac>)")
    skew = now - int(ts_s)
    if abs(skew) > max_skew:
        raise AuthError(f"request time is {abs(skew):.0f} s {'behind' if skew > 0 else 'ahead of'} "
                        f"this node's clock (allowed: {max_skew:.0f} s)")
    expected = sign(secret, method, target, node, int(ts_s))
    if not hmac.compare_digest(expected, mac.strip().lower()):
        raise AuthError("bad signature")
    return node


# ---------------------------------------------------------------------------- helpers
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


def files_target(path: bytes) -> str:
    """The request-target of ``/v1/files`` for a path (every byte but unreserved ones and
    '/' percent-encoded, so non-UTF-8 names travel intact)."""
    return f"/{API}/files?path={quote_from_bytes(path, safe='/')}"


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


def _unquote_etag(value: str) -> str:
    value = value.strip()
    value = value.removeprefix("W/")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value


# blocking helpers, run in worker threads -------------------------------------------------
def _open_for_read(blob: str, sequential: bool) -> int:
    fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    if sequential:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
    return fd


def _read_small(blob: str, offset: int, n: int, times: list[float] | None = None) -> tuple[bytes, str | None]:
    """``n`` bytes of ``blob`` at ``offset`` (open, pread, close: one worker-thread hop),
    and what went wrong with the blob, if anything (None: all of it).  ``times`` gets the
    thread's start, the open's end and the read's end (time.monotonic)."""
    if times is not None:
        times.append(time.monotonic())
    try:
        fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        return b"", f"cannot open blob {blob}: {e}"
    if times is not None:
        times.append(time.monotonic())
    try:
        data = os.pread(fd, n, offset)
        while 0 < len(data) < n:  # (a short read: the rest, if the file still has it)
            more = os.pread(fd, n - len(data), offset + len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
        if times is not None:
            times.append(time.monotonic())
    if len(data) < n:
        return b"", f"{blob} shrank to {offset + len(data)} bytes while serving it"
    return data, None


def _pread_into(fd: int, buf: bytearray, n: int, offset: int) -> int:
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            break
        got += k
    return got


def _write_behind(fd: int, pieces: list[bytes], kicked: int, written: int) -> tuple[int, int]:
    """Append ``pieces``; once WRITEBACK_KICK bytes are written since the last kick, start
    their write-back (POSIX_FADV_DONTNEED writes dirty pages back without waiting, then
    drops them: a replica is not read here), so the final fsync finds little left to do
    and the disk works while the network does.  Returns (bytes written, new kick mark)."""
    n = bulk.write_all(fd, pieces)
    return n, _kick_writeback(fd, kicked, written + n)


def _kick_writeback(fd: int, kicked: int, written: int) -> int:
    """Start the write-back of ``fd``'s bytes [kicked, written) once WRITEBACK_KICK of
    them have gathered; the new kick mark."""
    if written - kicked < WRITEBACK_KICK:
        return kicked
    try:
        os.posix_fadvise(fd, kicked, written - kicked, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    return written


class _FileBody:
    """A body h11 counts (its length) but never sees: the bytes go by sendfile."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _close_pipe(pipe: tuple[int, int]) -> None:
    for p in pipe:
        os.close(p)


def _fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)




def _make_temp(staging_dir: str, sender: str) -> tuple[int, str]:
    fd, name = tempfile.mkstemp(prefix=f".peer-{sender}-", suffix=".part", dir=staging_dir)
    return fd, name


# ---------------------------------------------------------------------------- the server
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
    active_transfers: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Abort(Exception):
    """The response cannot be completed (the file shrank, a read failed): drop the
    connection so the peer sees a broken transfer rather than wrong bytes."""


class _Stalled(Exception):
    """A request stopped arriving mid-way (not an OSError, unlike TimeoutError)."""


class _Conn:
    __slots__ = ("close_after", "h", "marks", "peer", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.close_after = False  # a body went around h11: no next request on this connection
        self.marks: list[tuple[str, float]] = []  # a request's steps (name, time.monotonic), for the debug log
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=16 << 10)
        try:
            host, port = stream.socket.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"


class PeerServer:
    """Serve :class:`PeerFiles` to authenticated peers.

    >>> server = PeerServer(files, node_id="n1", secret=load_secret(path))
    >>> host, port = await nursery.start(server.serve, "0.0.0.0", 7070)

    Cancel the surrounding scope to stop it: open connections are dropped and every
    opened :class:`PeerFile` is closed."""

    def __init__(self, files: PeerFiles, *, node_id: str, secret: bytes,
                 max_skew: float = MAX_SKEW, chunk_size: int = CHUNK,
                 idle_timeout: float = IDLE_TIMEOUT, io_threads: int = 8,
                 clock: Callable[[], float] = time.time, version: str | None = None,
                 metrics: Callable[[], Awaitable[tuple[bytes, str]]] | None = None) -> None:
        if not NODE_ID_RE.match(node_id):
            raise ValueError(f"invalid node id {node_id!r}")
        if len(secret) < MIN_SECRET:
            raise ValueError(f"cluster secret must be at least {MIN_SECRET} bytes")
        self.files = files
        self.node_id = node_id
        self._secret = secret
        self.max_skew = max_skew
        self.chunk_size = chunk_size
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.metrics = metrics  # GET /metrics (Prometheus, no authentication): (body, content type)
        self.version = version or agent_version()
        self.limiter = trio.CapacityLimiter(io_threads)
        self.stats = PeerStats()
        self.address: tuple[str, int] | None = None

    # -------------------------------------------------------------- lifecycle
    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on host:port (port 0: any free port) and serve until cancelled;
        ``task_status.started`` reports the bound (host, port)."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        log.info("peer data service of node %s listening on %s:%d", self.node_id, *self.address)
        task_status.started(self.address)
        try:
            await trio.serve_listeners(self._connection, listeners)
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()

    async def _thread(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    # -------------------------------------------------------------- connection loop
    async def _connection(self, stream: trio.SocketStream) -> None:
        c = _Conn(stream)
        self.stats.connections += 1
        try:
            while True:
                event = await self._next_event(c)
                if event is None or isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.Request):  # pragma: no cover - h11 guarantees
                    return
                await self._request(c, event)
                if c.h.our_state is h11.DONE and c.h.their_state is h11.DONE:
                    c.h.start_next_cycle()
                else:
                    return
        except h11.RemoteProtocolError as e:
            await self._protocol_error(c, e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, _Abort, _Stalled) as e:
            if not isinstance(e, _Stalled):
                self.stats.aborted += 1
            log.debug("peer connection from %s dropped: %r", c.peer, e)
        except Exception:  # one bad connection must never take the server down
            self.stats.aborted += 1
            log.exception("peer connection from %s failed", c.peer)
        finally:
            await trio.aclose_forcefully(stream)

    async def _next_event(self, c: _Conn):
        """The next h11 event, reading from the socket as needed; None on idle timeout."""
        while True:
            event = c.h.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = b""
            with trio.move_on_after(self.idle_timeout) as cs:
                data = await c.stream.receive_some(RECV)
            if cs.cancelled_caught:
                if c.h.their_state is h11.IDLE:
                    return None  # idle keep-alive connection: close quietly
                raise _Stalled(f"no data from {c.peer} for {self.idle_timeout:.0f} s")
            c.h.receive_data(data)

    async def _protocol_error(self, c: _Conn, e: h11.RemoteProtocolError) -> None:
        log.debug("bad HTTP from %s: %s", c.peer, e)
        if c.h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await self._send_json(c, e.error_status_hint or 400, {"error": f"bad request: {e}"},
                                      close=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
                pass

    # -------------------------------------------------------------- responses
    def _count(self, status: int) -> None:
        if status < 300:
            self.stats.responses_2xx += 1
        elif status < 500:
            self.stats.responses_4xx += 1
        else:
            self.stats.responses_5xx += 1

    async def _send(self, c: _Conn, event) -> None:
        for piece in c.h.send_with_data_passthrough(event):
            await c.stream.send_all(piece)

    def _response(self, c: _Conn, status: int, headers: Iterable[tuple[str, str]],
                  close: bool = False) -> h11.Response:
        hdrs = [("x-hycache-node", self.node_id), *headers]
        if close or c.close_after:
            hdrs.append(("connection", "close"))
        self._count(status)
        return h11.Response(status_code=status, headers=hdrs)

    async def _send_head(self, c: _Conn, status: int, headers: Iterable[tuple[str, str]],
                         close: bool = False) -> None:
        await self._send(c, self._response(c, status, headers, close))

    async def _send_json(self, c: _Conn, status: int, obj: dict, *, head: bool = False,
                         close: bool = False, extra: Iterable[tuple[str, str]] = ()) -> None:
        extra = list(extra)
        if "error" in obj:
            obj = {**obj, "status": status}
            # also as a header, for HEAD requests (no body); ASCII only
            extra.append(("x-hycache-error", str(obj["error"]).encode("ascii", "replace").decode()[:500]))
        body = json.dumps(obj).encode()
        await self._send_head(c, status, [("content-type", "application/json"),
                                          ("content-length", str(len(body))), *extra], close=close)
        if not head and body:
            await self._send(c, h11.Data(data=body))
        await self._send(c, h11.EndOfMessage())

    async def _body(self, c: _Conn) -> AsyncIterator[bytes]:
        """The pieces of the request body, until its end (stalls and hang-ups raise)."""
        while True:
            event = await self._next_event(c)
            if event is None:
                raise _Stalled("request body stalled")
            if isinstance(event, h11.Data):
                yield event.data
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("peer closed the connection mid-body")

    async def _drain(self, c: _Conn) -> bool:
        """Read the rest of a request body we do not want; False if it is too big (the
        connection must then close after the response)."""
        seen = 0
        async with contextlib.aclosing(self._body(c)) as body:
            async for data in body:
                seen += len(data)
                if seen > MAX_SMALL_BODY:
                    return False
        return True

    # -------------------------------------------------------------- dispatch
    async def _request(self, c: _Conn, req: h11.Request) -> None:
        self.stats.requests += 1
        t0 = time.monotonic()
        c.marks = [("start", t0)]
        method = req.method.decode("ascii", "replace").upper()
        target = req.target
        path_part, _, query = target.partition(b"?")
        headers: dict[str, str] = {}
        for name, value in req.headers:  # h11 lower-cases names
            headers[name.decode("latin-1")] = value.decode("latin-1")
        log.debug("peer %s: %s %s", c.peer, method, target.decode("latin-1"))

        if method != "PUT" and not await self._drain(c):
            await self._send_json(c, 413, {"error": f"{method} takes no request body"}, close=True)
            return
        if path_part == HEALTH:
            if method not in ("GET", "HEAD"):
                await self._method_not_allowed(c, "GET, HEAD", method)
                return
            await self._send_json(c, 200, {"node": self.node_id, "version": self.version, "api": API,
                                           "time": round(self.clock(), 3)}, head=method == "HEAD")
            return

        if path_part == METRICS and self.metrics is not None:
            if method not in ("GET", "HEAD"):
                await self._method_not_allowed(c, "GET, HEAD", method)
                return
            body, ctype = await self.metrics()
            await self._send_head(c, 200, [("content-type", ctype), ("content-length", str(len(body)))])
            if method == "GET":
                await self._send(c, h11.Data(data=body))
            await self._send(c, h11.EndOfMessage())
            return

        # everything else needs a valid signature
        try:
            sender = verify_authorization(self._secret, headers.get("authorization"), method, target,
                                          self.clock(), self.max_skew)
        except AuthError as e:
            self.stats.auth_failures += 1
            log.warning("peer %s: %s %s refused: %s", c.peer, method, path_part.decode("latin-1"), e)
            await self._send_json(c, 401, {"error": str(e)}, head=method == "HEAD",
                                  close=method == "PUT", extra=[("www-authenticate", AUTH_SCHEME)])
            return

        if path_part != FILES:
            await self._send_json(c, 404, {"error": f"no such endpoint {path_part.decode('latin-1')!r}"},
                                  head=method == "HEAD", close=method == "PUT")
            return
        try:
            path = parse_query(query).get("path")
            if not path:
                raise ValueError("missing query parameter 'path'")
            if b"\0" in path:
                raise ValueError("path contains a NUL byte")
        except ValueError as e:
            await self._send_json(c, 400, {"error": str(e)}, head=method == "HEAD", close=method == "PUT")
            return

        if method in ("GET", "HEAD"):
            await self._get(c, method, path, headers)
        elif method == "PUT":
            await self._put(c, path, headers, sender)
        else:
            await self._method_not_allowed(c, "GET, HEAD, PUT", method)
        if log.isEnabledFor(logging.DEBUG):
            t1 = time.monotonic()
            steps = " ".join(f"{name} {(t - prev) * 1e3:.3f}" for (name, t), (_, prev) in zip(c.marks[1:], c.marks))
            log.debug("peer %s: %s %r done in %.3f s (ms: %s)", c.peer, method, path, t1 - t0, steps)

    async def _method_not_allowed(self, c: _Conn, allow: str, method: str) -> None:
        await self._send_json(c, 405, {"error": f"method {method} not allowed"},
                              head=method == "HEAD", close=method == "PUT", extra=[("allow", allow)])

    @staticmethod
    def _error_status(e: BaseException) -> int:
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

    def _describe(self, e: BaseException, path: bytes) -> str:
        what = quote_from_bytes(path, safe="/")
        if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return f"no such file: {what}"
        if isinstance(e, OSError):
            return f"{what}: {e.strerror or e}"
        return f"{what}: {e}"

    # -------------------------------------------------------------- GET / HEAD
    async def _get(self, c: _Conn, method: str, path: bytes, headers: dict[str, str]) -> None:
        head = method == "HEAD"
        try:
            c.marks.append(("auth", time.monotonic()))
            pf = await self.files.open_for_peer(path)
            c.marks.append(("open_for_peer", time.monotonic()))
        except Exception as e:
            status = self._error_status(e)
            if status == 500:
                log.exception("open_for_peer(%r) failed", path)
            await self._send_json(c, status, {"error": self._describe(e, path)}, head=head)
            return
        self.stats.active_transfers += 1
        try:
            size = int(pf.size)
            etag = str(pf.etag)
            if not ETAG_RE.match(etag):
                log.error("open_for_peer(%r) gave an unusable etag %r", path, etag)
                await self._send_json(c, 500, {"error": "unusable version token"}, head=head)
                return
            qetag = f'"{etag}"'
            common = [("etag", qetag), ("accept-ranges", "bytes")]
            first, last, status = 0, size - 1, 200
            rng = headers.get("range")
            if_range = headers.get("if-range")
            if rng is not None and not head and (if_range is None or if_range.strip() == qetag):
                try:
                    first, last = parse_range(rng, size)
                except RangeError as e:
                    await self._send_json(c, e.status, {"error": str(e)},
                                          extra=[*common, ("content-range", f"bytes */{size}")])
                    return
                status = 206
                self.stats.range_requests += 1
                common.append(("content-range", f"bytes {first}-{last}/{size}"))
            length = last - first + 1
            hdrs = [("content-type", "application/octet-stream"), ("content-length", str(length)), *common]
            if not head and 0 < length < SENDFILE_MIN and length <= self.chunk_size:
                await self._send_small(c, status, hdrs, pf.blob, first, length)
                return
            await self._send_head(c, status, hdrs)
            if not head and length > 0:
                await self._stream_file(c, pf.blob, first, length)
            await self._send(c, h11.EndOfMessage())
        finally:
            self.stats.active_transfers -= 1
            with trio.CancelScope(shield=True):
                try:
                    await pf.close()
                except Exception:
                    log.exception("PeerFile.close() for %r failed", path)

    async def _send_small(self, c: _Conn, status: int, headers: list[tuple[str, str]], blob: str,
                          offset: int, length: int) -> None:
        """A small body (a small file, one block): read first (open, pread, close in one
        worker-thread hop), then the head, the body and the end of the message go in one
        send: the reader wakes up once, to the whole response.  (Head first, then the body
        after the hop, woke the reader for the head alone and cost the holder a second
        send and trio checkpoint: 0.2-1.3 ms of a ~1 ms GET in remote_probe --steps.)
        A blob that cannot be read drops the connection, as a failure mid-body does."""
        times: list[float] = []
        c.marks.append(("prepare", time.monotonic()))
        try:
            data, err = await self._thread(_read_small, blob, offset, length, times)
        except OSError as e:
            raise _Abort(f"reading {blob} at {offset}: {e}") from e
        c.marks.extend(zip(("to_thread", "blob_open", "blob_read"), times))
        c.marks.append(("back_on_loop", time.monotonic()))
        if err is not None:
            raise _Abort(err)
        wire = [*c.h.send_with_data_passthrough(self._response(c, status, headers)),
                *c.h.send_with_data_passthrough(h11.Data(data=data)),
                *c.h.send_with_data_passthrough(h11.EndOfMessage())]
        await c.stream.send_all(b"".join(wire))
        c.marks.append(("send", time.monotonic()))
        self.stats.bytes_sent += length

    async def _stream_file(self, c: _Conn, blob: str, offset: int, length: int) -> None:
        n_chunk = min(self.chunk_size, length)
        try:
            fd = await self._thread(_open_for_read, blob, length > n_chunk)
        except OSError as e:
            raise _Abort(f"cannot open blob {blob}: {e}") from e
        try:
            if length >= SENDFILE_MIN:
                await self._sendfile(c, fd, blob, offset, length)
                return
            buf = bytearray(n_chunk)
            view = memoryview(buf)
            end = offset + length
            pos = offset
            while pos < end:
                want = min(n_chunk, end - pos)
                try:
                    got = await self._thread(_pread_into, fd, buf, want, pos)
                except OSError as e:
                    raise _Abort(f"reading {blob} at {pos}: {e}") from e
                if got < want:
                    raise _Abort(f"{blob} shrank to {pos + got} bytes while serving it")
                # the buffer is reused: send_all returns only when the kernel has the bytes
                await self._send(c, h11.Data(data=view[:got]))
                pos += got
                self.stats.bytes_sent += got
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(os.close, fd)

    async def _sendfile(self, c: _Conn, fd: int, blob: str, offset: int, length: int) -> None:
        """The body by ``os.sendfile`` from the blob to the socket: the bytes go from the
        page cache to the socket in the kernel, never through Python.  h11 is told about
        them with a placeholder of the body's length (its data passthrough), so it still
        checks the Content-Length framing and keeps the connection reusable.  The calls
        run in a worker thread (a cold blob blocks on the disk), bulk.SEND_HOP bytes per
        hop so a cancelled transfer stops within one hop."""
        for piece in c.h.send_with_data_passthrough(h11.Data(data=_FileBody(length))):
            if not isinstance(piece, _FileBody):  # pragma: no cover - framing bytes (none for Content-Length)
                await c.stream.send_all(piece)
        sock = c.stream.socket
        bulk.set_notsent_lowat(sock, bulk.BULK_LOWAT)  # trio's 16 KiB would drain the socket between polls
        try:
            pos, end = offset, offset + length
            while pos < end:
                want = min(bulk.SEND_HOP, end - pos)
                try:
                    sent = await self._thread(bulk.sendfile_out, sock.fileno(), fd, pos, want, self.idle_timeout)
                except TimeoutError as e:
                    raise _Abort(f"peer {c.peer} stopped reading for {self.idle_timeout:.0f} s") from e
                except (BrokenPipeError, ConnectionError) as e:
                    raise trio.BrokenResourceError(str(e)) from e
                except OSError as e:
                    raise _Abort(f"sending {blob} at {pos}: {e}") from e
                pos += sent
                self.stats.bytes_sent += sent
                if sent < want:
                    raise _Abort(f"{blob} shrank to {pos} bytes while serving it")
        finally:
            bulk.set_notsent_lowat(sock, bulk.TRIO_LOWAT)

    # -------------------------------------------------------------- PUT
    async def _receive_to(self, c: _Conn, fd: int) -> int:
        """The request body into ``fd``: received on the loop, written by a writer task
        in worker threads (up to 4 chunks queued), so the socket, the copy and the disk's
        write-back overlap.  Errors of either side are raised as they are."""
        send_ch, recv_ch = trio.open_memory_channel[list[bytes]](4)
        errors: list[BaseException] = []
        received = 0

        async def writer() -> None:
            kicked = written = 0
            async with recv_ch:
                async for pieces in recv_ch:
                    n, kicked = await self._thread(_write_behind, fd, pieces, kicked, written)
                    written += n

        async def receiver() -> None:
            nonlocal received
            pieces: list[bytes] = []
            buffered = 0
            async with send_ch, contextlib.aclosing(self._body(c)) as body:
                async for data in body:
                    pieces.append(data)
                    buffered += len(data)
                    received += len(data)
                    self.stats.bytes_received += len(data)
                    if buffered >= self.chunk_size or len(pieces) >= 512:
                        await send_ch.send(pieces)
                        pieces, buffered = [], 0
                if pieces:
                    await send_ch.send(pieces)

        async def guarded(fn, nursery: trio.Nursery) -> None:
            try:
                await fn()
            except Exception as e:
                errors.append(e)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(guarded, writer, nursery)
            await guarded(receiver, nursery)
        if errors:
            raise errors[0]
        return received

    async def _receive_raw(self, c: _Conn, fd: int, length: int) -> int:
        """A body of ``length`` bytes into ``fd``, moved in the kernel: what h11 already
        read with the head is written first, the rest is spliced socket → pipe → file in
        worker threads (``cluster/bulk.py``), write-back started every WRITEBACK_KICK
        bytes so the final fsync finds little left.  h11 does not see those bytes, so the
        connection closes after the response."""
        pieces, ended = bulk.buffered_body(c)
        received = 0
        kicked = 0
        if pieces:
            n, kicked = await self._thread(_write_behind, fd, pieces, kicked, 0)
            received += n
            self.stats.bytes_received += n
        if ended:
            return received
        c.close_after = True
        pipe = await self._thread(bulk.make_pipe)
        kicking = False

        async def kick(start: int, end: int) -> None:  # the write-back's submission, off the receive path
            nonlocal kicking
            try:
                await self._thread(_kick_writeback, fd, start, end)
            finally:
                kicking = False

        error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:  # (raises nothing itself: no exception groups)
                while received < length:
                    try:
                        r = await self._thread(bulk.splice_in, c.stream.socket.fileno(), fd, received,
                                               min(bulk.HOP, length - received), self.idle_timeout, pipe)
                    except Exception as e:
                        error = e
                        break
                    received += r.n
                    self.stats.bytes_received += r.n
                    if isinstance(r.error, TimeoutError):
                        error = _Stalled(f"request body from {c.peer} stalled for {self.idle_timeout:.0f} s")
                    elif r.error is not None:
                        error = trio.BrokenResourceError(f"peer {c.peer} closed the connection mid-body: {r.error}")
                    if error is not None:
                        break
                    if not kicking and received - kicked >= WRITEBACK_KICK:
                        kicking = True
                        nursery.start_soon(kick, kicked, received)
                        kicked = received
            if error is not None:
                raise error
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(_close_pipe, pipe)
        return received

    async def _put(self, c: _Conn, path: bytes, headers: dict[str, str], sender: str) -> None:
        staging = self.files.staging_dir
        try:
            fd, temp = await self._thread(_make_temp, staging, sender)
        except OSError as e:
            status = self._error_status(e)
            log.error("cannot create a temp file in %s: %s", staging, e)
            await self._send_json(c, status if status != 404 else 500,
                                  {"error": f"staging directory: {e.strerror}"}, close=True)
            return
        adopted = False
        received = 0
        try:
            if c.h.they_are_waiting_for_100_continue:
                await self._send(c, h11.InformationalResponse(status_code=100, headers=[]))
            length = headers.get("content-length", "")
            t0 = time.monotonic()
            if length.isascii() and length.isdigit() and "transfer-encoding" not in headers:
                received = await self._receive_raw(c, fd, int(length))
            else:
                received = await self._receive_to(c, fd)
            t1 = time.monotonic()
            fd_, fd = fd, -1
            await self._thread(_fsync_close, fd_)
            log.debug("replica of %r from %s: %d bytes received in %.3f s, fsync %.3f s", path, sender, received,
                      t1 - t0, time.monotonic() - t1)
            meta = {k: v for k, v in headers.items() if k.startswith("x-hycache-")}
            meta["content-length"] = str(received)
            meta["x-hycache-from"] = sender
            try:
                await self.files.receive_replica(path, temp, meta)
                adopted = True
            except Exception as e:
                status = self._error_status(e)
                if status == 500:
                    log.exception("receive_replica(%r) failed", path)
                await self._send_json(c, status, {"error": self._describe(e, path)})
                return
            await self._send_json(c, 201, {"path": quote_from_bytes(path, safe="/"), "size": received,
                                           "node": self.node_id})
        except OSError as e:  # writing the temp file failed: answer if we still can
            status = self._error_status(e)
            log.error("receiving %r from %s: %s", path, sender, e)
            await self._send_json(c, status, {"error": self._describe(e, path)}, close=True)
        finally:
            with trio.CancelScope(shield=True):
                if fd >= 0:
                    await self._thread(os.close, fd)
                if not adopted:
                    await self._thread(remove_blob, temp)

"""Client of the agent-to-agent data service (:mod:`hycache_agent.transport.server`).

``PeerClient`` wraps one ``httpx.AsyncClient`` (connection pool, keep-alive; httpx runs on
trio through anyio) and signs every request with the cluster secret.  File I/O runs in
worker threads; the event loop only moves buffers.

Errors::

    PeerError            base class (unexpected status, malformed response)
    ├─ PeerUnavailable   connect/read failures or timeouts, after the retries
    ├─ PeerNotFound      404: the peer has no such file
    ├─ PeerAuthError     401: the peer refused our signature (secret or clock wrong)
    └─ PeerChanged       the file's ETag (version token) changed mid-transfer or
                         differs from the one the caller expected

Transient failures (connection refused/reset, timeouts, a connection dropped mid-body,
503) are retried with exponential backoff and jitter; ``fetch_to_file`` resumes a broken
transfer with ``Range: bytes=N-`` and ``If-Range: <etag>`` so the bytes it already has are
not fetched twice and a file changed in between is detected, never spliced.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Self

import h11
import httpcore
import httpx
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.auth import authorization
from hycache_agent.transport.errors import (
    PeerAuthError,
    PeerChanged,
    PeerError,
    PeerNotFound,
    PeerUnavailable,
)
from hycache_agent.transport.fetch import Fetch, Progress
from hycache_agent.transport.idle import BackgroundThreads
from hycache_agent.transport.push_parts import PARTS_MIN, NoParts, PartPusher
from hycache_agent.transport.retry import Again, Retry
from hycache_agent.transport.wire import API, CHUNK, PUSH_HEADER, files_target, parse_addr, unquote_etag

log = logging.getLogger(__name__)
Addr = str | tuple[str, int]
__all__ = ["PeerAuthError", "PeerChanged", "PeerClient", "PeerError", "PeerNotFound", "PeerUnavailable"]


# --------------------------------------------------------------------------- transport
RECV_BYTES = 1 << 20  # socket reads of the client (httpcore's default is 64 KiB)


class _BigReadStream(httpcore.AsyncNetworkStream):
    """A network stream that reads up to RECV_BYTES per call whatever httpcore asks for.
    httpcore feeds what it reads to its h11 parser, so larger reads are safe; on bulk
    transfers they cut the client's CPU per GiB by about half (fewer loop iterations,
    parser calls and syscalls; see docs/peer.md)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max(max_bytes, RECV_BYTES), timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _BigReadBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.TrioBackend()

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _BigReadStream(await self._inner.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _BigReadStream(await self._inner.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _transport(max_connections: int) -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport()
    # httpx (pinned) has no knob for the network backend: give its transport the pool it
    # would have built, with ours.  httpx still maps httpcore's exceptions to its own.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=max_connections, max_keepalive_connections=max_connections,
        keepalive_expiry=30.0, network_backend=_BigReadBackend())
    return transport


# transport problems worth another attempt (not LocalProtocolError/UnsupportedProtocol: ours)
RETRYABLE = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
# the same for the raw bulk connections (transport/bulk.py)
RAW_RETRYABLE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                 h11.RemoteProtocolError)


class _Retry(Exception):
    """A retryable answer (503) from the peer."""




@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0
    resumes: int = 0  # fetches continued with a Range request after a broken connection
    bytes_received: int = 0
    bytes_sent: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# blocking helpers, run in worker threads ---------------------------------------------------
def _truncate_regular(fd: int, size: int) -> None:
    if stat.S_ISREG(os.fstat(fd).st_mode):  # not e.g. /dev/null
        os.ftruncate(fd, size)


def _open_src(path: str) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except OSError:
        pass
    return fd, os.fstat(fd).st_size


class PeerClient:
    """Signed requests to peer agents.  Use as ``async with PeerClient(...) as c`` or call
    :meth:`aclose`.  ``peer_addr`` arguments are ``"host:port"`` or ``(host, port)``."""

    def __init__(self, node_id: str, secret: bytes, *, retries: int = 5, backoff: float = 0.1,
                 max_backoff: float = 3.0, connect_timeout: float = 5.0, read_timeout: float = 30.0,
                 chunk_size: int = CHUNK, max_connections: int = 64, io_threads: int = 2,
                 bulk_threads: int = 8, background: BackgroundThreads | None = None,
                 push_streams: int = 2, clock: Callable[[], float] = time.time) -> None:
        authorization(secret, node_id, "GET", "/")  # validates the node id early
        self.node_id = node_id
        self._secret = secret
        self.chunk_size = chunk_size
        self.clock = clock
        self.stats = ClientStats()
        # transport errors and 503 are retried (each request's attempts: _retry.run)
        self._retry = Retry(retries, backoff, max_backoff, self.stats)
        # file reads/writes of all transfers share these threads (see docs/peer.md: more
        # writer threads than cores starve the loop thread without adding throughput)
        self.limiter = trio.CapacityLimiter(io_threads)
        # whole-file transfers (transport/bulk.py): a thread each while its body moves in
        # the kernel; they mostly wait on the socket, so more of them than io_threads
        self._bulk_limiter = trio.CapacityLimiter(bulk_threads)
        # pushes no request waits for (``background=True``) move their bytes on niced
        # threads of their own (transport/idle.py)
        self.background = background if background is not None else BackgroundThreads("hycache-push")
        self._raw = bulk.Pool(connect_timeout)
        # a large push a request waits for (sync replicas) goes in ``push_streams`` byte
        # ranges at once, each on a connection and a worker thread of its own
        # (transport/push_parts.py), to peers that know /v1/parts
        self.parts = PartPusher(self._raw, streams=push_streams, sign=self._sign_put,
                                thread=self._thread_bulk, timeout=read_timeout, stats=self.stats)
        self.read_timeout = read_timeout
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=_transport(max_connections),
            trust_env=False,  # never route peer traffic through an environment proxy
            follow_redirects=False,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._raw.aclose()
        await self._http.aclose()

    # -------------------------------------------------------------- plumbing
    @staticmethod
    def _base(addr: Addr) -> str:
        host, port = parse_addr(addr, default_host="127.0.0.1")
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def _build(self, method: str, addr: Addr, target: str, headers: dict[str, str] | None = None,
               content: Any = None, sign: bool = True) -> httpx.Request:
        req = self._http.build_request(method, self._base(addr) + target, headers=headers, content=content)
        if sign:  # sign exactly the bytes httpx puts on the request line
            req.headers["Authorization"] = authorization(self._secret, self.node_id, method,
                                                         req.url.raw_path, self.clock())
        self.stats.requests += 1
        return req

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def _error(self, resp: httpx.Response, addr: Addr, path: bytes | None) -> PeerError:
        """The exception for a non-success response (reads at most 64 KiB of its body)."""
        body = b""
        try:
            async for chunk in resp.aiter_raw():
                body += chunk
                if len(body) > 65536:
                    break
        except RETRYABLE:
            pass
        return _error_for(resp.status_code, body, resp.headers.get("x-hycache-error"), resp.reason_phrase,
                          addr, path)

    def _unavailable(self, addr: Addr, what: str, path: bytes | None) -> Callable[[BaseException, int], PeerError]:
        def fail(e: BaseException, attempts: int) -> PeerError:
            return PeerUnavailable(f"{addr}: {what}: {e!r} after {attempts} attempts", addr=str(addr), path=path)
        return fail

    async def _simple(self, method: str, addr: Addr, target: str, path: bytes | None,
                      handle: Callable[[httpx.Response], Any], *, headers: dict[str, str] | None = None,
                      content_factory: Callable[[], Any] | None = None, sign: bool = True,
                      ok: tuple[int, ...] = (200,)) -> Any:
        """One request with retries on transport errors; ``handle(response)`` (async)
        turns a response whose status is in ``ok`` into the result."""
        async def attempt() -> Any:
            content = content_factory() if content_factory else None
            req = self._build(method, addr, target, headers, content, sign)
            resp = await self._http.send(req, stream=True)
            try:
                if resp.status_code == 503:
                    raise _Retry(f"HTTP 503 from {addr}")
                if resp.status_code not in ok:
                    raise await self._error(resp, addr, path)
                return await handle(resp)
            finally:
                await resp.aclose()

        return await self._retry.run(attempt, (*RETRYABLE, _Retry), self._unavailable(addr, f"{method} {target}", path))

    # -------------------------------------------------------------- API
    async def health(self, peer_addr: Addr) -> dict[str, Any]:
        """The peer's ``/v1/health``: ``{"node", "version", "api", "time"}`` (unsigned)."""
        async def handle(resp: httpx.Response) -> dict[str, Any]:
            return json.loads(await resp.aread())
        return await self._simple("GET", peer_addr, f"/{API}/health", None, handle, sign=False)

    async def stat(self, peer_addr: Addr, path: bytes) -> tuple[int, str]:
        """HEAD: the file's (size, etag) on the peer."""
        async def handle(resp: httpx.Response) -> tuple[int, str]:
            return int(resp.headers["content-length"]), unquote_etag(resp.headers.get("etag", ""))
        return await self._simple("HEAD", peer_addr, files_target(path), path, handle)

    async def _get_head(self, host: str, port: int, target: bytes,
                        headers: list[tuple[str, str]]) -> tuple[bulk.Conn, h11.Response] | None:
        """A GET on a pooled raw connection, up to the response's head.  None when a
        reused keep-alive connection turned out closed by the server (not a failure: ask
        again); other transport errors are raised (the connection closed)."""
        t0 = time.monotonic()
        conn = await self._raw.get(host, port)
        self.stats.requests += 1
        try:
            t1 = time.monotonic()
            await bulk.send_head(conn, "GET", target, headers)
            t2 = time.monotonic()
            resp = await bulk.read_response(conn, self.read_timeout)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("GET %s: ms conn %.3f send %.3f head %.3f reused %d", target.decode("latin-1"),
                          (t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.monotonic() - t2) * 1e3, conn.reused)
            return conn, resp
        except (*RAW_RETRYABLE, bulk.Broken):
            with trio.CancelScope(shield=True):
                await self._raw.put(conn, False)
            if conn.reused:
                return None
            raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._raw.put(conn, False)
            raise

    async def _raise_for(self, conn: bulk.Conn, resp: h11.Response, addr: Addr, path: bytes) -> None:
        """Raise the PeerError of a non-success answer (its body read, at most 64 KiB)."""
        body = await bulk.read_small_body(conn, self.read_timeout)
        raise _error_for(resp.status_code, body, bulk.header(resp, b"x-hycache-error"),
                         resp.reason.decode("latin-1"), addr, path)

    async def read_range(self, peer_addr: Addr, path: bytes, offset: int, length: int, *,
                         etag: str | None = None) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file, b"" past it,
        like pread).  With ``etag``, raise PeerChanged if the file is no longer that version."""
        if length <= 0 or offset < 0:
            if offset < 0:
                raise ValueError("negative offset")
            return b""
        data, _etag, _total = await self._range_get(peer_addr, path, offset, length, etag)
        return data

    async def read_block(self, peer_addr: Addr, path: bytes, offset: int, length: int) -> tuple[bytes, str, int]:
        """``(data, etag, total size)`` of ``length`` bytes at ``offset`` (fewer at the end of
        the file, b"" past it): one range request, the caller checks the version token."""
        if length <= 0 or offset < 0:
            raise ValueError("read_block wants offset >= 0 and length > 0")
        return await self._range_get(peer_addr, path, offset, length, None)

    async def _range_get(self, addr: Addr, path: bytes, offset: int, length: int,
                         expect: str | None) -> tuple[bytes, str, int]:
        """One range GET on a raw keep-alive connection (``transport/bulk.py``, the same
        connections as the whole-file fetches): the signed request, the head through h11,
        the body (at most ``length`` bytes: a block or a small file) read on the loop.
        ``(data, etag, total size)``; 416 (past the end) is ``b""``.  The checks are the
        protocol's: status, Content-Range (its total), the ETag (``expect``: else
        PeerChanged) and the body's length against Content-Length (h11); TCP's checksum
        covers the wire.  Retried on transport errors and 503 (:class:`Retry`)."""
        host, port = parse_addr(addr, default_host="127.0.0.1")
        target = files_target(path).encode("ascii")
        rng = f"bytes={offset}-{offset + length - 1}"

        async def attempt() -> tuple[bytes, str, int]:
            headers = [("authorization", authorization(self._secret, self.node_id, "GET", target, self.clock())),
                       ("range", rng)]
            head = await self._get_head(host, port, target, headers)
            if head is None:
                raise Again
            conn, resp = head
            reusable = False
            try:
                data, got, size = await self._range_body(conn, resp, addr, path, offset, length, expect)
                reusable = (conn.h.their_state is h11.DONE
                            and (bulk.header(resp, b"connection") or "").lower() != "close")
                return data, got, size
            finally:
                with trio.CancelScope(shield=True):
                    await self._raw.put(conn, reusable)

        return await self._retry.run(attempt, (*RAW_RETRYABLE, bulk.Broken, _Retry),
                                    self._unavailable(addr, f"GET {target.decode()} ({rng})", path))

    async def _range_body(self, conn: bulk.Conn, resp: h11.Response, addr: Addr, path: bytes, offset: int,
                          length: int, expect: str | None) -> tuple[bytes, str, int]:
        """The checked answer to a range GET: ``(data, etag, total size)``."""
        status = resp.status_code
        if status == 503:
            raise _Retry(f"HTTP 503 from {addr}")
        if status not in (206, 416):
            await self._raise_for(conn, resp, addr, path)
        got = unquote_etag(bulk.header(resp, b"etag") or "")
        if expect is not None and got != expect:
            raise PeerChanged(f"{addr} {path!r}: version {got!r}, expected {expect!r}", addr=str(addr), path=path)
        total = (bulk.header(resp, b"content-range") or "").rpartition("/")[2]
        if status == 416:
            await bulk.read_small_body(conn, self.read_timeout)
            return b"", got, int(total) if total.isdigit() else offset
        if not total.isdigit():
            raise PeerError(f"{addr} {path!r}: HTTP 206 without a total in Content-Range",
                            addr=str(addr), path=path, status=status)
        data = await bulk.read_body(conn, self.read_timeout, length)
        self.stats.bytes_received += len(data)
        return data, got, int(total)

    async def fetch_to_file(self, peer_addr: Addr, path: bytes, dest: int | str | os.PathLike[str],
                            progress: Progress | None = None, *, etag: str | None = None,
                            started: Callable[[int, str], None] | None = None) -> str:
        """Copy the peer's file into ``dest`` and return its ETag (version token).

        ``dest`` is a path (created or truncated, mode 0600) or a writable file descriptor
        (written from offset 0 with pwrite and truncated to the file's size; the caller
        keeps it open).  Not fsync'd: the caller decides when the copy must be durable.
        ``progress(done, total)`` is called on the event loop after each write.  With
        ``etag``, the transfer must be that version (else PeerChanged).  ``started(size,
        etag)`` is called once, when the first response's headers arrived."""
        own = not isinstance(dest, int)
        if isinstance(dest, int):
            fd = dest
        else:
            fd = await trio.to_thread.run_sync(
                os.open, dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            return await self._fetch(peer_addr, path, fd, progress, etag, started)
        finally:
            if own:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(os.close, fd)

    async def fetch_part_to_file(self, peer_addr: Addr, path: bytes, fd: int, first: int, end: int, *,
                                 etag: str | None = None, progress: Progress | None = None,
                                 started: Callable[[int, str], None] | None = None) -> tuple[str, int]:
        """Bytes ``[first, end)`` of the peer's file into ``fd`` at the same offsets (a
        part of a copy fetched in several parallel streams).  Returns ``(etag, file
        size)``; PeerChanged if the file no longer reaches ``end`` or is not ``etag``.
        ``started(file size, etag)`` as for :meth:`fetch_to_file`."""
        total: list[int] = []

        def first_head(size: int, got_etag: str) -> None:
            total.append(size)
            if started is not None:
                started(size, got_etag)

        got = await self._fetch(peer_addr, path, fd, progress, etag, first_head, first=first, end=end)
        return got, total[0]

    async def _fetch(self, addr: Addr, path: bytes, fd: int, progress: Progress | None,
                     expect: str | None, started: Callable[[int, str], None] | None = None, *,
                     first: int = 0, end: int | None = None) -> str:
        """The whole file (or with ``end``, bytes ``[first, end)``) into ``fd`` over a raw
        connection (``transport/bulk.py``): the head through h11, the body spliced from the
        socket into the file in worker threads.  A broken connection resumes with
        Range/If-Range from the bytes written; the retries count attempts without progress."""
        host, port = parse_addr(addr, default_host="127.0.0.1")
        target = files_target(path).encode("ascii")
        regular = await trio.to_thread.run_sync(bulk.is_regular, fd)
        f = Fetch(str(addr), path, fd, regular, progress, started, expect, first=first, end=end)

        def fail(e: BaseException, attempts: int) -> PeerError:
            return PeerUnavailable(f"{addr}: fetching {path!r}: {e!r} after {attempts} attempts without progress "
                                   f"({f.got} of {f.size} bytes)", addr=str(addr), path=path)

        try:
            await self._retry.run(lambda: self._fetch_once(f, host, port, target),
                                 (*RAW_RETRYABLE, bulk.Broken, _Retry), fail,
                                 progressed=lambda: f.got > f.before, retry_if=lambda e: e is not f.local_error)
        finally:
            if f.pipe is not None:
                for p in f.pipe:
                    os.close(p)
        assert f.size is not None and f.etag is not None, "a response's head set them"
        if regular and end is None:
            await trio.to_thread.run_sync(_truncate_regular, fd, f.size)
        return f.etag

    async def _fetch_once(self, f: Fetch, host: str, port: int, target: bytes) -> None:
        """One request of a fetch: from ``f.got`` to the end of the span."""
        headers = [("authorization", authorization(self._secret, self.node_id, "GET", target, self.clock())),
                   *f.range_headers()]
        f.before = f.got
        head = await self._get_head(host, port, target, headers)
        if head is None:
            raise Again
        conn, resp = head
        reusable = False
        try:
            status = resp.status_code
            if status == 503:
                raise _Retry(f"HTTP 503 from {f.addr}")
            if status == 416 and f.known:
                raise f.changed("the file shrank during the transfer")
            if status not in (200, 206):
                await self._raise_for(conn, resp, f.addr, f.path)
            if f.accept(resp):
                self.stats.resumes += 1
            try:
                await f.receive(conn, self._thread_bulk, self.read_timeout)
                reusable = (bulk.header(resp, b"connection") or "").lower() != "close"
            finally:
                self.stats.bytes_received += f.got - f.before
        finally:
            with trio.CancelScope(shield=True):
                await self._raw.put(conn, reusable)

    async def _thread_bulk(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._bulk_limiter)

    def _sign_put(self, target: bytes) -> str:
        self.stats.requests += 1
        return authorization(self._secret, self.node_id, "PUT", target, self.clock())

    async def push_replica(self, peer_addr: Addr, path: bytes, src_blob: str | os.PathLike[str],
                           headers: dict[str, str] | None = None, *, background: bool = False) -> dict[str, Any]:
        """PUT the whole of ``src_blob`` as ``path``'s replica on the peer, with metadata
        headers (``X-HyCache-Version``, ``X-HyCache-Mode``, ...).  The body goes by
        ``sendfile`` from the blob (its page cache, right after a write) to a raw
        connection (``transport/bulk.py``).  Retried from the start on transport errors (a
        replica push is idempotent).  Returns the peer's JSON answer.

        ``background``: nobody waits for this push (an async replica): the ``sendfile``
        runs on :attr:`background`'s niced threads, and the request says so
        (``X-HyCache-Push: background``) so the peer receives it at a low priority too."""
        src = os.fspath(src_blob)
        host, port = parse_addr(peer_addr, default_host="127.0.0.1")
        target = files_target(path).encode("ascii")
        fd, size = await trio.to_thread.run_sync(_open_src, src)
        extra = [(k.lower(), v) for k, v in (headers or {}).items()]
        if background:
            extra.append((PUSH_HEADER, "background"))

        async def attempt() -> dict[str, Any]:
            conn = await self._raw.get(host, port)
            reusable = False
            try:
                self.stats.requests += 1
                hdrs = [*extra, ("content-length", str(size)), ("content-type", "application/octet-stream"),
                        ("authorization", authorization(self._secret, self.node_id, "PUT", target, self.clock()))]
                answer, reusable = await self._push_once(conn, target, hdrs, fd, size, src, peer_addr, path,
                                                         background)
                return answer
            finally:
                with trio.CancelScope(shield=True):
                    await self._raw.put(conn, reusable)

        async def in_parts() -> dict[str, Any]:
            return await self.parts.push(host, port, path, fd, size, extra)

        try:
            if not background and size >= PARTS_MIN and self.parts.wanted(host, port):
                try:
                    return await self._retry.run(in_parts, (*RAW_RETRYABLE, bulk.Broken, _Retry, PeerError),
                                                self._unavailable(peer_addr, f"PUT {target.decode()} in parts", path),
                                                retry_if=_retry_part)
                except NoParts:
                    log.info("peer %s:%d takes no pushes in parts: one stream from here on", host, port)
            return await self._retry.run(attempt, (*RAW_RETRYABLE, bulk.Broken, _Retry),
                                        self._unavailable(peer_addr, f"PUT {target.decode()}", path))
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(os.close, fd)

    async def _push_once(self, conn: bulk.Conn, target: bytes, hdrs: list[tuple[str, str]], fd: int, size: int,
                         src: str, peer_addr: Addr, path: bytes, background: bool) -> tuple[dict[str, Any], bool]:
        """One PUT of the blob on ``conn``: the peer's answer, and whether the connection
        can be kept."""
        sent_error: BaseException | None = None
        pos = 0
        try:
            await bulk.send_head(conn, "PUT", target, hdrs)
            while pos < size:  # one worker-thread job for the body: one wake-up of the loop
                want = size - pos
                if background:
                    n = await self.background.run(bulk.sendfile_out, conn.fd, fd, pos, want, self.read_timeout)
                else:
                    n = await self._thread_bulk(bulk.sendfile_out, conn.fd, fd, pos, want, self.read_timeout)
                pos += n
                self.stats.bytes_sent += n
                if n < want:
                    raise PeerError(f"{src} shrank while pushing it", addr=str(peer_addr), path=path)
            # h11 counts the body it did not see
            conn.h.send_with_data_passthrough(h11.Data(data=_Sent(size)))  # type: ignore[arg-type]  # h11 passes any sized body through; its annotation says bytes
            conn.h.send(h11.EndOfMessage())
        except (*RAW_RETRYABLE, bulk.Broken) as e:
            if conn.reused and pos == 0:  # a keep-alive connection the server had closed
                raise Again from e
            sent_error = e  # the peer may have answered early (401, 4xx): read it
        try:
            resp = await bulk.read_response(conn, self.read_timeout if sent_error is None else 1.0)
        except (*RAW_RETRYABLE, bulk.Broken):
            if sent_error is not None:
                raise sent_error from None
            raise
        body = await bulk.read_small_body(conn, self.read_timeout)
        if resp.status_code == 503:
            raise _Retry(f"HTTP 503 from {peer_addr}")
        if resp.status_code != 201:
            raise _error_for(resp.status_code, body, bulk.header(resp, b"x-hycache-error"),
                             resp.reason.decode("latin-1"), peer_addr, path)
        reusable = (sent_error is None and conn.h.our_state is h11.DONE and conn.h.their_state is h11.DONE
                    and (bulk.header(resp, b"connection") or "").lower() != "close")
        return json.loads(body), reusable


class _Sent:
    """A body h11 counts (its length) but never sees: it went by sendfile."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _retry_part(e: BaseException) -> bool:
    """A push in parts is tried again, whole, after a transport error, a 503 or a part the
    holder lost (cut, stalled: 502/504); not after a refusal (4xx, 507, ...)."""
    return not isinstance(e, PeerError) or e.status in (502, 503, 504)


def _error_for(status: int, body: bytes, header: str | None, reason: str, addr: Addr,
               path: bytes | None) -> PeerError:
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace") or header or reason
    where = str(addr) if path is None else f"{addr} {path!r}"
    cls = {404: PeerNotFound, 401: PeerAuthError}.get(status, PeerError)
    return cls(f"{where}: HTTP {status}: {message}", addr=str(addr), path=path, status=status)

"""The agent-to-agent data service: authenticated HTTP/1.1 inside the agent's trio loop.

Peers (and later the control plane) fetch file bytes from the node that holds them and
push replicas to other nodes.  The server is :mod:`h11` driven directly on
``trio.serve_listeners``: one task per connection, keep-alive, no framework.  It does not
know the tiering engine; it talks to a :class:`PeerFiles` object that opens files for
reading and adopts received replicas.  Nothing blocking runs on the event loop: opening,
reading, writing, fsync and removing files go through ``trio.to_thread.run_sync`` (on a
limiter of its own, so a burst of peer transfers cannot starve the FUSE operations of
worker threads).

See :mod:`hycache_agent.transport.wire` for the protocol and
:mod:`hycache_agent.transport.auth` for the signatures.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable

import h11
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.auth import AUTH_SCHEME, MAX_SKEW, MIN_SECRET, AuthError, verify_authorization
from hycache_agent.transport.blob_io import FileBody, open_for_read, pread_into, read_small
from hycache_agent.transport.conn import Abort, Conn, PeerStats, Stalled, describe, error_status
from hycache_agent.transport.idle import BackgroundThreads
from hycache_agent.transport.parts import PartIntake
from hycache_agent.transport.receive import ReplicaIntake
from hycache_agent.transport.wire import (
    API,
    CHUNK,
    ETAG_RE,
    FILES,
    HEALTH,
    METRICS,
    NODE_ID_RE,
    PARTS,
    PeerFiles,
    RangeError,
    agent_version,
    parse_query,
    parse_range,
)

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 60.0  # an idle keep-alive connection, or a stalled request, is dropped after this
SENDFILE_MIN = 1 << 20  # bodies from this size go by os.sendfile (smaller: one pread + send)


def remove_quietly(path: str) -> None:
    """Remove a file that may be gone already."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class PeerServer:
    """Serve :class:`PeerFiles` to authenticated peers.

    >>> server = PeerServer(files, node_id="n1", secret=load_secret(path))
    >>> host, port = await nursery.start(server.serve, "0.0.0.0", 7070)

    ``remove_temp`` removes a received replica's temp file the engine did not adopt.
    Cancel the surrounding scope to stop it: open connections are dropped and every
    opened :class:`PeerFile` is closed."""

    def __init__(self, files: PeerFiles, *, node_id: str, secret: bytes,
                 max_skew: float = MAX_SKEW, chunk_size: int = CHUNK,
                 idle_timeout: float = IDLE_TIMEOUT, io_threads: int = 8,
                 clock: Callable[[], float] = time.time, version: str | None = None,
                 metrics: Callable[[], Awaitable[tuple[bytes, str]]] | None = None,
                 remove_temp: Callable[[str], None] = remove_quietly,
                 background: BackgroundThreads | None = None) -> None:
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
        self.intake = ReplicaIntake(files, node_id=node_id, stats=self.stats, chunk_size=chunk_size,
                                    idle_timeout=idle_timeout, thread=self._thread, remove_temp=remove_temp,
                                    background=background or BackgroundThreads("hycache-intake"))
        self.parts = PartIntake(files, node_id=node_id, stats=self.stats, idle_timeout=idle_timeout,
                                thread=self._thread, remove_temp=remove_temp)

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
        c = Conn(stream, node_id=self.node_id, idle_timeout=self.idle_timeout, stats=self.stats)
        self.stats.connections += 1
        try:
            while True:
                event = await c.next_event()
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
            await c.protocol_error(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, Abort, Stalled) as e:
            if not isinstance(e, Stalled):
                self.stats.aborted += 1
            log.debug("peer connection from %s dropped: %r", c.peer, e)
        except Exception:  # one bad connection must never take the server down
            self.stats.aborted += 1
            log.exception("peer connection from %s failed", c.peer)
        finally:
            await trio.aclose_forcefully(stream)

    # -------------------------------------------------------------- dispatch
    async def _request(self, c: Conn, req: h11.Request) -> None:
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

        if method != "PUT" and not await c.drain():
            await c.send_json(413, {"error": f"{method} takes no request body"}, close=True)
            return
        if await self._unsigned(c, method, path_part):
            return
        sender = await self._authenticate(c, method, target, path_part, headers)
        if sender is None:
            return
        path = await self._file_path(c, method, path_part, query)
        if path is None:
            return
        if path_part == PARTS:
            await self.parts.put(c, path, headers, sender)
        elif method in ("GET", "HEAD"):
            await self._get(c, method, path, headers)
        elif method == "PUT":
            await self.intake.put(c, path, headers, sender)
        else:
            await c.method_not_allowed("GET, HEAD, PUT", method)
        if log.isEnabledFor(logging.DEBUG):
            t1 = time.monotonic()
            steps = " ".join(f"{name} {(t - prev) * 1e3:.3f}" for (name, t), (_, prev) in zip(c.marks[1:], c.marks))
            log.debug("peer %s: %s %r done in %.3f s (ms: %s)", c.peer, method, path, t1 - t0, steps)

    async def _unsigned(self, c: Conn, method: str, path_part: bytes) -> bool:
        """Answer the endpoints that need no signature (health, metrics); whether it was one."""
        if path_part == HEALTH:
            if method not in ("GET", "HEAD"):
                await c.method_not_allowed("GET, HEAD", method)
                return True
            await c.send_json(200, {"node": self.node_id, "version": self.version, "api": API,
                                    "time": round(self.clock(), 3)}, head=method == "HEAD")
            return True
        if path_part == METRICS and self.metrics is not None:
            if method not in ("GET", "HEAD"):
                await c.method_not_allowed("GET, HEAD", method)
                return True
            body, ctype = await self.metrics()
            await c.send_head(200, [("content-type", ctype), ("content-length", str(len(body)))])
            if method == "GET":
                await c.send(h11.Data(data=body))
            await c.send(h11.EndOfMessage())
            return True
        return False

    async def _authenticate(self, c: Conn, method: str, target: bytes, path_part: bytes,
                            headers: dict[str, str]) -> str | None:
        """The signer's node id, or None when the signature is refused (answered: 401)."""
        try:
            return verify_authorization(self._secret, headers.get("authorization"), method, target,
                                        self.clock(), self.max_skew)
        except AuthError as e:
            self.stats.auth_failures += 1
            log.warning("peer %s: %s %s refused: %s", c.peer, method, path_part.decode("latin-1"), e)
            await c.send_json(401, {"error": str(e)}, head=method == "HEAD",
                              close=method == "PUT", extra=[("www-authenticate", AUTH_SCHEME)])
            return None

    async def _file_path(self, c: Conn, method: str, path_part: bytes, query: bytes) -> bytes | None:
        """The file path a ``/v1/files`` request names, or None (answered: 404 or 400)."""
        if path_part != FILES and not (path_part == PARTS and method == "PUT"):
            await c.send_json(404, {"error": f"no such endpoint {path_part.decode('latin-1')!r}"},
                              head=method == "HEAD", close=method == "PUT")
            return None
        try:
            path = parse_query(query).get("path")
            if not path:
                raise ValueError("missing query parameter 'path'")
            if b"\0" in path:
                raise ValueError("path contains a NUL byte")
        except ValueError as e:
            await c.send_json(400, {"error": str(e)}, head=method == "HEAD", close=method == "PUT")
            return None
        return path

    # -------------------------------------------------------------- GET / HEAD
    async def _get(self, c: Conn, method: str, path: bytes, headers: dict[str, str]) -> None:
        head = method == "HEAD"
        try:
            c.marks.append(("auth", time.monotonic()))
            pf = await self.files.open_for_peer(path)
            c.marks.append(("open_for_peer", time.monotonic()))
        except Exception as e:
            status = error_status(e)
            if status == 500:
                log.exception("open_for_peer(%r) failed", path)
            await c.send_json(status, {"error": describe(e, path)}, head=head)
            return
        self.stats.active_transfers += 1
        try:
            size = int(pf.size)
            etag = str(pf.etag)
            if not ETAG_RE.match(etag):
                log.error("open_for_peer(%r) gave an unusable etag %r", path, etag)
                await c.send_json(500, {"error": "unusable version token"}, head=head)
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
                    await c.send_json(e.status, {"error": str(e)},
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
            await c.send_head(status, hdrs)
            if not head and length > 0:
                await self._stream_file(c, pf.blob, first, length)
            await c.send(h11.EndOfMessage())
        finally:
            self.stats.active_transfers -= 1
            with trio.CancelScope(shield=True):
                try:
                    await pf.close()
                except Exception:
                    log.exception("PeerFile.close() for %r failed", path)

    async def _send_small(self, c: Conn, status: int, headers: list[tuple[str, str]], blob: str,
                          offset: int, length: int) -> None:
        """A small body (a small file, one block): read first (open, pread, close in one
        worker-thread hop), then the head, the body and the end of the message go in one
        send: the reader wakes up once, to the whole response.  A blob that cannot be read drops the connection, as a failure mid-body does."""
        times: list[float] = []
        c.marks.append(("prepare", time.monotonic()))
        try:
            data, err = await self._thread(read_small, blob, offset, length, times)
        except OSError as e:
            raise Abort(f"reading {blob} at {offset}: {e}") from e
        c.marks.extend(zip(("to_thread", "blob_open", "blob_read"), times))
        c.marks.append(("back_on_loop", time.monotonic()))
        if err is not None:
            raise Abort(err)
        # (send_with_data_passthrough returns None only for ConnectionClosed: h11 types every
        # event's answer as optional)
        wire = [*c.h.send_with_data_passthrough(c.response(status, headers)),  # type: ignore[misc]
                *c.h.send_with_data_passthrough(h11.Data(data=data)),
                *c.h.send_with_data_passthrough(h11.EndOfMessage())]
        await c.stream.send_all(b"".join(wire))
        c.marks.append(("send", time.monotonic()))
        self.stats.bytes_sent += length

    async def _stream_file(self, c: Conn, blob: str, offset: int, length: int) -> None:
        n_chunk = min(self.chunk_size, length)
        try:
            fd = await self._thread(open_for_read, blob, length > n_chunk)
        except OSError as e:
            raise Abort(f"cannot open blob {blob}: {e}") from e
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
                    got = await self._thread(pread_into, fd, buf, want, pos)
                except OSError as e:
                    raise Abort(f"reading {blob} at {pos}: {e}") from e
                if got < want:
                    raise Abort(f"{blob} shrank to {pos + got} bytes while serving it")
                # the buffer is reused: send_all returns only when the kernel has the bytes
                await c.send(h11.Data(data=view[:got]))  # type: ignore[arg-type]  # h11 passes any sized body through; its annotation says bytes
                pos += got
                self.stats.bytes_sent += got
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(os.close, fd)

    async def _sendfile(self, c: Conn, fd: int, blob: str, offset: int, length: int) -> None:
        """The body by ``os.sendfile`` from the blob to the socket: the bytes go from the
        page cache to the socket in the kernel, never through Python.  h11 is told about
        them with a placeholder of the body's length (its data passthrough), so it still
        checks the Content-Length framing and keeps the connection reusable.  The calls
        run in a worker thread (a cold blob blocks on the disk), bulk.SEND_HOP bytes per
        hop so a cancelled transfer stops within one hop."""
        # (None only for ConnectionClosed)
        for piece in c.h.send_with_data_passthrough(h11.Data(data=FileBody(length))):  # type: ignore[arg-type,union-attr]
            if not isinstance(piece, FileBody):  # pragma: no cover - framing bytes (none for Content-Length)
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
                    raise Abort(f"peer {c.peer} stopped reading for {self.idle_timeout:.0f} s") from e
                except (BrokenPipeError, ConnectionError) as e:
                    raise trio.BrokenResourceError(str(e)) from e
                except OSError as e:
                    raise Abort(f"sending {blob} at {pos}: {e}") from e
                pos += sent
                self.stats.bytes_sent += sent
                if sent < want:
                    raise Abort(f"{blob} shrank to {pos} bytes while serving it")
        finally:
            bulk.set_notsent_lowat(sock, bulk.TRIO_LOWAT)

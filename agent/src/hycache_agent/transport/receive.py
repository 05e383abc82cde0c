"""The PUT side of the peer data service: a replica's body into a staged temp file, then
handed to the engine (:meth:`PeerFiles.receive_replica`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote_from_bytes

import h11
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.blob_io import (
    close_pipe,
    fsync_close,
    make_temp,
    splice_body,
    write_behind,
)
from hycache_agent.transport.conn import Conn, PeerStats, Stalled, describe, error_status
from hycache_agent.transport.direct_in import direct_body, open_direct
from hycache_agent.transport.idle import BackgroundThreads
from hycache_agent.transport.wire import PUSH_HEADER, PeerFiles

log = logging.getLogger(__name__)


class ReplicaIntake:
    """Receive replicas pushed by peers into ``files.staging_dir``; a temp file the engine
    did not adopt is removed with ``remove_temp`` (it tolerates a missing file).  A push
    its sender marks as background (``X-HyCache-Push: background``: nobody waits for it)
    is spliced in on ``background``'s niced threads, so it takes the CPU this node's own
    requests leave (transport/idle.py)."""

    def __init__(self, files: PeerFiles, *, node_id: str, stats: PeerStats, chunk_size: int, idle_timeout: float,
                 thread: Callable[..., Awaitable], remove_temp: Callable[[str], None],
                 background: BackgroundThreads) -> None:
        self.files = files
        self.node_id = node_id
        self.stats = stats
        self.chunk_size = chunk_size
        self.idle_timeout = idle_timeout
        self._thread = thread
        self.remove_temp = remove_temp
        self.background = background

    async def put(self, c: Conn, path: bytes, headers: dict[str, str], sender: str) -> None:
        staging = self.files.staging_dir
        try:
            fd, temp = await self._thread(make_temp, staging, sender)
        except OSError as e:
            status = error_status(e)
            log.error("cannot create a temp file in %s: %s", staging, e)
            await c.send_json(status if status != 404 else 500, {"error": f"staging directory: {e.strerror}"},
                              close=True)
            return
        adopted = False
        try:
            if c.h.they_are_waiting_for_100_continue:
                await c.send(h11.InformationalResponse(status_code=100, headers=[]))
            length = headers.get("content-length", "")
            t0 = time.monotonic()
            if length.isascii() and length.isdigit() and "transfer-encoding" not in headers:
                received = await self._receive_raw(c, fd, temp, int(length),
                                                   headers.get(PUSH_HEADER) == "background")
            else:
                received = await self._receive_to(c, fd)
            t1 = time.monotonic()
            fd_, fd = fd, -1
            await self._thread(fsync_close, fd_)
            log.debug("replica of %r from %s: %d bytes received in %.3f s, fsync %.3f s", path, sender, received,
                      t1 - t0, time.monotonic() - t1)
            adopted = await self._adopt(c, path, temp, headers, sender, received)
            if adopted:
                await c.send_json(201, {"path": quote_from_bytes(path, safe="/"), "size": received,
                                        "node": self.node_id})
        except OSError as e:  # writing the temp file failed: answer if we still can
            log.error("receiving %r from %s: %s", path, sender, e)
            await c.send_json(error_status(e), {"error": describe(e, path)}, close=True)
        finally:
            with trio.CancelScope(shield=True):
                if fd >= 0:
                    await self._thread(os.close, fd)
                if not adopted:
                    await self._thread(self.remove_temp, temp)

    async def _adopt(self, c: Conn, path: bytes, temp: str, headers: dict[str, str], sender: str,
                     received: int) -> bool:
        """Hand the received file to the engine; whether it took it (if not, the error is answered)."""
        meta = {k: v for k, v in headers.items() if k.startswith("x-hycache-")}
        meta["content-length"] = str(received)
        meta["x-hycache-from"] = sender
        try:
            await self.files.receive_replica(path, temp, meta)
        except Exception as e:
            status = error_status(e)
            if status == 500:
                log.exception("receive_replica(%r) failed", path)
            await c.send_json(status, {"error": describe(e, path)})
            return False
        return True

    async def _receive_to(self, c: Conn, fd: int) -> int:
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
                    n, kicked = await self._thread(write_behind, fd, pieces, kicked, written)
                    written += n

        async def receiver() -> None:
            nonlocal received
            pieces: list[bytes] = []
            buffered = 0
            async with send_ch, contextlib.aclosing(c.body()) as body:
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

    async def _receive_raw(self, c: Conn, fd: int, temp: str, length: int, background: bool) -> int:
        """A body of ``length`` bytes into ``fd`` (the temp file ``temp``), moved without
        h11: past the page cache where the staging file system allows it
        (``direct_in.direct_body``), else spliced socket → pipe → file with its write-back
        started every WRITEBACK_KICK bytes (``blob_io.splice_body``); either way in one
        worker-thread job, so the final fsync finds little left.  h11 does not see those
        bytes, so the connection closes after the response."""
        pieces, ended = bulk.buffered_body(c)
        if ended:
            n, _ = await self._thread(write_behind, fd, pieces, 0, 0)
            self.stats.bytes_received += n
            return n
        c.close_after = True
        dfd = await self._thread(open_direct, temp)
        try:
            if dfd >= 0:
                job = (direct_body, c.stream.socket.fileno(), fd, dfd, pieces, length, self.idle_timeout)
                r, direct = await (self.background.run(*job) if background else self._thread(*job))
                self.stats.bytes_received_direct += direct
            else:
                r = await self._splice(c, fd, pieces, length, background)
        finally:
            if dfd >= 0:
                with trio.CancelScope(shield=True):
                    await self._thread(os.close, dfd)
        self.stats.bytes_received += r.n
        if isinstance(r.error, TimeoutError):
            raise Stalled(f"request body from {c.peer} stalled for {self.idle_timeout:.0f} s")
        if r.error is not None:
            raise trio.BrokenResourceError(f"peer {c.peer} closed the connection mid-body: {r.error}")
        return r.n

    async def _splice(self, c: Conn, fd: int, pieces: list[bytes], length: int, background: bool) -> bulk.Received:
        """``pieces`` written, then the rest of the body spliced in (``blob_io.splice_body``)."""
        received, kicked = 0, 0
        if pieces:
            received, kicked = await self._thread(write_behind, fd, pieces, kicked, 0)
        pipe = await self._thread(bulk.make_pipe)
        hop = (c.stream.socket.fileno(), fd, received, length - received, self.idle_timeout, pipe, kicked)
        try:
            if background:
                r, _ = await self.background.run(splice_body, *hop)
            else:
                r, _ = await self._thread(splice_body, *hop)
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(close_pipe, pipe)
        r.n += received
        return r

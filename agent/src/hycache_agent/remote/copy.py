"""A remote file copied whole to the fast tier with one streamed GET, read while it fills.

The first open of a remote file that is to be copied (HCCache off, or a large file HCCache
copies, ``reader.wants_copy``) starts one streamed GET into ``fast/remote-cache/`` (a
background task).  A file of at least FILLING_MIN bytes is opened as soon as the stream
has its first response head: that open is served by the agent (no backing id: the kernel
must never read the copy's unfilled bytes) and each read is answered from the part of
the copy already written (:meth:`StreamCopy.read`), waiting for the stream to reach it,
or, FAR_AHEAD bytes or more beyond where the stream writes, by a range GET of its own to
the same holder (the same version: its ETag), so neither a ``head`` of a 10 GiB file nor
a random read deep into it waits for the bytes before it.  Once the copy is whole it is
the node's copy (``RemoteCopies.stream_done``) and later opens are read by the kernel
through passthrough (``remote/backing.py``).  A smaller file's open waits for its whole
copy, as every open did before.

* One stream per (path, DHT version), shared by every open of the version and by a
  takeover that wants the bytes (``ClusterLink.fetch_locked`` waits for the whole copy).
* A small file (at most SMALL_WHOLE) is one range request read into memory and the copy
  written in one worker-thread hop: its cold open is a round trip, not a stream's hops.
  With HCCache (hybrid) a cold small file is copied this way too (``reader.copies_small``)
  and the same bytes go into the memory cache.
* Each stream (the whole file, or one of PARTS ranges) writes in order from its first
  byte, so what is filled is one span per stream, ``[first, got)`` (``spans``), reported
  per hop of the transfer; a read is served from the copy only inside a span.
* A holder that fails mid-stream: the next one (primary, then replicas) starts over from
  byte 0 and must send the same bytes: its ETag must be of the same family as the first
  one's (a replica's is the primary's with ``r-``), else the stream fails.  Bytes below
  a span's end are then rewritten with the same values.  Parts of different versions
  are fetched again by one stream, unless a reader was already served from them: then
  the stream fails (the bytes served cannot be told apart).  No holder left: waiting and
  later reads of what is not filled get EIO, never zeros; the partial copy is removed,
  never the node's copy, and the next open streams again.
"""

from __future__ import annotations

import errno
import logging
import os
import time

import trio

from hycache_agent.fs.namespace import FsError
from hycache_agent.transport import bulk
from hycache_agent.transport.client import PeerChanged

log = logging.getLogger(__name__)

# A copy of at least this size is fetched as PARTS ranges in parallel (each its own
# connection and worker thread: the holder's sendfile and our splice of one stream keep
# one core busy; two streams use both).
PARTS = 2
PARTS_MIN = 16 << 20
PART_ALIGN = 1 << 20
# A copy of at most this size is one range request read into memory, written in one hop.
SMALL_WHOLE = 256 << 10
# A copy of at least this size is opened while it fills (smaller ones: once whole, a wait
# of tens of ms, and then read through passthrough rather than by the agent).
FILLING_MIN = PARTS_MIN
# A read at least this far beyond where its stream writes is a range GET of its own.
FAR_AHEAD = 8 << 20


class _Torn(Exception):
    """Parts of two versions, and a reader was served from them."""


def _write_whole(dest: str, data: bytes) -> list[float]:
    t = [time.monotonic()]
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    t.append(time.monotonic())
    try:
        bulk.write_all(fd, [data])
        t.append(time.monotonic())
    finally:
        os.close(fd)
        t.append(time.monotonic())
    return t


def _norm(etag: str) -> str:
    return etag[2:] if etag.startswith("r-") else etag


def _pread_cached(fd: int, n: int, off: int) -> memoryview | None:
    """``n`` bytes at ``off`` if they are all in the page cache (the stream wrote them just
    now), else None.  ``RWF_NOWAIT`` never waits for the disk or a lock: safe on the loop
    thread, and no worker-thread hop for the common case of a reader close behind the
    stream."""
    buf = bytearray(n)
    try:
        k = os.preadv(fd, [buf], off, os.RWF_NOWAIT)
    except (BlockingIOError, OSError):
        return None
    return memoryview(buf) if k == n else None


class StreamCopy:
    def __init__(self, link, node, dest: str) -> None:
        self.link = link
        self.node = node
        self.version = node.meta.version
        self.dest = dest
        self.size = node.meta.size
        self.written = 0
        self.etag: str | None = None
        self.done = False
        self.error: FsError | None = None
        self.fd = -1
        self.refs = 1  # the stream itself, and each open reading it while it fills
        self.finished = trio.Event()
        self.begun = trio.Event()  # the first response head came (or the stream ended)
        self.spans: dict[int, int] = {0: 0}  # first byte of a stream -> the end of what it wrote
        self.served = False  # a reader was answered from the copy before it was whole
        self.addr: str | None = None  # the holder streaming now
        self._moved = trio.Event()  # set (and replaced) whenever a span grows or the stream ends
        self.created = time.monotonic()

    def _progress(self, done: int, total: int) -> None:
        self.written, self.size = done, total
        self._grew(0, done)

    def _grew(self, first: int, got: int) -> None:
        if got > self.spans.get(first, first):
            self.spans[first] = got
        moved, self._moved = self._moved, trio.Event()
        moved.set()

    async def run(self) -> None:
        node = self.node
        try:
            last: BaseException | None = None
            t0 = time.monotonic()
            for holder in [h for h in [node.meta.primary, *node.meta.replicas] if h]:
                expect = None
                if self.etag is not None:  # the same bytes as the first holder's, or nothing
                    expect = _norm(self.etag) if holder == node.meta.primary else "r-" + _norm(self.etag)

                def started(size: int, etag: str) -> None:
                    self.size = size
                    if self.etag is None:
                        self.etag = etag
                    self.begun.set()

                try:
                    addr = self.addr = await self.link.address_of(holder)
                    etag = None
                    if 0 < self.size <= SMALL_WHOLE and self.fd < 0:
                        etag = await self._small(addr, expect)
                    if etag is None and self.fd < 0:
                        self.fd = await trio.to_thread.run_sync(
                            os.open, self.dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    if etag is None and self.size >= PARTS_MIN:
                        etag = await self._parts(addr, expect)
                    if etag is None:
                        etag = await self.link.peers.fetch_to_file(addr, node.path, self.fd, self._progress,
                                                                  etag=expect, started=started)
                except _Torn:
                    log.error("%r changed on %s while readers were served from its copy: EIO", node.path, holder)
                    break
                except Exception as exc:
                    last = exc
                    log.warning("streaming %r from %s failed: %s", node.path, holder, exc)
                    continue
                self.written = self.size
                self.done = True
                self.link.stream_done(self, etag, holder, time.monotonic() - t0)
                return
            log.error("no holder of %r could serve it (%s)", node.path, last)
            self.error = FsError(errno.EIO)
            self.link.stream_failed(self)
        except BaseException:
            if self.error is None and not self.done:
                self.error = FsError(errno.EIO)
            raise
        finally:
            if not self.done and self.error is None:
                self.error = FsError(errno.EIO)
            self.finished.set()
            self.begun.set()
            self._grew(0, 0)  # wakes the waiting readers
            with trio.CancelScope(shield=True):
                await self.put()

    async def _small(self, addr, expect: str | None) -> str | None:
        """A small file whole: one range request read into memory on the loop (the body
        comes with the head), then the copy written in one worker-thread hop (open, write,
        close) instead of the stream's five (open, fstat, write, truncate, close).  None
        when the file is no longer the size the DHT gave (then the stream takes it)."""
        t0 = time.monotonic()
        data, etag, total = await self.link.peers.read_block(addr, self.node.path, 0, self.size)
        t1 = time.monotonic()
        if expect is not None and etag != expect:
            raise PeerChanged(f"{self.node.path!r}: version {etag!r}, expected {expect!r}")
        if total != len(data):
            return None
        if self.etag is None:  # a holder tried next must send the same bytes
            self.etag = etag
        tw = await trio.to_thread.run_sync(_write_whole, self.dest, data)
        t2 = time.monotonic()
        self.size = self.written = len(data)
        if self.link.reader is not None:  # HCCache: the same bytes fill the memory cache
            self.link.reader.keep_copied(self.node, self.version, etag, data)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("small copy of %r: ms start %.3f fetch %.3f write %.3f insert %.3f w_thread %.3f w_open %.3f "
                      "w_write %.3f w_close %.3f w_back %.3f", self.node.path,
                      (t0 - self.created) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.monotonic() - t2) * 1e3,
                      (tw[0] - t1) * 1e3, (tw[1] - tw[0]) * 1e3, (tw[2] - tw[1]) * 1e3, (tw[3] - tw[2]) * 1e3,
                      (t2 - tw[3]) * 1e3)
        return etag

    async def _parts(self, addr, expect: str | None) -> str | None:
        """The copy as PARTS ranges fetched in parallel; the same version (ETag) and the
        size the DHT gave in every part, else None (then one stream decides), or _Torn
        when a reader was already served from them.  Any other failure (the holder is
        gone) goes to the next holder."""
        try:
            return await self._parts_once(addr, expect)
        except* PeerChanged as group:
            log.info("parallel fetch of %r from %s: %r; one stream", self.node.path, addr, group)
        if self.served:
            raise _Torn
        self.spans = {0: 0}  # (what the parts wrote may be of two versions)
        return None

    async def _parts_once(self, addr, expect: str | None) -> str:
        size = self.size
        step = -(-size // PARTS // PART_ALIGN) * PART_ALIGN
        bounds = [(i, min(i + step, size)) for i in range(0, size, step)]
        got: list[tuple[str, int]] = []
        for first, _end in bounds:
            self.spans.setdefault(first, first)

        def started(_size: int, etag: str) -> None:
            if self.etag is None:  # a holder tried next must send the same bytes
                self.etag = etag
            self.begun.set()

        async def one(first: int, end: int) -> None:
            got.append(await self.link.peers.fetch_part_to_file(
                addr, self.node.path, self.fd, first, end, etag=expect, started=started,
                progress=lambda done, _total: self._grew(first, done)))

        async with trio.open_nursery() as nursery:
            for first, end in bounds:
                nursery.start_soon(one, first, end)
        etags = {e for e, _ in got}
        if len(etags) != 1 or any(total != size for _, total in got):
            raise PeerChanged(f"{self.node.path!r}: parts of different versions or sizes: {got}")
        return got[0][0]

    # ------------------------------------------------------------------ reads while it fills
    def filled(self, off: int, end: int) -> bool:
        """Whether bytes ``[off, end)`` are in the copy."""
        return self.done or any(first <= off and end <= got for first, got in self.spans.items())

    def _behind(self, off: int) -> int:
        """How far ``off`` is beyond the end of the span of the stream that writes it."""
        first = max((f for f in self.spans if f <= off), default=0)
        return off - self.spans.get(first, first)

    async def read(self, off: int, size: int) -> bytes | memoryview:
        """Bytes ``[off, off + size)`` (fewer at the end of the file) of a copy that may still
        be filling: from the copy once the bytes are in it, or by a range GET of their own
        when they are FAR_AHEAD; EIO when the stream failed before it wrote them.  The
        caller holds a reference (``refs``): the copy's descriptor stays open."""
        end = min(off + size, self.size)
        if off >= end:
            return b""
        status = self.link.status
        if not self.filled(off, end):
            if self._behind(off) >= FAR_AHEAD and self.etag is not None and self.addr is not None:
                ranged = await self._ranged(off, end - off)
                if ranged is not None:
                    status.filling_ranged += 1
                    return ranged
            status.filling_waits += 1
            while not self.filled(off, end):
                if self.finished.is_set():
                    raise self.error or FsError(errno.EIO)
                await self._moved.wait()
        if not self.done:
            self.served = True
            status.filling_reads += 1
        cached = _pread_cached(self.fd, end - off, off)
        if cached is not None:
            return cached
        return await trio.to_thread.run_sync(os.pread, self.fd, end - off, off)

    async def _ranged(self, off: int, n: int) -> bytes | None:
        """Bytes of this copy's version (its ETag) fetched apart from the stream, or None
        (the holder failed, or has another version now: the reader waits for the stream)."""
        assert self.etag is not None and self.addr is not None, "the stream has its holder and version"
        try:
            data, etag, _total = await self.link.peers.read_block(self.addr, self.node.path, off, n)
        except Exception as exc:
            log.info("range GET of %r [%d+%d] from %s failed: %s", self.node.path, off, n, self.addr, exc)
            return None
        if _norm(etag) != _norm(self.etag) or len(data) != n:
            return None
        return data

    def hold(self) -> Filling | None:
        """An open's hold on the copy while it fills (the copy's descriptor stays open until
        :meth:`Filling.aclose`), or None once the stream has ended."""
        if self.finished.is_set():
            return None
        self.refs += 1
        return Filling(self)

    async def wait(self) -> None:
        """Until the stream ended; raises its error if it failed."""
        await self.finished.wait()
        if self.error is not None:
            raise self.error

    async def put(self) -> None:
        self.refs -= 1
        if self.refs == 0 and self.fd >= 0:
            fd, self.fd = self.fd, -1
            await trio.to_thread.run_sync(os.close, fd)


class Filling:
    """One open of a remote file served from its copy while the copy fills (and after: the
    open keeps its descriptor of the copy for its whole life)."""

    def __init__(self, sc: StreamCopy) -> None:
        self.sc = sc
        self.closed = False

    async def read(self, off: int, size: int) -> bytes | memoryview:
        return await self.sc.read(off, size)

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self.sc.put()

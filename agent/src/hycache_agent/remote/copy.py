"""A remote file copied whole to the fast tier with one streamed GET.

The first open of a remote file that is to be copied (HCCache off, or a large file HCCache
copies, ``reader.wants_copy``) starts one streamed GET into ``fast/remote-cache/`` (a
background task) and waits for it; then it and every later open is read by the kernel
through passthrough (``remote/backing.py``).  Serving the first open's reads from the part
already written while the rest streams in was tried and measured slower here: every
128 KiB FUSE read then costs a kernel → agent → worker thread round trip (2–3 ms each on
this loaded 2-core machine: 44 MB/s for a 256 MiB file whose stream took 2.4 s), while
the kernel reads a whole copy through passthrough at page-cache speed.

* One stream per (path, DHT version), shared by every open of the version and by a
  takeover that wants the bytes (``ClusterLink.fetch_locked`` waits for it).
* A small file (at most SMALL_WHOLE) is one range request read into memory and the copy
  written in one worker-thread hop: its cold open is a round trip, not a stream's hops.
  With HCCache (hybrid) a cold small file is copied this way too (``reader.copies_small``)
  and the same bytes go into the memory cache.
* The stream is written in order, so ``written`` is always a prefix of the file.
* A holder that fails mid-stream: the next one (primary, then replicas) starts over from
  byte 0 and must send the same bytes: its ETag must be of the same family as the first
  one's (a replica's is the primary's with ``r-``), else the stream fails.  Bytes below
  ``written`` are then rewritten with the same values.  No holder left: waiting and later
  reads get EIO.
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
        self.refs = 1  # the stream itself
        self.finished = trio.Event()
        self.created = time.monotonic()

    def _progress(self, done: int, total: int) -> None:
        self.written, self.size = done, total

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

                try:
                    addr = await self.link.address_of(holder)
                    etag = None
                    if 0 < self.size <= SMALL_WHOLE and self.fd < 0:
                        etag = await self._small(addr, expect)
                    if etag is None and self.fd < 0:
                        self.fd = await trio.to_thread.run_sync(
                            os.open, self.dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    if etag is None and self.size >= PARTS_MIN:
                        try:
                            etag = await self._parts(addr, expect)
                        except* PeerChanged as group:  # parts of two versions: one stream decides
                            log.info("parallel fetch of %r from %s: %r; one stream", node.path, holder, group)
                    if etag is None:
                        etag = await self.link.peers.fetch_to_file(addr, node.path, self.fd, self._progress,
                                                                  etag=expect, started=started)
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

    async def _parts(self, addr, expect: str | None) -> str:
        """The copy as PARTS ranges fetched in parallel; the same version (ETag) and the
        size the DHT gave in every part, else PeerChanged (then one stream).  Any other
        failure (the holder is gone) goes to the next holder."""
        size = self.size
        step = -(-size // PARTS // PART_ALIGN) * PART_ALIGN
        bounds = [(i, min(i + step, size)) for i in range(0, size, step)]
        got: list[tuple[str, int]] = []

        def started(_size: int, etag: str) -> None:
            if self.etag is None:  # a holder tried next must send the same bytes
                self.etag = etag

        async def one(first: int, end: int) -> None:
            got.append(await self.link.peers.fetch_part_to_file(addr, self.node.path, self.fd, first, end,
                                                                 etag=expect, started=started))

        async with trio.open_nursery() as nursery:
            for first, end in bounds:
                nursery.start_soon(one, first, end)
        etags = {e for e, _ in got}
        if len(etags) != 1 or any(total != size for _, total in got):
            raise PeerChanged(f"{self.node.path!r}: parts of different versions or sizes: {got}")
        return got[0][0]

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

"""One whole-file (or part) fetch's state on the client side: the span wanted, the bytes
written so far (always a prefix of the span) and the version, checked on every response
head so a resumed transfer never splices two versions."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.errors import PeerChanged, PeerError
from hycache_agent.transport.wire import unquote_etag

Progress = Callable[[int, int], None]  # (bytes written so far, total bytes)
# A body's first hop: progress is reported once per hop, and a reader of a copy that fills
# waits for it (remote/copy.py), so the first bytes show after 256 KiB, not bulk.HOP (4 MiB
# per part of a parallel fetch: 20-40 ms); each later hop is 4x the last, up to bulk.HOP
FIRST_HOP = 256 << 10


def content_range(value: str) -> tuple[int, int]:
    """``bytes a-b/total`` → (a, total)."""
    try:
        unit, _, rest = value.strip().partition(" ")
        span, _, total = rest.partition("/")
        first, _, _ = span.partition("-")
        if unit != "bytes":
            raise ValueError
        return int(first), int(total)
    except ValueError:
        raise PeerError(f"malformed Content-Range {value!r}") from None


def _pwrite_all(fd: int, pieces: list[bytes], offset: int) -> int:
    total = sum(len(p) for p in pieces)
    done = os.pwritev(fd, pieces, offset)
    if done < total:
        rest = memoryview(b"".join(pieces))[done:]
        pos = offset + done
        while rest:
            k = os.pwrite(fd, rest, pos)
            rest, pos = rest[k:], pos + k
    return total



@dataclass(eq=False)
class Fetch:
    """Bytes ``[first, end)`` of ``path`` (``end`` None: to the end of the file) into ``fd``.
    ``etag`` is the version wanted (None: the first response's); ``size`` where the bytes
    wanted end, once a response said (the file's size when whole)."""

    addr: str
    path: bytes
    fd: int
    regular: bool
    progress: Progress | None
    started: Callable[[int, str], None] | None
    etag: str | None
    first: int = 0
    end: int | None = None
    size: int | None = None
    total_seen: int | None = None  # the file's size per the first response (a part)
    got: int = 0  # bytes written, always a prefix of the span
    before: int = 0  # ``got`` when the current attempt began
    pipe: tuple[int, int] | None = None  # made when a body does not come whole with its head
    local_error: OSError | None = None  # the local file failed: not the peer's fault, not retried

    def __post_init__(self) -> None:
        self.got = self.first

    @property
    def known(self) -> bool:
        """Whether a response already fixed the span and the version (a resume, or a part)."""
        return self.size is not None or self.end is not None

    def range_headers(self) -> list[tuple[str, str]]:
        if self.end is not None:  # a part: always a range, of this version once known
            headers = [("range", f"bytes={self.got}-{self.end - 1}")]
            if self.size is not None:
                headers.append(("if-range", f'"{self.etag}"'))
            return headers
        if self.size is not None:  # resuming
            return [("range", f"bytes={self.got}-"), ("if-range", f'"{self.etag}"')]
        return []

    def where(self) -> str:
        return f"{self.addr} {self.path!r}"

    def changed(self, message: str) -> PeerChanged:
        return PeerChanged(f"{self.where()}: {message}", addr=self.addr, path=self.path)

    def accept(self, resp: h11.Response) -> bool:
        """Check a 200/206 head against what is known (raises PeerChanged, PeerError);
        learn the span and the version from it.  Whether it resumes the transfer."""
        status = resp.status_code
        new_etag = unquote_etag(bulk.header(resp, b"etag") or "")
        if self.known and status != 206:
            # If-Range did not match: the peer sent the whole, newer file
            raise self.changed(f"changed during the transfer ({self.etag!r} → {new_etag!r})")
        if self.etag is not None and new_etag != self.etag:
            raise self.changed(f"version {new_etag!r}, expected {self.etag!r}")
        length = int(bulk.header(resp, b"content-length") or "-1")
        resumed = False
        if status == 206:
            resumed = self._accept_range(bulk.header(resp, b"content-range") or "", length)
        else:
            if length < 0:
                raise PeerError(f"{self.where()}: no Content-Length", addr=self.addr, path=self.path)
            self.size = length
        self.etag = new_etag
        if self.started is not None:
            cb, self.started = self.started, None
            assert self.size is not None, "set by the head's length or range"
            cb(self.size if self.total_seen is None else self.total_seen, self.etag)
        return resumed

    def _accept_range(self, crange: str, length: int) -> bool:
        cr_first, total = content_range(crange)
        if self.end is not None:
            if cr_first != self.got or total < self.end or (self.total_seen is not None and total != self.total_seen) \
                    or length != self.end - self.got:
                raise self.changed(f"unexpected Content-Range {crange!r} for [{self.got}, {self.end})")
            if self.size is None:
                self.size, self.total_seen = self.end, total
                return False
        else:
            if cr_first != self.got or (self.size is not None and total != self.size) or length != total - cr_first:
                raise self.changed(f"unexpected Content-Range {crange!r}")
            if self.size is None:
                self.size = total
                return False
        return True

    async def receive(self, conn: bulk.Conn, thread: Callable[..., Awaitable[Any]], read_timeout: float) -> None:
        """The response body into the file at ``self.got``: what came with the head, then the
        rest spliced in (a broken or short body raises bulk.Broken)."""
        size = self.size
        assert size is not None, "the response's head set the size"
        pieces, ended = bulk.buffered_body(conn)
        r = bulk.Received()
        try:  # errors of the local file are not the peer's: raised as they are
            if pieces:  # (a small body comes whole with its head)
                self.got += await thread(_pwrite_all, self.fd, pieces, self.got) if self.regular \
                    else await thread(bulk.write_all, self.fd, pieces)
                if self.progress is not None:
                    self.progress(self.got, size)
            hop = FIRST_HOP  # (progress is reported per hop: the first bytes show early)
            while self.got < size and not ended and r.error is None:
                if self.regular and self.pipe is None:
                    self.pipe = await trio.to_thread.run_sync(bulk.make_pipe)
                r = await thread(bulk.splice_in, conn.fd, self.fd, self.got, min(hop, size - self.got),
                                 read_timeout, self.pipe)
                hop = min(hop * 4, bulk.HOP)
                self.got += r.n
                if self.progress is not None:
                    self.progress(self.got, size)
        except OSError as e:
            self.local_error = e
            raise
        if r.error is not None:
            raise bulk.Broken(str(r.error)) from r.error
        if ended and self.got < size:
            raise bulk.Broken("short response")

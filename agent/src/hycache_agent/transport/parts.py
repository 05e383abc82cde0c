"""A replica pushed in several byte ranges at once (``PUT /v1/parts``): the holder's side.

One loopback TCP stream on one core bounds a push; a large body therefore comes in
``count`` parts, each a request of its own on its own connection (and worker thread on
both sides), all naming one push (``X-HyCache-Part: <push id> <count>``) and their place
in it (``Content-Range: bytes FIRST-LAST/TOTAL``).  The rules the holder keeps:

* every part of a push writes its bytes at their offset into the one staged temp file
  (O_DIRECT from offsets that are multiples of ``direct_in.DIRECT_HOP``, as a whole push
  does; the sender puts the part boundaries there);
* the replica is adopted once, after every part arrived (their ranges cover the file
  exactly) and the file was fsynced; each part's request is then answered as a whole
  push's would be (201 and the same JSON);
* a part that fails (cut, stalled, refused) fails the whole push: the parts still moving
  are cancelled, every part's request gets the error, the temp file is removed, nothing
  is adopted.  A part waiting for the others gives up after the idle timeout.

A peer that does not know ``/v1/parts`` answers 404 before any body byte (the sender asks
``Expect: 100-continue``), and the sender pushes in one stream as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote_from_bytes

import h11
import trio

from hycache_agent.transport import bulk
from hycache_agent.transport.blob_io import make_temp
from hycache_agent.transport.conn import Conn, PeerStats, describe, error_status
from hycache_agent.transport.direct_in import DIRECT_HOP, direct_body, open_direct
from hycache_agent.transport.wire import PART_HEADER, PeerFiles

log = logging.getLogger(__name__)


class PartError(Exception):
    """A part that cannot belong to its push (400)."""


@dataclass
class Part:
    push_id: str
    count: int
    first: int
    length: int
    total: int


def parse_part(headers: dict[str, str]) -> Part:
    """The part a request carries (its ``X-HyCache-Part`` and ``Content-Range``)."""
    try:
        push_id, count_s = headers[PART_HEADER].split()
        unit, spec = headers["content-range"].split()
        span, total_s = spec.split("/")
        first_s, last_s = span.split("-")
        length = int(headers["content-length"])
        part = Part(push_id, int(count_s), int(first_s), int(last_s) - int(first_s) + 1, int(total_s))
    except (KeyError, ValueError) as e:
        raise PartError(f"malformed part headers: {e}") from None
    if unit != "bytes" or not 1 <= part.count <= 64 or not 0 < len(push_id) <= 64 or length != part.length \
            or part.length <= 0 or part.first % DIRECT_HOP or part.first + part.length > part.total:
        raise PartError(f"part {headers[PART_HEADER]!r} {headers['content-range']!r} does not fit its push")
    return part


@dataclass
class Push:
    """One push in parts, shared by its parts' requests while any of them runs."""

    path: bytes
    total: int
    count: int
    meta: dict[str, str]
    ready: trio.Event = field(default_factory=trio.Event)  # the temp file exists (or its creation failed)
    done: trio.Event = field(default_factory=trio.Event)  # ``outcome`` is set
    temp: str | None = None
    fd: int = -1
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (first, length) of the parts that arrived
    taken: set[int] = field(default_factory=set)  # first offsets of the parts seen
    scopes: set[trio.CancelScope] = field(default_factory=set)  # the parts still receiving
    users: int = 0
    outcome: tuple[int, dict] | None = None  # the answer every part gets
    adopted: bool = False

    def complete(self) -> bool:
        if len(self.ranges) != self.count:
            return False
        pos = 0
        for first, length in sorted(self.ranges):
            if first != pos:
                return False
            pos += length
        return pos == self.total


class PartIntake:
    """Receive the parts of replica pushes into ``files.staging_dir`` (see the module)."""

    def __init__(self, files: PeerFiles, *, node_id: str, stats: PeerStats, idle_timeout: float,
                 thread: Callable[..., Awaitable], remove_temp: Callable[[str], None]) -> None:
        self.files = files
        self.node_id = node_id
        self.stats = stats
        self.idle_timeout = idle_timeout
        self._thread = thread
        self.remove_temp = remove_temp
        self.pushes: dict[tuple[str, str], Push] = {}

    async def put(self, c: Conn, path: bytes, headers: dict[str, str], sender: str) -> None:
        try:
            part = parse_part(headers)
        except PartError as e:
            await c.send_json(400, {"error": str(e)}, close=True)
            return
        key = (sender, part.push_id)
        push = self.pushes.get(key)
        if push is None:
            meta = {k: v for k, v in headers.items() if k.startswith("x-hycache-") and k != PART_HEADER}
            meta.update({"content-length": str(part.total), "x-hycache-from": sender})
            push = self.pushes[key] = Push(path, part.total, part.count, meta)
            creating = True
        else:
            creating = False
        push.users += 1
        try:
            if creating:
                await self._stage(push)
            await push.ready.wait()
            if push.outcome is None:
                if (push.path, push.total, push.count) != (path, part.total, part.count) or part.first in push.taken:
                    self._fail(push, 400, f"part at {part.first} does not fit push {part.push_id}")
                else:
                    push.taken.add(part.first)
                    await self._receive(c, push, part, path, sender)
            status, answer = push.outcome or (500, {"error": "push ended without an answer"})
            await c.send_json(status, answer, close=status != 201)
        finally:
            push.users -= 1
            if push.users == 0:
                del self.pushes[key]
                with trio.CancelScope(shield=True):
                    await self._thread(self._drop, push)

    async def _stage(self, push: Push) -> None:
        try:
            push.fd, push.temp = await self._thread(make_temp, self.files.staging_dir, push.meta["x-hycache-from"])
            await self._thread(os.ftruncate, push.fd, push.total)
        except OSError as e:
            log.error("cannot stage a replica in %s: %s", self.files.staging_dir, e)
            self._fail(push, error_status(e) if error_status(e) != 404 else 500,
                       f"staging directory: {e.strerror}")
        finally:
            push.ready.set()

    def _drop(self, push: Push) -> None:
        """(blocking) The last part is out: close the temp file, remove it unless adopted."""
        if push.fd >= 0:
            os.close(push.fd)
        if push.temp is not None and not push.adopted:
            self.remove_temp(push.temp)

    def _fail(self, push: Push, status: int, error: str) -> None:
        if push.outcome is None:
            push.outcome = (status, {"error": error})
            push.done.set()
        for scope in push.scopes:
            scope.cancel()

    async def _receive(self, c: Conn, push: Push, part: Part, path: bytes, sender: str) -> None:
        """The part's body into the temp file at its offset; the last part to arrive
        fsyncs the file and has the engine adopt it, the others wait for that."""
        assert push.temp is not None
        if c.h.they_are_waiting_for_100_continue:
            await c.send(h11.InformationalResponse(status_code=100, headers=[]))
        c.close_after = True  # the body goes around h11
        scope = trio.CancelScope()
        push.scopes.add(scope)
        r: bulk.Received | None = None
        try:
            with scope:
                r = await self._body(c, push.fd, push.temp, part)
        except OSError as e:
            self._fail(push, error_status(e), describe(e, path))
            return
        finally:
            push.scopes.discard(scope)
        if r is None or r.error is not None:  # cancelled (another part failed), or this one was cut
            self._fail(push, 502, f"part at {part.first} of push {part.push_id} cut: {r.error if r else 'cancelled'}")
            return
        push.ranges.append((part.first, part.length))
        if not push.complete():
            with trio.move_on_after(self.idle_timeout):
                await push.done.wait()
            self._fail(push, 504, f"push {part.push_id}: the other parts did not arrive")  # (no-op once done)
            return
        await self._adopt(push, path, sender)

    async def _body(self, c: Conn, fd: int, temp: str, part: Part) -> bulk.Received:
        pieces, ended = bulk.buffered_body(c)
        if ended:
            data = b"".join(pieces)
            await self._thread(os.pwrite, fd, data, part.first)
            self.stats.bytes_received += len(data)
            return bulk.Received(len(data), None if len(data) == part.length else bulk.Broken("short body"))
        dfd = await self._thread(open_direct, temp)
        try:
            r, direct = await self._thread(direct_body, c.stream.socket.fileno(), fd, dfd, pieces, part.length,
                                           self.idle_timeout, None, part.first)
        finally:
            if dfd >= 0:
                with trio.CancelScope(shield=True):
                    await self._thread(os.close, dfd)
        self.stats.bytes_received += r.n
        self.stats.bytes_received_direct += direct
        return r

    async def _adopt(self, push: Push, path: bytes, sender: str) -> None:
        assert push.temp is not None
        try:
            await self._thread(os.fsync, push.fd)
            await self.files.receive_replica(path, push.temp, push.meta)
        except Exception as e:
            status = error_status(e)
            if status == 500:
                log.exception("receive_replica(%r) of a push in parts failed", path)
            self._fail(push, status, describe(e, path))
            return
        push.adopted = True
        push.outcome = (201, {"path": quote_from_bytes(path, safe="/"), "size": push.total, "node": self.node_id})
        push.done.set()
        log.debug("replica of %r from %s: %d bytes in %d parts", path, sender, push.total, push.count)

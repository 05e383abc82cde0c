"""Write leases: this node's use of each file's write flag in the DHT (see
:mod:`hycache_agent.cluster.ownership` for the protocol): taken before a write, kept idle
after the last close for the next open, renewed while in use, yielded when another node
asks, forgotten once it could run out, and taken again in batches (a directory's lapsed
leases with the first that an open needs)."""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from hycache_dht.meta import Op

from hycache_agent.fs.namespace import FsError, Inode

log = logging.getLogger("hycache_agent.cluster.ownership")  # one log with the ownership protocol

# An open for writing whose idle lease lapsed (forgotten once it could run out) takes it
# again from the store, and with it, in the same round trip, up to RETAKE_BATCH - 1 other
# lapsed leases of files in the same directory, in the order they lapsed (the order the
# files were written): a program that writes many files and opens them again later (mdtest's
# read phase, a build's second pass) pays one round trip per batch, not one per file.
RETAKE_BATCH = 256
LAPSED_MAX = 65_536  # lapsed leases remembered for that (the oldest forgotten first)


@dataclass
class Lease:
    """This node's use of one file's write flag."""

    path: bytes  # when acquired (a rename carries the flag along in the store)
    held: bool  # False: written without the flag (store unreachable, or the lease was lost)
    writers: int = 0  # open write handles (0: idle — after a takeover or a create, or the last close)
    since: float = field(default_factory=time.monotonic)  # last time the writers fell to 0 (or taken)
    until: float = 0.0  # (monotonic) the store's lease runs at least until then
    yield_asked: bool = False  # another node waits for it: release at the last close


class WriteLeases:
    """The leases by inode number.  ``event`` queues a namespace event for the outbox,
    ``notify`` a message for another node's inbox, ``commit_soon`` sends them."""

    def __init__(self, link, ns, *, node_id: str, lease_seconds: float, lease_wait: float, stats,
                 event: Callable[..., None], notify: Callable[..., None], commit_soon: Callable[[], None]) -> None:
        self.link = link
        self.ns = ns
        self.node_id = node_id
        self.lease_seconds = lease_seconds
        self.lease_wait = lease_wait
        self.idle_seconds = 2 * lease_seconds  # the lease a create takes with its publication
        self.stats = stats
        self._event = event
        self._notify = notify
        self._commit_soon = commit_soon
        self.leases: dict[int, Lease] = {}  # by inode number
        # what renew_once looks at, so that it does not walk every lease (one per file
        # created here): the leases with writers (stale ones skipped and dropped there),
        # and the idle ones in the order they stop being reusable (forget at, seq, ino, lease)
        self._in_use: dict[int, Lease] = {}
        self._idle: list[tuple[float, int, int, Lease]] = []
        self._idle_seq = itertools.count()
        # leases forgotten while their files stayed (:meth:`_lapse`): by directory path, each
        # in the order they lapsed; and every one's directory, oldest first (LAPSED_MAX)
        self._lapsed: dict[bytes, dict[int, None]] = {}
        self._lapsed_dir: dict[int, bytes] = {}
        self._retaking: dict[int, trio.Event] = {}  # inodes in a batch being taken again
        self.unleased: set[int] = set()  # written without the lease (degraded / lease lost)
        self._warned_unleased = False
        # the FUSE layer answers opens for writing of a file without the agent while its
        # lease is lendable(): told (ino) when that may have stopped (forgotten, released,
        # yielded, lost), before anything else can use the lease
        self.unlendable: Callable[[int], None] = lambda ino: None

    def lendable(self, ino: int) -> bool:
        """Whether an open for writing of ``ino`` may use its lease without the agent
        (answered by the FUSE layer, counted after the fact: :meth:`lent_writers`): held,
        reusable, nobody waiting for it.  It stays usable until :attr:`unlendable` is told:
        renew_once forgets an idle lease no earlier than it stops being reusable, with half
        a lease left in the store, and a writer counted before that (the FUSE layer hands
        its opens over before any task runs) keeps it in use and renewed."""
        entry = self.leases.get(ino)
        return (entry is not None and entry.held and not entry.yield_asked
                and self._reusable(entry, time.monotonic()))

    def lent_writers(self, ino: int, n: int) -> None:
        """``n`` opens for writing of ``ino`` were answered with its lendable lease: in use
        (:meth:`lease_for_write` without the wait); :meth:`write_done` for each at its
        release."""
        entry = self.leases.get(ino)
        if entry is None:  # cannot happen: unlendable is told before a lease goes
            log.error("inode %d: %d writers answered without its write lease", ino, n)
            return
        entry.writers += n
        self.stats.lease_reuses += n
        self._in_use[ino] = entry

    def hold_taken(self, ino: int, path: bytes, until: float) -> None:
        """A lease just taken for a takeover: held, idle, for the open that follows (the
        kernel retries it on the local inode); if none comes, it goes as any idle lease."""
        entry = self.leases[ino] = Lease(path, held=True, since=time.monotonic(), until=until)
        self._went_idle(ino, entry)

    def forget_idle(self, ino: int) -> None:
        """A removed file's idle lease: its flag runs out in the store by itself."""
        entry = self.leases.get(ino)
        if entry is not None and entry.writers <= 0:
            del self.leases[ino]
            self.unlendable(ino)

    def moved(self, ino: int, path: bytes) -> None:
        """The file was renamed here: the store's rename carries the flag along."""
        entry = self.leases.get(ino)
        if entry is not None:
            entry.path = path

    def status_into(self, d: dict) -> None:
        d["write_leases_held"] = sum(1 for e in self.leases.values() if e.held and e.writers > 0)
        d["write_leases_idle"] = sum(1 for e in self.leases.values() if e.held and e.writers <= 0)
        d["unleased_files"] = len(self.unleased)

    async def acquire(self, path: bytes, nonblocking: bool) -> bool | None:
        """Take the write flag of ``path``, waiting for another holder.  True: held;
        None: the path is not in the store (not published yet: nobody else can know it);
        False: the store is unreachable."""
        deadline = time.monotonic() + self.lease_wait
        delay, waited = 0.05, False
        while True:
            got = await self.link.query("acquire_write", path, self.node_id, self.lease_seconds,
                                         missing=None)
            if got is self.link.UNREACHABLE:
                return False
            if got is None or got:
                return got
            if nonblocking:
                raise FsError(errno.EAGAIN)
            if not waited:
                waited = True
                self.stats.lease_waits += 1
                log.info("waiting for the write lease on %r (held by another node)", path)
                await self._ask_to_yield(path)
            if time.monotonic() > deadline:
                raise FsError(errno.EBUSY)
            await trio.sleep(delay)
            delay = min(1.0, delay * 2)

    def _lapse(self, ino: int, path: bytes) -> None:
        """``ino``'s idle lease was forgotten while the file stays here: remembered (with
        its directory) for :meth:`_retake`."""
        dirpath = path.rpartition(b"/")[0] or b"/"
        self._unlapse(ino)
        self._lapsed.setdefault(dirpath, {})[ino] = None
        self._lapsed_dir[ino] = dirpath
        if len(self._lapsed_dir) > LAPSED_MAX:
            self._unlapse(next(iter(self._lapsed_dir)))

    def _unlapse(self, ino: int) -> None:
        dirpath = self._lapsed_dir.pop(ino, None)
        if dirpath is not None:
            inos = self._lapsed[dirpath]
            del inos[ino]
            if not inos:
                del self._lapsed[dirpath]

    async def _retake(self, ino: int, path: bytes) -> bool:
        """Take ``ino``'s lapsed lease again together with up to RETAKE_BATCH - 1 others
        lapsed in its directory (one round trip, each for a create's idle lease), as
        :meth:`created` holds them: whether ``ino``'s was taken (False also when it had
        not lapsed, when the store is unreachable or another node holds it: then
        :meth:`acquire` decides, waiting or asking as it does)."""
        dirpath = self._lapsed_dir.get(ino)
        if dirpath is None:
            return False
        batch = [(ino, path)]
        self._unlapse(ino)
        inodes = self.ns.inodes
        for other in list(self._lapsed.get(dirpath, ())):
            if len(batch) >= RETAKE_BATCH:
                break
            self._unlapse(other)
            inode = inodes.get(other)
            other_path = self.ns.path_of(other) if inode is not None and inode.nlink > 0 else None
            if other_path is not None and other not in self.leases and other not in self._retaking:
                batch.append((other, other_path))
        done = trio.Event()
        for i, _ in batch:
            self._retaking[i] = done
        lease = self.idle_seconds
        t0 = time.monotonic()
        try:
            results = await self._acquire_all(batch, lease)
        finally:
            for i, _ in batch:
                del self._retaking[i]
            done.set()
        if results is None:
            return False
        got = False
        for (i, p), ok in zip(batch, results):
            if ok is not True:
                continue  # another node's flag, or no longer in the store: asked for at its open
            if i == ino:
                got = True
            elif i not in self.leases:
                entry = self.leases[i] = Lease(p, held=True, since=t0, until=t0 + lease)
                self._went_idle(i, entry)
                self.stats.leases_retaken += 1
        self.stats.lease_batches += 1
        return got

    async def _acquire_all(self, leases: list[tuple[int, bytes]], seconds: float) -> list | None:
        """Take the flag of each ``(ino, path)`` for ``seconds`` in one pipelined store
        call (a renewal, a batch taken again): the store's answer for each (True, False:
        another node's, FileNotFoundError), or None when the store is unreachable.  The
        store is read once the link has connected (``query`` waits for that)."""
        node = self.node_id

        def apply() -> list:
            return self.link.store.apply([Op.acquire(path, node, seconds) for _, path in leases])

        results = await self.link.query(apply, missing=None)
        return None if results is self.link.UNREACHABLE else results

    def _reusable(self, entry: Lease, now: float) -> bool:
        """An idle lease that an open may take without asking the store: held, and
        valid in the store for longer than the renewer needs to come round again."""
        return entry.held and entry.until - now > self.lease_seconds / 2

    def _went_idle(self, ino: int, entry: Lease) -> None:
        """Queue an idle lease for renew_once, at the time it stops being reusable."""
        heapq.heappush(self._idle, (entry.until - self.lease_seconds / 2, next(self._idle_seq), ino, entry))

    def created(self, inode: Inode) -> None:
        """(engine hook, trio thread, inside the create) A regular file made here: its
        write flag is taken right after its put is published (same pipeline); meanwhile
        nobody else can know the name. The lease starts idle."""
        path = self.ns.path_of(inode.ino)
        if path is None or self.ns.events is None:
            return
        now = time.monotonic()
        entry = self.leases[inode.ino] = Lease(path, held=True, since=now, until=now + self.idle_seconds)
        self._went_idle(inode.ino, entry)
        self._event("acquire", path, None, None)

    async def lease_for_write(self, inode: Inode, nonblocking: bool = False) -> None:
        """Before a local write handle opens (or a truncate): hold ``inode``'s lease.
        A lease this node still holds (in use, or idle and valid) costs nothing."""
        entry = self.leases.get(inode.ino)
        if entry is not None and entry.writers <= 0:
            if self._reusable(entry, time.monotonic()):
                self.stats.lease_reuses += 1
            else:
                del self.leases[inode.ino]  # idle and no longer vouched for: take it afresh
                self.unlendable(inode.ino)
                entry = None
        retaking = self._retaking.get(inode.ino) if entry is None else None
        if retaking is not None:  # another open's batch is taking it again: its answer first
            await retaking.wait()
            entry = self.leases.get(inode.ino)
            if entry is not None and entry.writers <= 0:
                if self._reusable(entry, time.monotonic()):
                    self.stats.lease_reuses += 1
                else:
                    entry = None
        if entry is None:
            path = self.ns.path_of(inode.ino)
            if path is None:
                return
            t0 = time.monotonic()
            got: bool | None = True
            if not await self._retake(inode.ino, path):
                got = await self.acquire(path, nonblocking)
            entry = self.leases.get(inode.ino)  # another opener may have got it meanwhile
            if entry is None:
                if got is False:
                    self.unleased.add(inode.ino)
                    if not self._warned_unleased:
                        self._warned_unleased = True
                        log.warning("metadata store unreachable: writing local files without a write lease")
                entry = self.leases[inode.ino] = Lease(path, held=bool(got),
                                                       until=t0 + self.lease_seconds if got else 0.0)
        entry.writers += 1
        self._in_use[inode.ino] = entry

    async def write_done(self, ino: int, *, keep: bool = True) -> None:
        """A write handle closed (or a truncate finished). The lease stays, idle, for the
        next open of this file (``keep``), unless another node asked for it: then it is
        released after the file's last change is published."""
        entry = self.writers_closed(ino, 1, keep=keep)
        if entry is not None:
            await self._release(ino, entry)

    def writers_closed(self, ino: int, n: int, *, keep: bool = True) -> Lease | None:
        """``n`` writers of ``ino`` closed (:meth:`write_done`'s first half; those
        :meth:`lent_writers` counted, right away): the lease idle again, or (returned) to
        be released (:meth:`release_closed`)."""
        entry = self.leases.get(ino)
        if entry is None:
            return None
        entry.writers -= n
        if entry.writers > 0:
            return None
        entry.since = time.monotonic()
        if entry.yield_asked:
            self.stats.leases_yielded += 1
        if not keep or entry.yield_asked or not entry.held:
            return entry
        self._went_idle(ino, entry)
        return None

    async def release_closed(self, ino: int, entry: Lease) -> None:
        """Release the lease :meth:`writers_closed` returned."""
        if self.leases.get(ino) is entry:
            await self._release(ino, entry)

    async def _release(self, ino: int, entry: Lease) -> None:
        del self.leases[ino]
        self.unlendable(ino)
        if entry.held:
            self._event("release", self.ns.path_of(ino) or entry.path, None, None)
            await self.ns.journal.sync()

    async def _ask_to_yield(self, path: bytes) -> None:
        """Another node holds ``path``'s flag: ask it (inbox) to release it if idle, or
        at its last close."""
        meta = await self.link.store_get(path)
        if meta is not None and meta.writer and meta.writer != self.node_id:
            self._notify(meta.writer, "yield", path)
            self._commit_soon()

    async def yield_lease(self, path: bytes, sender: str) -> None:
        """(inbox) ``sender`` waits for our flag on ``path``."""
        try:
            inode = self.ns.resolve(path)
        except FsError:
            inode = None
        entry = self.leases.get(inode.ino) if inode is not None else None
        if entry is not None and entry.writers > 0:
            entry.yield_asked = True  # released at the last close
            self.unlendable(inode.ino)  # (writers from now on: through the agent)
            log.info("%s waits for the write lease on %r: released at its last close", sender, path)
            return
        if entry is not None:
            del self.leases[inode.ino]
            self.unlendable(inode.ino)
            self.stats.leases_yielded += 1
            log.info("%s waits for the write lease on %r: released", sender, path)
        # idle, or forgotten here while the flag still runs in the store: release it
        # (the store ignores a release by a node that does not hold the flag)
        self._event("release", path, None, None)
        await self.ns.journal.sync()

    def lease_lost(self, path: bytes) -> None:
        """The publisher's ``acquire`` after a create found another node's flag."""
        try:
            inode = self.ns.resolve(path)
        except FsError:
            return
        entry = self.leases.get(inode.ino)
        if entry is not None and entry.held:
            self._lost(inode.ino, entry, path)

    def _lost(self, ino: int, entry: Lease, path: bytes) -> None:
        self.stats.leases_lost += 1
        entry.held = False
        self.unlendable(ino)
        self.unleased.add(ino)
        log.error("lost the write lease on %r to another node (our lease ran out): "
                  "if it takes the file over, our bytes are kept as a conflict copy", path)

    async def renew_leases(self) -> None:
        while True:
            await trio.sleep(self.lease_seconds / 3)
            await self.renew_once()

    async def renew_once(self) -> None:
        """Forget idle leases that could run out before the next renewal (their flag runs
        out in the store by itself) and those of removed files; renew the leases in use
        in one pipelined batch."""
        now = time.monotonic()
        inodes, leases, idle = self.ns.inodes, self.leases, self._idle
        # only the idle leases due (the heap's head), not every lease kept for reuse; one
        # that was renewed since it was queued goes back in, one taken again is skipped
        # (queued anew when its last writer closes)
        while idle and idle[0][0] <= now:
            _, _, ino, entry = heapq.heappop(idle)
            if leases.get(ino) is not entry or entry.writers > 0:
                continue
            inode = inodes.get(ino)
            if (inode is None or inode.nlink <= 0  # removed: the store's entry went with its name
                    or not entry.held  # written without the flag: nothing to release
                    or not self._reusable(entry, now)):
                del leases[ino]
                self.unlendable(ino)
                if inode is not None and inode.nlink > 0 and entry.held:
                    self._lapse(ino, entry.path)
            else:
                self._went_idle(ino, entry)
        # the path each lease was taken under (a rename carries the flag along in the
        # store): a renamed file's entry is missing there, and is renewed under its new path
        held = []
        for ino, e in list(self._in_use.items()):
            if leases.get(ino) is not e or e.writers <= 0:
                del self._in_use[ino]
            elif e.held:
                held.append((ino, e.path))
        if not held or not self.link.reachable:
            return
        t0 = time.monotonic()
        results = await self._acquire_all(held, self.lease_seconds)
        if results is None:
            return
        moved = []
        for (ino, path), ok in zip(held, results):
            kept = self.leases.get(ino)
            if kept is None:
                continue
            if isinstance(ok, FileNotFoundError):
                now_path = self.ns.path_of(ino)
                if now_path is not None and now_path != path:
                    kept.path = now_path
                    moved.append((ino, now_path))
                    continue
            self._renewed(ino, kept, path, ok, t0)
        if moved:
            results = await self._acquire_all(moved, self.lease_seconds)
            if results is None:
                return
            for (ino, path), ok in zip(moved, results):
                kept = self.leases.get(ino)
                if kept is not None:
                    self._renewed(ino, kept, path, ok, t0)

    def _renewed(self, ino: int, entry: Lease, path: bytes, ok, t0: float) -> None:
        if ok is True:  # the store's lease is now this long (also a create's longer one)
            entry.until = t0 + self.lease_seconds
        elif isinstance(ok, FileNotFoundError):
            pass  # not published yet: the publication's acquire sets the lease
        elif ok is False and entry.held:
            self._lost(ino, entry, path)

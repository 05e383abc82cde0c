"""Replicas (``--replicas N``): copies of a file's bytes on other nodes, so that losing a
node does not lose its files.

* **Sending** (:class:`Replicator`). When a write handle of a local file closes with new
  bytes, the file is pushed whole (authenticated ``PUT /v1/files``) to N other live nodes,
  chosen by rendezvous hashing of the path over the node registry (stable: the same file
  goes to the same nodes while they live, and files spread evenly). Then its entry is
  published with ``replicas=[...]``. Any later write clears the list *before* the new size
  is published, so the DHT never names a replica holding older bytes than the primary.
  ``--replica-mode sync`` pushes in ``flush`` (close(2) returns once the copies are
  durable on the peers); ``async`` (default) pushes from a background task shortly after.
  In sync mode an ``fsync`` of the only open handle pushes too, *while* the local fsync
  runs (:meth:`Replicator.synced`), so a ``write; fsync; close`` waits for the longer of
  the two instead of their sum, and the close finds the replicas current and pushes
  nothing.  That rests on the blob's mtime telling "written since": the close's fstat
  must see a new mtime after any write that followed the fstat the push started from,
  which file systems with multigrain timestamps (Linux 6.13+: ext4, xfs, btrfs, tmpfs)
  guarantee (a queried timestamp makes the next change fine-grained) and coarse ones do
  not within a tick; the tier's file system is probed once (:func:`fine_mtime`) and
  without it the push stays at the close.
* **Keeping** (:class:`ReplicaStore`). A node keeps the replicas it received in
  ``SLOW/replicas/``: ``<sha1 of path>.data`` plus a JSON sidecar naming the path, the
  sender (the primary) and the ETag; the peer service serves them like local files, so a
  reader (or a node taking the file over) falls back to them when the primary is down.
  They are dropped or renamed when the primary says so through the inbox.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass

import trio

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import Inode

log = logging.getLogger(__name__)

ASYNC_DELAY = 0.5  # seconds an async push waits, so a burst of closes is pushed once
RETRY_SECONDS = 2.0  # files that found no peer (or no store) are tried again this much later
REGISTRY_RELIST_SECONDS = 1.0  # the least time between two registry listings of replicate's own


@dataclass
class ReplicaRecord:
    path: bytes
    data: str
    primary: str
    etag: str
    size: int


class ReplicaStore:
    """Replicas this node keeps for other nodes (the receiving side)."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.index: dict[bytes, ReplicaRecord] = {}

    def load(self) -> None:
        """(start-up, before the loop) rebuild the index from the sidecars."""
        os.makedirs(self.dir, exist_ok=True)
        for entry in os.scandir(self.dir):
            if not entry.name.endswith(".json"):
                if entry.name.endswith(".tmp"):
                    os.unlink(entry.path)
                continue
            try:
                with open(entry.path) as f:
                    d = json.load(f)
                rec = ReplicaRecord(bytes.fromhex(d["path"]), entry.path[:-5] + ".data", d["primary"], d["etag"],
                                    d["size"])
            except (OSError, ValueError, KeyError) as exc:
                log.warning("replica sidecar %s unreadable (%s): dropped", entry.path, exc)
                os.unlink(entry.path)
                continue
            if os.path.exists(rec.data):
                self.index[rec.path] = rec
        log.info("%d replicas kept for other nodes", len(self.index))

    def _base(self, path: bytes) -> str:
        return os.path.join(self.dir, hashlib.sha1(path).hexdigest())

    @staticmethod
    def _write(rec: ReplicaRecord, temp_blob: str | None) -> None:
        sidecar = rec.data[:-5] + ".json"
        if temp_blob is not None:
            os.rename(temp_blob, rec.data)
        tmp = sidecar + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"path": rec.path.hex(), "primary": rec.primary, "etag": rec.etag, "size": rec.size}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, sidecar)

    @staticmethod
    def _remove(rec: ReplicaRecord) -> None:
        for p in (rec.data[:-5] + ".json", rec.data):
            T.remove_blob(p)

    async def adopt(self, path: bytes, temp_blob: str, headers: dict[str, str]) -> None:
        """A pushed replica arrived (fsync'd by the peer service) in ``temp_blob``."""
        rec = ReplicaRecord(path, self._base(path) + ".data", headers.get("x-hycache-from", "?"),
                            headers.get("x-hycache-etag", ""), int(headers.get("content-length", "0")))
        await trio.to_thread.run_sync(self._write, rec, temp_blob)
        self.index[path] = rec

    async def drop(self, path: bytes, sender: str | None = None) -> None:
        """Forget a replica; with ``sender``, only one that ``sender`` did not push (a new
        primary's own fresh copy must survive the drop it sent for the old one)."""
        rec = self.index.get(path)
        if rec is None or (sender is not None and rec.primary == sender):
            return
        del self.index[path]
        await trio.to_thread.run_sync(self._remove, rec)

    async def rename(self, src: bytes, dst: bytes) -> None:
        """The primary renamed ``src`` (a file or a whole directory) to ``dst``."""
        moves = [(p, dst + p[len(src):]) for p in self.index if p == src or p.startswith(src + b"/")]
        for old, new in moves:
            rec = self.index.pop(old)
            moved = ReplicaRecord(new, self._base(new) + ".data", rec.primary, rec.etag, rec.size)

            def move(rec=rec, moved=moved) -> None:
                os.rename(rec.data, moved.data)
                self._write(moved, None)
                T.remove_blob(rec.data[:-5] + ".json")

            await trio.to_thread.run_sync(move)
            self.index[new] = moved


def fine_mtime(directory: str, tries: int = 3) -> bool:
    """(blocking) Does a write right after an fstat always give the file a new mtime in
    ``directory``'s file system?  Multigrain timestamps do (the fstat marks the time
    queried, the next change takes a fine-grained one); a coarse clock gives the same
    tick to back-to-back writes.  Probed with a scratch file, ``tries`` times."""
    fd, tmp = -1, os.path.join(directory, f".mtime-probe-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        for _ in range(tries):
            before = os.fstat(fd).st_mtime_ns
            os.pwrite(fd, b"x", 0)
            if os.fstat(fd).st_mtime_ns == before:
                return False
        return True
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass


@dataclass
class ReplicatorStats:
    pushed_files: int = 0
    pushed_bytes: int = 0
    pushed_at_fsync: int = 0  # sync mode: pushes overlapped with the writer's fsync
    failures: int = 0
    pending: int = 0
    no_peers: int = 0
    last_error: str | None = None


class Replicator:
    """Pushes local files to ``count`` other nodes (the sending side)."""

    def __init__(self, link, count: int, mode: str) -> None:
        self.link = link
        self.engine = link.engine
        self.count = count
        self.mode = mode
        self.stats = ReplicatorStats()
        self._pending: dict[int, Inode] = {}
        self._wakeup = trio.Event()
        self._put_back = False  # the last batch put files back (no peer, no store yet)
        self._warned = False
        self._listed_at = -REGISTRY_RELIST_SECONDS  # when replicate last listed the registry itself
        self._fine: dict[str, bool] = {}  # tier -> fine_mtime() of its directory

    def wanted(self, inode: Inode) -> bool:
        return self.count > 0 and inode.is_reg and inode.nlink > 0 and inode.replicated_gen != inode.data_gen

    async def closed(self, inode: Inode) -> None:
        """A write handle of ``inode`` closed (flush)."""
        if not self.wanted(inode):
            return
        if self.mode == "sync":
            await self.replicate(inode)
        else:
            self._pending[inode.ino] = inode
            self.stats.pending = len(self._pending)
            self._wakeup.set()

    async def synced(self, inode: Inode, local_sync, current) -> None:
        """(sync mode) ``fsync`` of ``inode``'s only open handle, a writer: push the bytes
        while ``local_sync()`` (the local fsync) runs, and have them count as the
        replicas of the current bytes if ``current()`` (an fstat of the blob taking size
        and mtime, bumping ``data_gen`` if they moved) finds nothing written during the
        push.  The caller ran ``current()`` just before.  The close then pushes nothing
        unless the file was written after."""
        if not (self.mode == "sync" and self.wanted(inode) and await self._fine_mtime(inode)):
            await local_sync()
            return
        failed: list[Exception] = []
        t0 = time.monotonic()
        took: list[float] = []

        async def local() -> None:
            try:
                await local_sync()
            except Exception as e:
                failed.append(e)
            took.append(time.monotonic() - t0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(local)
            if await self.replicate(inode, current=current):
                self.stats.pushed_at_fsync += 1
            pushed = time.monotonic() - t0
        log.debug("fsync of inode %d: local %.3f s, push %.3f s beside it", inode.ino, took[0] if took else -1, pushed)
        if failed:
            raise failed[0]

    async def _fine_mtime(self, inode: Inode) -> bool:
        tier = inode.tier
        assert tier is not None, "a regular file's bytes are on a tier"
        fine = self._fine.get(tier)
        if fine is None:
            d = str(self.engine.tiers[tier].path)
            fine = self._fine[tier] = await trio.to_thread.run_sync(fine_mtime, d)
            log.info("replicas: %s %s fine-grained mtimes: %s", d, "has" if fine else "lacks",
                     "pushes start at fsync" if fine else "pushes wait for the close")
        return fine

    async def resume(self) -> None:
        """Queue every local file whose replicas are not of its current bytes: the
        ledger (each inode's ``replicas`` in the metadata store) names none for a file
        whose push a crash or a stop cut short, or that was written before replicas were
        on.  Such files are pushed in the background like any async push."""
        if self.count == 0:
            return
        for k, inode in enumerate(list(self.engine.ns.inodes.values())):
            if self.wanted(inode):
                self._pending[inode.ino] = inode
            if k % 4096 == 4095:
                await trio.lowlevel.checkpoint()
        if self._pending:
            log.info("replicas: %d files to push (not replicated before the last stop)", len(self._pending))
            self.stats.pending = len(self._pending)
            self._wakeup.set()

    def _later(self, inode: Inode) -> None:
        """Try ``inode`` again RETRY_SECONDS from now (no peer, no store, a failed push)."""
        self._pending[inode.ino] = inode
        self._put_back = True
        self.stats.pending = len(self._pending)
        self._wakeup.set()

    async def run(self) -> None:
        await self.resume()
        while True:
            if not self._pending:
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            await trio.sleep(ASYNC_DELAY)
            batch, self._pending = self._pending, {}
            self._put_back = False
            for inode in batch.values():
                if self.wanted(inode):
                    try:
                        await self.replicate(inode, background=True)
                    except Exception:
                        log.exception("replicating inode %d failed", inode.ino)
            self.stats.pending = len(self._pending)
            # files put back by replicate() (no peer known yet, or no store) wait before
            # the next try; files closed during the batch only wait ASYNC_DELAY (before,
            # any file closed while a batch was pushed waited RETRY_SECONDS too)
            if self._put_back:
                await trio.sleep(RETRY_SECONDS)

    def targets(self, path: bytes, nodes: dict, *, spares: bool = False) -> list[str]:
        """Rendezvous (highest random weight) hashing over the live nodes but this one:
        the first ``count`` (with ``spares``, all of them in that order: the next ones
        stand in for a peer that fails)."""
        alive = [n for n, d in nodes.items() if d["alive"] and n != self.link.node_id]
        alive.sort(key=lambda n: hashlib.sha1(n.encode() + b"\0" + path).digest(), reverse=True)
        return alive if spares else alive[: self.count]

    async def replicate(self, inode: Inode, current=None, *, background: bool = False) -> list[str]:
        """Push ``inode``'s current bytes to its replica nodes and publish the list;
        ``current`` (a coroutine function) brings the inode up to what was written
        through passthrough meanwhile before the check that nothing was.  ``background``
        (async mode: no request waits): the bytes move at a low CPU priority on both
        sides (transport/idle.py), after this node's own requests."""
        path = self.engine.ns.path_of(inode.ino)
        if path is None:
            return []
        nodes = self.link.known_nodes  # refreshed by every heartbeat
        targets = self.targets(path, nodes, spares=True)
        now = time.monotonic()
        # before the first heartbeat, or too few holders in the last one's list (nodes that
        # joined since, up to a heartbeat ago): the registry as it is now, at most once a
        # second (a cluster that has too few nodes asks no more often than that)
        if not nodes or (len(targets) < self.count and now - self._listed_at >= REGISTRY_RELIST_SECONDS):
            self._listed_at = now
            fresh = await self.link.query(lambda: self.link.nodes_blocking(self.link.store), missing={})
            if fresh is not self.link.UNREACHABLE:
                nodes = fresh
                targets = self.targets(path, nodes, spares=True)
            elif not nodes:
                self._later(inode)
                return []
        if len(targets) < self.count:
            self.stats.no_peers += 1
            if not self._warned:
                self._warned = True
                log.warning("replicas: %d wanted, only %d other live nodes", self.count, len(targets))
            if not targets:
                self._later(inode)  # a peer may register later
                return []
        opened = await self.link.local_files.open_for_peer(path)
        gen = inode.data_gen
        done: list[str] = []
        t0 = time.monotonic()
        try:
            for node in targets:
                if len(done) >= self.count:
                    break
                # a node that stopped a moment ago still counts as alive (the registry's
                # TTL): a failed push goes to the next node in rendezvous order instead
                try:
                    addr = nodes[node]["addr"]
                    await self.link.peers.push_replica(addr, path, opened.blob, {"X-HyCache-Etag": opened.etag},
                                                       background=background)
                except Exception as exc:
                    self.stats.failures += 1
                    self.stats.last_error = f"{node}: {exc}"
                    log.warning("pushing a replica of %r to %s failed: %s", path, node, exc)
                    continue
                done.append(node)
        finally:
            await opened.close()
        if current is not None:
            await current()
        if inode.data_gen != gen or inode.nlink == 0:
            return []  # written again meanwhile: the next close pushes the new bytes
        if not done:
            self._later(inode)  # every push failed (the peers down, or busy): the file stays wanted
            return []
        self.stats.pushed_files += 1
        self.stats.pushed_bytes += opened.size * len(done)
        log.debug("replicated %r to %s in %.3f s", path, done, time.monotonic() - t0)
        if done:
            inode.replicas, inode.replicated_gen = tuple(sorted(done)), gen
            self.engine.ns.journal.inode(inode.ino)
            await self.engine.ns.journal.sync()
        return done

    def status(self) -> dict:
        d = dict(self.stats.__dict__)
        d.update(count=self.count, mode=self.mode)
        return d

"""Who holds a file, and changing that (HyCache+ "writes are always local").

* **Write leases.** Opening a published file for writing (or truncating it) first takes
  its write flag in the DHT (``acquire_write``, a compare-and-swap with a lease, renewed
  every third of the lease while the file is open). A second writer on another node waits
  until the flag is free or its lease has expired (a dead holder's lease runs out: no lock
  survives it), then gets EBUSY; with O_NONBLOCK it gets EAGAIN at once.
* **The primary keeps its lease** (no store round trip on the open path). A file created
  here takes its flag with its publication (an ``acquire`` row right after its put in the
  same pipeline, for ``idle_seconds`` = two lease periods), and a lease whose last writer
  closed is *idle*, not released. A later open for writing of a file this node created
  or wrote a moment ago takes the lease it still holds without asking the store, as long
  as the lease outlasts the next renewal (renewals, one pipelined batch, cover the leases
  in use only). An idle lease is forgotten once it could run out, and its flag runs out in
  the store by itself (nothing is sent); the next open for writing of such a file takes it
  again, and in the same round trip the other lapsed leases of its directory (up to 256,
  each as a create's idle lease): a program that opens many files again later waits for
  one store round trip per batch instead of one per file. Another node that finds the flag held asks its
  holder to *yield* (an inbox message): an idle lease is released at once, one in use at
  its last close — so a takeover waits for the inbox poll (about a second), not for the
  lease; a dead node's newest files wait for their flag to run out (at most two lease
  periods). Releases go through the outbox, *after* the file's last size and times are
  published.
  While the store is unreachable, local files are written without a lease (the agent keeps
  serving); such files are marked, and if another node took one over meanwhile the local
  bytes are kept as a conflict copy instead of being dropped.
* **Takeover.** Writing a file held by another node makes this node the primary: take the
  lease, fetch the current bytes from the holder (nothing with O_TRUNC), make a local inode
  at the same path with the same owner, mode and times, and publish it with an owner guard
  that admits the old holder (``owners=(me, old)``). The bytes are never sent back.
* **The old holder learns** in two ways: the new primary drops a message in its *inbox*
  (``/.hycache-inbox/<node>/``, entries in the DHT, read every second), and any later put
  of its own for that path fails the owner guard (:class:`~hycache_dht.meta.NotPrimary`).
  Either way it drops its local name without publishing anything (the store is already
  right), or keeps a conflict copy as said above. A node that was down learns at start-up:
  its inbox waited for it, and its re-publication of every local name meets the guard.
* **Names held elsewhere** are removed or renamed in the store directly (CAS on the version
  for a file), and the holder (or, for a directory, every node: directories are the union
  of what the nodes hold) is told through its inbox to do the same locally.

Every store call runs in a worker thread (through :meth:`ClusterLink.query`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import stat
import time
from dataclasses import dataclass

import msgpack
import trio
from hycache_dht.meta import EntryMeta
from hycache_dht.registry import INBOX_DIR

from hycache_agent.cluster.leases import WriteLeases
from hycache_agent.fs.namespace import ROOT_INO, FsError, Inode
from hycache_agent.fs.namespace import join_path as join

log = logging.getLogger(__name__)

INBOX_POLL_SECONDS = 1.0
BROADCAST = b"*"
TAKEOVER = b"takeover"  # path2 of a "drop" sent by a node that took the file over


def split_path(path: bytes) -> tuple[bytes, bytes]:
    parent, _, name = path.rpartition(b"/")
    return parent or b"/", name


@dataclass
class OwnershipStats:
    takeovers: int = 0  # files this node took over from another
    taken_from_us: int = 0  # local names dropped because another node took them over / removed them
    conflict_copies: int = 0
    lease_waits: int = 0  # opens that had to wait for another node's write lease
    lease_reuses: int = 0  # write opens that took a lease this node still held (no store call)
    lease_batches: int = 0  # round trips that took lapsed leases again (an open's and its directory's)
    leases_retaken: int = 0  # lapsed leases taken again by another open's batch (none asked for yet)
    leases_yielded: int = 0  # idle leases released because another node asked for them
    leases_lost: int = 0  # renewals that found another holder
    inbox_messages: int = 0
    remote_removes: int = 0
    remote_renames: int = 0


class Ownership:
    def __init__(self, link, *, lease_seconds: float, lease_wait: float, on_invalidate=None) -> None:
        self.link = link
        self.engine = link.engine
        self.ns = link.engine.ns
        self.node_id: str = link.node_id
        self.stats = OwnershipStats()
        self.write = WriteLeases(link, self.ns, node_id=self.node_id, lease_seconds=lease_seconds,
                                 lease_wait=lease_wait, stats=self.stats, event=self._event, notify=self.notify,
                                 commit_soon=self.engine.commit_soon)
        self.on_invalidate = on_invalidate  # the FUSE layer's: forget the kernel's entry (parent ino, name)
        self._seq = itertools.count()
        self._boxes: set[bytes] = set()  # inboxes known to exist in the store

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def quiet(self):
        """Local namespace changes that must not be published (the store already has
        them, or has something newer)."""
        saved = self.ns.events
        self.ns.events = None
        try:
            yield
        finally:
            self.ns.events = saved

    def _event(self, *event) -> None:
        self.ns.events.append(event)
        self.ns.journal.touch()

    def notify(self, node: str | None, act: str, path: bytes, path2: bytes | None = None) -> None:
        """Queue a message for ``node``'s inbox (``None``/``"*"``: every other node),
        sent by the publisher after everything queued before it."""
        target = BROADCAST if node in (None, "*") else node.encode()
        if target == self.node_id.encode():
            return
        self._event("notify", path, target, msgpack.packb([act, path2], use_bin_type=True))

    def _invalidate(self, parent: int, name: bytes) -> None:
        self.link.forget_listing(self.ns.path_of(parent))
        if self.on_invalidate is not None:
            self.on_invalidate(parent, name)

    async def store_entry(self, path: bytes) -> EntryMeta | None:
        """The store's entry; EIO when the store cannot be asked."""
        meta = await self.link.query("get", path, missing=None)
        if meta is self.link.UNREACHABLE:
            raise FsError(errno.EIO, "the metadata store is unreachable")
        return meta

    # ------------------------------------------------------------------ write leases (leases.py)
    @property
    def idle_seconds(self) -> float:
        return self.write.idle_seconds

    def created(self, inode: Inode) -> None:
        self.write.created(inode)

    async def lease_for_write(self, inode: Inode, nonblocking: bool = False) -> None:
        await self.write.lease_for_write(inode, nonblocking)

    async def write_done(self, ino: int, *, keep: bool = True) -> None:
        await self.write.write_done(ino, keep=keep)

    def lease_lost(self, path: bytes) -> None:
        self.write.lease_lost(path)

    async def renew_leases(self) -> None:
        await self.write.renew_leases()

    # ------------------------------------------------------------------ takeover
    async def take_over(self, node, *, truncate: bool, nonblocking: bool = False) -> Inode:
        """Make this node the primary of the remote file ``node`` (a RemoteNode); returns
        the local inode that now holds it (also remembered as ``node.local``)."""
        path = node.path
        async with self.link.fetch_lock(path):
            if node.local is not None and node.local.nlink > 0:
                return node.local
            try:
                local = self.ns.resolve(path)
            except FsError:
                local = None
            if local is not None and local.is_reg:
                node.local = local
                return local
            t_acquired = time.monotonic()  # the store's lease runs at least a lease from here
            got = await self.write.acquire(path, nonblocking)
            if got is None:
                raise FsError(errno.ENOENT)
            if got is False:
                raise FsError(errno.EIO, "the metadata store is unreachable")
            try:
                meta = await self.store_entry(path)
                if meta is None:
                    raise FsError(errno.ENOENT)
                if meta.kind != "file":
                    raise FsError(errno.EISDIR if meta.kind == "dir" else errno.EPERM)
                node.meta = meta
                src = None
                t0 = time.monotonic()
                if not truncate and meta.size:
                    src = await self.link.fetch_locked(node)
                    node.cache_blob = None  # the copy becomes our blob
                parent_path, name = split_path(path)
                parent = await self.local_dir(parent_path)
                inode = await self.engine.adopt_file(parent, name, meta, src, taken_from=meta.primary)
                for holder in {meta.primary, *meta.replicas} - {None, self.node_id}:
                    self.notify(holder, "drop", path, TAKEOVER)
                await self.ns.journal.sync()
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self.link.query("release_write", path, self.node_id, missing=None)
                raise
            self.write.hold_taken(inode.ino, path, t_acquired + self.write.lease_seconds)
            node.local = inode
            self.stats.takeovers += 1
            log.info("took over %r from %s (%d bytes fetched in %.3f s)", path, meta.primary,
                     0 if src is None else meta.size, time.monotonic() - t0)
            return inode

    async def local_dir(self, path: bytes, *, quiet: bool = False) -> int:
        """The local inode of directory ``path``: directories held only in the global
        namespace are created locally first, with the owner and mode the store gives them
        (the namespace is the union of what the nodes hold)."""
        parent = ROOT_INO
        sub = b""
        for part in [p for p in path.split(b"/") if p]:
            sub += b"/" + part
            try:
                child = self.ns.lookup(parent, part)
            except FsError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                meta = await self.link.store_get(sub)
                if meta is not None and meta.kind != "dir":
                    raise FsError(errno.ENOTDIR) from None
                mode, uid, gid = (meta.mode, meta.uid, meta.gid) if meta else (stat.S_IFDIR | 0o755, 0, 0)
                try:
                    child = self.ns.lookup(parent, part)  # made meanwhile
                except FsError:
                    with self.quiet() if quiet else contextlib.nullcontext():
                        child = self.ns.new_inode(parent, part, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid)
                    await self.ns.journal.sync()
            if not child.is_dir:
                raise FsError(errno.ENOTDIR)
            parent = child.ino
        return parent

    # ------------------------------------------------------------------ names held elsewhere
    async def remove_remote(self, node, *, rmdir: bool) -> None:
        """unlink/rmdir of a name another node holds: remove it from the store (a file:
        CAS on the version we saw, retried with a fresh one), tell the holder(s)."""
        path = node.path
        await self.link.drain_outbox()
        meta = node.meta
        for _ in range(5):
            if rmdir and meta.kind != "dir":
                raise FsError(errno.ENOTDIR)
            if not rmdir and meta.kind == "dir":
                raise FsError(errno.EISDIR)
            try:
                done = await self.link.query("delete", path,
                                              None if rmdir else meta.version, missing=False)
            except OSError as exc:
                raise FsError(exc.errno or errno.EIO) from exc
            if done is self.link.UNREACHABLE:
                raise FsError(errno.EIO)
            if done:
                break
            meta = await self.store_entry(path)
            if meta is None:
                raise FsError(errno.ENOENT)
        else:
            raise FsError(errno.EBUSY)
        self.stats.remote_removes += 1
        if rmdir:
            self.notify(None, "drop", path)
        else:
            for holder in {meta.primary, *meta.replicas} - {None}:
                self.notify(holder, "drop", path)
        await self.ns.journal.sync()
        self.link.forget_listing(split_path(path)[0])

    async def rename_remote(self, src_path: bytes, dst_path: bytes, src_meta: EntryMeta, *,
                            noreplace: bool, dst_local: tuple[int, bytes] | None) -> None:
        """rename whose source is held by another node: rename in the store (the holder
        stays the primary: no bytes move), tell the holder(s) — every node for a directory
        — and drop a local name the rename replaced."""
        await self.link.drain_outbox()
        try:
            done = await self.link.query("rename", src_path, dst_path, missing=False,
                                          kwargs={"replace": not noreplace})
        except OSError as exc:
            raise FsError(exc.errno or errno.EIO) from exc
        if done is self.link.UNREACHABLE:
            raise FsError(errno.EIO)
        if done is False:
            raise FsError(errno.ENOENT)
        self.stats.remote_renames += 1
        if dst_local is not None:  # our name at the destination was replaced in the store
            parent, name = dst_local
            with self.quiet():
                try:
                    inode = self.ns.unlink(parent, name, rmdir=self.ns.lookup(parent, name).is_dir)
                except FsError:
                    inode = None
            if inode is not None:
                await self.engine.maybe_free(inode)
            self._invalidate(parent, name)
        if src_meta.kind == "dir":
            self.notify(None, "rename", src_path, dst_path)
        else:
            for holder in {src_meta.primary, *src_meta.replicas} - {None}:
                self.notify(holder, "rename", src_path, dst_path)
        await self.ns.journal.sync()
        for p in (src_path, dst_path):
            self.link.forget_listing(split_path(p)[0])

    # ------------------------------------------------------------------ our names changed
    async def removed_here(self, inode: Inode, path: bytes) -> None:
        """A local name was removed (its delete is queued): a directory may exist on every
        node, a file's replicas are on its replica nodes — tell them."""
        if inode.nlink == 0 and not inode.is_dir:
            self.write.forget_idle(inode.ino)
        if inode.is_dir:
            self.link.unlisted(path)
            self.notify(None, "drop", path)
        elif inode.nlink == 0 and inode.replicas:
            for node in inode.replicas:
                self.notify(node, "drop", path)
        else:
            return
        await self.ns.journal.sync()

    async def renamed_here(self, src: Inode, src_path: bytes, dst_path: bytes, replaced) -> None:
        """A local name was renamed (the store's rename is queued): the node whose name the
        rename replaced drops it; other nodes move their parts of a directory; a file's
        replica holders rename their copies."""
        self.write.moved(src.ino, dst_path)
        if replaced is not None:
            if replaced.is_dir:
                self.notify(None, "drop", dst_path)
            for holder in {replaced.meta.primary, *replaced.meta.replicas} - {None}:
                self.notify(holder, "drop", dst_path)
        if src.is_dir:
            self.link.unlisted(src_path)
            self.notify(None, "rename", src_path, dst_path)
        for node in src.replicas:
            self.notify(node, "rename", src_path, dst_path)
        if replaced is not None or src.is_dir or src.replicas:
            await self.ns.journal.sync()

    # ------------------------------------------------------------------ the inbox
    def inbox(self, node: str | bytes) -> bytes:
        return join(INBOX_DIR, node if isinstance(node, bytes) else node.encode())

    def send_messages(self, store, messages: list[tuple[bytes, bytes, bytes]]) -> None:
        """(worker thread, publisher) Write ``(path, target, packed)`` messages into the
        targets' inboxes (``*``: every registered node but this one)."""
        nodes = None
        for path, target, packed in messages:
            if target == BROADCAST:
                if nodes is None:
                    nodes = [n for n in self.link.nodes_blocking(store) if n != self.node_id]
                targets = nodes
            else:
                targets = [target.decode()]
            act, path2 = msgpack.unpackb(packed, raw=False)
            body = msgpack.packb([act, path, path2, self.node_id], use_bin_type=True)
            now = time.time_ns()
            for node in targets:
                box = self.inbox(node)
                if box not in self._boxes:
                    ensure_dir(store, INBOX_DIR)
                    ensure_dir(store, box)
                    self._boxes.add(box)
                name = b"%020d-%s-%d" % (now, self.node_id.encode(), next(self._seq))
                store.put(join(box, name), EntryMeta("special", stat.S_IFREG | 0o400, 0, 0, len(body), now, now, now,
                                                     primary=self.node_id, target=body))

    async def drain_inbox(self) -> None:
        """Act on the messages other nodes left for us, oldest first."""
        box = self.inbox(self.node_id)
        msgs = await self.link.query(lambda: sorted(self.link.store.list_dir(box)), missing=[])
        if msgs is self.link.UNREACHABLE or not msgs:
            return
        for name, meta in msgs:
            try:
                act, path, path2, sender = msgpack.unpackb(meta.target or b"", raw=False)
            except Exception:
                log.error("inbox: malformed message %r dropped", name)
                act = None
            if act is not None:
                self.stats.inbox_messages += 1
                try:
                    if act == "drop":  # after a takeover, keep the new primary's own fresh copy
                        await self.link.replica_store.drop(path, sender if path2 == TAKEOVER else None)
                        await self.superseded(path, f"{act} from {sender}")
                    elif act == "rename":
                        await self.link.replica_store.rename(path, path2)
                        await self.renamed_elsewhere(path, path2, sender)
                    elif act == "yield":
                        await self.write.yield_lease(path, sender)
                    elif act == "adopt" and self.link.rebalancer is not None:
                        await self.link.rebalancer.adopt(path, sender)
                    else:
                        log.warning("inbox: unknown message %r from %s", act, sender)
                except FsError as exc:
                    if exc.errno == errno.EIO:  # the store went away: keep the message
                        return
                    log.warning("inbox: %s %r from %s not applied: %s", act, path, sender, exc)
                except Exception:
                    log.exception("inbox: %s %r from %s failed", act, path, sender)
            await self.link.query("delete", join(box, name), missing=False)

    async def superseded(self, path: bytes, why: str) -> None:
        """Another node took ``path`` over or removed it: drop our local name (quietly:
        the store is already right), or keep our bytes under a conflict name when they
        may hold writes the new primary has not seen."""
        try:
            inode = self.ns.resolve(path)
        except FsError:
            return
        current = await self.store_entry(path)
        if current is not None and (current.primary == self.node_id or
                                    (inode.is_dir and current.kind == "dir")):
            return  # still ours (or a directory that still exists)
        if inode.ino == ROOT_INO or (inode.is_dir and self.ns.children.get(inode.ino)):
            return
        parent, name = self._link_at(inode, path)
        entry = self.write.leases.pop(inode.ino, None) if inode.is_reg else None
        if inode.is_reg and (not inode.published or inode.ino in self.write.unleased
                             or (entry is not None and entry.writers > 0)):
            new = name + b".hycache-conflict-%s-%d" % (self.node_id.encode(), time.time_ns() // 10**6)
            with self.quiet():
                self.ns.rename(parent, name, parent, new, 0)
            self._event("put", inode.ino, join(split_path(path)[0], new))
            self.write.unleased.discard(inode.ino)
            self.stats.conflict_copies += 1
            log.warning("%r: %s while this node held writes the new holder may not have: "
                        "our bytes are kept as %r", path, why, new)
        else:
            with self.quiet():
                self.ns.unlink(parent, name, rmdir=inode.is_dir)
            await self.engine.maybe_free(inode)
            self.stats.taken_from_us += 1
            log.info("%r: %s; local copy dropped", path, why)
        await self.ns.journal.sync()
        self._invalidate(parent, name)

    async def renamed_elsewhere(self, src: bytes, dst: bytes, sender: str) -> None:
        """Another node renamed ``src`` to ``dst`` in the store: move our local part."""
        try:
            inode = self.ns.resolve(src)
        except FsError:
            return
        meta = await self.store_entry(dst)
        if meta is None or (await self.store_entry(src)) is not None:
            return  # not (or no longer) what the message says
        src_parent, src_name = self._link_at(inode, src)
        dst_parent = await self.local_dir(split_path(dst)[0], quiet=True)
        dst_name = split_path(dst)[1]
        with self.quiet():
            replaced = self.ns.rename(src_parent, src_name, dst_parent, dst_name, 0)
        if replaced is not None:
            await self.engine.maybe_free(replaced)
        await self.ns.journal.sync()
        self._invalidate(src_parent, src_name)
        self._invalidate(dst_parent, dst_name)
        log.info("%r renamed to %r by %s: local name moved", src, dst, sender)

    def _link_at(self, inode: Inode, path: bytes) -> tuple[int, bytes]:
        for parent, name in inode.links:
            base = self.ns.path_of(parent)
            if base is not None and join(base, name) == path:
                return parent, name
        raise FsError(errno.ENOENT)

    def status(self) -> dict:
        d = dict(self.stats.__dict__)
        self.write.status_into(d)
        return d


def ensure_dir(store, path: bytes) -> None:
    """(worker thread) Create a directory entry in the store if it is missing."""
    if store.get(path) is None:
        now = time.time_ns()
        store.create(path, EntryMeta("dir", stat.S_IFDIR | 0o700, 0, 0, 0, now, now, now))


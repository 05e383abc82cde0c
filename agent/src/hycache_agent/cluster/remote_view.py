"""The global view: a name that is not in the local namespace is looked up in the store;
names held by other nodes appear as *remote nodes* (an overlay beside the local namespace,
never written to the local database).  Directory listings merge the local entries with
the store's; a directory's listing is cached a while (:meth:`RemoteView._small_listing`)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import trio
from hycache_dht.meta import EntryMeta
from hycache_dht.registry import HIDDEN_ROOT_NAMES

from hycache_agent.cluster.entries import LATER, REMOTE_INO_BASE, UNREACHABLE, RemoteNode, same_bytes
from hycache_agent.cluster.kept import KeptCopies
from hycache_agent.cluster.store_link import StoreLink
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import join_path as join

log = logging.getLogger("hycache_agent.cluster.dht_link")  # one log for all the parts of the link

META_TTL_SECONDS = 1.0
SMALL_DIR = 1024
# A directory whose names are being looked up fast (a burst of creates) is listed whole
# if it has at most this many entries per lookup of the last listing period: one listing
# a second costs less than a store round trip (and a thread hop) per name.
LIST_PER_LOOKUP = 32


class RemoteView:
    """The remote nodes by inode and by path, and the cached directory listings.
    ``inval`` keeps entries valid by announced changes, ``reader`` (None: whole-file
    reads) learns new versions, ``drain_outbox`` waits for this node's own changes to be
    published, ``spawn`` starts a background task once the link runs."""

    def __init__(self, ns, link: StoreLink, *, node_id: str, inval, reader, kept: KeptCopies,
                 drain_outbox: Callable[[], Awaitable[None]], spawn: Callable[..., None]) -> None:
        self.ns = ns
        self.link = link
        self.node_id = node_id
        self.inval = inval
        self.reader = reader
        self.kept = kept  # copies of forgotten inodes, adopted by a new node of the same bytes
        self._drain_outbox = drain_outbox
        self._spawn = spawn
        self.remote: dict[int, RemoteNode] = {}
        self._remote_by_path: dict[bytes, RemoteNode] = {}
        self._next_remote = itertools.count(REMOTE_INO_BASE)
        self._listings: dict[bytes, tuple[float, dict[bytes, EntryMeta] | None]] = {}
        self._list_lookups: dict[bytes, int] = {}  # directory -> lookups since its last listing
        self._dir_sizes: dict[bytes, int] = {}  # directory -> entries (at least) at its last listing
        self._learnt_at: dict[bytes, float] = {}  # directory -> when a remote node in it was last made
        # told of a directory whose listing this view no longer answers all lookups from
        # (the FUSE adapter's answer table, which answers "no such name" from it)
        self.listing_changed: Callable[[bytes], None] | None = None

    def path_of(self, ino: int) -> bytes | None:
        node = self.remote.get(ino)
        if node is not None:
            return node.path
        return self.ns.path_of(ino)

    def remote_by_path(self, path: bytes) -> RemoteNode | None:
        return self._remote_by_path.get(path)

    def remote_files_in(self, dirpath: bytes | None) -> list[RemoteNode]:
        """The remote file nodes of directory ``dirpath`` (None: all of them)."""
        return [n for n in self._remote_by_path.values() if n.meta.kind == "file"
                and (dirpath is None or (n.path.rpartition(b"/")[0] or b"/") == dirpath)]

    def remote_node(self, path: bytes, meta: EntryMeta, read_at: float | None = None) -> RemoteNode:
        """The overlay node for a remote name.  A file gets a new inode number for every
        version: with the writeback cache the kernel keeps its own idea of a regular
        file's size and ignores sizes the agent reports later, so a changed file must
        look like a new inode (the old one lives on until the kernel forgets it)."""
        node = self._remote_by_path.get(path)
        if node is not None and node.meta.version != meta.version and same_bytes(node.meta, meta):
            meta = meta.copy(version=node.meta.version)  # the same bytes: the same inode and copy
        if node is None or (meta.kind != "dir" and node.meta.version != meta.version) \
                or node.meta.kind != meta.kind:
            node = RemoteNode(next(self._next_remote), path, meta, time.monotonic())
            if meta.kind == "file":
                for blob in self.kept.adopt(node):
                    self._spawn(trio.to_thread.run_sync, T.remove_blob, blob)
                if self.reader is not None:
                    self.reader.learn_version(path, node.meta.version)
            self.remote[node.ino] = node
            self._remote_by_path[path] = node
        else:
            node.meta, node.fetched = meta, time.monotonic()
        self._learnt(path.rpartition(b"/")[0] or b"/", read_at)
        # when the read began (None: unknown, so not covered by announcements)
        node.read_at = float("-inf") if read_at is None else read_at
        if meta.kind == "file":
            self.inval.watch(path.rpartition(b"/")[0] or b"/")
        return node

    def lookup_now(self, parent_ino: int, name: bytes) -> RemoteNode | None | object:
        """:meth:`lookup` answered from memory (the directory's listing is cached and
        fresh; counted as a lookup made in it), or LATER when the store must be asked
        (nothing counted: :meth:`lookup` does it)."""
        parent = self.path_of(parent_ino)
        if parent is None or (parent == b"/" and name in HIDDEN_ROOT_NAMES):
            return None
        cached = self._listings.get(parent)
        if cached is None or cached[1] is None or time.monotonic() - cached[0] >= META_TTL_SECONDS:
            return LATER
        self._list_lookups[parent] = self._list_lookups.get(parent, 0) + 1
        path = join(parent, name)
        return self._found(path, *self._listed(path, cached[1].get(name), cached[0]))

    async def lookup(self, parent_ino: int, name: bytes) -> RemoteNode | None:
        """A name not held locally: ask the global namespace."""
        found = self.lookup_now(parent_ino, name)
        if found is None or isinstance(found, RemoteNode):  # (else LATER: the store is asked)
            return found
        parent = self.path_of(parent_ino)
        assert parent is not None, "lookup_now answers LATER only under a known path"
        path = join(parent, name)
        read_at = time.monotonic()
        listing = await self._small_listing(parent)
        if listing is not None:
            meta = listing.get(name)
            meta, read_at = self._listed(path, meta, self._listings.get(parent, (float("-inf"), None))[0])
        else:
            meta = await self.link.store_get(path)
        return self._found(path, meta, read_at)

    def listed_names(self, parent_ino: int):
        """The names the fresh cached listing of directory ``parent_ino`` holds and until
        when :meth:`lookup_now` answers every lookup there from it (``time.monotonic()``),
        or None: not listed, stale, or a remote node was made in it since it was listed
        (:meth:`_listed` answers with that node)."""
        parent = self.path_of(parent_ino)
        if parent is None:
            return None
        cached = self._listings.get(parent)
        if cached is None or cached[1] is None:
            return None
        until = cached[0] + META_TTL_SECONDS
        if time.monotonic() >= until or self._learnt_at.get(parent, float("-inf")) > cached[0]:
            return None
        return until, cached[1].keys()

    def count_lookups(self, parent_ino: int, n: int) -> None:
        """``n`` lookups in directory ``parent_ino`` were answered from its listing
        elsewhere (by the answer table): they count as :meth:`lookup_now`'s."""
        parent = self.path_of(parent_ino)
        if parent is not None:
            self._list_lookups[parent] = self._list_lookups.get(parent, 0) + n

    def _learnt(self, dirpath: bytes, read_at: float | None) -> None:
        """A new remote node in ``dirpath``, from what was read at ``read_at`` (None: now):
        the listing no longer answers every lookup there unless it was read later."""
        at = time.monotonic() if read_at is None else read_at
        if at > self._learnt_at.get(dirpath, float("-inf")):
            self._learnt_at[dirpath] = at
        cached = self._listings.get(dirpath)
        if cached is None or at > cached[0]:
            self._listing_changed(dirpath)

    def _listing_changed(self, dirpath: bytes) -> None:
        if self.listing_changed is not None:
            self.listing_changed(dirpath)

    def _listed(self, path: bytes, meta: EntryMeta | None, listed_at: float) -> tuple[EntryMeta | None, float]:
        """What a directory listing taken at ``listed_at`` says of ``path`` (its entry and
        when it was read), unless this node learnt of the file after the listing was
        taken (e.g. a 2LS prefetch fetched it): then what it learnt."""
        known = self._remote_by_path.get(path) if meta is None else None
        if known is not None and known.fetched > listed_at:
            return known.meta, known.read_at
        return meta, listed_at

    def _found(self, path: bytes, meta: EntryMeta | None, read_at: float) -> RemoteNode | None:
        """The node for what the store said of ``path`` (``read_at``: when that read
        began, for cluster/invalidation.py), None where no other node holds it."""
        if meta is None or meta.primary == self.node_id and meta.kind != "dir":
            return None  # ours but deleted locally (publication pending) — not there
        return self.remote_node(path, meta, read_at)

    async def _small_listing(self, dirpath: bytes) -> dict[bytes, EntryMeta] | None:
        """The store's entries of a directory, cached for META_TTL_SECONDS, so that a
        burst of creates (each preceded by a lookup of the new name) costs one listing
        per second instead of one store round trip per name.  Listed when it has at most
        SMALL_DIR entries, or LIST_PER_LOOKUP per lookup made in it since its last
        listing (a large directory being filled fast); otherwise None (names are looked
        up one by one), also when the store is unreachable.  The staleness is the same as
        the kernel's entry cache."""
        now = time.monotonic()
        lookups = self._list_lookups.get(dirpath, 0) + 1
        self._list_lookups[dirpath] = lookups
        cached = self._listings.get(dirpath)
        if cached is not None and now - cached[0] < META_TTL_SECONDS:
            return cached[1]
        limit = max(SMALL_DIR, LIST_PER_LOOKUP * lookups)
        self._list_lookups[dirpath] = 0
        if self._dir_sizes.get(dirpath, 0) > limit:  # too large the last time: no scan
            entries = None
        else:
            entries = await self.link.query(self._list_up_to, dirpath, limit, missing={})
            if entries is UNREACHABLE:
                return None
            self._dir_sizes[dirpath] = limit + 1 if entries is None else len(entries)
        if len(self._listings) > 4096:
            self._listings.clear()
            self._list_lookups.clear()
            self._dir_sizes.clear()
            self._learnt_at.clear()
        self._listings[dirpath] = (now, entries)
        return entries

    def _list_up_to(self, dirpath: bytes, limit: int) -> dict[bytes, EntryMeta] | None:
        """The store's listing of ``dirpath`` (run by ``query`` in a worker thread), or None
        when it holds more than ``limit`` names."""
        out: dict[bytes, EntryMeta] = {}
        for name, meta in self.link.store.list_dir(dirpath):
            if len(out) >= limit:
                return None
            out[name] = meta
        return out

    async def dir_has_entries(self, path: bytes) -> bool:
        """Whether the store lists any name in directory ``path`` once our own queued
        changes are published (rmdir of a directory other nodes hold names in)."""
        def first() -> bool:
            return next(iter(self.link.store.list_dir(path)), None) is not None

        has = await self.link.query(first, missing=False)
        if has is True:  # maybe only our own removals, not published yet
            await self._drain_outbox()
            has = await self.link.query(first, missing=False)
        return has is True  # unreachable: local rules only (the store refuses it later)

    def relist_soon(self, dirpath: bytes) -> None:
        """The announcements of ``dirpath`` are heard from now on (its subscription was just
        confirmed): what was read of it before is not covered (an announcement may have
        been missed), so its listing is read once more, in the background, and the remote
        files it still describes (the same version, or the same bytes) are covered from
        that read on (cluster/invalidation.py): their entries get the lease at the next
        lookup or stat instead of an attribute timeout of 0 until a refresh."""
        if dirpath in self._listings or self.remote_files_in(dirpath):
            self._spawn(self._relist, dirpath)

    async def _relist(self, dirpath: bytes) -> None:
        if self._dir_sizes.get(dirpath, 0) > SMALL_DIR:  # a large directory: not listed whole
            return
        read_at = time.monotonic()
        entries = await self.link.query(self._list_up_to, dirpath, SMALL_DIR, missing={})
        if entries is UNREACHABLE or entries is None or not self.inval.heard_since(dirpath, read_at):
            return  # unreachable, too large, or changed meanwhile (read again at the next lookup)
        self.inval.stats["relists"] += 1
        cached = self._listings.get(dirpath)
        if cached is None or cached[0] < read_at:
            self._listings[dirpath] = (read_at, entries)
            self._dir_sizes[dirpath] = len(entries)
            self._listing_changed(dirpath)
        now = time.monotonic()
        for node in self.remote_files_in(dirpath):
            meta = entries.get(node.path.rpartition(b"/")[2])
            if meta is None or node.superseded or node.read_at >= read_at:
                continue
            if meta.version != node.meta.version:
                if not same_bytes(node.meta, meta):
                    continue  # a new version: a new inode at the next lookup
                meta = meta.copy(version=node.meta.version)
            node.meta, node.fetched, node.read_at = meta, now, read_at

    def unlisted(self, path: bytes) -> None:
        """``path`` was removed or renamed away here and its delete is queued: it leaves the
        cached listing of its directory now, not when that listing is read again. A
        directory removed here and made again at once was found in the stale listing
        (another node's, for all this node knew) and the kernel answered EEXIST."""
        parent, _, name = path.rpartition(b"/")
        cached = self._listings.get(parent or b"/")
        if cached is not None and cached[1] is not None:
            cached[1].pop(name, None)

    def forget_listing(self, dirpath: bytes | None) -> None:
        """Our view of a directory changed: the next lookup asks the store again."""
        if dirpath is not None:
            self._listings.pop(dirpath, None)
            self._listing_changed(dirpath)

    def stale(self, node: RemoteNode) -> bool:
        """Whether :meth:`refresh` asks the store (else it returns the node as it is):
        its attributes are older than META_TTL_SECONDS and no announcement of changes to
        it would be heard (an entry covered by a confirmed subscription is kept)."""
        if time.monotonic() - node.fetched <= META_TTL_SECONDS:
            return False
        if self.inval.covers(node):
            self.inval.stats["kept_refreshes"] += 1  # no round trip: announcements keep it
            return False
        return True

    async def refresh(self, node: RemoteNode) -> RemoteNode:
        """Fresh attributes for a directory, or for a file still at the same version
        (a newer version is a new inode, found by the next lookup)."""
        if self.stale(node):
            read_at = time.monotonic()
            meta = await self.link.store_get(node.path)
            if meta is not None and meta.version != node.meta.version and same_bytes(node.meta, meta):
                meta = meta.copy(version=node.meta.version)  # the same bytes (see same_bytes)
            if meta is not None and (node.is_dir or meta.version == node.meta.version):
                node.meta, node.fetched, node.read_at = meta, time.monotonic(), read_at
                self._learnt(node.path.rpartition(b"/")[0] or b"/", read_at)
            elif meta is not None and meta.kind == "file":
                log.debug("%r superseded: %s -> %s", node.path, node.meta, meta)
                node.superseded = True
                self.forget_listing(node.path.rpartition(b"/")[0] or b"/")  # the next lookup finds it
                if self.reader is not None:
                    self.reader.learn_version(node.path, meta.version)
        return node

    async def list_remote(self, path: bytes) -> list[tuple[bytes, RemoteNode]]:
        read_at = time.monotonic()
        entries = await self.link.query(lambda: list(self.link.store.list_dir(path)), missing=[])
        if entries is UNREACHABLE:
            return []
        out = []
        for name, meta in entries:
            if path == b"/" and name in HIDDEN_ROOT_NAMES:
                continue
            out.append((name, self.remote_node(join(path, name), meta, read_at)))
        return out

    def release(self, node: RemoteNode, n: int) -> bool | None:
        """The kernel forgets ``n`` lookups of ``node``: None while it still knows it,
        else the node leaves the view (True: it was the path's current node)."""
        node.lookups = max(0, node.lookups - n)
        if node.lookups or node.open_count:
            return None
        log.debug("the kernel forgot %r (ino %d, version %d, copy %s)", node.path, node.ino, node.meta.version,
                  node.cache_version if node.cache_blob else None)
        del self.remote[node.ino]
        if self._remote_by_path.get(node.path) is node:
            del self._remote_by_path[node.path]
            return True
        return False

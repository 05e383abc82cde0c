"""Cached remote entries kept valid by announcements instead of a round trip per open.

Every write of an entry in the global namespace is announced on its directory's sharded
pub/sub channel (``hycache_dht.invalidations``: ``SPUBLISH`` behind the write, on the same
master).  This node subscribes to the channels of the directories it keeps remote files
of (one subscriber per agent: a worker thread owns the feed), and then:

* a remote file's entry read *after* its directory's subscription was confirmed is
  **covered**: ``ClusterLink.refresh`` does not ask the store again, and the kernel keeps
  the entry and attributes (``lease_left``) instead of asking at every open and stat;
* an announcement of a path ends the coverage of what was read before it: the store is
  asked again at the next refresh, the directory's cached listing goes, and the kernel
  forgets the name, so the next open looks it up (a new version is a new inode);
* when a directory's subscription is confirmed, its listing is read once more
  (``ClusterLink.relist_soon``): the remote files read before the confirmation (not
  covered: an announcement may have come before it) are covered from that read on, so a
  cold directory's entries get the lease within a round trip of the first lookup;
* a lost subscription (a connection error, a reconnection, a slot that moved) may have
  missed announcements: the coverage of everything read before it ends at once, the
  kernel forgets those names, and until the channel is confirmed again entries fall back
  to the short refresh of before (``META_TTL_SECONDS``); the degradation is logged.

A coverage is a lease: it lasts at most ``LEASE_SECONDS`` after the read, then the entry
is read again, so a subscription that died without a word (no error: a half-open
connection) cannot keep an entry longer than that.
"""

from __future__ import annotations

import collections
import logging
import time

import trio

log = logging.getLogger(__name__)

LEASE_SECONDS = 10.0  # longest a covered entry is trusted after its read
POLL_SECONDS = 0.5  # the subscriber thread's wait when nothing arrives (it is woken for new channels)
MAX_CHANGED = 65536  # paths whose last announcement is remembered (then: everything older is stale)
RETRY_MAX_SECONDS = 5.0


def _parent(path: bytes) -> bytes:
    return path.rpartition(b"/")[0] or b"/"


class Invalidations:
    def __init__(self, link) -> None:
        self.link = link
        self.state = "off"  # off (not started / no feed) | connecting | ok | degraded
        self.active_since: dict[bytes, float] = {}  # directory -> when its subscription was confirmed
        self.wanted: set[bytes] = set()  # directories to be subscribed
        self.changed_at: dict[bytes, float] = {}  # path -> when its last announcement was heard
        self.dir_changed_at: dict[bytes, float] = {}  # directory -> when an announcement of a name in it was heard
        self.floor = float("-inf")  # nothing read before this is covered (a loss, a trimmed changed_at)
        self._todo: collections.deque[bytes] = collections.deque()  # for the subscriber thread
        self._feed = None
        self._stopping = False
        self.stats = {"kept_refreshes": 0, "announcements": 0, "kernel_invalidations": 0, "losses": 0,
                      "confirmations": 0, "relists": 0}

    # ------------------------------------------------------------------ questions
    def covers(self, node) -> bool:
        """Whether ``node.meta`` (read at ``node.read_at``) is known to be current."""
        read_at = node.read_at
        if read_at <= self.floor or time.monotonic() - read_at > LEASE_SECONDS:
            return False
        since = self.active_since.get(_parent(node.path))
        return since is not None and since <= read_at and self.changed_at.get(node.path, -1.0) < read_at

    def lease_left(self, node) -> float:
        """Seconds the kernel may keep ``node``'s entry and attributes (0: not covered)."""
        if not self.covers(node):
            return 0.0
        return max(0.0, node.read_at + LEASE_SECONDS - time.monotonic())

    def heard_since(self, dirpath: bytes, read_at: float) -> bool:
        """Whether a read of ``dirpath``'s names that began at ``read_at`` is covered as a
        whole: its subscription was confirmed before it, and no announcement of a name in
        it (nor a loss) came since."""
        since = self.active_since.get(dirpath)
        return (since is not None and since <= read_at and read_at > self.floor
                and self.dir_changed_at.get(dirpath, -1.0) < read_at)

    def watch(self, dirpath: bytes) -> None:
        """Remote files of ``dirpath`` are kept here: subscribe to its announcements."""
        if dirpath in self.wanted or self._stopping:
            return
        self.wanted.add(dirpath)
        self._todo.append(dirpath)
        if self._feed is not None:
            self._feed.wake()

    def status(self) -> dict:
        return {"state": self.state, "channels": len(self.wanted), "active": len(self.active_since), **self.stats}

    # ------------------------------------------------------------------ the subscriber
    async def run(self) -> None:
        await self.link.connected.wait()
        feed = self.link.store.invalidation_feed()
        if feed is None:
            log.info("the metadata store announces no changes: remote entries are refreshed every %.0f s",
                     self.link.meta_ttl)
            return
        self._feed = feed
        self.state = "connecting"
        token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._thread, feed, token, abandon_on_cancel=True)
        finally:
            self._stopping = True
            feed.wake()

    def _thread(self, feed, token) -> None:
        """(worker thread) Owns the feed: subscribes what ``watch`` queued, hands what it
        hears to the loop."""
        from hycache_dht.invalidations import FeedLost

        backoff = 0.2
        try:
            while not self._stopping:
                try:
                    todo = []
                    while self._todo:
                        todo.append(self._todo.popleft())
                    if todo:
                        feed.subscribe(todo)
                    events = feed.poll(POLL_SECONDS)
                    backoff = 0.2
                    if events:
                        token.run_sync_soon(self._events, events)
                except FeedLost as exc:
                    token.run_sync_soon(self._lost, str(exc))
                    time.sleep(backoff)
                    backoff = min(RETRY_MAX_SECONDS, backoff * 2)
        except trio.RunFinishedError:
            pass
        finally:
            feed.close()

    # ------------------------------------------------------------------ on the loop
    def _events(self, events: list[tuple[str, bytes]]) -> None:
        try:
            self._handle(events)
        except Exception:
            log.exception("handling change announcements failed: what was read before is read again")
            self._uncover_all(time.monotonic())

    def _handle(self, events: list[tuple[str, bytes]]) -> None:
        now = time.monotonic()
        for kind, value in events:
            if kind == "changed":
                self.stats["announcements"] += 1
                self._changed(value, now)
            elif kind == "active":
                self.stats["confirmations"] += 1
                if value in self.active_since:  # confirmed again: a reconnection, maybe a gap
                    self._drop_dir(value, now)
                self.active_since[value] = now
                self.link.relist_soon(value)  # what was read before is covered once read again
                if self.state != "ok" and len(self.active_since) >= len(self.wanted):
                    if self.state == "degraded":
                        log.info("change announcements heard again: cached remote entries are kept")
                    self.state = "ok"
            elif kind == "lost":  # the slot moved: subscribe again
                self._drop_dir(value, now)
                if value in self.wanted:
                    self._todo.append(value)
                    if self._feed is not None:
                        self._feed.wake()

    def _changed(self, path: bytes, now: float) -> None:
        if len(self.changed_at) >= MAX_CHANGED:
            self.changed_at.clear()
            self.dir_changed_at.clear()
            self.floor = now
        self.changed_at[path] = now
        self.dir_changed_at[_parent(path)] = now
        self.link.forget_listing(_parent(path))
        node = self.link.remote_by_path(path)
        if node is not None:
            log.debug("announcement of %r: ino %d version %d read %.3f s before, copy %s, open %d", path,
                      node.ino, node.meta.version, now - node.read_at, node.cache_version, node.open_count)
            node.fetched = float("-inf")  # the next refresh asks the store
            if node.meta.kind == "file":  # (a directory's entry changes with every name made in it;
                self._forget_name(path)   # the kernel keeps it 1 s anyway, and forgetting it drops its subtree)

    def _drop_dir(self, dirpath: bytes, now: float) -> None:
        """The channel of ``dirpath`` may have missed announcements."""
        self.active_since.pop(dirpath, None)
        self.link.forget_listing(dirpath)
        for node in self.link.remote_files_in(dirpath):
            if node.read_at < now:
                node.read_at = float("-inf")
                self._forget_name(node.path)

    def _lost(self, why: str) -> None:
        """Every subscription may have missed announcements."""
        self.stats["losses"] += 1
        if self.state != "degraded":
            log.warning("change announcements lost (%s): cached remote entries are refreshed every %.0f s "
                        "until they are heard again", why, self.link.meta_ttl)
        self.state = "degraded"
        self.active_since.clear()
        self._uncover_all(time.monotonic())
        self._todo.extend(self.wanted)

    def _uncover_all(self, now: float) -> None:
        """Nothing read before ``now`` is covered any more; the kernel forgets it."""
        self.floor = now
        for node in self.link.remote_files_in(None):
            if node.read_at < now:
                node.read_at = float("-inf")
                self.link.forget_listing(_parent(node.path))
                self._forget_name(node.path)

    def _forget_name(self, path: bytes) -> None:
        self.stats["kernel_invalidations"] += 1
        self.link.forget_kernel_entry(path)

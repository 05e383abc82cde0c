"""The invalidation feed (hycache_dht/invalidations.py): every write of an entry is
announced on its directory's sharded pub/sub channel, heard by a subscriber of that
directory only after its subscription is confirmed; a dropped connection is reported."""

from __future__ import annotations

import contextlib
import time

import pytest
from hycache_dht.invalidations import FeedLost, wait_active
from hycache_dht.meta import EntryMeta, Op, dir_meta
from hycache_dht.redis_store import RedisClusterStore

pytest_plugins = ["hycache_dht.testing"]


def fmeta(size: int) -> EntryMeta:
    return EntryMeta("file", 0o100644, 0, 0, size, 1, 1, 1, primary="n1")


def heard(feed, want: int, timeout: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [p for kind, p in feed.poll(0.05) if kind == "changed"]
    return got


@contextlib.contextmanager
def subscribed(redis_cluster, namespace: str, dirpath: bytes):
    """A store with directory ``dirpath`` and a feed whose subscription to it is confirmed:
    (store, feed, the directory's channel); both closed after."""
    store = RedisClusterStore(redis_cluster.nodes, namespace=namespace)
    feed = store.invalidation_feed()
    try:
        store.create(dirpath, dir_meta())
        wait_active(feed, [dirpath])
        yield store, feed, feed.channel(dirpath)
    finally:
        feed.close()
        store.close()


def hears_again(store, feed, dirpath: bytes) -> None:
    """After a loss: subscribed afresh, the feed hears the next change in ``dirpath``."""
    wait_active(feed, [dirpath])
    store.put(dirpath + b"/f", fmeta(1))
    assert heard(feed, 1) == [dirpath + b"/f"]


def test_writes_are_announced_to_subscribers(redis_cluster, dht_namespace):
    writer = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace)
    reader = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace)
    feed = reader.invalidation_feed()
    try:
        for d in (b"/a", b"/b"):
            writer.create(d, dir_meta())
        wait_active(feed, [b"/a"])
        writer.put(b"/a/x", fmeta(1))  # a single put
        writer.apply([Op.put(b"/a/y", fmeta(2)), Op.put(b"/b/z", fmeta(3))])  # a batch, two slots
        writer.delete(b"/a/x")
        writer.rename(b"/a/y", b"/a/w")
        got = heard(feed, 5)
        # /b is not subscribed: its change is not heard
        assert got == [b"/a/x", b"/a/y", b"/a/x", b"/a/y", b"/a/w"]
        assert heard(feed, 1, timeout=0.3) == []
        # a new subscription hears only what comes after its confirmation
        wait_active(feed, [b"/b"])
        writer.put(b"/b/z", fmeta(4))
        assert heard(feed, 1) == [b"/b/z"]
    finally:
        feed.close()
        writer.close()
        reader.close()


def test_a_dropped_connection_is_reported(redis_cluster, dht_namespace):
    with subscribed(redis_cluster, dht_namespace, b"/d") as (store, feed, ch):
        # the server drops the subscriber's connection (CLIENT KILL of the pubsub clients)
        for conn in store.c.primaries():
            conn.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        events = []
        deadline = time.monotonic() + 5
        with pytest.raises(FeedLost):
            while time.monotonic() < deadline:
                events += feed.poll(0.05)
        assert ch not in feed.channels
        hears_again(store, feed, b"/d")


def test_a_connection_readable_with_nothing_read_is_dropped_not_spun_on(redis_cluster, dht_namespace):
    """A node's subscriber that redis-py keeps in its round robin but no longer reads from
    (unsubscribed: ``get_message`` returns None without reading), with bytes pending on its
    socket, makes every wait return at once.  The feed must drop its connections (FeedLost)
    after a bounded number of such polls instead of spinning a core on them."""
    with subscribed(redis_cluster, dht_namespace, b"/s") as (store, feed, ch):
        (node_ps,) = feed._pubsub.node_pubsub_mapping.values()
        # the node's subscriber, behind the cluster client's back: unsubscribed, confirmation read
        node_ps.sunsubscribe(ch)
        deadline = time.monotonic() + 5
        while node_ps.subscribed and time.monotonic() < deadline:
            node_ps.get_message(timeout=0.1)
        assert not node_ps.subscribed
        node_ps.connection.send_command("PING")  # a reply nobody will read
        cpu0, polls = time.thread_time(), 0
        with pytest.raises(FeedLost, match="readable"):
            while time.monotonic() < deadline + 5:
                feed.poll(0.5)
                polls += 1
        assert polls < 100
        assert time.thread_time() - cpu0 < 0.5
        assert ch not in feed.channels
        # subscribed afresh, the feed hears again and waits quietly
        hears_again(store, feed, b"/s")
        cpu0 = time.thread_time()
        assert feed.poll(0.3) == []
        assert time.thread_time() - cpu0 < 0.05

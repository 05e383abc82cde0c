"""Cached remote entries kept valid by announcements (cluster/invalidation.py): a reader
keeps a remote file's entry without asking the store at every open, hears when the
holder changes it, and falls back to the short refresh when its subscription is lost."""

from __future__ import annotations

import os
import time

import pytest
import redis
from clusterkit import cluster_status, redis_addr, start_agents, wait_for, wait_published

pytestmark = pytest.mark.mount


def inval(m) -> dict:
    return cluster_status(m)["invalidations"]


def rewrite(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def holder_and_reader(hycache_mount, redis_cluster, dht_namespace, secret_file):
    """a holds d/f ("one"), b has read it and subscribed to d's announcements."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace)
    (a.mountpoint / "d").mkdir()
    rewrite(a.mountpoint / "d" / "f", b"one")
    wait_published(a)
    theirs = b.mountpoint / "d" / "f"
    assert theirs.read_bytes() == b"one"
    wait_for(lambda: inval(b)["state"] == "ok", what="b subscribed to d's announcements")
    return a, b, theirs


def test_a_covered_entry_is_kept_until_the_holder_changes_the_file(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    a, b, theirs = holder_and_reader(hycache_mount, redis_cluster, dht_namespace, secret_file)
    wait_published(a)  # past the first, uncovered entry's 1 s
    assert theirs.read_bytes() == b"one"  # read again: now covered
    time.sleep(1.1)  # older than the 1 s refresh
    before = inval(b)
    for _ in range(20):
        assert theirs.read_bytes() == b"one"
    # every open kept the entry without asking the store
    assert inval(b)["kept_refreshes"] - before["kept_refreshes"] >= 20
    # the holder changes it: the reader hears it (well within the 10 s lease) and reads the new bytes
    rewrite(a.mountpoint / "d" / "f", b"two, longer")
    wait_for(lambda: theirs.read_bytes() == b"two, longer", timeout=5.0, what="the new bytes on b")
    st = inval(b)
    assert st["announcements"] >= 1 and st["kernel_invalidations"] >= 1 and st["losses"] == 0


def test_a_lost_subscription_falls_back_to_the_refresh_and_comes_back(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    a, b, theirs = holder_and_reader(hycache_mount, redis_cluster, dht_namespace, secret_file)
    # Redis drops every subscriber connection (as a failover would)
    for host, port in redis_cluster.nodes:
        r = redis.Redis(host=host, port=port)
        try:
            r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        except redis.RedisError:
            pass
        finally:
            r.close()
    wait_for(lambda: inval(b)["losses"] >= 1, what="b noticed the lost subscription")
    # whatever was published meanwhile is seen: by the refresh, then by announcements again
    rewrite(a.mountpoint / "d" / "f", b"two, longer")
    wait_for(lambda: theirs.read_bytes() == b"two, longer", timeout=5.0, what="the new bytes on b")
    wait_for(lambda: inval(b)["state"] == "ok", what="b subscribed again")
    wait_published(a)
    assert theirs.read_bytes() == b"two, longer"
    rewrite(a.mountpoint / "d" / "f", b"three")
    wait_for(lambda: theirs.read_bytes() == b"three", timeout=5.0, what="the newest bytes on b")


def test_a_file_renamed_over_is_never_announced_with_an_older_entry(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    """The writer's way to replace a file atomically: write a temp name, close, rename it
    over.  The close's new size and the rename reach the publisher in one batch; the rename
    must move the current entry.  Before: the rename went first, announced at once, so for
    the moment until the put behind it the new name showed the temp file's entry of its
    create (size 0), and every reader the announcement sent to look the name up again read
    that (the torn-read test's readers all read b'' from a 3 MiB file).  Here every
    announcement of the name is answered by a read of its entry, as a reader's lookup does."""
    from hycache_dht.invalidations import wait_active
    from hycache_dht.redis_store import RedisClusterStore

    (a,) = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a",))
    (a.mountpoint / "d").mkdir()
    wait_published(a)
    store = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace)
    feed = store.invalidation_feed()
    size = 256 << 10
    seen: list[int] = []
    try:
        wait_active(feed, [b"/d"])
        for k in range(20):
            tmp = a.mountpoint / "d" / f".f.tmp{k}"
            tmp.write_bytes(bytes([k]) * size)
            (a.mountpoint / "d" / f".f.tmp{k}").rename(a.mountpoint / "d" / "f")
            deadline = time.monotonic() + 10
            done = False
            while not done and time.monotonic() < deadline:
                for kind, path in feed.poll(0.05):
                    if kind == "changed" and path == b"/d/f":
                        meta = store.get(b"/d/f")
                        seen.append(-1 if meta is None else meta.size)
                        done = done or (meta is not None and meta.size == size)
            assert done, f"rewrite {k}: /d/f never announced at its size ({seen})"
    finally:
        feed.close()
        store.close()
    assert seen and set(seen) == {size}, seen


def test_entries_read_before_the_subscription_get_the_lease_and_still_show_changes(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    """A cold directory's first lookups read its listing before this node's subscription
    to its announcements is confirmed (not covered: an announcement may come before it).
    The confirmation reads the listing once more (``ClusterLink.relist_soon``) and covers
    those entries from then on: the kernel keeps them with the lease instead of asking at
    every stat.  A leased entry still shows another node's change of its size, its mtime
    and its removal within the announcement path's bound (here 5 s, half the lease)."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace)
    (a.mountpoint / "d").mkdir()
    for name in ("f", "g", "h"):
        rewrite(a.mountpoint / "d" / name, b"one")
    wait_published(a)
    theirs = b.mountpoint / "d"
    before = inval(b)
    # the first lookups in d: one listing, taken before d's subscription exists
    assert (theirs / "f").read_bytes() == b"one"
    assert os.stat(theirs / "g").st_size == 3 and os.stat(theirs / "h").st_size == 3
    wait_for(lambda: inval(b)["relists"] > before["relists"], what="d listed again once its subscription was confirmed")
    st = inval(b)
    assert st["state"] == "ok" and st["losses"] == 0
    for _ in range(5):  # within the lease: the same attributes, no store read needed
        assert (theirs / "f").read_bytes() == b"one" and os.stat(theirs / "g").st_size == 3
    # size: the holder rewrites f longer
    rewrite(a.mountpoint / "d" / "f", b"two, longer")
    wait_for(lambda: os.stat(theirs / "f").st_size == 11 and (theirs / "f").read_bytes() == b"two, longer",
             timeout=5.0, what="f's new size and bytes on b")
    # mtime: the holder sets g's times
    os.utime(a.mountpoint / "d" / "g", ns=(1_000_000_000, 2_000_000_000))
    wait_for(lambda: os.stat(theirs / "g").st_mtime_ns == 2_000_000_000, timeout=5.0, what="g's new mtime on b")
    # unlink: the holder removes h
    os.unlink(a.mountpoint / "d" / "h")
    wait_for(lambda: not (theirs / "h").exists(), timeout=5.0, what="h gone on b")
    st = inval(b)
    assert st["announcements"] >= 3 and st["kernel_invalidations"] >= 2 and st["losses"] == 0

"""Writes are always local (HyCache+): writing, truncating, removing or renaming a name
held by another node, and two nodes writing one file. Real agents, real mounts, the
session's real Redis Cluster."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
from clusterkit import (
    agent_status,
    cluster_status,
    info,
    lent_writers,
    redis_addr,
    sha,
    start_agents,
    wait_for,
    wait_published,
)

pytestmark = pytest.mark.mount


def ownership(m) -> dict:
    return cluster_status(m)["ownership"]


def passthrough(m) -> bool:
    return bool(agent_status(m)["passthrough"]["enabled"])


@pytest.fixture
def two(hycache_mount, redis_cluster, dht_namespace, secret_file):
    return start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                        write_lease_seconds=3)


def published_on(m, path, timeout=20.0):
    wait_for(lambda: os.path.exists(m.mountpoint / path), timeout=timeout, what=f"{path} on {m.mountpoint}")


def test_writing_a_file_held_elsewhere_makes_this_node_its_primary(two):
    a, b = two
    data = os.urandom(3 << 20)
    (a.mountpoint / "d").mkdir()
    (a.mountpoint / "d" / "f").write_bytes(data)
    published_on(b, "d/f")
    wait_published(a)
    fetched_before = cluster_status(b)["remote_bytes"]
    with open(b.mountpoint / "d" / "f", "ab") as f:  # append: the current bytes are fetched once
        f.write(b"+tail from b")
    assert (b.mountpoint / "d" / "f").read_bytes() == data + b"+tail from b"
    mine = info(b.mountpoint / "d" / "f")
    assert mine["tier"] in ("fast", "slow") and ownership(b)["takeovers"] == 1
    assert cluster_status(b)["remote_bytes"] - fetched_before == len(data)
    wait_published(b)
    # the old holder learns (inbox) and drops its copy; the bytes were never sent back
    wait_for(lambda: ownership(a)["taken_from_us"] == 1, what="a dropped its copy")
    wait_for(lambda: info(a.mountpoint / "d" / "f").get("primary") == "b", what="a sees b as primary")
    assert (a.mountpoint / "d" / "f").read_bytes() == data + b"+tail from b"
    assert cluster_status(b)["ownership"]["write_leases_held"] == 0  # released after close
    # writing it again on a goes back the other way (a takes it over from b)
    (a.mountpoint / "d" / "f").write_text("a again")  # O_TRUNC: nothing to fetch
    assert (a.mountpoint / "d" / "f").read_text() == "a again"
    wait_published(a)
    wait_for(lambda: ownership(b)["taken_from_us"] == 1, what="b dropped its copy")
    assert (b.mountpoint / "d" / "f").read_text() == "a again"


def test_truncating_a_remote_file_fetches_nothing(two):
    a, b = two
    (a.mountpoint / "big").write_bytes(os.urandom(4 << 20))
    published_on(b, "big")
    wait_published(a)
    before = cluster_status(b)["remote_bytes"]
    os.truncate(b.mountpoint / "big", 0)
    assert os.stat(b.mountpoint / "big").st_size == 0
    (b.mountpoint / "big").write_bytes(b"small")  # O_TRUNC open of the now local file
    assert cluster_status(b)["remote_bytes"] == before
    wait_published(b)
    wait_for(lambda: (a.mountpoint / "big").read_bytes() == b"small", what="b's version on a")


def test_remove_and_rename_names_held_elsewhere(two):
    a, b = two
    for name in ("gone", "moved", "keep"):
        (a.mountpoint / name).write_text(name)
    (a.mountpoint / "tree" / "sub").mkdir(parents=True)
    (a.mountpoint / "tree" / "sub" / "leaf").write_text("leaf")
    published_on(b, "tree/sub/leaf")
    wait_published(a)
    (b.mountpoint / "gone").unlink()
    (b.mountpoint / "moved").rename(b.mountpoint / "renamed")
    (b.mountpoint / "tree").rename(b.mountpoint / "forest")
    assert sorted(os.listdir(b.mountpoint)) == ["forest", "keep", "renamed"]
    wait_published(b)
    # a applies them to its own names: the bytes stay on a, which is still the primary
    wait_for(lambda: sorted(os.listdir(a.mountpoint)) == ["forest", "keep", "renamed"], what="a's view")
    assert (a.mountpoint / "renamed").read_text() == "moved"
    assert info(a.mountpoint / "renamed")["tier"] in ("fast", "slow")  # local on a
    assert (a.mountpoint / "forest" / "sub" / "leaf").read_text() == "leaf"
    assert info(a.mountpoint / "forest" / "sub" / "leaf")["tier"] in ("fast", "slow")
    assert (b.mountpoint / "renamed").read_text() == "moved"
    with pytest.raises(FileNotFoundError):
        (a.mountpoint / "gone").read_text()
    # rmdir of a directory another node holds names in is refused
    (b.mountpoint / "forest" / "mine").write_text("b's")
    with pytest.raises(OSError) as exc:
        os.rmdir(a.mountpoint / "forest" / "sub")  # a holds leaf in it: local rule
    assert exc.value.errno == errno.ENOTEMPTY
    (a.mountpoint / "forest" / "sub" / "leaf").unlink()
    wait_published(b)
    os.rmdir(a.mountpoint / "forest" / "sub")
    with pytest.raises(OSError) as exc:
        os.rmdir(a.mountpoint / "forest")  # empty on a, but b holds forest/mine
    assert exc.value.errno == errno.ENOTEMPTY
    assert ownership(b)["remote_removes"] == 1 and ownership(b)["remote_renames"] == 2


def test_removals_answered_by_the_table_reach_the_other_node(two):
    """The reader answers the UNLINK of a closed local file itself; the agent makes the
    removal its own at the drain, so it is published as any other: the other node loses
    the names, and the primary's write leases of the removed files are let go."""
    a, b = two
    names = [f"t{i}" for i in range(30)]
    for n in names:
        (a.mountpoint / n).write_text(n)
    wait_published(a)
    for n in names:
        published_on(b, n)
        os.stat(a.mountpoint / n)  # a's table has their attributes
    before = agent_status(a)["request_loop"]["answer_table"]["unlink"]
    for n in names[:20]:
        os.unlink(a.mountpoint / n)
    assert agent_status(a)["request_loop"]["answer_table"]["unlink"] - before >= 18
    assert sorted(x for x in os.listdir(a.mountpoint) if x.startswith("t")) == sorted(names[20:])
    wait_published(a)
    wait_for(lambda: sorted(x for x in os.listdir(b.mountpoint) if x.startswith("t")) == sorted(names[20:]),
             what="b's view without the removed names")
    for n in names[:20]:
        with pytest.raises(FileNotFoundError):
            (b.mountpoint / n).read_text()
    assert (b.mountpoint / "t25").read_text() == "t25"
    # b may write a removed name afresh: a holds no lease of it any more
    (b.mountpoint / "t3").write_text("b's own")
    wait_published(b)
    wait_for(lambda: (a.mountpoint / "t3").read_text() == "b's own", what="b's new file on a")


def test_creates_answered_by_the_table_are_published_with_their_lease(two):
    """The reader answers CREATEs in a directory whose names it has, with pool blobs the
    agent gave it; the agent makes them its own at the drain: published as its own creates
    (the other node sees them), each with this node's write lease, which the create's open
    holds until its release and which another node's writer then gets."""
    a, b = two
    d = a.mountpoint / "made"
    d.mkdir()
    with pytest.raises(FileNotFoundError):
        os.stat(d / "nothing")
    (d / "warm").write_text("w")

    def table(m) -> dict:
        return agent_status(m)["request_loop"]["answer_table"]

    wait_for(lambda: table(a)["pool"] > 0, what="pool blobs given to a's table")
    before = table(a)["create"]
    for i in range(20):
        (d / f"c{i}").write_text(f"c{i}")
    assert table(a)["create"] - before >= 15
    wait_published(a)
    wait_for(lambda: sorted(os.listdir(b.mountpoint / "made")) == sorted(["warm"] + [f"c{i}" for i in range(20)]),
             what="b's view of a's new files")
    assert (b.mountpoint / "made" / "c7").read_text() == "c7"
    assert info(b.mountpoint / "made" / "c7").get("primary") == "a"
    with open(b.mountpoint / "made" / "c7", "a") as f:  # a lets its lease go: b takes the file over
        f.write("+b")
    assert (b.mountpoint / "made" / "c7").read_text() == "c7+b"
    wait_published(b)
    wait_for(lambda: (a.mountpoint / "made" / "c7").read_text() == "c7+b", what="b's version on a")


def test_concurrent_writers_are_serialized_by_the_write_lease(two):
    a, b = two
    (a.mountpoint / "shared.log").write_text("")
    published_on(b, "shared.log")
    wait_published(a)
    f = open(a.mountpoint / "shared.log", "ab")  # a holds the write lease while it is open
    f.write(b"a1\n")
    f.flush()
    with pytest.raises(OSError) as exc:  # O_NONBLOCK: refused at once
        os.close(os.open(b.mountpoint / "shared.log", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    assert exc.value.errno == errno.EAGAIN
    opened_at = []

    def b_writes():
        with open(b.mountpoint / "shared.log", "ab") as g:  # waits for a's lease
            opened_at.append(time.monotonic())
            g.write(b"b1\n")

    t = threading.Thread(target=b_writes)
    t0 = time.monotonic()
    t.start()
    time.sleep(1.5)
    assert not opened_at, "b opened while a held the write lease"
    f.write(b"a2\n")
    f.close()
    closed_at = time.monotonic()
    t.join(30)
    assert opened_at and opened_at[0] >= closed_at - 0.05, (opened_at, closed_at - t0)
    # b took it over with a's complete bytes: nothing a wrote is lost
    assert (b.mountpoint / "shared.log").read_bytes() == b"a1\na2\nb1\n"
    wait_published(b)
    wait_for(lambda: (a.mountpoint / "shared.log").read_bytes() == b"a1\na2\nb1\n", what="a sees b's append")
    assert ownership(b)["lease_waits"] >= 1


def test_the_primary_keeps_its_write_lease_until_another_node_asks(hycache_mount, redis_cluster, dht_namespace,
                                                                    secret_file):
    """A file created here takes its write flag with its publication; opening it for
    writing later reuses the lease without asking the store, and closing it keeps the
    lease (idle). Another node that wants to write the file asks the holder to yield
    (inbox) and gets it long before the lease would run out."""
    from hycache_dht.redis_store import RedisClusterStore

    # leases of 30 s (a create's: 60 s): what this test sees cannot be their running out
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                        write_lease_seconds=30, write_lease_wait=120)
    store = RedisClusterStore(redis_cluster.nodes[:3], namespace=dht_namespace)
    try:
        (a.mountpoint / "mine").write_bytes(b"one")
        wait_published(a)
        assert store.get(b"/mine").writer == "a"  # taken with the create's publication
        before, lent = ownership(a), lent_writers(a)
        with open(a.mountpoint / "mine", "r+b") as f:  # mdtest's read phase opens O_RDWR
            assert f.read() == b"one"
            f.write(b"+two")
        after = ownership(a)
        assert after["lease_reuses"] == before["lease_reuses"] + 1
        # (with kernel passthrough, answered by the request reader with the idle lease)
        lent_open = lent_writers(a) - lent
        assert lent_open in (0, 1) and (lent_open == 1) == passthrough(a)
        assert after["lease_waits"] == before["lease_waits"]
        assert after["write_leases_held"] == 0 and after["write_leases_idle"] >= 1
        wait_published(a)
        assert store.get(b"/mine").writer == "a"  # kept, idle
        # a writer of a answered by the request reader holds the lease as one of the agent's:
        # b cannot have it meanwhile, and gets it once a closes
        lent = lent_writers(a)
        f = open(a.mountpoint / "mine", "r+b")
        assert lent_writers(a) == lent + (1 if passthrough(a) else 0)
        assert ownership(a)["write_leases_held"] == 1
        with pytest.raises(OSError) as exc:  # O_NONBLOCK: refused at once
            os.close(os.open(b.mountpoint / "mine", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        assert exc.value.errno == errno.EAGAIN
        f.close()
        # b takes the file over: a yields its idle lease at b's request
        with open(b.mountpoint / "mine", "ab") as g:
            g.write(b"+three")
        assert (b.mountpoint / "mine").read_bytes() == b"one+two+three"
        assert ownership(a)["leases_yielded"] == 1 and ownership(b)["takeovers"] == 1
        wait_published(b)
        wait_for(lambda: (a.mountpoint / "mine").read_bytes() == b"one+two+three", what="a sees b's append")
        assert store.get(b"/mine").writer == "b"  # b keeps it now, idle
        # a no longer holds the lease: its writers' opens are not answered without it
        lent = lent_writers(a)
        with open(a.mountpoint / "mine", "ab") as f:  # (takes it back from b)
            f.write(b"+four")
        assert lent_writers(a) == lent
        assert ownership(b)["leases_yielded"] == 1
        wait_published(a)
        assert store.get(b"/mine").writer == "a"
    finally:
        store.close()


def test_idle_leases_are_forgotten_and_leases_in_use_renewed(hycache_mount, redis_cluster, dht_namespace,
                                                              secret_file):
    """The renewal looks only at the idle leases due and at those in use: files created
    here keep their idle lease until it could run out (two lease periods from the create,
    less half a period), a removed file's idle lease goes at once, and a file held open
    for writing keeps its flag across many lease periods (renewed, never forgotten)."""
    from hycache_dht.redis_store import RedisClusterStore

    lease = 6.0  # a create's idle lease: 12 s, forgotten from 9 s on
    (a,) = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a",),
                        write_lease_seconds=lease)
    store = RedisClusterStore(redis_cluster.nodes[:3], namespace=dht_namespace)
    try:
        # (the file held open is in a directory of its own: its lease, idle once it closes,
        # may lapse before f9 is written, and would be taken again with f9's batch)
        (a.mountpoint / "held").mkdir()
        with open(a.mountpoint / "held" / "open", "wb") as f:
            t_open = time.monotonic()
            f.write(b"held")
            f.flush()
            for i in range(20):
                (a.mountpoint / f"f{i}").write_bytes(b"x")
            wait_published(a)
            own = ownership(a)
            assert own["write_leases_held"] == 1
            if time.monotonic() - t_open < 1.5 * lease:  # (a very slow machine: the idle ones may be gone)
                assert own["write_leases_idle"] == 20
                for i in range(5):
                    (a.mountpoint / f"f{i}").unlink()
                assert ownership(a)["write_leases_idle"] <= 15  # the removed files' went at once
            # the idle ones are forgotten once they could run out ...
            wait_for(lambda: ownership(a)["write_leases_idle"] == 0, timeout=30, what="idle leases forgotten")
            # ... while the open one is renewed past the create's own lease (2 periods)
            time.sleep(max(0.0, t_open + 2.5 * lease - time.monotonic()))
            assert ownership(a)["write_leases_held"] == 1 and ownership(a)["leases_lost"] == 0
            assert store.get(b"/held/open").writer == "a"
            f.write(b" still")
        assert (a.mountpoint / "held" / "open").read_bytes() == b"held still"
        # written again after its idle lease was forgotten: taken afresh from the store (an
        # open the agent answers, not the request reader: the lease was not lendable) ...
        lent, before = lent_writers(a), ownership(a)
        with open(a.mountpoint / "f9", "ab") as g:
            g.write(b"y")
        assert lent_writers(a) == lent
        assert ownership(a)["lease_waits"] == 0
        assert (a.mountpoint / "f9").read_bytes() == b"xy"
        # ... in one round trip with the other lapsed leases of its directory (f5-f19 but
        # f9: the removed files' are not taken), which the next opens reuse without asking
        after = ownership(a)
        assert after["lease_batches"] == before["lease_batches"] + 1
        assert after["leases_retaken"] == before["leases_retaken"] + 14
        assert store.get(b"/f12").writer == "a"
        for i in range(10, 20):
            with open(a.mountpoint / f"f{i}", "ab") as g:
                g.write(b"z")
        after = ownership(a)
        assert after["lease_batches"] == before["lease_batches"] + 1
        assert after["lease_reuses"] >= before["lease_reuses"] + 10
        assert (a.mountpoint / "f19").read_bytes() == b"xz"
    finally:
        store.close()


def test_a_node_that_was_down_learns_of_the_takeover_at_restart(hycache_mount, two):
    a, b = two
    (a.mountpoint / "report").write_bytes(b"old " * 1000)
    published_on(b, "report")
    wait_published(a)
    before = sha(a.mountpoint / "report")
    a.unmount()
    (b.mountpoint / "report").write_text("new")  # O_TRUNC: no bytes needed from a
    wait_published(b)
    a2 = hycache_mount.remount(a)
    assert sha(b.mountpoint / "report") != before
    wait_for(lambda: (a2.mountpoint / "report").read_text() == "new", timeout=30, what="a2 sees b's version")
    wait_for(lambda: ownership(a2)["taken_from_us"] == 1, what="a2 dropped its stale copy")
    assert info(a2.mountpoint / "report")["primary"] == "b"

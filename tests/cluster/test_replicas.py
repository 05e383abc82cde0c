"""Replicas (--replicas N): a node's loss does not lose the files that had replicas.
Real agents, real mounts, the session's real Redis Cluster."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
from clusterkit import agent_status, cluster_status, info, redis_addr, sha, start_agents, wait_for, wait_published
from hycache_agent.cluster.replicas import fine_mtime

pytestmark = pytest.mark.mount


def test_sync_replicas_survive_the_primary_being_killed(hycache_mount, redis_cluster, dht_namespace, secret_file):
    a, b, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                           names=("a", "b", "c"), replicas=1, replica_mode="sync")
    wait_for(lambda: cluster_status(a)["state"] == "ok" and cluster_status(a)["nodes_alive"] == ["a", "b", "c"],
             what="a ready and seeing b and c (heartbeats)")
    files = {f"f{i}": os.urandom(256 << 10) for i in range(6)}
    for name, data in files.items():
        (a.mountpoint / name).write_bytes(data)
        # sync: close(2) returned after the copy was durable on the other node
        assert len(info(a.mountpoint / name)["replicas"]) == 1
    holders = {info(a.mountpoint / n)["replicas"][0] for n in files}
    assert holders <= {"b", "c"} and len(holders) == 2, holders  # rendezvous hashing spreads them
    wait_published(a)
    kept = cluster_status(b)["replicas_kept"] + cluster_status(c)["replicas_kept"]
    assert kept == len(files)
    a.proc.kill()  # kill -9 the primary
    a.proc.wait()
    for name, data in files.items():  # every file is still readable, from its replica
        assert (b.mountpoint / name).read_bytes() == data
        assert sha(c.mountpoint / name) == sha(b.mountpoint / name)
    # writing one takes it over from the dead primary, with the bytes of the replica
    with open(b.mountpoint / "f0", "ab") as f:
        f.write(b"!")
    assert (b.mountpoint / "f0").read_bytes() == files["f0"] + b"!"
    wait_published(b)
    wait_for(lambda: (c.mountpoint / "f0").read_bytes() == files["f0"] + b"!", what="b's version on c")
    a2 = hycache_mount.remount(a, after_kill=True)  # a learns of the takeover at restart
    wait_for(lambda: (a2.mountpoint / "f0").read_bytes() == files["f0"] + b"!", timeout=30,
             what="a2 sees b's version")


def test_a_sync_replica_goes_to_a_node_that_joined_since_the_last_heartbeat(hycache_mount, redis_cluster,
                                                                            dht_namespace, secret_file):
    """The list of live nodes a writer keeps is its last heartbeat's (every 2 s): a node
    that registered since is not in it.  A replica that finds too few holders there looks
    at the registry itself before it gives up (a file written right after another node
    started used to get no replica, and a sync writer's close did not wait for one)."""
    (a,) = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a",),
                        replicas=1, replica_mode="sync")
    wait_for(lambda: cluster_status(a)["state"] == "ok" and cluster_status(a)["nodes_alive"] == ["a"],
             what="a alone")
    (b,) = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("b",),
                        replicas=1, replica_mode="sync")
    wait_for(lambda: cluster_status(b)["state"] == "ok", what="b registered")
    seen = cluster_status(a)["nodes_alive"]
    (a.mountpoint / "right-after").write_bytes(b"x" * 65536)
    # sync: close(2) returned after the copy was on b, whether a's heartbeat had seen b or not
    assert info(a.mountpoint / "right-after")["replicas"] == ["b"], f"a saw {seen} before the write"
    assert cluster_status(b)["replicas_kept"] == 1


def test_async_replicas_follow_writes_renames_and_removals(hycache_mount, redis_cluster, dht_namespace,
                                                           secret_file):
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, replicas=1)
    wait_for(lambda: cluster_status(b)["state"] == "ok", what="b ready")
    (a.mountpoint / "doc").write_text("v1")
    wait_for(lambda: info(a.mountpoint / "doc")["replicas"] == ["b"], what="the async push")
    assert cluster_status(b)["replicas_kept"] == 1
    (a.mountpoint / "doc").write_text("version 2")  # a new write clears the list, then re-pushes
    wait_for(lambda: info(a.mountpoint / "doc")["replicas"] == ["b"] and
             cluster_status(a)["replication"]["pushed_files"] >= 2, what="the second push")
    wait_published(a)
    (a.mountpoint / "doc").rename(a.mountpoint / "doc2")
    wait_published(a)
    wait_for(lambda: cluster_status(b)["ownership"]["inbox_messages"] >= 1, what="b told of the rename")
    a.unmount()  # with a gone, b reads doc2 from the replica it keeps under the new name
    assert (b.mountpoint / "doc2").read_text() == "version 2"
    a2 = hycache_mount.remount(a)
    os.stat(a2.mountpoint / "doc2")  # its attributes in a2's answer table, not removable there
    table = agent_status(a2)["request_loop"]["answer_table"]
    (a2.mountpoint / "doc2").unlink()
    assert agent_status(a2)["request_loop"]["answer_table"]["unlink"] == table["unlink"], \
        "a file with a replica is removed by the agent, which tells the holder"
    wait_for(lambda: cluster_status(b)["replicas_kept"] == 0, what="the replica dropped with the file")


def test_a_push_to_a_node_that_just_stopped_goes_to_the_next_node(hycache_mount, redis_cluster, dht_namespace,
                                                                   secret_file):
    import hashlib

    a, b, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                           names=("a", "b", "c"), replicas=1, replica_mode="sync")
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b", "c"], what="a sees b and c")

    def first_choice(name: str) -> str:  # Replicator.targets: rendezvous hashing over b and c
        return max(("b", "c"), key=lambda n: hashlib.sha1(n.encode() + b"\0/" + name.encode()).digest())

    name = next(f"f{i}" for i in range(100) if first_choice(f"f{i}") == "b")
    b.unmount()  # b's registry entry stays "alive" for a while (the heartbeat TTL)
    data = os.urandom(1 << 20)
    (a.mountpoint / name).write_bytes(data)  # sync: close returns once a replica is durable
    assert info(a.mountpoint / name)["replicas"] == ["c"]
    assert cluster_status(c)["replicas_kept"] == 1
    wait_published(a)
    a.proc.kill()  # the replica serves the file
    a.proc.wait()
    assert (c.mountpoint / name).read_bytes() == data
    hycache_mount.remount(a, after_kill=True)  # (the fixture wants every agent to exit cleanly)


def _replica_bytes(m, name: str) -> bytes:
    """The replica ``m`` keeps of ``/name`` (replicas.ReplicaStore: SLOW/replicas/<sha1>.data)."""
    import hashlib

    return (m.slow / "replicas" / (hashlib.sha1(b"/" + name.encode()).hexdigest() + ".data")).read_bytes()


def test_sync_replica_pushed_at_fsync_matches_a_close_after_overwrites(hycache_mount, redis_cluster, dht_namespace,
                                                                       secret_file):
    """Sync mode pushes at fsync (beside the local fsync); writes after it, even ones that
    only overwrite earlier bytes (same size, within the same clock tick), are pushed by the
    close: the replica is byte-identical to the file whenever close (or fsync) returns, and
    a close with nothing written since the fsync pushes nothing."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                        replicas=1, replica_mode="sync")
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b"], what="a sees b")
    data = bytearray(os.urandom(6 << 20))
    fd = os.open(a.mountpoint / "ow", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for off in range(0, len(data), 1 << 20):  # 1 MiB writes, as dd bs=1M
            os.pwrite(fd, data[off:off + (1 << 20)], off)
        os.fsync(fd)  # the push runs beside the local fsync
        if fine_mtime(str(a.fast)):
            assert _replica_bytes(b, "ow") == data
            assert info(a.mountpoint / "ow")["replicas"] == ["b"]
        for off in (0, 3 << 20, len(data) - 4096):  # rewrite earlier bytes, size unchanged
            patch = os.urandom(4096)
            os.pwrite(fd, patch, off)
            data[off:off + 4096] = patch
    finally:
        os.close(fd)  # close returns once the new bytes are durable on b
    assert _replica_bytes(b, "ow") == data
    assert info(a.mountpoint / "ow")["replicas"] == ["b"]
    # (a file system without multigrain timestamps, before Linux 6.13: pushes only at close)
    fine = fine_mtime(str(a.fast))
    rep = cluster_status(a)["replication"]
    assert rep["pushed_at_fsync"] == (1 if fine else 0) and rep["pushed_files"] == 2, rep

    # write + fsync + close, as dd conv=fsync: one push, at the fsync; the close adds none
    more = os.urandom(3 << 20)
    with open(a.mountpoint / "dd", "wb") as f:
        f.write(more)
        f.flush()
        os.fsync(f.fileno())
    assert _replica_bytes(b, "dd") == more
    rep = cluster_status(a)["replication"]
    assert rep["pushed_at_fsync"] == (2 if fine else 0) and rep["pushed_files"] == 3, rep

    # an acknowledged fsync survives the primary's kill -9 with the file still open
    if not fine:
        return
    last = os.urandom(2 << 20)
    fd = os.open(a.mountpoint / "open", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, last)
    os.fsync(fd)
    wait_published(a)
    a.proc.kill()
    a.proc.wait()
    with contextlib.suppress(OSError):  # the mount's agent is gone
        os.close(fd)
    for name, want in (("ow", bytes(data)), ("dd", more), ("open", last)):
        assert (b.mountpoint / name).read_bytes() == want, name
    hycache_mount.remount(a, after_kill=True)  # (the fixture wants every agent to exit cleanly)


def _mid_push(holder, timeout: float = 30.0) -> None:
    """Until ``holder`` is receiving a push (a non-empty temp file in its staging dir)."""
    staging = holder.slow / "peer-staging"

    def receiving() -> bool:
        return any(e.name.endswith(".part") and e.stat().st_size > 0 for e in os.scandir(staging))

    wait_for(receiving, timeout=timeout, what="a push under way")


def _write_synced(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_async_push_cut_by_the_holders_kill_is_pushed_again(hycache_mount, redis_cluster, dht_namespace,
                                                             secret_file):
    """The holder is killed while an async replica streams in: the writer counts the
    file unreplicated, tries again, and once the holder is back the replica lands whole;
    the cut push's temp file does not outlive the holder's restart."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, replicas=1,
                        fast_capacity="512M")
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b"], what="a sees b")
    data = os.urandom(192 << 20)
    _write_synced(a.mountpoint / "big", data)
    _mid_push(b)
    b.proc.kill()
    b.proc.wait()
    wait_for(lambda: cluster_status(a)["replication"]["failures"] >= 1, what="the cut push counted")
    assert info(a.mountpoint / "big")["replicas"] == []
    b2 = hycache_mount.remount(b, after_kill=True)
    wait_for(lambda: info(a.mountpoint / "big")["replicas"] == ["b"], timeout=60, what="the push done again")
    assert _replica_bytes(b2, "big") == data
    assert [e for e in os.listdir(b2.slow / "peer-staging") if e.endswith(".part")] == []


def test_async_push_cut_by_the_writers_kill_resumes_at_restart(hycache_mount, redis_cluster, dht_namespace,
                                                               secret_file):
    """The writer (the pusher) is killed mid-push: the file's ledger entry names no
    replica, so the restarted writer pushes it again without a new write, and the holder
    keeps exactly the file's bytes."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, replicas=1,
                        fast_capacity="512M")
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b"], what="a sees b")
    data = os.urandom(192 << 20)
    _write_synced(a.mountpoint / "big", data)
    _mid_push(b)
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: not [e for e in os.listdir(b.slow / "peer-staging") if e.endswith(".part")],
             what="b dropped the cut push")
    assert cluster_status(b)["replicas_kept"] == 0
    a2 = hycache_mount.remount(a, after_kill=True)
    wait_for(lambda: info(a2.mountpoint / "big")["replicas"] == ["b"], timeout=60, what="the push resumed")
    assert _replica_bytes(b, "big") == data
    assert (a2.mountpoint / "big").read_bytes() == data
    assert cluster_status(a2)["replication"]["pushed_files"] == 1


def test_sync_push_in_parts_lands_and_a_cut_one_leaves_nothing(hycache_mount, redis_cluster, dht_namespace,
                                                               secret_file):
    """Sync replicas of large files go in byte ranges at once (--push-streams 2): the
    replica is current when the close returns and byte-exact; the writer killed (-9) in the
    middle of such a push leaves the holder no staged file and no replica, and the
    restarted writer pushes the file again."""
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, replicas=1,
                        replica_mode="sync", fast_capacity="512M")
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b"], what="a sees b")
    one = os.urandom(40 << 20)
    _write_synced(a.mountpoint / "one", one)
    assert info(a.mountpoint / "one")["replicas"] == ["b"]
    assert _replica_bytes(b, "one") == one
    big = os.urandom(192 << 20)

    def write_big() -> None:
        with contextlib.suppress(OSError):  # (the agent is killed under it)
            _write_synced(a.mountpoint / "big", big)

    writer = threading.Thread(target=write_big)
    writer.start()
    staging = b.slow / "peer-staging"
    _mid_push(b)
    # the parts write at their offsets into one file, sized whole before the first byte
    assert [e.stat().st_size for e in os.scandir(staging) if e.name.endswith(".part")] == [len(big)]
    a.proc.kill()
    a.proc.wait()
    writer.join()
    wait_for(lambda: not [e for e in os.listdir(staging) if e.endswith(".part")], what="b dropped the cut push")
    assert cluster_status(b)["replicas_kept"] == 1
    a2 = hycache_mount.remount(a, after_kill=True)
    wait_for(lambda: info(a2.mountpoint / "big")["replicas"] == ["b"], timeout=60, what="the push done again")
    assert _replica_bytes(b, "big") == big and _replica_bytes(b, "one") == one

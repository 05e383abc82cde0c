"""HCCache on the remote read path (issue 12): real agents, real mounts, the session's
real Redis Cluster.  Readers never see stale or torn bytes while another node rewrites a
file, the memory bound holds under a flood (the agent's RSS too), dedup is right when
every content collides on the hash, and a holder killed mid-read gives a replica's bytes
or EIO, never wrong bytes."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading

import pytest
from clusterkit import AGENT, cluster_status, info, redis_addr, start_agents, wait_for, wait_published

pytestmark = pytest.mark.mount
MiB = 1 << 20


def hccache(m) -> dict:
    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["hccache"]


def rss(m) -> int:
    with open(f"/proc/{m.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def version_bytes(k: int, size: int) -> bytes:
    """Version k of a file: a header naming k, then k's byte pattern (a torn read mixes two)."""
    return (b"v%06d|" % k + bytes([k % 251]) * size)[:size]


def check_version(data: bytes, size: int) -> int:
    assert data[:1] == b"v", data[:16]
    k = int(data[1:7])
    assert data == version_bytes(k, size), f"torn or wrong bytes (header says version {k})"
    return k


# small: a cold small file is copied whole at open as with HCCache off and the same bytes
# go into memory (remote/reader.py copies_small); small-memory: without the fast-tier second
# level it is fetched by its first read and served from memory; large-blocks: 3 MiB is more
# than a quarter of an 8 MiB fast tier, so it is read by blocks through memory; large-copy:
# with 64 MiB it is copied whole at open and read through passthrough (remote/reader.py
# wants_copy); small-off: HCCache off, a small file's copy is one range request written
# whole (remote/copy.py SMALL_WHOLE)
@pytest.mark.parametrize("size,fast,hcc,second", [(100 << 10, "64M", "64M", True), (100 << 10, "64M", "64M", False),
                                                  (3 * MiB, "8M", "64M", True), (3 * MiB, "64M", "64M", True),
                                                  (100 << 10, "64M", "0", True)],
                         ids=["small", "small-memory", "large-blocks", "large-copy", "small-off"])
def test_readers_never_see_stale_or_torn_bytes_while_another_node_rewrites(
        hycache_mount, redis_cluster, dht_namespace, secret_file, size, fast, hcc, second):
    a, b, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                           names=("a", "b", "c"), write_lease_seconds=3, hccache_size=hcc,
                           hccache_block_size="64K", fast_capacity=fast, no_hccache_second_level=not second)
    (a.mountpoint / "f").write_bytes(version_bytes(0, size))
    wait_for(lambda: (c.mountpoint / "f").exists(), what="a's file on c")
    wait_published(a)
    assert check_version((c.mountpoint / "f").read_bytes(), size) == 0
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []
    failures: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                with open(c.mountpoint / "f", "rb") as f:
                    chunks = []
                    while chunk := f.read(48 << 10):  # reads across block boundaries
                        chunks.append(chunk)
                data = b"".join(chunks)
            except OSError as exc:  # the version it opened is gone from every holder
                failures.append(exc.errno)
                continue
            try:
                seen.append(check_version(data, size))
            except AssertionError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        last = 0
        for k in range(1, 6):
            # the writer on b replaces the file atomically (a new name, renamed over it):
            # the first rewrite takes the name over from a
            tmp = b.mountpoint / f".f.tmp{k}"
            tmp.write_bytes(version_bytes(k, size))
            os.rename(tmp, b.mountpoint / "f")
            last = k
            wait_published(b)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors[:3]
    assert set(failures) <= {errno.EIO, errno.ENOENT, errno.ESTALE}, failures
    assert len(seen) > 10 and len(set(seen)) >= 2, (seen, failures)
    # no stale byte: once the last version is published, a new open on c reads it
    wait_for(lambda: check_version((c.mountpoint / "f").read_bytes(), size) == last, timeout=30,
             what="c reads the last version")
    if hcc == "0":  # every open fetched a whole copy of its version
        assert cluster_status(c)["remote_fetches"] > 0
        return
    st = hccache(c)
    assert st["mode"] == "hybrid" and st["memory_bytes"] <= st["limit_bytes"]
    if fast == "64M" and size > 1 * MiB:  # whole copies: the stream never went through memory
        assert st["lookups"] == 0 and cluster_status(c)["remote_fetches"] > 0
        return
    if second and size < 1 * MiB:  # copied whole at each cold open; the same bytes went into memory
        assert st["inserts"] > 0 and st["object_fetches"] > 0 and cluster_status(c)["remote_fetches"] > 0
        return
    assert st["lookups"] > 0 and st["hit_ratio"] is not None


def test_the_memory_bound_holds_under_a_flood(hycache_mount, redis_cluster, dht_namespace, secret_file):
    limit = 16 * MiB
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                        names=("a", "c"), hccache_size=limit, hccache_block_size="64K")
    smalls = {f"s{i}": os.urandom(100 << 10) for i in range(200)}  # 20 MiB of small files
    for name, data in smalls.items():
        (a.mountpoint / name).write_bytes(data)
    larges = {f"L{i}": os.urandom(24 * MiB) for i in range(5)}  # 120 MiB of large ones
    for name, data in larges.items():
        (a.mountpoint / name).write_bytes(data)
    wait_published(a)
    wait_for(lambda: (c.mountpoint / "L4").exists(), what="a's files on c")
    # warm up the agent (code paths, connection pool), then measure
    (c.mountpoint / "s0").read_bytes()
    before = rss(c)
    peak_cache = 0
    for _round in range(2):
        for name, data in {**smalls, **larges}.items():
            assert (c.mountpoint / name).read_bytes() == data
            if name.endswith("0"):
                st = hccache(c)
                peak_cache = max(peak_cache, st["memory_bytes"])
                assert st["memory_bytes"] <= st["limit_bytes"] == limit
    after = rss(c)
    st = hccache(c)
    assert st["memory_bytes"] <= limit and st["evictions"] > 0
    assert peak_cache > limit // 2  # the cache was really used
    # 280 MiB went through a 16 MiB cache: the agent grew by at most the cache plus slack
    assert after - before < limit + 64 * MiB, (before, after)


def test_dedup_is_right_when_every_content_collides(hycache_mount, redis_cluster, dht_namespace, secret_file,
                                                     monkeypatch):
    monkeypatch.setenv("HYCACHE_HCCACHE_FORCE_COLLISIONS", "1")
    # a 1 MiB fast tier: the large files (356 and 512 KiB) are more than a quarter of it, so
    # they are read by blocks through memory (not streamed whole into a fast-tier copy)
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                        names=("a", "c"), hccache_size="64M", hccache_block_size="64K", fast_capacity="1M")
    same = os.urandom(50 << 10)
    other = os.urandom(50 << 10)
    block = os.urandom(64 << 10)
    files = {"x1": same, "x2": same, "y": other, "big": block * 8, "big2": block * 4 + other + same}
    for name, data in files.items():
        (a.mountpoint / name).write_bytes(data)
    wait_published(a)
    wait_for(lambda: (c.mountpoint / "big2").exists(), what="a's files on c")
    for _ in range(2):
        for name, data in files.items():
            assert (c.mountpoint / name).read_bytes() == data, name
    st = hccache(c)
    # x1/x2 share one object, y collides with it but is stored apart; big's 8 equal blocks
    # are one chunk, shared with big2's first 4
    assert st["hash_collisions"] >= 3, st
    assert st["dedup_saved_bytes"] >= len(same) + 11 * len(block), st
    assert st["memory_bytes"] <= st["limit_bytes"]


# blocks: 32 MiB is more than a quarter of a 64 MiB fast tier (read by blocks); stream: with
# 512 MiB it is streamed whole into the fast tier (remote/copy.py), failing over to the replica
@pytest.mark.parametrize("fast", ["64M", "512M"], ids=["blocks", "stream"])
def test_a_holder_killed_mid_read_gives_a_replicas_bytes_or_eio(hycache_mount, redis_cluster, dht_namespace,
                                                                secret_file, fast):
    a, b, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace,
                           names=("a", "b", "c"), replicas=1, replica_mode="sync", hccache_size="8M",
                           hccache_block_size="64K", fast_capacity=fast)
    wait_for(lambda: cluster_status(a)["nodes_alive"] == ["a", "b", "c"], what="a sees b and c")
    data = os.urandom(32 * MiB)
    (a.mountpoint / "big").write_bytes(data)
    assert len(info(a.mountpoint / "big")["replicas"]) == 1
    wait_published(a)
    wait_for(lambda: (c.mountpoint / "big").exists(), what="a's file on c")
    got = bytearray()
    errs = []
    with open(c.mountpoint / "big", "rb") as f:
        got += f.read(4 * MiB)
        a.proc.kill()  # kill -9 the primary mid-read
        a.proc.wait()
        while True:
            try:
                chunk = f.read(1 * MiB)
            except OSError as exc:
                errs.append(exc.errno)
                break
            if not chunk:
                break
            got += chunk
    assert bytes(got) == data[:len(got)], "wrong bytes after the holder died"
    assert set(errs) <= {errno.EIO}
    if not errs:
        assert len(got) == len(data)  # all of it, the rest from the replica on b
    assert (c.mountpoint / "big").read_bytes() == data  # a new open reads the replica
    hycache_mount.remount(a, after_kill=True)  # (the fixture wants every agent to exit cleanly)


@pytest.mark.parametrize("hccache_size", ["0", "256M"], ids=["off", "hybrid"])
def test_a_large_file_streams_in_then_reads_through_passthrough(hycache_mount, redis_cluster, dht_namespace,
                                                                 secret_file, hccache_size):
    """The first open of a large remote file streams it whole into the fast tier (one GET);
    reads, random then sequential, are right; a later open reads the copy without a new
    fetch, through passthrough where the host has it (the agent then sees no read).

    The kernel may forget an inode nobody holds at any moment (a cache drop anywhere on
    the machine: benchmarks write /proc/sys/vm/drop_caches before every step); the copy
    then outlives it (cluster/kept.py, test_remote_refetch.py).  An O_PATH descriptor
    holds the name here (no FUSE open: the agent sees the second open after the first
    one's release), and the test drops the caches itself between the opens."""
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a", "c"),
                        hccache_size=hccache_size, fast_capacity="512M")
    data = os.urandom(48 * MiB)
    (a.mountpoint / "big").write_bytes(data)
    wait_published(a)
    # the holder publishes the size at close and may publish the blob's final mtime a little
    # later (its passthrough release): wait for that, or c would rightly fetch the new entry
    wait_for(lambda: os.stat(c.mountpoint / "big").st_mtime_ns == os.stat(a.mountpoint / "big").st_mtime_ns,
             what="a's final entry on c")
    pin = os.open(c.mountpoint / "big", os.O_PATH)  # c's inode stays known (see above)
    try:
        with open(c.mountpoint / "big", "rb") as f:  # random reads first
            for off in (40 * MiB, 3 * MiB + 7, 47 * MiB + 100):
                f.seek(off)
                assert f.read(5000) == data[off:off + 5000]
            f.seek(0)
            assert f.read() == data

        def status() -> dict:
            out = subprocess.run([AGENT, "status", str(c.root), "--json"], capture_output=True, text=True,
                                 check=True)
            return json.loads(out.stdout)

        before = status()["counters"]["remote"]
        assert before["fetches"] == 1 and before["fetch_bytes"] == len(data)
        with open("/proc/sys/vm/drop_caches", "w") as f:  # dentries and inodes nobody holds: FORGET
            f.write("2\n")
        assert (c.mountpoint / "big").read_bytes() == data
        st = status()
        after = st["counters"]["remote"]
        assert after["fetches"] == 1  # not fetched again
        if st["passthrough"]["enabled"]:
            assert after["read_bytes"] == before["read_bytes"], "the second open was served by the agent"
        else:
            assert after["read_bytes"] == before["read_bytes"] + len(data)
    finally:
        os.close(pin)


@pytest.mark.parametrize("hccache_size", ["0", "256M"], ids=["off", "hybrid"])
def test_reopens_right_after_the_kernel_forgets_find_their_copy(hycache_mount, redis_cluster, dht_namespace,
                                                                secret_file, hccache_size):
    """The kernel forgetting a remote inode removes its fast-tier copy in a worker thread,
    after the node is gone; a reopen of the same path at the same version in that moment
    fetches a new copy.  Each fetch has its own file name, so the late removal of the old
    copy never takes the new one: every reopen reads the file (before: ENOENT now and then,
    seen in remote_bench's mixed row)."""
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a", "c"),
                        hccache_size=hccache_size)
    files = {f"s{i}": os.urandom(4096 + 997 * i) for i in range(24)}
    for name, data in files.items():
        (a.mountpoint / name).write_bytes(data)
    wait_published(a)
    for name in files:
        wait_for(lambda n=name: os.stat(c.mountpoint / n).st_mtime_ns == os.stat(a.mountpoint / n).st_mtime_ns,
                 what=f"a's final entry of {name} on c")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader(k: int) -> None:
        names = list(files)[k::3]
        try:
            while not stop.is_set():
                for name in names:
                    assert (c.mountpoint / name).read_bytes() == files[name]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(60):  # the kernel forgets the readers' inodes under their feet
            with open("/proc/sys/vm/drop_caches", "w") as f:  # dentries and inodes: FORGET
                f.write("2\n")
            if errors:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]

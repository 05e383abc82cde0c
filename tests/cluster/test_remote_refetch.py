"""A remote file's copy outlives the kernel's inode (cluster/kept.py): real agents, real
mounts, the session's real Redis Cluster.

The kernel forgets a FUSE inode whenever its dentry and inode caches are dropped (memory
pressure, or ``drop_caches`` by any process, as here).  The next open of the same
unchanged file must read the copy already on this node's fast tier, not fetch the file
again; a file whose bytes changed meanwhile must be fetched again, even when its writer
set its mtime back (a utimes after the write: only the ctime tells)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from clusterkit import AGENT, cluster_status, redis_addr, start_agents, wait_for, wait_published

pytestmark = pytest.mark.mount
MiB = 1 << 20


def status(m) -> dict:
    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def forget_all(m) -> None:
    """The kernel forgets every inode it may: ``m``'s remote nodes leave its view."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
    wait_for(lambda: cluster_status(m)["remote_nodes_cached"] == 0, what=f"{m.mountpoint} forgot its inodes")


def test_a_forgotten_inodes_copy_serves_the_same_bytes_and_never_changed_ones(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace)
    first = os.urandom(2 * MiB)
    (a.mountpoint / "f").write_bytes(first)
    wait_published(a)
    wait_for(lambda: (b.mountpoint / "f").exists(), what="a's file on b")
    assert (b.mountpoint / "f").read_bytes() == first
    s0 = status(b)
    assert s0["counters"]["remote"]["fetches"] == 1
    # forgotten and reopened, unchanged: the kept copy, no fetch, a fast-tier hit
    forget_all(b)
    assert (b.mountpoint / "f").read_bytes() == first
    s1 = status(b)
    assert s1["counters"]["remote"]["fetches"] == 1
    assert s1["counters"]["fast"]["hits"] == s0["counters"]["fast"]["hits"] + 1
    assert s1["cluster"]["copies_kept"] == {"files": 0, "bytes": 0, "adopted": 1}
    assert s1["tiers"]["fast"]["remote_cache_bytes"] == 2 * MiB
    # forgotten again, then rewritten on a with the same size and its old mtime put back:
    # the new bytes are fetched, the kept copy goes
    forget_all(b)
    st = os.stat(a.mountpoint / "f")
    second = os.urandom(2 * MiB)
    with open(a.mountpoint / "f", "r+b") as f:
        f.write(second)
    os.utime(a.mountpoint / "f", ns=(st.st_atime_ns, st.st_mtime_ns))
    wait_published(a)
    assert os.stat(a.mountpoint / "f").st_mtime_ns == st.st_mtime_ns
    assert (b.mountpoint / "f").read_bytes() == second
    s2 = status(b)
    assert s2["counters"]["remote"]["fetches"] == 2
    assert s2["cluster"]["copies_kept"] == {"files": 0, "bytes": 0, "adopted": 1}
    assert s2["tiers"]["fast"]["remote_cache_bytes"] == 2 * MiB
    wait_for(lambda: len(os.listdir(b.fast / "remote-cache")) == 1, what="the old copy removed")


def test_a_pin_on_the_holder_costs_no_refetch(hycache_mount, redis_cluster, dht_namespace, secret_file):
    # a pin republishes the holder's entry (a new version of the same bytes); the
    # announcement makes the reader's kernel forget the name, and with it the inode
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace)
    data = os.urandom(2 * MiB)
    (a.mountpoint / "f").write_bytes(data)
    wait_published(a)
    wait_for(lambda: (b.mountpoint / "f").exists(), what="a's file on b")
    assert (b.mountpoint / "f").read_bytes() == data
    assert status(b)["counters"]["remote"]["fetches"] == 1
    announced = cluster_status(b)["invalidations"]["kernel_invalidations"]
    os.setxattr(a.mountpoint / "f", "user.hycache.pinned", b"1")  # what the burst buffer's stage-in does
    wait_published(a)
    wait_for(lambda: cluster_status(b)["invalidations"]["kernel_invalidations"] > announced,
             what="the pin announced to b")
    wait_for(lambda: cluster_status(b)["remote_nodes_cached"] == 0, what="b's kernel forgot the inode")
    assert (b.mountpoint / "f").read_bytes() == data
    s = status(b)
    assert s["counters"]["remote"]["fetches"] == 1
    assert s["cluster"]["copies_kept"]["adopted"] == 1

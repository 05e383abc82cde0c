"""The engine's counters for files held by another node (issue 8): an open of a remote
file is a miss, its bytes count as remote reads, its fetch as a remote fetch; the peer
service's /metrics shows them without authentication."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from clusterkit import AGENT, cluster_status, redis_addr, start_agents, wait_for, wait_published
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.mount

K = 1 << 10


@pytest.fixture
def secret_file(tmp_path) -> Path:
    p = tmp_path / "cluster-secret"
    p.write_bytes(os.urandom(24).hex().encode())
    p.chmod(0o600)
    return p


def counters(m) -> dict:
    import json
    import subprocess

    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["counters"]


def test_remote_reads_count_as_misses_remote_bytes_and_fetches(hycache_mount, redis_cluster, dht_namespace,
                                                               secret_file):
    # passthrough off: the holder's write is counted in bytes only when it reaches the agent
    a, b = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, passthrough="off")
    payload = os.urandom(100 * K)
    (a.mountpoint / "shared.bin").write_bytes(payload)
    wait_published(a)
    wait_for(lambda: (b.mountpoint / "shared.bin").exists(), what="a's file on b")
    before = counters(b)
    assert (b.mountpoint / "shared.bin").read_bytes() == payload
    # a name never looked up: a request the kernel cannot answer from its caches (the read
    # above may need none: the entry and attributes are cached since the wait's lookup)
    assert not (b.mountpoint / f"absent-{os.urandom(4).hex()}").exists()
    c = counters(b)
    assert c["misses"] == before["misses"] + 1 and c["remote"]["opens"] == before["remote"]["opens"] + 1
    assert c["remote"]["read_bytes"] == before["remote"]["read_bytes"] + 100 * K
    assert c["remote"]["fetches"] == before["remote"]["fetches"] + 1
    assert c["remote"]["fetch_bytes"] == before["remote"]["fetch_bytes"] + 100 * K
    assert c["fast"]["hits"] == before["fast"]["hits"]  # nothing of it was local
    assert c["metadata_ops"] > before["metadata_ops"]
    # the holder counted nothing remote, and its write on its fast tier
    ca = counters(a)
    assert ca["fast"]["write_bytes"] >= 100 * K and ca["remote"]["read_bytes"] == 0
    # b's peer service: /metrics without authentication
    listen = b.opts["listen"]

    def metrics() -> dict:
        text = httpx.get(f"http://{listen}/metrics", timeout=10).raise_for_status().text
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}

    got = metrics()
    assert got["hycache_remote_fetches_total"] >= 1 and got["hycache_remote_read_bytes_total"] >= 100 * K
    assert got["hycache_misses_total"] >= 1
    # HCCache is on by default: a cold small file is copied whole as without it, and the same
    # bytes go into memory (remote/reader.py copies_small: 100 KiB hashed in a worker thread
    # behind the open, up to 64 KiB inserted on the loop)
    tiny = os.urandom(16 * K)
    (a.mountpoint / "tiny.bin").write_bytes(tiny)
    wait_published(a)
    assert (b.mountpoint / "tiny.bin").read_bytes() == tiny
    got = wait_for(lambda: (g := metrics())["hycache_hccache_memory_bytes"] >= 116 * K and g,
                   what="both files' bytes in memory")
    fetches, fast_hits = got["hycache_remote_fetches_total"], counters(b)["fast"]["hits"]
    # the kernel forgets the inodes, their copies are kept (cluster/kept.py): reopens of the
    # unchanged files read them from the fast tier, no fetch
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
    wait_for(lambda: cluster_status(b)["remote_nodes_cached"] == 0, what="b forgot the files' inodes")
    assert (b.mountpoint / "shared.bin").read_bytes() == payload
    assert (b.mountpoint / "tiny.bin").read_bytes() == tiny
    got = metrics()
    assert counters(b)["fast"]["hits"] == fast_hits + 2 and got["hycache_remote_fetches_total"] == fetches
    assert cluster_status(b)["copies_kept"]["adopted"] == 2
    assert got["hycache_hccache_limit_bytes"] == 256 << 20

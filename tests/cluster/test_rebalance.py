"""Periodic rebalance: a node whose fast tier stays hot hands files to a cold node, which
takes them over. Real agents, real mounts, the session's real Redis Cluster."""

from __future__ import annotations

import os

import pytest
from clusterkit import cluster_status, free_port, info, redis_addr, sha, wait_for, wait_published

pytestmark = pytest.mark.mount


def test_a_hot_fast_tier_hands_its_eviction_victims_to_a_cold_node(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    common = dict(redis=redis_addr(redis_cluster), dht_namespace=dht_namespace, cluster_secret_file=secret_file,
                  rebalance_interval=0.5, rebalance_rounds=2)
    hot = hycache_mount(fast_capacity="8M", node_id="hot", listen=f"127.0.0.1:{free_port()}", **common)
    cold = hycache_mount(fast_capacity="64M", node_id="cold", listen=f"127.0.0.1:{free_port()}", **common)
    digests = {}
    for i in range(7):  # 7 MiB on an 8 MiB fast tier: above the low watermark (70 %), below high
        data = os.urandom(1 << 20)
        (hot.mountpoint / f"part-{i}").write_bytes(data)
        digests[f"part-{i}"] = sha(hot.mountpoint / f"part-{i}")
    wait_published(hot)
    wait_for(lambda: cluster_status(cold)["rebalance"]["adopted_files"] >= 1, timeout=30, what="an adoption")

    def primaries_follow_adoptions():
        # the cold node adopts a round's files one by one: compare with its count now,
        # not with a count read while the round's later adoptions were still under way
        adopted = cluster_status(cold)["rebalance"]["adopted_files"]
        moved = [n for n in digests if info(hot.mountpoint / n).get("primary") == "cold"]
        return len(moved) == adopted and moved

    moved = wait_for(primaries_follow_adoptions, timeout=30, what="hot sees the new primaries")
    wait_published(cold)
    st_hot = cluster_status(hot)["rebalance"]
    assert st_hot["handed_over_files"] >= len(moved) and st_hot["rounds_acted"] >= 1, st_hot
    # the cold node holds them on its fast tier now; the hot node's fast tier has room again
    assert all(info(cold.mountpoint / n)["tier"] == "fast" for n in moved)
    wait_for(lambda: cluster_status(hot)["ownership"]["taken_from_us"] >= len(moved), what="hot dropped its copies")
    status_hot = cluster_status(hot)
    assert st_hot["handed_over_bytes"] >= len(moved) << 20, status_hot
    # nothing was lost or changed, wherever it lives
    for name, digest in digests.items():
        assert sha(hot.mountpoint / name) == sha(cold.mountpoint / name) == digest

"""pytest fixtures: a real local Redis Cluster for the whole session.

Use from any test directory::

    pytest_plugins = ["hycache_dht.testing"]

    def test_something(redis_cluster, dht_namespace):
        store = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace)

``redis_cluster`` starts 3 masters + 3 replicas on free loopback ports (``cluster-node-timeout``
2000 ms, so a failover takes a few seconds) in a temporary directory and stops them at the
end of the session. Tests that kill nodes must leave the cluster healthy again
(``redis_cluster.start_node(port)`` + ``wait_healthy()``), since the cluster is shared.
``dht_namespace`` gives each test its own key prefix, so tests never see each other's keys.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

from .localcluster import LocalRedisCluster, find_free_base

_counter = itertools.count()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    base = find_free_base(6)
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"), base,
                                node_timeout_ms=int(os.environ.get("HYCACHE_REDIS_NODE_TIMEOUT", "2000")))
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def dht_namespace() -> str:
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"

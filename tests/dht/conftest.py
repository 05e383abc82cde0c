"""Fixtures of the metadata store tests: one ``store`` parametrized over both engines.

The Redis engine runs against the session's real local Redis Cluster
(:mod:`hycache_dht.testing`, loaded by the test modules through ``pytest_plugins``); each
test gets its own key namespace. Every test ends with an invariant check: ``fsck`` finds
nothing to repair.
"""

from __future__ import annotations

import pytest
from hycache_dht.local_store import LocalStore
from hycache_dht.redis_store import RedisClusterStore

ENGINES = ["local", "redis"]


@pytest.fixture
def open_store(engine, request, tmp_path):
    """Open a store of the engine under test; several calls share one backend (the same
    SQLite file, the same Redis namespace), like several agents would."""
    opened = []

    def factory(**kw):
        if engine == "local":
            s = LocalStore(tmp_path / "meta.db", **kw)
        else:
            cluster = request.getfixturevalue("redis_cluster")
            ns = request.getfixturevalue("dht_namespace")
            kw.setdefault("op_timeout", 30.0)
            s = RedisClusterStore(cluster.nodes, namespace=ns, **kw)
        opened.append(s)
        return s

    yield factory
    for s in opened:
        s.close()


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture
def store(open_store):
    s = open_store()
    yield s
    s.step_hook = None
    rep = s.fsck()
    assert rep["problems"] == 0, rep

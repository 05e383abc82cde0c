"""A local Redis Cluster for a test, a bench or a demo, and the cluster secret its agents share."""

from __future__ import annotations

import secrets
from pathlib import Path

from hycache_dht.localcluster import LocalRedisCluster, find_free_base

from .procs import write_secret


def start_redis_cluster(directory: Path, *, masters: int = 3, replicas: int = 1, start: int = 20000,
                        stop: int = 29000) -> LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each on free ports between ``start``
    and ``stop``, their files in ``directory``; started and healthy."""
    base = find_free_base(masters * (1 + replicas), start=start, stop=stop)
    return LocalRedisCluster(directory, base, masters=masters, replicas=replicas).start()


def cluster_secret(path: Path, nbytes: int = 32) -> Path:
    """A new random cluster secret (the agents' ``--cluster-secret-file``), mode 0600."""
    return write_secret(path, secrets.token_hex(nbytes))

"""Helpers of the multi-agent tests: agents on loopback ports against a real Redis
Cluster, their status, and polling."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from hycache_dht.localcluster import LocalRedisCluster
from hycache_harness import executable, free_port, redis_seeds
from hycache_harness import wait_for as _wait_for

REPO = Path(__file__).resolve().parents[2]
AGENT = executable("hycache-agent")


def redis_addr(cluster: LocalRedisCluster) -> str:
    return redis_seeds(cluster.nodes)


def start_agents(hycache_mount, redis: str, secret: Path, namespace: str, names=("a", "b"), **opts):
    opts.setdefault("fast_capacity", "64M")
    return [hycache_mount(redis=redis, dht_namespace=namespace, node_id=name,
                          listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret, **opts)
            for name in names]


def agent_status(m) -> dict:
    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def cluster_status(m) -> dict:
    return agent_status(m)["cluster"]


def lent_writers(m) -> int:
    """Opens for writing the agent's answer table answered with a lent registration."""
    table = agent_status(m)["request_loop"]["answer_table"]
    assert table is not None, "pyfuse3 without the answer table (scripts/bootstrap.sh builds it)"
    return int(table["open_lent_writers"])


def wait_for(predicate, timeout=20.0, what="condition"):
    """The harness's ``wait_for``; an OSError (a name not visible through a mount yet) means "not yet"."""
    return _wait_for(predicate, timeout, what, ignore=(OSError,))


def wait_published(*mounts, timeout: float = 30.0) -> None:
    """Until every agent has committed what it was told and its outbox is empty, plus the
    kernel's entry timeout (1 s), after which a lookup on another node finds the newest
    version.  A close the answer table answered (a lent open's RELEASE: the file's size
    at close) reaches the agent at its next drain, which comes before any request the
    agent answers itself: a listing of the mount root first."""
    for m in mounts:
        os.listdir(m.mountpoint)  # (OPENDIR: the agent drains what the table answered first)

        def published(m=m) -> tuple | None:
            """None once done, else what is left (the timeout's message names it)."""
            st = agent_status(m)
            left = st["metadata"]["pending"], st["cluster"]["backlog"]
            return None if left == (0, 0) else left

        # (one status call a poll: the message no longer asks for one up front)
        wait_for(lambda: published() is None, timeout=timeout,
                 what=f"{m.mountpoint}'s changes committed and its outbox drained (pending, backlog)")
    time.sleep(1.1)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def info(path: Path) -> dict:
    """The agent's view of one file (xattr user.hycache.info)."""
    return json.loads(os.getxattr(path, "user.hycache.info"))

"""Helpers of the multi-agent tests: agents on loopback ports against a real Redis
Cluster, their status, and polling."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

from hycache_dht.localcluster import LocalRedisCluster

REPO = Path(__file__).resolve().parents[2]
AGENT = str(REPO / ".venv" / "bin" / "hycache-agent")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_addr(cluster: LocalRedisCluster) -> str:
    return ",".join(f"{h}:{p}" for h, p in cluster.nodes[:3])


def start_agents(hycache_mount, redis: str, secret: Path, namespace: str, names=("a", "b"), **opts):
    opts.setdefault("fast_capacity", "64M")
    return [hycache_mount(redis=redis, dht_namespace=namespace, node_id=name,
                          listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret, **opts)
            for name in names]


def cluster_status(m) -> dict:
    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["cluster"]


def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def wait_published(*mounts, timeout: float = 30.0) -> None:
    """Until every agent's outbox is empty, plus the kernel's entry timeout (1 s), after
    which a lookup on another node finds the newest version."""
    for m in mounts:
        wait_for(lambda: cluster_status(m)["backlog"] == 0, timeout=timeout,
                 what=f"{m.mountpoint}'s outbox drained (status: {cluster_status(m)})")
    time.sleep(1.1)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def info(path: Path) -> dict:
    """The agent's view of one file (xattr user.hycache.info)."""
    return json.loads(os.getxattr(path, "user.hycache.info"))

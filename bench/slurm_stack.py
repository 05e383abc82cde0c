"""The stack a Slurm workflow runs on (bench/slurm_workflow.py, tests/slurm/test_workflow.py):
a control plane (SQLite) on a Redis Cluster (the caller's, or one started here), three
agents named n1–n3 (FUSE mounts, 64 MiB fast tiers, slow tiers on one file system on a
throttled loop device: bench/slowtier.py) linked to it, and a Slurm cluster whose nodes
are n1–n3 with HyCache's plugins (``cluster_cls``: tests/slurm/slurmcluster.py's
SlurmCluster).  Everything is started through hycache_harness and stopped, by pid, on
exit; the temp directories under ``base`` are the caller's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from hycache_harness import (
    Agent,
    ControlPlane,
    cluster_secret,
    create_token,
    kill_pid,
    redis_seeds,
    start_redis_cluster,
    wait_for,
    write_secret,
)
from slowtier import SlowTier

NODES = ["n1", "n2", "n3"]
#: the burst buffer's bound on a job's wait for its staging (hycache-slurm.conf stage_wait)
STAGE_WAIT = 30


class Stack:
    def __init__(self, cp: ControlPlane, api: httpx.Client, mounts: dict[str, Path], slurm: Any,
                 slow: SlowTier, token_file: Path) -> None:
        self.cp, self.api, self.mounts, self.slurm, self.slow = cp, api, mounts, slurm, slow
        self.token_file = token_file  # the admin token (mode 0600)

    def kill_control_plane(self) -> None:
        """SIGKILL: no goodbye to the agents or to Slurm."""
        kill_pid(self.cp.pid)


@contextlib.contextmanager
def stack(base: Path, cluster_cls: Any, *, mbps: float = 20.0, seeds: str | None = None,
          namespace: str = "slurmwf", fast_capacity: str = "64M") -> Iterator[Stack]:
    base.chmod(0o755)  # the jobs (nobody) reach the mounts under it
    with contextlib.ExitStack() as ex:
        if seeds is None:
            rc = start_redis_cluster(base / "redis")
            ex.callback(rc.stop)
            seeds = redis_seeds(rc.nodes)
        slow = SlowTier(mbps, size="1G", base=base)
        ex.callback(slow.close)
        db = f"sqlite:///{base}/control.db"
        cp = ControlPlane("--redis", seeds, "--dht-namespace", namespace, "--heartbeat-interval", "0.5",
                          db=db, log=base / "control.log", state_dir=base).start()
        ex.callback(cp.stop)
        admin = create_token(db, "admin", "slurm")
        secret = cluster_secret(base / "cluster.secret")
        mounts = {}
        for n in NODES:
            tok = write_secret(base / f"{n}.token", create_token(db, "node", f"node-{n}", n))
            (base / n).mkdir(mode=0o755)
            agent = Agent(base / n / "root", n, "--fast-capacity", fast_capacity, "--slow", str(slow.share(n)),
                          "--control-plane", cp.url, "--control-token-file", str(tok),
                          mountpoint=base / n / "mnt", log=base / n / "agent.log", redis=seeds, secret=secret,
                          namespace=namespace, log_level=None, append_log=True)
            ex.callback(agent.stop)
            agent.start(60)
            mounts[n] = agent.mnt
        token_file = write_secret(base / "slurm.token", admin)
        conf = (f"url = {cp.url}\ntoken_file = {token_file}\nsubmit_timeout = 2\nhttp_timeout = 3\n"
                f"stage_wait = {STAGE_WAIT}\npoll_interval = 0.25\npublish_wait = 10\n")
        api = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
        ex.callback(api.close)
        for n in NODES:
            wait_for(lambda n=n: api.get(f"/api/v1/nodes/{n}").json().get("state") == "up", 60, f"{n} up")
        slurm = cluster_cls(NODES, hycache_conf=conf)
        ex.callback(slurm.stop)
        slurm.start()
        yield Stack(cp, api, mounts, slurm, slow, token_file)

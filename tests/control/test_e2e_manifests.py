"""2-Layer Scheduling end to end: the control plane server (SQLite, the real Redis
Cluster), two real agents with FUSE mounts linked to it, the tiny WfFormat 1.5 instance
(scaled) run by the workflow runner (``hycache_control.runner``, what ``hycache-control
run`` does): placement → plans carried out by the agents → jobs run as real reads and
writes through the mounts.  Every input was on its node's fast tier when its job opened it
(the agents' miss counters did not grow) and the bytes fetched between nodes equal the
placement's reported figure."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from hycache_control.runner import Runner

from .conftest import CONTROL_BIN, cli, redis_seeds, start_server, wait_for

TINY = Path(__file__).resolve().parents[1] / "core" / "data" / "wfformat-1.5-tiny.json"
AGENT_PORTS: list[int] = []


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture
def linked_cluster(redis_cluster, dht_namespace, hycache_mount, tmp_path):
    db = f"sqlite:///{tmp_path / 'control.db'}"
    seeds = redis_seeds(redis_cluster)
    srv = start_server(db, tmp_path, "--redis", seeds, "--dht-namespace", dht_namespace,
                       "--heartbeat-interval", "0.5")
    try:
        secret = _private(tmp_path / "cluster.secret", os.urandom(32).hex())
        mounts = {}
        for name in ("a", "b"):
            tok = cli("token", "create", "--db", db, "--scope", "node", "--node-id", name).stdout.strip()
            tf = _private(tmp_path / f"{name}.token", tok)
            mounts[name] = hycache_mount(fast_capacity="64M", redis=seeds, dht_namespace=dht_namespace, node_id=name,
                                         listen=f"127.0.0.1:{_free_port()}", cluster_secret_file=secret,
                                         control_plane=srv.url, control_token_file=tf)
        h = {"Authorization": f"Bearer {srv.admin}"}

        def up():
            r = httpx.get(srv.url + "/api/v1/nodes", headers=h, timeout=5).json()
            return {n["id"] for n in r["items"] if n["state"] == "up" and n["tiers"]} >= {"a", "b"}
        wait_for(up, 60, "both agents up at the control plane")
        yield srv, mounts
    finally:
        srv.stop()


def test_workflow_runs_with_its_inputs_on_the_fast_tier(linked_cluster, tmp_path):
    srv, mounts = linked_cluster
    runner = Runner(srv.url, srv.admin, {n: m.mountpoint for n, m in mounts.items()}, scale=0.01, plan_wait=60)
    res = runner.run(json.loads(TINY.read_text()))
    assert set(res["jobs"]) == {"ID01", "ID02", "ID03", "ID04", "ID05", "ID06"}
    assert {j["node"] for j in res["jobs"].values()} == {"a", "b"}
    # every job's prefetch/evict steps were carried out before it started
    for jid, j in res["jobs"].items():
        assert set(j["plan_steps"]) <= {"done"}, (jid, j["plan_steps"], res["steps"])
        assert j["bytes_read"] > 0 or jid == "ID01"
    assert res["failed_steps"] == [], res["failed_steps"]
    assert all(c["pending"] == 0 for c in res["steps"].values()), res["steps"]
    c = res["counters"]
    # every input was on its node's fast tier when its job opened it
    for n in ("a", "b"):
        assert c[n]["after"]["misses"] == c[n]["before"]["misses"], (n, c[n])
        assert c[n]["after"]["fast"]["hits"] > c[n]["before"]["fast"]["hits"]
    # the bytes moved between nodes are the placement's figure
    moved = sum(c[n]["after"]["remote"]["fetch_bytes"] - c[n]["before"]["remote"]["fetch_bytes"] for n in ("a", "b"))
    assert res["transfer_bytes"]["placed"] > 0
    assert moved == res["transfer_bytes"]["placed"], (moved, res["transfer_bytes"], c)
    m = httpx.get(f"{srv.url}/api/v1/manifests/{res['manifest_id']}",
                  headers={"Authorization": f"Bearer {srv.admin}"}).json()
    assert m["state"] == "done" and all(j["state"] == "done" for j in m["jobs"])
    # the CLI: --help, and a bad --mount named
    out = subprocess.run([str(CONTROL_BIN), "run", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--mount" in out.stdout
    tok = _private(tmp_path / "admin.token", srv.admin)
    out = subprocess.run([str(CONTROL_BIN), "run", str(TINY), "--api", srv.url, "--token-file", str(tok),
                          "--mount", "a"], capture_output=True, text=True)
    assert out.returncode == 2 and "--mount" in out.stderr

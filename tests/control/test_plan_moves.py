"""Layer 2 and the moves under way on a node, on the real cluster: the control plane
server (SQLite, the real Redis Cluster) and a real agent whose slow tier is a throttled
device (``bench/slowtier.py``: a loop device limited to 16 MB/s by the blkio controller;
root needed), so that a demotion stays under way for seconds.

The agent reports its moves under way (``tiers.fast.moving_in_bytes``,
``moving_out_bytes``, ``moving``), and a prefetch released while a demotion is still
moving a file off the fast tier waits for that room instead of failing for it."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import httpx
import pytest
from hycache_agent.control import local as agent_control
from hycache_control.runner import Runner
from hycache_harness import cluster_secret, free_port, wait_for, write_secret

from .conftest import cli, redis_seeds, start_server

REPO = Path(__file__).resolve().parents[2]
M = 1 << 20


def _slowtier_module():
    spec = importlib.util.spec_from_file_location("slowtier", REPO / "bench" / "slowtier.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def throttled_slow_tier():
    if os.geteuid() != 0:
        pytest.skip("a throttled loop device needs root")
    mod = _slowtier_module()
    if not (mod.BLKIO / "blkio.throttle.read_bps_device").exists():
        pytest.skip("no cgroup v1 blkio throttle")
    st = mod.SlowTier(16, size="512M")
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def node_on_a_slow_device(redis_cluster, dht_namespace, hycache_mount, tmp_path, throttled_slow_tier):
    """One agent (node a, 64 MiB fast tier, its slow tier on the throttled device) linked to
    a control plane that asks for a heartbeat every 60 s: the census a plan starts from is
    the one from before the test's moves began (steps still arrive at once, pushed)."""
    db = f"sqlite:///{tmp_path / 'control.db'}"
    seeds = redis_seeds(redis_cluster)
    srv = start_server(db, tmp_path, "--redis", seeds, "--dht-namespace", dht_namespace,
                       "--heartbeat-interval", "60")
    try:
        secret = cluster_secret(tmp_path / "cluster.secret")
        tok = cli("token", "create", "--db", db, "--scope", "node", "--node-id", "a").stdout.strip()
        slow = throttled_slow_tier.mnt / "a"
        slow.mkdir()
        m = hycache_mount(fast_capacity="64M", redis=seeds, dht_namespace=dht_namespace, node_id="a",
                          listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret, slow=slow,
                          control_plane=srv.url, control_token_file=write_secret(tmp_path / "a.token", tok))
        h = {"Authorization": f"Bearer {srv.admin}"}

        def up():
            r = httpx.get(srv.url + "/api/v1/nodes", headers=h, timeout=5).json()
            return any(n["id"] == "a" and n["state"] == "up" and n["tiers"] for n in r["items"])
        wait_for(up, 60, "node a up at the control plane")
        yield srv, m
    finally:
        srv.stop()


def _tier(path: Path) -> str:
    return os.getxattr(path, "user.hycache.tier").decode()


def test_a_prefetch_released_while_a_demotion_is_under_way_waits_for_its_room(node_on_a_slow_device):
    srv, m = node_on_a_slow_device
    mnt = m.mountpoint
    h = {"Authorization": f"Bearer {srv.admin}"}
    (mnt / "in.dat").write_bytes(b"i" * (24 * M))
    os.setxattr(mnt / "in.dat", "user.hycache.tier", b"slow")
    wait_for(lambda: _tier(mnt / "in.dat") == "slow", 30, "in.dat demoted")
    Runner(srv.url, srv.admin, {"a": mnt}).wait_published({"in.dat": 24 * M}, "a")
    # 48 MiB of another file on the fast tier, then its demotion: about 3 s at 16 MB/s
    (mnt / "old.dat").write_bytes(b"o" * (48 * M))
    os.setxattr(mnt / "old.dat", "user.hycache.tier", b"slow")

    def status():
        return agent_control.request(m.root / "state", {"op": "status"})
    fast = wait_for(lambda: (s := status()["tiers"]["fast"])["moving_out_bytes"] and s, 10, "the demotion under way")
    # the agent reports the move: its bytes and the file
    assert fast["moving_out_bytes"] == 48 * M and fast["moving_in_bytes"] == 0, fast
    assert {"path": "/old.dat", "to": "slow", "bytes": 48 * M} in fast["moving"], fast
    assert fast["used"] >= 48 * M

    # a job on a that reads in.dat: its prefetch (24 MiB) is released at submission, while
    # old.dat still takes 48 of the 64 MiB
    doc = {"version": 1, "name": "moves", "jobs": [
        {"name": "j1", "accesses": [{"path": "in.dat", "size": 24 * M}, {"path": "out.dat", "size": 1000, "op": "W"}]}]}
    t0 = time.monotonic()
    r = httpx.post(f"{srv.url}/api/v1/manifests", params={"nodes": "a", "prefetch_first": "true"}, json=doc, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    assert [s["action"] for s in r.json()["plans"]["a"]][:1] == ["prefetch"]
    assert status()["tiers"]["fast"]["moving_out_bytes"] == 48 * M  # still under way after the release

    def prefetch_final():
        items = httpx.get(f"{srv.url}/api/v1/manifests/{mid}", headers=h, timeout=10).json()["step_items"]
        pre = [i for i in items if i["plan_action"] == "prefetch"]
        return pre if pre and all(i["state"] in ("done", "failed", "skipped") for i in pre) else None
    pre = wait_for(prefetch_final, 50, "the prefetch's result")
    assert [(i["path"], i["state"]) for i in pre] == [("/in.dat", "done")], (pre, time.monotonic() - t0)
    assert _tier(mnt / "in.dat") == "fast" and _tier(mnt / "old.dat") == "slow"
    fast = status()["tiers"]["fast"]
    assert fast["moving"] == [] and fast["moving_in_bytes"] == fast["moving_out_bytes"] == 0

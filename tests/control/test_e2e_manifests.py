"""2-Layer Scheduling end to end: the control plane server (SQLite, the real Redis
Cluster), two real agents with FUSE mounts linked to it, the tiny WfFormat 1.5 instance
(scaled) run by the workflow runner (``hycache_control.runner``, what ``hycache-control
run`` does): placement → plans carried out by the agents → jobs run as real reads and
writes through the mounts.  An input missed the fast tier only when its prefetch had not
reached the node when its job started (the job never waits for those) or its job was its
node's first (it reads its inputs where they are), and the bytes
fetched between nodes equal the placement's reported figure.  With the heartbeat interval
at 60 s, a released plan step still reaches its agent: through the push channel."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from hycache_agent.control import local as agent_control
from hycache_control.runner import Runner
from hycache_core.workflow import parse_workflow
from hycache_harness import cluster_secret, free_port, wait_for, write_secret

from .conftest import CONTROL_BIN, cli, redis_seeds, start_server

TINY = Path(__file__).resolve().parents[1] / "core" / "data" / "wfformat-1.5-tiny.json"
AGENT_PORTS: list[int] = []


def _linked(redis_cluster, dht_namespace, hycache_mount, tmp_path, interval: str):
    db = f"sqlite:///{tmp_path / 'control.db'}"
    seeds = redis_seeds(redis_cluster)
    srv = start_server(db, tmp_path, "--redis", seeds, "--dht-namespace", dht_namespace,
                       "--heartbeat-interval", interval)
    try:
        secret = cluster_secret(tmp_path / "cluster.secret")
        mounts = {}
        for name in ("a", "b"):
            tok = cli("token", "create", "--db", db, "--scope", "node", "--node-id", name).stdout.strip()
            tf = write_secret(tmp_path / f"{name}.token", tok)
            mounts[name] = hycache_mount(fast_capacity="64M", redis=seeds, dht_namespace=dht_namespace, node_id=name,
                                         listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret,
                                         control_plane=srv.url, control_token_file=tf)
        h = {"Authorization": f"Bearer {srv.admin}"}

        def up():
            r = httpx.get(srv.url + "/api/v1/nodes", headers=h, timeout=5).json()
            return {n["id"] for n in r["items"] if n["state"] == "up" and n["tiers"]} >= {"a", "b"}
        wait_for(up, 60, "both agents up at the control plane")
        yield srv, mounts
    finally:
        srv.stop()


@pytest.fixture
def linked_cluster(redis_cluster, dht_namespace, hycache_mount, tmp_path):
    yield from _linked(redis_cluster, dht_namespace, hycache_mount, tmp_path, "0.5")


@pytest.fixture
def slow_heartbeat_cluster(redis_cluster, dht_namespace, hycache_mount, tmp_path):
    """The agents are told to send a heartbeat every 60 s."""
    yield from _linked(redis_cluster, dht_namespace, hycache_mount, tmp_path, "60")


def test_workflow_runs_with_its_inputs_on_the_fast_tier(linked_cluster, tmp_path):
    srv, mounts = linked_cluster
    runner = Runner(srv.url, srv.admin, {n: m.mountpoint for n, m in mounts.items()}, scale=0.01, plan_wait=60)
    res = runner.run(json.loads(TINY.read_text()))
    assert set(res["jobs"]) == {"ID01", "ID02", "ID03", "ID04", "ID05", "ID06"}
    assert {j["node"] for j in res["jobs"].values()} == {"a", "b"}
    # when a job started, each of its prefetches had ended, was under way on its node (the
    # job read that input after it ended) or had not reached the node (skipped: the job
    # read the file where it was)
    skipped = 0
    for jid, j in res["jobs"].items():
        assert set(j["plan_steps"]) <= {"done", "delivered", "skipped"}, (jid, j["plan_steps"], res["steps"])
        skipped += j["plan_steps"].get("skipped", 0)
        assert j["bytes_read"] > 0 or jid == "ID01"
    assert res["failed_steps"] == [], res["failed_steps"]
    assert all(c["pending"] == 0 for c in res["steps"].values()), res["steps"]
    c = res["counters"]
    # an input missed its node's fast tier only if its prefetch was skipped, or if it is
    # an input of its node's first job (which reads its local inputs where they are: no
    # prefetch planned; the node's later jobs read those in place too, from the page cache)
    wf = parse_workflow(json.loads(TINY.read_text()))
    first = {n: min((j for j in res["jobs"] if res["jobs"][j]["node"] == n), key=lambda j: res["jobs"][j]["started"])
             for n in ("a", "b")}
    in_place = sum(len(set(wf.job(j).inputs) & set(wf.job(first[res["jobs"][j]["node"]]).inputs))
                   for j in res["jobs"])
    misses = sum(c[n]["after"]["misses"] - c[n]["before"]["misses"] for n in ("a", "b"))
    assert misses <= skipped + in_place, (misses, skipped, in_place, c)
    for n in ("a", "b"):
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
    tok = write_secret(tmp_path / "admin.token", srv.admin)
    out = subprocess.run([str(CONTROL_BIN), "run", str(TINY), "--api", srv.url, "--token-file", str(tok),
                          "--mount", "a"], capture_output=True, text=True)
    assert out.returncode == 2 and "--mount" in out.stderr


def test_a_released_step_reaches_the_agent_between_heartbeats(slow_heartbeat_cluster):
    """Heartbeats every 60 s: the prefetch released at submission is carried out by node a
    (its result sent early, with the heartbeat a finished action triggers), having come
    through the push channel."""
    srv, mounts = slow_heartbeat_cluster
    size = 1 << 20
    (mounts["b"].mountpoint / "in.dat").write_bytes(b"p" * size)
    runner = Runner(srv.url, srv.admin, {n: m.mountpoint for n, m in mounts.items()})
    runner.wait_published({"in.dat": size}, "b")
    doc = {"version": 1, "name": "push", "jobs": [
        {"name": "j1", "accesses": [{"path": "in.dat", "size": size}, {"path": "out.dat", "size": 1000, "op": "W"}]}]}
    h = {"Authorization": f"Bearer {srv.admin}"}
    r = httpx.post(f"{srv.url}/api/v1/manifests", params={"nodes": "a", "prefetch_first": "true"}, json=doc, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    m = r.json()
    assert [s["action"] for s in m["plans"]["a"]][:1] == ["prefetch"]

    def step_done():
        items = httpx.get(f"{srv.url}/api/v1/manifests/{m['id']}", headers=h, timeout=10).json()["step_items"]
        return all(i["state"] in ("done", "skipped") for i in items if i["plan_action"] == "prefetch") and items
    items = wait_for(step_done, 50, "the prefetch carried out (the next regular heartbeat is 60 s away)")
    assert [i["state"] for i in items if i["plan_action"] == "prefetch"] == ["done"]
    link = agent_control.request(mounts["a"].root / "state", {"op": "status"})["control"]
    assert link["push"] == "ok" and link["pushed_actions"] >= 1 and link["interval"] == 60, link

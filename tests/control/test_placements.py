"""Online placement (issue 21): ``POST /api/v1/placements`` — this job reads these files,
where should it run now — and ``hycache-control place``.  The control plane in-process
(and, for the command, as a real server) on SQLite with the real Redis Cluster."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hycache_dht.meta import dir_meta

from .conftest import Api, cli, make_token, redis_seeds, start_server
from .test_api import file_meta, store  # noqa: F401  (the store fixture)

MB = 1 << 20
STATUS = {"tiers": {"fast": {"capacity": 256 * MB, "used": 0}, "slow": {"capacity": 1 << 40, "used": 0}}}

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_placement_endpoint_follows_the_dht(api: Api, store):  # noqa: F811
    store.create(b"/in", dir_meta())
    store.create(b"/in/big.dat", file_meta("b", size=64 * MB))
    store.create(b"/in/small.dat", file_meta("a", size=1 * MB))
    for n in ("a", "b"):
        assert api.beat(n, status=STATUS).status_code == 200
    r = api.post("/api/v1/placements", {"inputs": ["/in/big.dat", "/in/small.dat", "/in/nowhere"]}, token=api.read)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["node"] == "b" and out["bytes_moved"] == {"a": 64 * MB, "b": 1 * MB}
    assert out["locations"] == {"/in/big.dat": "b", "/in/small.dat": "a", "/in/nowhere": None}
    assert out["slow_tier_bytes"] == 0 and out["candidates"] == ["a", "b"]
    # relative paths are under /; the candidates can be named
    r = api.post("/api/v1/placements", {"inputs": ["in/small.dat"], "nodes": ["a"]})
    assert r.status_code == 200 and r.json()["node"] == "a"
    # inputs on no node: the two nodes tie; the one sent fewer jobs lately gets the next
    got = [api.post("/api/v1/placements", {"inputs": ["/in/nowhere"]}).json()["node"] for _ in range(4)]
    assert sorted(got) == ["a", "a", "b", "b"]
    # a footprint no node has room for, an unknown node: 422 naming the field
    r = api.post("/api/v1/placements", {"inputs": ["/in/big.dat"], "footprint": 1 << 40})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "inputs"]
    r = api.post("/api/v1/placements", {"inputs": [], "nodes": ["zz"]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "nodes"]
    # documented in the OpenAPI document
    doc = api.client.get("/openapi.json").json()
    assert doc["paths"]["/api/v1/placements"]["post"]["operationId"] == "placeJob"
    # queries are not audited as submissions
    events = api.get("/api/v1/events", params={"limit": 500}).json()["items"]
    assert not any("placements" in (e.get("message") or "") for e in events)


def test_place_command_against_a_real_server(db_url, redis_cluster, dht_namespace, store, tmp_path):  # noqa: F811
    store.create(b"/w", dir_meta())
    store.create(b"/w/ref.db", file_meta("b", size=8 * MB))
    srv = start_server(db_url, tmp_path, "--redis", redis_seeds(redis_cluster), "--dht-namespace", dht_namespace)
    try:
        for n in ("a", "b"):
            tok = make_token(db_url, "node", f"node-{n}", n)
            body = {"node_id": n, "version": "0.1.0", "boot_id": "boot-1", "seq": 1, "sent_at": time.time(),
                    "address": None, "status": STATUS, "counters": {}, "policy_version": 0, "action_results": []}
            r = httpx.post(f"{srv.url}/api/v1/nodes/{n}/heartbeats", json=body,
                           headers={"Authorization": f"Bearer {tok}"}, timeout=30)
            assert r.status_code == 200, r.text
        token_file = tmp_path / "token"
        token_file.write_text(srv.admin)
        mount_a, mount_b = tmp_path / "mnt-a", tmp_path / "mnt-b"
        p = cli("place", "--api", srv.url, "--token-file", str(token_file),
                "--mount", f"a={mount_a}", "--mount", f"b={mount_b}", str(mount_a / "w" / "ref.db"))
        assert p.stdout.split() == ["b", str(mount_b)]
        # (the nodes are named: their heartbeats may be older than the down window by now)
        p = cli("place", "--api", srv.url, "--token-file", str(token_file), "--json",
                "--mount", f"a={mount_a}", "--mount", f"b={mount_b}", "/w/ref.db")
        assert json.loads(p.stdout)["bytes_moved"] == {"a": 8 * MB, "b": 0}
        p = cli("place", "--api", srv.url, "--token-file", str(token_file), "--mount", "zz=/x", "/w/ref.db",
                check=False)
        assert p.returncode != 0 and "unknown node" in p.stderr
    finally:
        srv.stop()

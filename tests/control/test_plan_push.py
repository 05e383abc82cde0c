"""The push channel of plan steps (issue 21): ``GET /api/v1/nodes/{id}/plan?wait=&after=``
answers a waiting node as soon as steps are released to it — here with no heartbeat sent
at all — and, on PostgreSQL, when another control-plane process released them (the bus).
The control plane in-process on the real database and the real Redis Cluster."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient
from hycache_control.app import create_app
from hycache_control.control import Control
from hycache_harness import wait_for

from .conftest import Api
from .test_api import store  # noqa: F401  (the store fixture)
from .test_manifests import submit

BEFORE = ("prefetch", "evict")


def poll(client: TestClient, token: str, node: str, **params):
    r = client.get(f"/api/v1/nodes/{node}/plan", params=params, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()


def poll_in_thread(client: TestClient, token: str, node: str, **params):
    out: list[dict] = []
    t = threading.Thread(target=lambda: out.append(poll(client, token, node, **params)), daemon=True)
    t.start()
    return t, out


def before_steps(m: dict, node: str, job: str) -> list[int]:
    return sorted(s["step"] for s in m["plans"][node] if s["job"] == job and s["action"] in BEFORE)


def first_jobs(m: dict) -> dict[str, list[str]]:
    order: dict[str, list[str]] = {}
    for j in sorted(m["jobs"], key=lambda j: (j["node"], j["position"])):
        order.setdefault(j["node"], []).append(j["id"])
    return order


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_released_steps_reach_a_waiting_node_without_a_heartbeat(api: Api, store):  # noqa: F811
    m = submit(api, store)  # two heartbeats (a, b) register the nodes; none is sent after this
    mid, order = m["id"], first_jobs(m)
    parents = {j["id"]: j["parents"] for j in m["jobs"]}
    url = "/api/v1/nodes/a/plan"
    # only node a's own token
    for tok in (api.node_token("b"), api.read, api.admin):
        assert api.get(url, token=tok).status_code == 403
    ta = api.node_token("a")
    # the first poll (no version) answers at once: what is deliverable now, a's first job's steps
    first = poll(api.client, ta, "a", wait=30)
    a_first = order["a"][0]
    assert not parents[a_first]
    assert sorted(d["step"] for d in first["actions"]) == before_steps(m, "a", a_first) != []
    assert all(d["manifest_id"] == mid and d["job"] == a_first for d in first["actions"])
    # b's first job waits for a parent on a: b's poll waits
    tb = api.node_token("b")
    b_first = order["b"][0]
    assert parents[b_first]
    vb = poll(api.client, tb, "b", wait=0)["version"]
    t_b, out_b = poll_in_thread(api.client, tb, "b", wait=60, after=vb)
    wait_for(lambda: "b" in api.control.actions._watchers, 30, "b's poll waiting")
    # a's job (and b's first job's other parents) run and finish: no heartbeat from anyone
    done = set()
    for p in [a_first] + [p for p in parents[b_first] if p != a_first]:
        for ev in ("start", "finish"):
            assert api.post(f"/api/v1/manifests/{mid}/jobs/{p}/{ev}").status_code == 200
        done.add(p)
        if set(parents[b_first]) <= done:
            break
    # the waiting poll was answered by a wake (a new version), and steps of b's first job
    # came through polls only (each poll after the previous version, as the agent does)
    got: dict[int, dict] = {}
    t_b.join(60)
    assert out_b and out_b[0]["version"] != vb
    ans = out_b[0]
    for _ in range(10):
        got.update({d["step"]: d for d in ans["actions"] if d["job"] == b_first})
        if sorted(got) == before_steps(m, "b", b_first):
            break
        ans = poll(api.client, tb, "b", wait=0, after=ans["version"])
    assert sorted(got) == before_steps(m, "b", b_first) != []
    items = api.get(f"/api/v1/manifests/{mid}").json()["step_items"]
    assert all(i["state"] == "delivered" for i in items if i["node"] == "b" and i["job"] == b_first
               and i["plan_action"] in BEFORE)
    # a poll with the current version waits; one with a stale version answers at once
    t, out = poll_in_thread(api.client, tb, "b", wait=60, after=ans["version"])
    wait_for(lambda: "b" in api.control.actions._watchers, 30, "b's poll waiting again")
    assert not out
    assert poll(api.client, tb, "b", wait=60, after="stale.0")["actions"]
    api.control.actions.wake(["b"])  # what any release does
    t.join(60)
    assert out and out[0]["version"] != ans["version"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_release_in_another_process_wakes_the_poll(api: Api, store):  # noqa: F811
    """Two control-plane processes (two Control objects, each with its own bus listener) on
    one PostgreSQL database: the node polls the second, the first releases."""
    other = Control(api.control.settings, migrate=False)
    with TestClient(create_app(api.control.settings, other)) as client2:
        wait_for(lambda: other.bus.others() and api.control.bus.others(), 30, "the two processes hear each other")
        m = submit(api, store)
        mid, order = m["id"], first_jobs(m)
        parents = {j["id"]: j["parents"] for j in m["jobs"]}
        tb = api.node_token("b")
        b_first = order["b"][0]
        vb = poll(client2, tb, "b", wait=0)["version"]
        t, out = poll_in_thread(client2, tb, "b", wait=60, after=vb)
        wait_for(lambda: "b" in other.actions._watchers, 30, "b's poll waiting on the second process")
        for p in parents[b_first]:
            for ev in ("start", "finish"):
                assert api.post(f"/api/v1/manifests/{mid}/jobs/{p}/{ev}").status_code == 200
        t.join(60)
        assert out and out[0]["version"] != vb
        ans = out[0]
        got = {d["step"] for d in ans["actions"] if d["job"] == b_first}
        for _ in range(10):
            if sorted(got) == before_steps(m, "b", b_first):
                break
            ans = poll(client2, tb, "b", wait=5, after=ans["version"])
            got |= {d["step"] for d in ans["actions"] if d["job"] == b_first}
        assert sorted(got) == before_steps(m, "b", b_first) != []

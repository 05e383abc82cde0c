"""Online placement (issue 21) with several control-plane processes on one PostgreSQL
database: the tie-break of ``POST /api/v1/placements`` (the node sent the fewest jobs in
the last minute) counts the jobs every process placed, told through the bus."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from hycache_control.app import create_app
from hycache_control.control import Control
from hycache_harness import wait_for

from .conftest import Api
from .test_api import store  # noqa: F401  (the store fixture)

MB = 1 << 20
STATUS = {"tiers": {"fast": {"capacity": 256 * MB, "used": 0}, "slow": {"capacity": 1 << 40, "used": 0}}}


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_tie_break_counts_the_jobs_other_processes_placed(api: Api, store):  # noqa: F811
    other = Control(api.control.settings, migrate=False)
    with TestClient(create_app(api.control.settings, other)) as client2:
        wait_for(lambda: other.bus.others() and api.control.bus.others(), 30, "the two processes hear each other")
        for n in ("a", "b"):  # each process hears the nodes (behind a load balancer, either may)
            assert api.beat(n, status=STATUS).status_code == 200
            body = {"node_id": n, "version": "0.1.0", "boot_id": "boot-1", "seq": 2, "sent_at": time.time(),
                    "address": None, "status": STATUS, "counters": {}, "policy_version": 0, "action_results": []}
            r = client2.post(f"/api/v1/nodes/{n}/heartbeats", json=body,
                             headers={"Authorization": f"Bearer {api.node_token(n)}"})
            assert r.status_code == 200, r.text
        h = {"Authorization": f"Bearer {api.read}"}
        # inputs on no node: a and b tie; alternating between the two processes, each job
        # goes to the node the *cluster* sent fewer jobs to, not the process
        got = []
        for k in range(4):
            if k % 2 == 0:
                r = api.post("/api/v1/placements", {"inputs": ["/nowhere"]}, token=api.read)
            else:
                r = client2.post("/api/v1/placements", json={"inputs": ["/nowhere"]}, headers=h)
            assert r.status_code == 200, r.text
            got.append(r.json()["node"])
            wait_for(lambda: len(api.control.manifests._online) == len(other.manifests._online) == k + 1, 30,
                     "the placement heard by the other process")
        assert got == ["a", "b", "a", "b"]

"""The Slurm endpoints (issue 35, docs/slurm.md): the node job_submit.lua asks for, and the
burst buffer's stage-in, pre-run, post-run, teardown and status, by Slurm job id.  The
control plane in-process on SQLite with the real Redis Cluster; the nodes' side of the
staging (delivery in the heartbeat answer, results reported back) through the real
heartbeat endpoint."""

from __future__ import annotations

import pytest
from hycache_dht.meta import dir_meta

from .conftest import Api
from .test_api import file_meta, store  # noqa: F401  (the store fixture)

MB = 1 << 20
STATUS = {"tiers": {"fast": {"capacity": 256 * MB, "used": 0}, "slow": {"capacity": 1 << 40, "used": 0}}}

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def beat(api: Api, node: str, results=None) -> list[dict]:
    api.seq = getattr(api, "seq", 10) + 1  # type: ignore[attr-defined]
    r = api.beat(node, seq=api.seq, status=STATUS, action_results=results or [])  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return r.json()["actions"]


def loc(r) -> list:
    return r.json()["detail"][0]["loc"]


@pytest.fixture
def files(api: Api, store):  # noqa: F811
    store.create(b"/in", dir_meta())
    store.create(b"/in/big.dat", file_meta("b", size=64 * MB, tier="slow"))
    store.create(b"/in/small.dat", file_meta("a", size=1 * MB, tier="slow"))
    store.create(b"/out.dat", file_meta("a", size=3 * MB))
    for n in ("a", "b"):
        assert api.beat(n, status=STATUS).status_code == 200
    return store


def test_choose_node_by_inputs_or_by_manifest(api: Api, files):
    r = api.post("/api/v1/slurm/placements", {"inputs": ["/in/big.dat", "/in/small.dat"]}, token=api.read)
    assert r.status_code == 200, r.text
    assert r.json() == {"node": "b", "source": "placement", "inputs": ["/in/big.dat", "/in/small.dat"]}
    # Slurm's candidates bound the choice
    r = api.post("/api/v1/slurm/placements", {"inputs": ["/in/big.dat"], "nodes": ["a"]})
    assert r.status_code == 200 and r.json()["node"] == "a"
    doc = {"version": 1, "name": "w", "jobs": [
        {"name": "j1", "accesses": [{"path": "in/small.dat", "size": "1M"}]}]}
    m = api.post("/api/v1/manifests?nodes=a", doc).json()
    r = api.post("/api/v1/slurm/placements", {"manifest_id": m["id"], "job": "j1"})
    assert r.status_code == 200, r.text
    assert r.json() == {"node": "a", "source": "manifest", "inputs": ["/in/small.dat"]}
    # neither a manifest's job nor inputs; half a manifest reference; a bad path: 422
    r = api.post("/api/v1/slurm/placements", {"outputs": ["/x"]})
    assert r.status_code == 422 and loc(r) == ["body"]
    r = api.post("/api/v1/slurm/placements", {"manifest_id": m["id"]})
    assert r.status_code == 422 and loc(r) == ["body"]
    r = api.post("/api/v1/slurm/placements", {"inputs": ["/a\x00b"]})
    assert r.status_code == 422 and loc(r) == ["body", "inputs", 0]
    # Slurm's nodes without an agent are left out; none known: 422
    r = api.post("/api/v1/slurm/placements", {"inputs": ["/in/big.dat"], "nodes": ["zz", "a"]})
    assert r.status_code == 200 and r.json()["node"] == "a"
    r = api.post("/api/v1/slurm/placements", {"inputs": ["/in/big.dat"], "nodes": ["zz"]})
    assert r.status_code == 422 and loc(r) == ["body", "nodes"]
    # an unknown manifest or job: 404 naming it
    r = api.post("/api/v1/slurm/placements", {"manifest_id": 999, "job": "j1"})
    assert r.status_code == 404 and loc(r) == ["body", "manifest_id"]
    r = api.post("/api/v1/slurm/placements", {"manifest_id": m["id"], "job": "nope"})
    assert r.status_code == 404 and loc(r) == ["body", "job"]
    doc = api.client.get("/openapi.json").json()
    assert doc["paths"]["/api/v1/slurm/placements"]["post"]["operationId"] == "slurmChooseNode"
    assert doc["paths"]["/api/v1/slurm/jobs/{slurm_job_id}/stage-in"]["post"]["operationId"] == "slurmStageIn"


def test_a_job_staged_run_elsewhere_published_and_torn_down(api: Api, files, store):  # noqa: F811
    body = {"node": "a", "inputs": ["/in/big.dat", "/in/small.dat"], "outputs": ["/out.dat", "/missing.out"]}
    r = api.post("/api/v1/slurm/jobs/41/stage-in", body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert (j["state"], j["staging"], j["staged_on"], j["ran_on"]) == ("staging", "staging", "a", None)
    # the prefetches reach node a in its heartbeat answer; b gets none
    assert beat(api, "b") == []
    got = beat(api, "a")
    assert sorted((d["action"], d["path"]) for d in got) == [("prefetch", "/in/big.dat"),
                                                             ("prefetch", "/in/small.dat")]
    assert api.get("/api/v1/slurm/jobs/41").json()["steps"]["delivered"] == 2
    # the same stage-in again (a hook retried) sends nothing new
    assert api.post("/api/v1/slurm/jobs/41/stage-in", body).json()["steps"]["total"] == 2
    beat(api, "a", [{"id": d["id"], "state": "done", "detail": "fast"} for d in got])
    assert api.get("/api/v1/slurm/jobs/41", token=api.read).json()["staging"] == "staged"
    # Slurm ran it on b after all: recorded, staged again there, its inputs on b pinned (a's
    # file is read from b's remote cache: pinning it on a would keep nothing the job reads)
    r = api.post("/api/v1/slurm/jobs/41/pre-run", {"node": "b"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert (j["state"], j["ran_on"], j["staged_on"], j["staging"]) == ("running", "b", "b", "staging")
    again = [d for d in beat(api, "b") if d["action"] == "prefetch"]
    assert sorted(d["path"] for d in again) == ["/in/big.dat", "/in/small.dat"]
    pins = [d for d in beat(api, "a") + beat(api, "b") if d["action"] == "pin"]
    assert sorted(d["path"] for d in pins) == ["/in/big.dat"]
    beat(api, "b", [{"id": d["id"], "state": "done"} for d in again])
    r = api.post("/api/v1/slurm/jobs/41/post-run", {"exit_code": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["state"] == "finished" and j["exit_code"] == 0
    assert j["published"] == {"/out.dat": {"node": "a", "size": 3 * MB}, "/missing.out": None}
    assert j["outputs_missing"] == 1
    # asked again (the hook waits for outputs an agent has not published yet): looked up
    # again, nothing unpinned twice, no second post-run in the hooks
    store.create(b"/missing.out", file_meta("b", size=5))
    j = api.post("/api/v1/slurm/jobs/41/post-run", {}).json()
    assert j["published"]["/missing.out"] == {"node": "b", "size": 5} and j["outputs_missing"] == 0
    unpins = [d for d in beat(api, "a") + beat(api, "b") if d["action"] == "unpin"]
    assert sorted(d["path"] for d in unpins) == ["/in/big.dat"]  # what was pinned
    j = api.post("/api/v1/slurm/jobs/41/teardown", {"hurry": False}).json()
    assert j["state"] == "done"
    assert [h["hook"] for h in j["hooks"]] == ["stage-in", "stage-in", "pre-run", "post-run", "teardown"]
    # a job that has run is not staged again
    r = api.post("/api/v1/slurm/jobs/41/stage-in", body)
    assert r.status_code == 409 and loc(r) == ["path", "slurm_job_id"]
    # the stage actions are not listed as operators' file actions
    assert all(a["action"] != "stage" for a in api.get("/api/v1/actions").json()["items"])


def test_a_job_recorded_without_staging(api: Api, files):
    """``stage: false`` (the directive ``stage=no``): the job and its node are recorded,
    nothing is prefetched or pinned, and it is not staged at pre-run either."""
    body = {"node": "a", "stage": False, "inputs": ["/in/big.dat"], "outputs": ["/out.dat"]}
    r = api.post("/api/v1/slurm/jobs/51/stage-in", body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert (j["staged_on"], j["staging"], j["steps"]["total"]) == ("a", "none", 0), j
    assert j["hooks"][0]["detail"] == "a (no staging)"
    j = api.post("/api/v1/slurm/jobs/51/pre-run", {"node": "b"}).json()
    assert (j["ran_on"], j["staged_on"], j["staging"], j["steps"]["total"]) == ("b", "a", "none", 0), j
    assert beat(api, "a") == [] and beat(api, "b") == []  # no prefetch, no pin
    j = api.post("/api/v1/slurm/jobs/51/post-run", {"exit_code": 0}).json()
    assert j["published"] == {"/out.dat": {"node": "a", "size": 3 * MB}}
    assert beat(api, "a") == [] and beat(api, "b") == []  # nothing to unpin


def test_a_staging_failure_and_the_status_text(api: Api, files):
    r = api.post("/api/v1/slurm/jobs/7/stage-in", {"inputs": ["/in/small.dat", "/in/nowhere"]})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["staged_on"] == "a"  # chosen here: the online placement of its inputs
    assert j["staging"] == "failed" and j["failures"] == ["/in/nowhere: no such file: /in/nowhere"]
    # a prefetch the node fails is a failure too
    r = api.post("/api/v1/slurm/jobs/8/stage-in", {"node": "b", "inputs": ["/in/small.dat"]})
    (d,) = beat(api, "b")
    beat(api, "b", [{"id": d["id"], "state": "failed", "detail": "/in/small.dat: no room on the fast tier"}])
    j = api.get("/api/v1/slurm/jobs/8").json()
    assert j["staging"] == "failed" and "no room" in j["failures"][0]
    st = api.get("/api/v1/slurm/status", token=api.read)
    assert st.status_code == 200
    text = st.json()["text"]
    assert "JobId=8 State=staging Staging=failed StagedOn=b" in text and "JobId=7 " in text
    one = api.get("/api/v1/slurm/status", params={"job": 7}).json()
    assert [x["id"] for x in one["jobs"]] == [7]
    # unknown job: 404 naming it; bad fields: 422 naming them
    for r in (api.get("/api/v1/slurm/jobs/9"), api.post("/api/v1/slurm/jobs/9/pre-run", {"node": "a"}),
              api.get("/api/v1/slurm/status", params={"job": 9})):
        assert r.status_code == 404 and loc(r) == ["path", "slurm_job_id"], r.text
    r = api.post("/api/v1/slurm/jobs/8/pre-run", {"node": "bad node"})
    assert r.status_code == 422 and loc(r) == ["body", "node"]
    r = api.post("/api/v1/slurm/jobs/0/stage-in", {"inputs": []})
    assert r.status_code == 422 and loc(r) == ["path", "slurm_job_id"]
    # writing needs admin
    assert api.post("/api/v1/slurm/jobs/8/teardown", {}, token=api.read).status_code == 403


def test_an_input_published_after_the_stage_in_is_staged_when_asked_again(api: Api, files):
    """A parent job's output may reach the namespace just after Slurm starts its child's
    stage-in: the staging fails for the file no node holds, the hook asks again, and only
    then (every failure a missing file) the staging is made anew; another failure stays."""
    r = api.post("/api/v1/slurm/jobs/61/stage-in", {"node": "a", "inputs": ["/in/small.dat", "/in/late.dat"]})
    j = r.json()
    assert j["staging"] == "failed" and j["failures"] == ["/in/late.dat: no such file: /in/late.dat"], j
    files.create(b"/in/late.dat", file_meta("b", size=2 * MB, tier="fast"))
    j = api.post("/api/v1/slurm/jobs/61/stage-in", {"node": "a", "inputs": ["/in/small.dat", "/in/late.dat"]}).json()
    assert (j["staged_on"], j["staging"], j["steps"]["total"]) == ("a", "staging", 2), j
    assert sorted(d["path"] for d in beat(api, "a")) == ["/in/late.dat", "/in/small.dat"]
    # a prefetch the node failed is not asked for again
    api.post("/api/v1/slurm/jobs/62/stage-in", {"node": "b", "inputs": ["/in/small.dat"]})
    (d,) = beat(api, "b")
    beat(api, "b", [{"id": d["id"], "state": "failed", "detail": "/in/small.dat: no room on the fast tier"}])
    j = api.post("/api/v1/slurm/jobs/62/stage-in", {"node": "b", "inputs": ["/in/small.dat"]}).json()
    assert j["staging"] == "failed" and "no room" in j["failures"][0], j
    assert beat(api, "b") == []


def test_a_manifest_job_run_by_slurm_shows_where(api: Api, files):
    doc = {"version": 1, "name": "w", "jobs": [
        {"name": "j1", "accesses": [{"path": "in/small.dat", "size": "1M"}]}]}
    m = api.post("/api/v1/manifests?nodes=a,b", doc).json()
    node = m["placement"]["j1"]
    r = api.post("/api/v1/slurm/jobs/100/stage-in", {"manifest_id": m["id"], "job": "j1"})
    assert r.status_code == 200, r.text
    assert r.json()["staged_on"] == node and r.json()["inputs"] == ["/in/small.dat"]
    api.post("/api/v1/slurm/jobs/100/pre-run", {"node": "b"})
    job = api.get(f"/api/v1/manifests/{m['id']}/jobs/j1").json()
    assert job["state"] == "running" and job["slurm"] == {"job_id": 100, "node": "b", "state": "running"}
    api.post("/api/v1/slurm/jobs/100/post-run", {"exit_code": 0})
    full = api.get(f"/api/v1/manifests/{m['id']}").json()
    (j1,) = full["jobs"]
    assert j1["state"] == "done" and j1["slurm"] == {"job_id": 100, "node": "b", "state": "finished"}
    r = api.post("/api/v1/slurm/jobs/101/stage-in", {"manifest_id": m["id"]})
    assert r.status_code == 422 and loc(r) == ["body", "job"]

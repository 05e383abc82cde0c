"""Manifests over REST (issue 9): validation, placement on the live nodes with the DHT's
file locations, plans delivered as action items in heartbeat answers, job start/finish,
cancellation.  The control plane in-process on SQLite with the real Redis Cluster."""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path

import pytest
from hycache_core.scheduling import place
from hycache_core.workflow import parse_workflow

from .conftest import Api
from .test_api import file_meta, store  # noqa: F401  (the store fixture)

TINY = json.loads((Path(__file__).resolve().parents[1] / "core" / "data" / "wfformat-1.5-tiny.json").read_text())
CAP = 256 << 20
STATUS = {"tiers": {"fast": {"capacity": CAP, "used": 0}, "slow": {"capacity": 1 << 40, "used": 0}}}

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def tasks(doc):
    return doc["workflow"]["specification"]["tasks"]


def detail_locs(r) -> list[tuple]:
    assert r.status_code == 422, r.text
    return [tuple(d["loc"]) for d in r.json()["detail"]]


def test_invalid_manifests_are_422_naming_the_field(api: Api):
    api.beat("a", status=STATUS)
    cyc = copy.deepcopy(TINY)
    tasks(cyc)[0]["parents"] = ["ID06"]
    r = api.post("/api/v1/manifests", cyc)
    assert ("body", "workflow", "specification", "tasks", 0, "parents") in detail_locs(r)
    assert "cyclic" in r.json()["detail"][0]["msg"] and r.json()["detail"][0]["format"] == "wfformat-1.5"

    unk = copy.deepcopy(TINY)
    tasks(unk)[1]["parents"] = ["NOPE"]
    r = api.post("/api/v1/manifests", unk)
    assert detail_locs(r) == [("body", "workflow", "specification", "tasks", 1, "parents", 0)]
    assert "NOPE" in r.json()["detail"][0]["msg"]

    neg = copy.deepcopy(TINY)
    neg["workflow"]["specification"]["files"][1]["sizeInBytes"] = -5
    r = api.post("/api/v1/manifests", neg)
    assert detail_locs(r) == [("body", "workflow", "specification", "files", 1, "sizeInBytes")]

    dup = copy.deepcopy(TINY)
    tasks(dup)[2]["id"] = "ID02"
    r = api.post("/api/v1/manifests", dup)
    assert ("body", "workflow", "specification", "tasks", 2, "id") in detail_locs(r)
    assert any("duplicate" in d["msg"] for d in r.json()["detail"])

    for junk in ([1, 2, 3], "hello", {"hello": 1}):
        r = api.post("/api/v1/manifests", junk)
        assert r.status_code == 422, r.text
        assert all(d["loc"][0] == "body" and d["format"] == "hycache-manifest" for d in r.json()["detail"])
    assert ("body", "jobs") in detail_locs(api.post("/api/v1/manifests", {"hello": 1}))

    # too large: 413 (the fixture's manifest bound is 8 MiB; other bodies: 64 KiB)
    big = copy.deepcopy(TINY)
    big["description"] = "x" * (9 << 20)
    assert api.post("/api/v1/manifests", big).status_code == 413
    # ... also when it comes gzipped (9 MiB of x compress to a few KiB)
    raw = gzip.compress(json.dumps(big).encode())
    assert len(raw) < 64 * 1024
    r = api.client.post("/api/v1/manifests", content=raw,
                        headers={**api.h(), "content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 413 and r.json()["detail"][0]["loc"] == ["body"]
    # a corrupt gzip body is 400, an unknown encoding 415
    r = api.client.post("/api/v1/manifests", content=raw[:100],
                        headers={**api.h(), "content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 400
    r = api.client.post("/api/v1/manifests", content=b"{}",
                        headers={**api.h(), "content-type": "application/json", "content-encoding": "br"})
    assert r.status_code == 415
    # a read token may not submit
    assert api.post("/api/v1/manifests", TINY, token=api.read).status_code == 403
    # unknown node
    assert ("query", "nodes") in detail_locs(api.post("/api/v1/manifests?nodes=a,zz", TINY))
    assert api.get("/api/v1/manifests").json()["total"] == 0


def submit(api: Api, store, tier: str = "slow") -> dict:  # noqa: F811
    """The tiny instance on a and b; its two inputs exist, on a and b's ``tier``.  With
    ``prefetch_first``: each node's first job gets its prefetches too (these tests are
    about when steps are released, the first job's included)."""
    store.create(b"/raw.dat", file_meta("a", size=100 << 20, tier=tier))
    store.create(b"/ref.db", file_meta("b", size=64 << 20, tier=tier))
    for n in ("a", "b"):
        assert api.beat(n, status=STATUS).status_code == 200
    r = api.post("/api/v1/manifests?prefetch_first=true", TINY)
    assert r.status_code == 201, r.text
    return r.json()


def beat(api: Api, node: str, results=None) -> list[dict]:
    api.seq = getattr(api, "seq", 10) + 1
    ans = api.beat(node, seq=api.seq, status=STATUS, action_results=results or []).json()
    return ans["actions"]


def test_placement_and_plans_stored_with_dht_locations(api: Api, store):  # noqa: F811
    m = submit(api, store, tier="fast")
    # layer 2 starts from the nodes' real fast tiers: raw.dat is on a's, ref.db on b's (the DHT)
    census = {"raw.dat": {"node": "a", "tier": "fast", "size": 100 << 20, "pinned": False},
              "ref.db": {"node": "b", "tier": "fast", "size": 64 << 20, "pinned": False}}
    expected = place(parse_workflow(TINY), ["a", "b"], capacity={"a": CAP, "b": CAP},
                     locations={"raw.dat": "a", "ref.db": "b"}, census=census,
                     fast_status={n: STATUS["tiers"]["fast"] for n in "ab"},
                     first_reads_in_place=False)  # submit() asks for ?prefetch_first=true
    blind = place(parse_workflow(TINY), ["a", "b"], capacity={"a": CAP, "b": CAP},
                  locations={"raw.dat": "a", "ref.db": "b"})
    assert m["plans"] != blind["plans"]
    # a file already on its node's fast tier is never prefetched there
    assert not [st for st in m["plans"]["a"] if st["action"] == "prefetch" and st["path"] == "raw.dat"]
    assert m["placement"] == expected["placement"]
    assert m["transfer_bytes"] == expected["transfer_bytes"]
    # within the 1.1 load bound (45 s | 45 s of runtime) the optimum moves as much as
    # round-robin here (the exact MILP agrees)
    exact = place(parse_workflow(TINY), ["a", "b"], solver="exact", capacity={"a": CAP, "b": CAP},
                  locations={"raw.dat": "a", "ref.db": "b"}, plans=False)
    assert m["transfer_bytes"]["placed"] == exact["transfer_bytes"]["placed"] <= m["transfer_bytes"]["round_robin"]
    assert m["slow_tier_bytes"] == expected["slow_tier_bytes"]
    assert m["plans"] == expected["plans"] and m["load"] == pytest.approx(expected["load"])
    assert m["format"] == "wfformat-1.5" and m["name"] == "tiny-chunks" and m["state"] == "planned"
    assert {j["id"]: j["node"] for j in m["jobs"]} == m["placement"]
    assert all(j["state"] == "pending" for j in m["jobs"])
    # each job carries its parents (the dashboard draws the workflow graph from them)
    assert {j["id"]: sorted(j["parents"]) for j in m["jobs"]} == {j.id: sorted(j.parents) for j in parse_workflow(TINY).jobs}
    assert {n: c["total"] for n, c in m["steps"].items()} == {n: len(p) for n, p in expected["plans"].items()}
    got = api.get(f"/api/v1/manifests/{m['id']}").json()
    assert got["placement"] == m["placement"] and got["plans"] == m["plans"]
    lst = api.get("/api/v1/manifests", token=api.read).json()
    assert lst["total"] == 1 and lst["items"][0]["id"] == m["id"]
    # the plan's action is not a file action
    assert api.get("/api/v1/actions").json()["total"] == 0
    assert api.get("/api/v1/manifests/999").status_code == 404


def test_each_nodes_first_job_reads_in_place_by_default(api: Api, store):  # noqa: F811
    """By default a node's first job gets no prefetch or eviction (its steps would be
    released the moment it starts: a prefetch would only move its read); the next job's
    prefetches do come, released when the first has read its inputs — not of the file the
    first read in place (its read left it in the page cache) — and a job's start answers
    with its before-steps' states (the runner reads them there)."""
    doc = {"version": 1, "name": "two", "jobs": [
        {"name": f"j{k}", "accesses": [{"path": f"x{k}", "size": "10M"}, {"path": "shared", "size": "10M"}]}
        for k in (1, 2)]}
    for name in ("x1", "x2", "shared"):
        store.create(f"/{name}".encode(), file_meta("a", size=10 << 20, tier="slow"))
    api.beat("a", status=STATUS)
    r = api.post("/api/v1/manifests?nodes=a", doc)
    assert r.status_code == 201, r.text
    m = r.json()
    acts = [(s["job"], s["action"], s["path"]) for s in m["plans"]["a"]]
    assert not [a for a in acts if a[0] == "j1" and a[1] in ("prefetch", "evict")], acts
    assert ("j2", "prefetch", "x2") in acts and not [a for a in acts if a[2] == "shared"], acts
    assert beat(api, "a") == []  # nothing released at submission
    started = api.post(f"/api/v1/manifests/{m['id']}/jobs/j1/start")
    assert started.status_code == 200 and started.json()["steps"] == []
    assert api.post(f"/api/v1/manifests/{m['id']}/jobs/j1/reads-done").status_code == 200
    got = beat(api, "a")
    assert sorted(d["path"] for d in got if d["job"] == "j2") == ["/x2"]
    assert api.post(f"/api/v1/manifests/{m['id']}/jobs/j1/finish").status_code == 200
    started = api.post(f"/api/v1/manifests/{m['id']}/jobs/j2/start").json()
    assert sorted((i["plan_action"], i["path"], i["state"]) for i in started["steps"]) == [
        ("prefetch", "/x2", "delivered")]
    # the same manifest with ?prefetch_first=true: the first job's prefetches are planned
    r = api.post("/api/v1/manifests?nodes=a&prefetch_first=true", doc)
    assert ("j1", "prefetch", "x1") in [(s["job"], s["action"], s["path"]) for s in r.json()["plans"]["a"]]


def test_steps_delivered_in_turn_started_finished_skipped(api: Api, store):  # noqa: F811
    m = submit(api, store)
    mid, plans, placement = m["id"], m["plans"], m["placement"]
    order = {n: [j["id"] for j in sorted(m["jobs"], key=lambda j: j["position"]) if j["node"] == n] for n in plans}
    parents = {t["id"]: t["parents"] for t in tasks(TINY)}
    a_first = order["a"][0]
    assert not parents[a_first]
    # only the before-steps (prefetch/evict) of a's first job are released now
    got = beat(api, "a")
    want = [s for s in plans["a"] if s["job"] == a_first and s["action"] in ("prefetch", "evict")]
    assert want, plans["a"]
    assert [(d["job"], d["step"]) for d in got] == [(s["job"], s["step"]) for s in want]
    for d, s in zip(got, want):
        assert d["manifest_id"] == mid and d["path"] == "/" + s["path"]
        assert d["action"] == {"prefetch": "prefetch", "evict": "demote"}[s["action"]]
    # step progress goes to the stream's `action` events (what /stream sends)
    ups = [u for _, u in api.control.actions.updates_after(0) if u.get("manifest_id") == mid]
    assert {(u["job"], u["step"]) for u in ups if u["state"] == "delivered"} == {(d["job"], d["step"]) for d in got}
    # b's first job has a parent on a that has not finished: nothing for b yet
    b_first = order["b"][0]
    assert parents[b_first] and beat(api, "b") == []

    # job reports: 404 unknown, 409 finish before start, node token of the other node 403
    assert api.post(f"/api/v1/manifests/{mid}/jobs/NOPE/start").status_code == 404
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{a_first}/finish").status_code == 409
    other = "b" if placement[a_first] == "a" else "a"
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{a_first}/start", token=api.node_token(other)).status_code == 403
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{a_first}/start", token=api.read).status_code == 403
    r = api.post(f"/api/v1/manifests/{mid}/jobs/{a_first}/start", token=api.node_token("a"))
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert api.get(f"/api/v1/manifests/{mid}").json()["state"] == "running"

    # a reports its results: done, visible in the steps summary
    results = [{"id": d["id"], "state": "done", "detail": "fast", "tier": "fast"} for d in got]
    nxt = beat(api, "a", results)
    summary = api.get(f"/api/v1/manifests/{mid}").json()["steps"]["a"]
    assert summary["done"] == len(got) and summary["total"] == len(plans["a"])
    # the second job of a now has its turn (the first started), if its parents are done
    second = order["a"][1]
    second_before = [s["step"] for s in plans["a"] if s["job"] == second and s["action"] in ("prefetch", "evict")]
    if all(p == a_first for p in parents[second]):
        assert [d["step"] for d in nxt] == []  # its parent (a_first) has not finished yet
    # finish a's first job: its after-steps (pin/unpin) are released; later jobs' before-steps too
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{a_first}/finish").status_code == 200
    got2 = beat(api, "a")
    after = [s["step"] for s in plans["a"] if s["job"] == a_first and s["action"] in ("pin", "unpin")]
    assert [d["step"] for d in got2] == sorted(after + second_before)
    # a job that starts before its before-steps are delivered: those are skipped (it never waits for them)
    b_jobs = order["b"]
    for j in b_jobs[:1]:
        for p in parents[j]:
            if p != a_first:
                api.post(f"/api/v1/manifests/{mid}/jobs/{p}/start")
                api.post(f"/api/v1/manifests/{mid}/jobs/{p}/finish")
        assert api.post(f"/api/v1/manifests/{mid}/jobs/{j}/start").status_code == 200
        assert api.post(f"/api/v1/manifests/{mid}/jobs/{j}/finish").status_code == 200
    skipped_want = [s for s in plans["b"] if s["job"] == b_jobs[0] and s["action"] in ("prefetch", "evict")]
    v = api.get(f"/api/v1/manifests/{mid}").json()
    items = [i for i in v["step_items"] if i["node"] == "b" and i["job"] == b_jobs[0]]
    before = [i for i in items if i["plan_action"] in ("prefetch", "evict")]
    assert len(before) == len(skipped_want) > 0
    assert all(i["state"] == "skipped" and "started before delivery" in i["detail"] for i in before)
    # unpin of a remote copy (a file whose primary is on another node) is skipped from the
    # start: a copy is never pinned; its evict is sent (the agent drops the copy)
    remote = [i for i in v["step_items"] if "remote copy" in (i["detail"] or "")]
    assert remote and all(i["state"] == "skipped" and i["plan_action"] == "unpin" for i in remote)
    assert all(v["placement"][i["job"]] == i["node"] for i in remote)
    assert v["steps"]["b"]["skipped"] == len(skipped_want) + sum(i["node"] == "b" for i in remote)
    # finishing twice is fine, starting a finished job is 409
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{b_jobs[0]}/start").status_code == 409
    assert api.post(f"/api/v1/manifests/{mid}/jobs/{b_jobs[0]}/finish").status_code == 200


def test_a_prefetch_that_found_no_room_is_released_again_once(api: Api, store):  # noqa: F811
    """A prefetch that fails for room goes back to pending (not dropped) and is delivered
    again — with ``attempt: 1``, so the agent applies it although it saw the id — once the
    job before it on the node has ended; a second failure, or another reason, is final."""
    m = submit(api, store)
    mid, plans = m["id"], m["plans"]
    order = {n: [j["id"] for j in sorted(m["jobs"], key=lambda j: j["position"]) if j["node"] == n] for n in plans}
    a_first = order["a"][0]
    got = beat(api, "a")
    pre = [d for d in got if d["job"] == a_first and d["action"] == "prefetch"]
    assert pre and all(d.get("attempt") is None for d in got)
    first, rest = pre[0], got[1:] if got[0] is pre[0] else [d for d in got if d is not pre[0]]
    again = beat(api, "a", [{"id": first["id"], "state": "failed", "tier": "slow",
                             "detail": f"{first['path']}: no room for 100 MiB on the fast tier"}])
    item = next(i for i in api.get(f"/api/v1/manifests/{mid}").json()["step_items"] if i["id"] == first["id"])
    assert item["state"] in ("pending", "delivered") and item["detail"].startswith("retry when the job before it")
    # nothing runs before a's first job on a: released again at once, marked as a new attempt
    again = again or beat(api, "a")
    redo = [d for d in again if d["id"] == first["id"]]
    assert redo and redo[0]["attempt"] == 1
    # the second failure is final; so is a failure for another reason
    others = [{"id": d["id"], "state": "failed", "detail": f"{d['path']}: no such file"} for d in rest]
    beat(api, "a", [{"id": first["id"], "state": "failed", "detail": "no room: still none"}, *others])
    items = {i["id"]: i for i in api.get(f"/api/v1/manifests/{mid}").json()["step_items"]}
    assert items[first["id"]]["state"] == "failed" and items[first["id"]]["detail"] == "no room: still none"
    assert all(items[d["id"]]["state"] == "failed" for d in rest)
    assert first["id"] not in [d["id"] for d in beat(api, "a")]


def test_a_retried_prefetch_waits_for_the_job_before_it_to_end_or_is_skipped(api: Api, store):  # noqa: F811
    """Two independent jobs on node a: the second one's prefetch is released when the first
    has read its inputs; it fails for room (the first's open files), is held while the
    first runs and delivered again when it has ended; a retried step whose job starts
    first is skipped."""
    for name in ("x1", "x2", "x3"):
        store.create(f"/{name}".encode(), file_meta("a", size=10 << 20, tier="slow"))
    api.beat("a", status=STATUS)
    doc = {"version": 1, "name": "two", "jobs": [
        {"name": f"j{k}", "accesses": [{"path": f"x{k}", "size": "10M"}]} for k in (1, 2, 3)]}
    r = api.post("/api/v1/manifests?nodes=a&prefetch_first=true", doc)
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    assert [d["job"] for d in beat(api, "a")] == ["j1"]
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j1/start").status_code == 200
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j1/reads-done").status_code == 200
    got = [d for d in beat(api, "a") if d["job"] == "j2"]
    assert [d["action"] for d in got] == ["prefetch"]
    d = got[0]
    beat(api, "a", [{"id": d["id"], "state": "failed", "detail": "no room: 56 MiB of 64 MiB held by open files"}])
    assert d["id"] not in [x["id"] for x in beat(api, "a")]  # held while j1 runs
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j1/finish").status_code == 200
    redo = [x for x in beat(api, "a") if x["id"] == d["id"]]
    assert redo and redo[0]["attempt"] == 1
    beat(api, "a", [{"id": d["id"], "state": "done", "detail": "fast", "tier": "fast"}])
    # j3's prefetch fails for room too, and j3 starts before j2 has ended: skipped, not failed
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j2/start").status_code == 200
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j2/reads-done").status_code == 200
    d3 = next(x for x in beat(api, "a") if x["job"] == "j3")
    beat(api, "a", [{"id": d3["id"], "state": "failed", "detail": "no room: held by open files"}])
    for ev in ("finish",):
        api.post(f"/api/v1/manifests/{mid}/jobs/j2/{ev}")
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j3/start").status_code == 200
    items = {i["id"]: i for i in api.get(f"/api/v1/manifests/{mid}").json()["step_items"]}
    assert items[d["id"]]["state"] == "done"
    assert items[d3["id"]]["state"] == "skipped" and "started before delivery" in items[d3["id"]]["detail"]


def test_delete_cancels_undelivered_steps(api: Api, store):  # noqa: F811
    m = submit(api, store)
    mid = m["id"]
    delivered = beat(api, "a")
    assert delivered
    r = api.client.delete(f"/api/v1/manifests/{mid}", headers=api.h())
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["state"] == "cancelled"
    total = sum(len(p) for p in m["plans"].values())
    cancelled = sum(c["cancelled"] for c in v["steps"].values())
    skipped = sum(c["skipped"] for c in m["steps"].values())  # remote copies' unpins, skipped at submission
    assert cancelled == total - len(delivered) - skipped > 0
    # delivered steps are still re-sent until reported; nothing new is released
    api.post(f"/api/v1/manifests/{mid}/jobs/{m['jobs'][0]['id']}/start")
    again = beat(api, "a")
    assert sorted(d["id"] for d in again) == sorted(d["id"] for d in delivered)
    assert beat(api, "b") == []
    assert api.client.delete("/api/v1/manifests/12345", headers=api.h()).status_code == 404


def test_exact_solver_keeps_the_servers_stdout_clean(api: Api, store, capfd):  # noqa: F811
    for n in ("a", "b"):
        api.beat(n, status=STATUS)
    capfd.readouterr()
    r = api.post("/api/v1/manifests?solver=exact&plans=false&nodes=a,b", TINY)
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["solver"] == "exact" and m["optimal"] is True
    assert m["plans"] == {} and sum(c["total"] for c in m["steps"].values()) == 0
    assert m["transfer_bytes"]["placed"] <= place(parse_workflow(TINY), ["a", "b"], capacity={"a": CAP, "b": CAP},
                                                  solver="local")["transfer_bytes"]["placed"]
    assert capfd.readouterr().out == ""


def wfformat_instance(n_tasks: int, seed: int = 0) -> dict:
    """A WfFormat 1.5 instance shaped like Montage (project → diff → fit → model →
    background → add per band), ``n_tasks`` tasks, runtimes and sizes at random."""
    rng = random.Random(seed)
    spec_tasks, exec_tasks, files = [], [], []

    def file(name: str) -> str:
        files.append({"id": name, "sizeInBytes": rng.randint(1 << 10, 512 << 10)})
        return name

    per_band = n_tasks // 4
    ids = 0
    for band in range(4):
        raw = [file(f"b{band}.raw{i}.fits") for i in range(per_band // 3)]
        projected = []
        for i, r in enumerate(raw):
            ids += 1
            out = file(f"b{band}.p{i}.fits")
            spec_tasks.append({"name": "mProject", "id": f"T{ids:05d}", "parents": [], "children": [],
                               "inputFiles": [r], "outputFiles": [out]})
            projected.append((f"T{ids:05d}", out))
        diffs = []
        for i in range(per_band - len(raw) - 1):
            (pa, fa), (pb, fb) = rng.sample(projected, 2)
            ids += 1
            out = file(f"b{band}.d{i}.fits")
            spec_tasks.append({"name": "mDiffFit", "id": f"T{ids:05d}", "parents": [pa, pb], "children": [],
                               "inputFiles": [fa, fb], "outputFiles": [out]})
            diffs.append((f"T{ids:05d}", out))
        ids += 1
        spec_tasks.append({"name": "mAdd", "id": f"T{ids:05d}", "parents": [t for t, _ in diffs], "children": [],
                           "inputFiles": [f for _, f in diffs], "outputFiles": [file(f"b{band}.mosaic.fits")]})
    for t in spec_tasks:
        exec_tasks.append({"id": t["id"], "runtimeInSeconds": round(rng.uniform(1, 30), 3)})
    return {"name": f"montage-like-{n_tasks}", "schemaVersion": "1.5",
            "workflow": {"specification": {"tasks": spec_tasks, "files": files},
                         "execution": {"makespanInSeconds": 1.0, "executedAt": "20251125T000000+0000",
                                       "tasks": exec_tasks, "machines": []}}}


def test_a_2000_job_instance_gzipped_over_rest(api: Api):
    """Real instances run to MB: a 2,000-task WfFormat document (over 1 MiB, the default
    bound of other bodies) is accepted gzipped, placed within the load bound, with the
    makespan and the bound's reason in the answer."""
    doc = wfformat_instance(2000)
    raw = json.dumps(doc).encode()
    assert len(raw) > 64 * 1024  # over the fixture's bound for other bodies
    for n in ("a", "b", "c"):
        assert api.beat(n, status=STATUS).status_code == 200
    r = api.client.post("/api/v1/manifests?plans=false", content=gzip.compress(raw),
                        headers={**api.h(), "content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 201, r.text[:500]
    m = r.json()
    wf = parse_workflow(doc)
    assert len(m["jobs"]) == len(wf.jobs) >= 1990
    assert set(m["placement"].values()) <= {"a", "b", "c"}
    assert max(m["load"].values()) <= m["load_bound"] + 1e-9
    assert m["load_bound"] == pytest.approx(1.1 / 3) and m["load_bound_reason"] is None
    assert m["transfer_bytes"]["placed"] < m["transfer_bytes"]["round_robin"]
    assert m["makespan"]["lower_bound"] <= m["makespan"]["placed"]
    # the same document uncompressed is accepted as well
    r = api.client.post("/api/v1/manifests?plans=false&solver=hypergraph&nodes=a,b,c", content=raw,
                        headers={**api.h(), "content-type": "application/json"})
    assert r.status_code == 201, r.text[:500]
    assert r.json()["solver"] == "hypergraph"


def test_jobs_carry_the_instances_task_type(api: Api):
    """The job view's ``task`` is the instance's own task type (WfFormat ``category`` or the
    command's ``program``), null when the instance has none."""
    for n in ("a", "b"):
        assert api.beat(n, status=STATUS).status_code == 200
    doc14 = json.loads((Path(__file__).resolve().parents[1] / "core" / "data" / "wfformat-1.4-tiny.json").read_text())
    r = api.post("/api/v1/manifests?plans=false", doc14)
    assert r.status_code == 201, r.text
    want = {"ID01": "split", "ID02": "process", "ID03": "process", "ID04": "process", "ID05": "merge",
            "ID06": "report"}
    assert {j["id"]: j["task"] for j in r.json()["jobs"]} == want
    listed = api.get("/api/v1/manifests").json()["items"][0]
    assert {j["id"]: j["task"] for j in listed["jobs"]} == want
    r = api.post("/api/v1/manifests?plans=false", TINY)  # 1.5 without category or command
    assert r.status_code == 201 and all(j["task"] is None for j in r.json()["jobs"])


def test_a_step_skipped_by_its_jobs_start_during_a_delivery_is_not_sent(api: Api, store):  # noqa: F811
    """A heartbeat's delivery reads the open steps, then marks them delivered; a job's
    start (another request) that skips the job's undelivered steps in between wins: the
    step stays skipped and never reaches the node, so the job that reads its inputs in
    place and the prefetch do not fetch the same bytes twice."""
    m = submit(api, store)
    mid = m["id"]
    a_first = next(j["id"] for j in sorted(m["jobs"], key=lambda j: j["position"]) if j["node"] == "a")
    actions, gate = api.control.actions, api.control.actions.gate
    started = []

    def gate_then_start(s, items):
        verdict = gate(s, items)
        if not started:  # the job starts after the delivery read its steps, before it wrote
            started.append(api.control.jobs.job_event(mid, a_first, "start", "test"))
        return verdict

    actions.gate = gate_then_start
    try:
        got = beat(api, "a")
    finally:
        actions.gate = gate
    assert started and started[0]["state"] == "running"
    assert [d for d in got if d.get("job") == a_first] == [], got
    v = api.get(f"/api/v1/manifests/{mid}").json()
    mine = [i for i in v["step_items"] if i["node"] == "a" and i["job"] == a_first
            and i["plan_action"] in ("prefetch", "evict")]
    assert mine and all(i["state"] == "skipped" and "started before delivery" in i["detail"] for i in mine), mine
    assert all(d.get("job") != a_first for d in beat(api, "a"))  # nor later


def test_a_jobs_prefetches_are_released_when_the_job_before_it_has_read_its_inputs(api: Api, store):  # noqa: F811
    """The next job's prefetches on a node are released by the job before it reporting
    ``…/reads-done`` (so they overlap its compute, not its reads), not by its start; a
    finish counts as reads done; ``?release=start`` keeps the rule before the event.  The
    event: 409 before the start, idempotent, 404 for an unknown job, only the job's node
    token or admin; ``GET …/jobs/{job}`` answers the job and its steps' states."""
    for name in ("x1", "x2", "x3"):
        store.create(f"/{name}".encode(), file_meta("a", size=10 << 20, tier="slow"))
    api.beat("a", status=STATUS)
    doc = {"version": 1, "name": "three", "jobs": [
        {"name": f"j{k}", "accesses": [{"path": f"x{k}", "size": "10M"}]} for k in (1, 2, 3)]}
    r = api.post("/api/v1/manifests?nodes=a", doc)
    assert r.status_code == 201, r.text
    m = r.json()
    mid = m["id"]
    assert m["options"].get("release") is None  # the default: reads done
    assert {(s["job"], s["action"]) for s in m["plans"]["a"]} >= {("j2", "prefetch"), ("j3", "prefetch")}
    url = f"/api/v1/manifests/{mid}/jobs"
    assert api.post(f"{url}/j1/reads-done").status_code == 409  # not started
    assert beat(api, "a") == []
    assert api.post(f"{url}/j1/start").status_code == 200
    assert beat(api, "a") == []  # j1 is reading: j2's prefetch waits for that
    assert api.post(f"{url}/NOPE/reads-done").status_code == 404
    assert api.post(f"{url}/j1/reads-done", token=api.read).status_code == 403
    r = api.post(f"{url}/j1/reads-done", token=api.node_token("a"))
    assert r.status_code == 200, r.text
    done_at = r.json()["reads_done_at"]
    assert r.json()["state"] == "running" and done_at >= r.json()["started_at"]
    got = beat(api, "a")
    assert [(d["job"], d["action"], d["path"]) for d in got] == [("j2", "prefetch", "/x2")]
    # idempotent: the first report's time stays; j3's turn has not come (j2 has not read)
    assert api.post(f"{url}/j1/reads-done").json()["reads_done_at"] == done_at
    assert [d["job"] for d in beat(api, "a")] == ["j2"]  # re-sent until reported; no j3
    one = api.get(f"{url}/j2", token=api.read).json()
    assert one["state"] == "pending" and [(i["plan_action"], i["path"], i["state"]) for i in one["steps"]] == [
        ("prefetch", "/x2", "delivered")]
    assert api.get(f"{url}/NOPE").status_code == 404 and api.get("/api/v1/manifests/999/jobs/j1").status_code == 404
    # a finish without a reads-done report counts as reads done
    api.post(f"{url}/j1/finish")
    assert api.post(f"{url}/j2/start").json()["steps"][0]["state"] == "delivered"
    api.post(f"{url}/j2/finish")
    assert ("j3", "prefetch") in {(d["job"], d["action"]) for d in beat(
        api, "a", [{"id": got[0]["id"], "state": "done", "detail": "fast", "tier": "fast"}])}
    v = api.get(f"/api/v1/manifests/{mid}").json()
    assert [j["reads_done_at"] is not None for j in v["jobs"]] == [True, False, False]
    # ?release=start: the rule before the event, the start releases the next job's steps
    r = api.post("/api/v1/manifests?nodes=a&release=start", doc)
    assert r.status_code == 201 and r.json()["options"]["release"] == "start"
    mid = r.json()["id"]
    assert api.post(f"/api/v1/manifests/{mid}/jobs/j1/start").status_code == 200
    assert [(d["job"], d["path"]) for d in beat(api, "a") if d["manifest_id"] == mid] == [("j2", "/x2")]
    assert api.post("/api/v1/manifests?nodes=a&release=never", doc).status_code == 422


def test_a_jobs_steps_are_planned_from_the_nodes_contents_at_their_release(api: Api, store):  # noqa: F811
    """Layer 2 plans each job's prefetch/evict steps again when its turn comes, from the
    node's contents then: room that moves under way took at submission is free at the
    release (the step the submission could not fit is released), a file that reached the
    fast tier meanwhile is not prefetched, and what is released fits the room.  The plan
    stored at submission stays as the forecast."""
    mib = 1 << 20
    for k in (1, 2, 3):
        store.create(f"/y{k}".encode(), file_meta("a", size=10 * mib, tier="slow"))
    cap = 24 * mib
    # at submission the agent's evictor is moving 20 MiB off the fast tier: 4 MiB of room left
    busy = {"tiers": {"fast": {"capacity": cap, "used": 20 * mib, "moving_out_bytes": 20 * mib},
                      "slow": {"capacity": 1 << 40, "used": 0}}}
    idle = {"tiers": {"fast": {"capacity": cap, "used": 0}, "slow": {"capacity": 1 << 40, "used": 0}}}
    assert api.beat("a", seq=2, status=busy).status_code == 200
    doc = {"version": 1, "name": "three", "jobs": [
        {"name": f"j{k}", "accesses": [{"path": f"y{k}", "size": "10M"}]} for k in (1, 2, 3)]}
    r = api.post("/api/v1/manifests?nodes=a", doc)
    assert r.status_code == 201, r.text
    m = r.json()
    mid, url = m["id"], f"/api/v1/manifests/{m['id']}/jobs"
    forecast = m["plans"]["a"]
    assert not [s for s in forecast if s["action"] == "prefetch"], forecast  # no room at submission
    # the moves have ended by the time j1 has read its input; y3 was promoted meanwhile
    assert api.beat("a", seq=3, status=idle).status_code == 200
    meta = store.get(b"/y3")
    meta.tier = "fast"
    assert store.put(b"/y3", meta)
    assert api.post(f"{url}/j1/start").status_code == 200
    assert api.post(f"{url}/j1/reads-done").status_code == 200
    got = api.beat("a", seq=4, status=idle).json()["actions"]
    assert [(d["job"], d["action"], d["path"]) for d in got] == [("j2", "prefetch", "/y2")]
    one = api.get(f"{url}/j2").json()
    assert [(i["plan_action"], i["path"], i["state"]) for i in one["steps"]] == [("prefetch", "/y2", "delivered")]
    v = api.get(f"/api/v1/manifests/{mid}").json()
    assert v["plans"]["a"] == forecast  # the forecast made at submission, as shown in the views
    item = next(i for i in v["step_items"] if i["job"] == "j2")
    assert item["size"] == 10 * mib <= cap and item["source"] == "a"
    # j3's turn: y3 is on the fast tier now (the DHT), so nothing to prefetch; y2 (j2's
    # staged input, read) and y3 fit together: no eviction either
    api.beat("a", seq=5, status=idle, action_results=[{"id": got[0]["id"], "state": "done", "detail": "fast",
                                                       "tier": "fast"}])
    api.post(f"{url}/j1/finish")
    assert api.post(f"{url}/j2/start").json()["steps"] == [{"step": item["step"], "plan_action": "prefetch",
                                                             "path": "/y2", "state": "done"}]
    assert api.post(f"{url}/j2/reads-done").status_code == 200
    assert [d for d in api.beat("a", seq=6, status=idle).json()["actions"] if d["job"] == "j3"] == []
    assert api.get(f"{url}/j3").json()["steps"] == []


def test_a_prefetch_of_a_parents_output_is_released_when_that_parent_finishes(api: Api, store):  # noqa: F811
    """A job reading several parents' outputs gets the prefetch of each one once the
    parent that writes it has finished (and the job's turn on its node has come), not
    when the last parent has: ``j`` on b reads ``o1`` and ``o3`` from a; ``o1``'s prefetch
    goes while ``p3`` still runs.  ``o3``'s would go when ``j`` can start (``p3`` was the
    last thing it waited for): it is skipped, ``j`` reads ``o3`` where it is."""
    mib = 1 << 20
    for n in ("a", "b"):
        assert api.beat(n, status=STATUS).status_code == 200
    doc = {"version": 1, "name": "fan-in", "jobs": [
        {"name": "p1", "accesses": [{"path": "o1", "size": "8M", "op": "W"}]},
        {"name": "p2", "accesses": [{"path": "o2", "size": "8M", "op": "W"}]},
        {"name": "p3", "accesses": [{"path": "o3", "size": "8M", "op": "W"}]},
        {"name": "j", "accesses": [{"path": f"o{k}", "size": "8M"} for k in (1, 2, 3)]}]}
    r = api.post("/api/v1/manifests?nodes=a,b&solver=round-robin", doc)
    assert r.status_code == 201, r.text
    m = r.json()
    mid, url = m["id"], f"/api/v1/manifests/{m['id']}/jobs"
    assert m["placement"] == {"p1": "a", "p2": "b", "p3": "a", "j": "b"}, m["placement"]
    assert {(s["job"], s["path"]) for s in m["plans"]["b"] if s["action"] == "prefetch"} == {("j", "o1"), ("j", "o3")}
    for p, n in (("p1", "a"), ("p2", "b"), ("p3", "a")):
        store.create(f"/o{p[1]}".encode(), file_meta(n, size=8 * mib, tier="fast"))
    for p in ("p1", "p2", "p3"):
        assert api.post(f"{url}/{p}/start").status_code == 200
    assert api.post(f"{url}/p2/reads-done").status_code == 200  # j's turn on b
    assert beat(api, "b") == []  # its prefetches' files do not exist yet
    assert api.post(f"{url}/p1/finish").status_code == 200
    got = [d for d in beat(api, "b") if d["job"] == "j"]
    assert [(d["action"], d["path"]) for d in got] == [("prefetch", "/o1")]  # p2 and p3 still run
    assert api.post(f"{url}/p2/finish").status_code == 200
    assert [d["path"] for d in beat(api, "b") if d["job"] == "j"] == ["/o1"]  # p3 still runs
    assert api.post(f"{url}/p3/finish").status_code == 200
    assert [d["path"] for d in beat(api, "b") if d["job"] == "j"] == ["/o1"]  # j can start: o3 skipped
    steps = api.post(f"{url}/j/start").json()["steps"]
    assert [(st["path"], st["state"]) for st in steps] == [("/o1", "delivered"), ("/o3", "skipped")]
    item = next(i for i in api.get(f"/api/v1/manifests/{mid}").json()["step_items"] if i["path"] == "/o3"
                and i["job"] == "j")
    assert "can start now" in item["detail"]

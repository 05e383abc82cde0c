"""The REST API on SQLite and on PostgreSQL, with the real Redis Cluster (see conftest.py)."""

from __future__ import annotations

import stat
import time

import pytest
from hycache_dht import registry
from hycache_dht.meta import EntryMeta, dir_meta
from hycache_dht.redis_store import RedisClusterStore
from hycache_harness import wait_for

from .conftest import Api


def names_field(resp, *loc) -> bool:
    """The 4xx body is {"detail": [{"loc": [...], ...}]} and some item's loc is ``loc``."""
    detail = resp.json()["detail"]
    assert isinstance(detail, list), detail
    return any(tuple(d["loc"]) == loc for d in detail)


@pytest.fixture
def store(redis_cluster, dht_namespace):
    s = RedisClusterStore(redis_cluster.nodes[:3], namespace=dht_namespace)
    yield s
    s.close()


def file_meta(primary: str, size: int = 10, tier: str = "fast", pinned: bool = False) -> EntryMeta:
    now = time.time_ns()
    return EntryMeta("file", stat.S_IFREG | 0o644, 0, 0, size, now, now, now, primary=primary, tier=tier,
                     pinned=pinned)


# -- auth -----------------------------------------------------------------------------------

def test_auth_scopes_and_revocation(api: Api):
    c = api.client
    r = c.get("/api/v1/nodes")
    assert r.status_code == 401 and names_field(r, "header", "Authorization")
    r = c.get("/api/v1/nodes", headers={"Authorization": "Bearer nonsense"})
    assert r.status_code == 401 and names_field(r, "header", "Authorization")
    assert api.get("/api/v1/whoami", api.read).json() == {"name": "test-reader", "scope": "read", "node_id": None}
    assert api.get("/api/v1/nodes", api.read).status_code == 200
    # a read token may not mutate, nor see tokens
    r = api.post("/api/v1/files/actions", {"action": "pin", "paths": ["/x"]}, token=api.read)
    assert r.status_code == 403 and names_field(r, "header", "Authorization")
    r = api.put("/api/v1/nodes/a/policy", {"policy": "lru", "high_watermark": 0.9, "low_watermark": 0.5},
                token=api.read)
    assert r.status_code == 403
    assert api.get("/api/v1/tokens", api.read).status_code == 403
    # a node token speaks for its own node only, and reads nothing
    assert api.beat("a").status_code == 200
    body = {"node_id": "b", "boot_id": "x", "seq": 1, "sent_at": time.time()}
    r = api.post("/api/v1/nodes/b/heartbeats", body, token=api.node_token("a"))
    assert r.status_code == 403 and names_field(r, "header", "Authorization")
    r = api.post("/api/v1/nodes/a/heartbeats", {**body, "node_id": "b"}, token=api.node_token("a"))
    assert r.status_code == 422 and names_field(r, "body", "node_id")
    assert api.get("/api/v1/nodes", api.node_token("a")).status_code == 403
    # an admin creates and revokes a token through the API; the revoked one gets 401 at once
    r = api.post("/api/v1/tokens", {"name": "temp", "scope": "read"})
    assert r.status_code == 201, r.text
    tok = r.json()
    assert tok["token"].startswith("hct_") and "hash" not in tok
    assert api.get("/api/v1/nodes", tok["token"]).status_code == 200
    listed = api.get("/api/v1/tokens").json()
    assert tok["id"] in [t["id"] for t in listed["items"]] and all("token" not in t for t in listed["items"])
    assert api.client.delete(f"/api/v1/tokens/{tok['id']}", headers=api.h()).json()["revoked_at"] is not None
    r = api.get("/api/v1/nodes", tok["token"])
    assert r.status_code == 401 and names_field(r, "header", "Authorization")
    r = api.post("/api/v1/tokens", {"name": "n", "scope": "node"})
    assert r.status_code == 422
    # every mutation is in the audit log with the token's name and the result
    events = api.get("/api/v1/events?kind=audit").json()["items"]
    seen = {(e["actor"], e["action"], e["result"]) for e in events}
    assert ("test-admin", "POST /api/v1/tokens", "201") in seen
    assert ("test-reader", "POST /api/v1/files/actions", "403") in seen


def test_paths_are_validated_and_nothing_is_touched(api: Api, store):
    bad = ["/../etc/passwd", "/a/../../b", "relative/path", "/a/./b", "/a\x00b", "/" + "x" * 5000]
    for p in bad:
        r = api.get("/api/v1/files", params={"path": p})
        assert r.status_code == 422, (p, r.text)
        assert names_field(r, "query", "path"), r.text
        r = api.get("/api/v1/files/info", params={"path": p})
        assert r.status_code == 422 and names_field(r, "query", "path")
    r = api.post("/api/v1/files/actions", {"action": "pin", "paths": ["/ok", *bad]})
    assert r.status_code == 422
    for i in range(len(bad)):
        assert names_field(r, "body", "paths", i + 1), r.text
    assert not names_field(r, "body", "paths", 0)
    assert api.get("/api/v1/actions").json()["total"] == 0
    assert api.get("/api/v1/events?kind=action").json()["total"] == 0
    r = api.post("/api/v1/files/actions", {"action": "explode", "paths": ["/a"]})
    assert r.status_code == 422 and names_field(r, "body", "action")
    # missing -> 404 naming the field; the registry's reserved names are not files
    r = api.get("/api/v1/files/info", params={"path": "/no/such"})
    assert r.status_code == 404 and names_field(r, "query", "path")
    registry.beat(store, registry.node_entry("n1", "127.0.0.1:1", None))
    assert api.get("/api/v1/files/info", params={"path": "/.hycache-nodes/n1"}).status_code == 404
    assert api.get("/api/v1/files", params={"path": "/.hycache-nodes"}).status_code == 404


def test_request_body_bound_is_413(api: Api):
    big = {"action": "pin", "paths": ["/" + "a" * 1000] * 100}  # > 64 KiB
    r = api.post("/api/v1/files/actions", big)
    assert r.status_code == 413 and names_field(r, "body")

    def chunks():  # no Content-Length: counted while it streams in
        yield b'{"action": "pin", "paths": ['
        for _ in range(200):
            yield b'"/' + b"b" * 1000 + b'",'
        yield b'"/c"]}'
    r = api.client.post("/api/v1/files/actions", content=chunks(),
                        headers={**api.h(), "content-type": "application/json"})
    assert r.status_code == 413 and names_field(r, "body")
    assert api.get("/api/v1/actions").json()["total"] == 0


# -- nodes ----------------------------------------------------------------------------------

def test_nodes_from_registry_and_heartbeats(api: Api, store):
    registry.beat(store, registry.node_entry("reg-only", "10.0.0.9:7070", {"fast_used": 1}))
    node = wait_for(lambda: next((n for n in api.get("/api/v1/nodes").json()["items"] if n["id"] == "reg-only"),
                                 None), what="the registry node in /nodes")
    assert node["address"] == "10.0.0.9:7070" and node["state"] == "up" and node["last_heartbeat"] is None
    assert node["dht"]["registry_alive"] is True

    status = {"policy": "lru", "watermarks": {"high": 0.9, "low": 0.7},
              "tiers": {"fast": {"capacity": 1000, "used": 1200, "files": 2, "device_free": 5000,
                                 "write_ceiling": 1500, "remote_cache_bytes": 40},
                        "slow": {"capacity": 9000, "used": 300, "files": 3, "device_free": 8000}},
              "cluster": {"state": "ok", "backlog": 4, "copies_kept": {"files": 2, "bytes": 30, "adopted": 1}},
              "migrations": {"migrations_done": 9, "evictions": 5, "promotions": 3, "spills": 1,
                             "evictions_taken_back": 2, "promotions_declined": 4, "migrations_failed": 0,
                             "migrations_abandoned": 1, "active": []}}
    assert api.beat("hb-node", status=status, address="127.0.0.1:7071").status_code == 200
    r = api.get("/api/v1/nodes/hb-node")
    assert r.status_code == 200
    n = r.json()
    assert n["state"] == "up" and n["address"] == "127.0.0.1:7071" and n["heartbeats"] == 1
    assert n["tiers"]["fast"]["capacity"] == 1000 and n["tiers"]["fast"]["high_watermark_bytes"] == 900
    # the write slack (used above capacity, up to the ceiling), the eviction counts and the kept copies
    assert n["tiers"]["fast"]["used"] == 1200 and n["tiers"]["fast"]["write_ceiling"] == 1500
    assert n["tiers"]["fast"]["remote_cache_bytes"] == 40 and n["tiers"]["slow"]["write_ceiling"] is None
    assert n["migrations"] == {"active": [], "done": 9, "bytes": 0, "evictions": 5, "promotions": 3, "spills": 1,
                               "evictions_taken_back": 2, "promotions_declined": 4, "failed": 0, "abandoned": 1}
    assert n["copies_kept"] == {"files": 2, "bytes": 30, "adopted": 1}
    assert n["dht"] == {"state": "ok", "backlog": 4, "registry_alive": None, "registry_age": None}
    assert n["policy"]["policy"] == "lru" and n["policy"]["version"] == 0
    # ETag: unchanged -> 304; changed -> 200 with a new tag
    etag = r.headers["etag"]
    assert api.client.get("/api/v1/nodes/hb-node", headers={**api.h(), "If-None-Match": etag}).status_code == 304
    api.beat("hb-node", seq=2, status={**status, "cluster": {"state": "degraded", "backlog": 40}})
    r2 = api.client.get("/api/v1/nodes/hb-node", headers={**api.h(), "If-None-Match": etag})
    assert r2.status_code == 200 and r2.headers["etag"] != etag
    assert r2.json()["state"] == "degraded"  # the agent's DHT link is degraded
    lst = api.get("/api/v1/nodes")
    assert api.client.get("/api/v1/nodes", headers={**api.h(), "If-None-Match": lst.headers["etag"]}).status_code \
        in (200, 304)
    assert api.get("/api/v1/nodes/nope").status_code == 404
    # heartbeats stop and the registry does not see it: down (after 3 x 0.5 s + 0.5 s)
    wait_for(lambda: api.get("/api/v1/nodes/hb-node").json()["state"] == "down", what="hb-node down")
    def transitions():  # node events are written in batches by the writer thread
        kinds = {(e["node"], e["result"]) for e in api.get("/api/v1/events?kind=node").json()["items"]}
        return {("hb-node", "down"), ("hb-node", "degraded"), ("hb-node", "up")} <= kinds
    wait_for(transitions, what="hb-node's transitions in /events")
    api.beat("hb-node", seq=3, status=status)
    assert api.get("/api/v1/nodes/hb-node").json()["state"] == "up"
    # heartbeats stop but the DHT registry sees the node alive: degraded
    registry.beat(store, registry.node_entry("hb-node", "127.0.0.1:7071", None))
    wait_for(lambda: api.get("/api/v1/nodes/hb-node").json()["state"] == "degraded", what="hb-node degraded")
    page = api.get("/api/v1/nodes?limit=1&offset=1").json()
    assert page["total"] >= 2 and len(page["items"]) == 1 and page["limit"] == 1


# -- files ----------------------------------------------------------------------------------

def test_files_listing_from_the_dht(api: Api, store):
    now = time.time_ns()
    store.create(b"/data", dir_meta(now_ns=now))
    for i in range(7):
        store.create(f"/data/f{i}".encode(), file_meta("a", size=100 + i, tier="fast" if i % 2 else "slow",
                                                       pinned=i == 3))
    registry.beat(store, registry.node_entry("a", "127.0.0.1:1", None))
    root = api.get("/api/v1/files", params={"path": "/"}).json()
    assert [e["name"] for e in root["items"]] == ["data"] and root["items"][0]["kind"] == "dir"
    seen, cursor = [], None
    while True:
        params = {"path": "/data/", "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.get("/api/v1/files", params=params).json()
        assert page["path"] == "/data" and len(page["items"]) <= 3
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [e["name"] for e in seen] == [f"f{i}" for i in range(7)]
    f3 = seen[3]
    assert f3 == {**f3, "path": "/data/f3", "size": 103, "primary": "a", "tier": "fast", "pinned": True,
                  "kind": "file", "replicas": []}
    info = api.get("/api/v1/files/info", params={"path": "/data/f4"}).json()
    assert info["tier"] == "slow" and info["size"] == 104 and info["version"] > 0
    r = api.get("/api/v1/files", params={"path": "/data/f4"})
    assert r.status_code == 422 and names_field(r, "query", "path")
    r = api.get("/api/v1/files", params={"path": "/data", "cursor": "!!!"})
    assert r.status_code in (200, 422)
    assert api.get("/api/v1/files", params={"path": "/nothing"}).status_code == 404


# -- actions --------------------------------------------------------------------------------

def test_files_pages_a_big_directory_without_reading_it_whole(api: Api, store):
    """A directory far larger than a page (a real hash table in Redis, not a listpack): every
    entry once over the pages, no page above the limit, the prefix filter done by the
    server (HSCAN MATCH), a bad cursor refused."""
    from hycache_dht.meta import Op
    n = 3000
    store.create(b"/big", dir_meta())
    for k in range(0, n, 500):
        assert all(r is True for r in store.apply([Op.create(f"/big/{'ab'[i % 2]}{i:05d}".encode(), file_meta("a"))
                                                   for i in range(k, min(n, k + 500))]))
    seen, cursor, pages = [], None, 0
    while True:
        page = api.get("/api/v1/files", params={"path": "/big", "limit": 400,
                                                **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["items"]) <= 400
        seen += [e["name"] for e in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(f"{'ab'[i % 2]}{i:05d}" for i in range(n))  # each once
    assert pages >= n // 400
    # the prefix filter (the dashboard's file view sends it): only b..., every one of them
    got, cursor = [], None
    while True:
        page = api.get("/api/v1/files", params={"path": "/big", "limit": 500, "prefix": "b0001",
                                                **({"cursor": cursor} if cursor else {})}).json()
        got += [e["name"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(got) == [f"b{i:05d}" for i in range(10, 20) if i % 2]
    # glob characters in a prefix are names, not patterns
    assert api.get("/api/v1/files", params={"path": "/big", "prefix": "*"}).json() == {
        "path": "/big", "items": [], "next_cursor": None}
    # the store's page walk itself: a page is about a page of the hash (its cost at
    # 1,000,000 entries: bench/files_bench.py)
    entries, position = store.list_page(b"/big", None, 100)
    assert len(entries) == 100 and position is not None
    more, _ = store.list_page(b"/big", position, 100)
    assert not {e[0] for e in entries} & {e[0] for e in more}
    r = api.get("/api/v1/files", params={"path": "/big", "cursor": "bm90LWEtY3Vyc29y"})
    assert r.status_code == 422 and names_field(r, "query", "cursor")


def test_actions_routed_to_the_primary_and_reported(api: Api, store):
    store.create(b"/d", dir_meta())
    store.create(b"/d/on-a", file_meta("a"))
    store.create(b"/d/on-a2", file_meta("a", tier="slow"))
    store.create(b"/d/on-b", file_meta("b"))  # b never heard of: no live node holds it
    assert api.beat("a").status_code == 200
    assert api.beat("c").status_code == 200
    r = api.post("/api/v1/files/actions", {"action": "promote", "paths": ["/d/on-a", "/d/on-a2", "/d/on-b", "/d/gone", "/d"]})
    assert r.status_code == 202, r.text
    act = r.json()
    items = {i["path"]: i for i in act["items"]}
    assert items["/d/on-a"]["node"] == "a" and items["/d/on-a"]["state"] == "pending"
    assert items["/d/on-b"]["state"] == "failed" and "b" in items["/d/on-b"]["detail"]
    assert items["/d/gone"]["state"] == "failed" and "no such file" in items["/d/gone"]["detail"]
    assert items["/d"]["state"] == "failed"
    assert act["state"] == "pending"
    # delivered in a's heartbeat answer only
    assert api.beat("c", seq=2).json()["actions"] == []
    ans = api.beat("a", seq=2).json()
    got = {a["path"]: a for a in ans["actions"]}
    assert set(got) == {"/d/on-a", "/d/on-a2"} and all(a["action"] == "promote" for a in got.values())
    assert api.get(f"/api/v1/actions/{act['id']}").json()["state"] == "running"
    # re-delivered until a result arrives; results are acknowledged
    ids = sorted(a["id"] for a in got.values())
    assert sorted(a["id"] for a in api.beat("a", seq=3).json()["actions"]) == ids
    results = [{"id": got["/d/on-a"]["id"], "state": "done", "detail": "fast", "tier": "fast"},
               {"id": got["/d/on-a2"]["id"], "state": "failed", "detail": "no space on the fast tier"}]
    ans = api.beat("a", seq=4, action_results=results).json()
    assert sorted(ans["acked_results"]) == ids and ans["actions"] == []
    # c may not report a's items
    assert api.beat("c", seq=3, action_results=[results[0]]).json()["acked_results"] == []
    final = api.get(f"/api/v1/actions/{act['id']}").json()
    fi = {i["path"]: i for i in final["items"]}
    assert fi["/d/on-a"]["state"] == "done" and fi["/d/on-a"]["tier"] == "fast"
    assert fi["/d/on-a2"]["state"] == "failed" and final["state"] == "failed"
    failures = api.get("/api/v1/events?kind=action").json()["items"]
    assert any(e["node"] == "a" and "no space" in (e["detail"] or "") for e in failures)
    assert any("/d/on-b" in e["action"] for e in failures)
    assert api.get("/api/v1/actions").json()["total"] == 1
    assert api.get("/api/v1/actions/999999").status_code == 404


# -- policies -------------------------------------------------------------------------------

def test_policy_put_delivered_applied(api: Api):
    api.beat("p", status={"policy": "lru", "watermarks": {"high": 0.9, "low": 0.7}})
    assert api.get("/api/v1/nodes/p/policy").json()["version"] == 0
    bad = [({"policy": "no-such-policy", "high_watermark": 0.9, "low_watermark": 0.5}, ("body", "policy")),
           ({"policy": "lru", "high_watermark": 1.5, "low_watermark": 0.5}, ("body", "high_watermark")),
           ({"policy": "lru", "high_watermark": 0.9, "low_watermark": 0}, ("body", "low_watermark"))]
    for body, loc in bad:
        r = api.put("/api/v1/nodes/p/policy", body)
        assert r.status_code == 422 and names_field(r, *loc), r.text
    r = api.put("/api/v1/nodes/p/policy", {"policy": "lru", "high_watermark": 0.5, "low_watermark": 0.6})
    assert r.status_code == 422
    assert api.put("/api/v1/nodes/nobody/policy", {"policy": "lru", "high_watermark": 0.9,
                                                   "low_watermark": 0.5}).status_code == 404
    r = api.put("/api/v1/nodes/p/policy", {"policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.6})
    assert r.status_code == 200 and r.json()["version"] == 1 and r.json()["applied_version"] == 0
    ans = api.beat("p", seq=2).json()
    assert ans["policy"] == {"version": 1, "policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.6}
    api.beat("p", seq=3, policy_version=1)
    pol = api.get("/api/v1/nodes/p/policy").json()
    assert pol["applied_version"] == 1 and pol["version"] == 1
    assert api.get("/api/v1/nodes/p").json()["policy"]["applied_version"] == 1
    ev = api.get("/api/v1/events?kind=policy&node=p").json()["items"]
    assert {e["action"] for e in ev} == {"policy set", "policy applied"}


def test_an_agent_restarted_within_the_down_bound_leaves_an_event(api: Api):
    """A new boot before the node was ever declared down: no state transition, but the
    restart is in /events (the first boot is not a restart)."""
    api.beat("r", boot_id="first", seq=1)
    api.beat("r", boot_id="first", seq=2)
    api.beat("r", boot_id="second", seq=1)

    def restarts():
        ev = api.get("/api/v1/events?kind=node&node=r").json()["items"]
        return [e for e in ev if e["action"] == "restarted"] or None
    (ev,) = wait_for(restarts, what="r's restart in /events")
    assert ev["result"] == "up" and ev["detail"] == "boot first -> second", ev
    assert api.get("/api/v1/nodes/r").json()["boot_id"] == "second"


# -- metrics --------------------------------------------------------------------------------

def test_metric_rates_from_counters_boot_change_and_gap(api: Api):
    t0 = time.time() - 100

    def c(fast_read, hits=0, misses=0):
        return {"fast": {"read_bytes": fast_read, "hits": hits}, "misses": misses, "metadata_ops": fast_read // 10}
    api.beat("m", boot_id="A", seq=1, sent_at=t0, counters=c(0))
    api.beat("m", boot_id="A", seq=2, sent_at=t0 + 1, counters=c(1000, hits=3, misses=1))
    api.beat("m", boot_id="A", seq=2, sent_at=t0 + 1, counters=c(1000, hits=3, misses=1))  # a replay: ignored
    # the agent restarts: its counters start again at 0; no negative or invented rate
    api.beat("m", boot_id="B", seq=1, sent_at=t0 + 2, counters=c(500))
    api.beat("m", boot_id="B", seq=2, sent_at=t0 + 3, counters=c(2500))
    # a gap of 10 s (control plane or network away): the rate is the average over the gap
    api.beat("m", boot_id="B", seq=9, sent_at=t0 + 13, counters=c(12500, hits=10, misses=10))

    def samples():
        s = api.get("/api/v1/nodes/m/metrics", params={"since": time.time() - 60}).json()["samples"]
        return s if len(s) >= 3 else None
    s = wait_for(samples, what="3 samples")
    assert [x["fast_read_bps"] for x in s] == [1000.0, 2000.0, 1000.0]
    assert s[0]["hits"] == 3.0 and s[0]["misses"] == 1.0 and s[0]["hit_ratio"] == 0.75
    assert s[1]["hit_ratio"] is None
    assert s[2]["hits"] == 1.0 and s[2]["hit_ratio"] == 0.5 and s[2]["metadata_ops_per_s"] == 100.0
    assert api.get("/api/v1/nodes/m").json()["rates"]["fast_read_bps"] == 1000.0
    r = api.get("/api/v1/nodes/m/metrics", params={"since": "yesterday"})
    assert r.status_code == 422 and names_field(r, "query", "since")
    r = api.get("/api/v1/nodes/m/metrics", params={"since": 0, "until": 10**9, "step": 1})
    assert r.status_code == 422 and names_field(r, "query", "step")
    iso = api.get("/api/v1/nodes/m/metrics", params={"since": "2000-01-01T00:00:00Z", "step": 86400})
    assert iso.status_code == 200 and iso.json()["resolution"] == 60


def test_downsampling_and_retention(api: Api):
    m = api.control.metrics
    # a minute boundary a day ahead: the control plane's own monitor (which downsamples at the
    # real time) never touches these samples
    base = float((int(time.time()) // 60) * 60 + 86400)
    for i in range(180):  # three minutes of 1 s samples: 0..59 -> 10, 60..119 -> 20, 120..179 -> 30
        m.add("ds", base + i, {"fast_read_bps": 10.0 * (1 + i // 60), "hit_ratio": 0.5})
    assert m.downsample(now=base + 130) == 2  # the third minute is not finished
    assert m.downsample(now=base + 130) == 0  # once per minute
    _, rows = m.query("ds", base, base + 200, 60, now=base + 130)
    assert [(r["ts"], r["fast_read_bps"], r["hit_ratio"]) for r in rows] == [(base, 10.0, 0.5), (base + 60, 20.0, 0.5)]
    assert m.downsample(now=base + 185) == 1
    # raw samples older than an hour are dropped, the minutes stay; a step > 1 s averages
    res, raw = m.query("ds", base, base + 200, 1, now=base + 200)
    assert res == 1 and len(raw) == 180
    _, coarse = m.query("ds", base, base + 179, 30, now=base + 200)
    assert [r["fast_read_bps"] for r in coarse] == [10.0, 10.0, 20.0, 20.0, 30.0, 30.0]
    m.downsample(now=base + 3600 + 61)
    res, raw = m.query("ds", base + 60, base + 200, 1, now=base + 120)
    assert res == 1 and [r["ts"] for r in raw] == [base + i for i in range(61, 180)]
    _, minutes = m.query("ds", base, base + 200, 60, now=base + 3600 + 61)
    assert len(minutes) == 3 and minutes[2]["fast_read_bps"] == 30.0
    m.downsample(now=base + 7 * 86400 + 70)
    _, minutes = m.query("ds", base, base + 200, 60, now=base + 7 * 86400 + 70)
    assert [r["ts"] for r in minutes] == [base + 120]


# -- health and prometheus ------------------------------------------------------------------

def test_health_ready_prometheus_and_ui(api: Api):
    assert api.client.get("/healthz").json() == {"status": "ok"}
    r = api.client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok", "redis": "ok"}
    api.beat("prom", status={"tiers": {"fast": {"capacity": 1000, "used": 10}}})
    text = api.client.get("/metrics").text
    assert 'hycache_nodes{state="up"}' in text
    assert 'hycache_node_tier_capacity_bytes{node="prom",tier="fast"} 1000.0' in text
    assert "hycache_control_heartbeats_received_total" in text
    assert "hycache_control_dht_reachable" in text
    r = api.client.get("/some/dashboard/page")
    assert r.status_code == 200 and "not built" in r.text
    (api.tmp / "no-ui").mkdir()
    (api.tmp / "no-ui" / "index.html").write_text("<html>spa</html>")
    (api.tmp / "no-ui" / "app.js").write_text("js")
    assert api.client.get("/nodes/a").text == "<html>spa</html>"
    assert api.client.get("/app.js").text == "js"
    r = api.client.get("/api/v1/nope", headers=api.h())
    assert r.status_code == 404 and names_field(r, "path")
    doc = api.client.get("/openapi.json").json()
    assert "bearerAuth" in str(doc) or "HTTPBearer" in str(doc)

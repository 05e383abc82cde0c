"""The control plane at cluster scale (issue 20): heartbeats that touch no database on the
request path, the token table, node views that conform to the schema without pydantic on
the way out, the adaptive interval (Nomad's rule) and the down window that follows it.
SQLite and PostgreSQL (real, see conftest.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from hycache_control import schemas as S
from hycache_control.api import routes
from hycache_control.app import create_app
from hycache_control.control import Control
from hycache_control.services.accounting import summarise
from hycache_control.services.nodes import LiveNode
from hycache_control.services.tokens import TokenService
from hycache_control.settings import load_settings
from hycache_control.views import node_view
from sqlalchemy import event

BACKGROUND_THREADS = ("metrics-writer", "monitor", "bus")  # batches, ticks, notifications


@pytest.fixture
def plane(db_url, tmp_path):
    def make(**kw) -> Control:
        settings = load_settings(None, db=db_url, state_dir=str(tmp_path), ui_dir=str(tmp_path / "no-ui"),
                                 **{"heartbeat_interval": 0.5, "down_grace": 0.5, "flush_interval": 0.1, **kw})
        return Control(settings)
    return make


def beat(node: str, seq: int = 1, **kw) -> S.Heartbeat:
    return S.Heartbeat(node_id=node, boot_id="b1", seq=seq, sent_at=time.time(), **kw)


def test_heartbeats_touch_no_database_on_the_request_path(plane):
    control = plane()
    tokens = {f"n{i}": control.tokens.create(f"n{i}", "node", f"n{i}")[1] for i in range(5)}
    statements: list[tuple[str, str]] = []

    def seen(conn, cursor, statement, *a):
        statements.append((threading.current_thread().name, statement.split()[0]))
    with TestClient(create_app(control.settings, control)) as client:
        event.listen(control.db.engine, "before_cursor_execute", seen)
        try:
            for seq in range(1, 21):
                for node, tok in tokens.items():
                    r = client.post(f"/api/v1/nodes/{node}/heartbeats", headers={"Authorization": f"Bearer {tok}"},
                                    json={"node_id": node, "boot_id": "b1", "seq": seq, "sent_at": time.time(),
                                          "counters": {"fast": {"read_bytes": seq * 100}}})
                    assert r.status_code == 200, r.text
                    assert r.json() == {"interval": 0.5, "policy": None, "actions": [], "acked_results": [],
                                        "plans": []}
        finally:
            event.remove(control.db.engine, "before_cursor_execute", seen)
        on_requests = [s for s in statements if s[0] not in BACKGROUND_THREADS]
        assert on_requests == []  # 100 heartbeats: not one statement outside the background threads
        # ... and the samples still reached the database through the writer
        control.writer.flush()
        _, samples = control.metrics.query("n0", time.time() - 60, time.time() + 1, 1.0)
        assert len(samples) == 19  # every heartbeat after the first of the boot


def test_the_lean_heartbeat_route_answers_as_fastapis_handler(plane, monkeypatch):
    """The heartbeat's lean path (api/routes.py HeartbeatRoute) against FastAPI's handler of
    the same route (taken for a ``+json`` content type the lean path leaves to it): the same
    answers, the same errors, the same published operation."""
    control = plane()
    tok = control.tokens.create("a", "node", "a")[1]
    other = control.tokens.create("b", "node", "b")[1]
    read = control.tokens.create("r", "read")[1]
    control.policies.put("a", "lru", 0.9, 0.5, "test")
    fastapi_path = {"Content-Type": "application/vnd.hycache+json"}
    lean_answered = []
    lean_path = routes._heartbeat_lean

    async def counted(request):
        out = await lean_path(request)
        lean_answered.append(out is not None)
        return out
    monkeypatch.setattr(routes, "_heartbeat_lean", counted)
    with TestClient(create_app(control.settings, control)) as client:
        def post(node, body, token=tok, headers=None, **kw):
            h = {"Authorization": f"Bearer {token}"} if token else {}
            return client.post(f"/api/v1/nodes/{node}/heartbeats", headers={**h, **(headers or {})},
                               content=body if isinstance(body, bytes) else json.dumps(body).encode(),
                               **kw)

        answers = {}
        for seq, headers in ((1, {"Content-Type": "application/json"}), (2, fastapi_path)):
            r = post("a", {"node_id": "a", "boot_id": "b1", "seq": seq, "sent_at": time.time(),
                           "status": {"big": 2 ** 70}, "counters": {"fast": {"read_bytes": seq}}}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("application/json")
            answers[seq] = r.json()
        assert answers[1] == answers[2] == S.HeartbeatAnswer.model_validate(answers[1]).model_dump(mode="json")
        assert answers[1]["policy"]["policy"] == "lru" and answers[1]["interval"] == 0.5
        assert lean_answered == [True, False]  # the lean path answered the first, FastAPI the second
        assert control.nodes.get("a").heartbeats == 2 and control.nodes.get("a").status == {"big": 2 ** 70}

        good = {"node_id": "a", "boot_id": "b1", "seq": 3, "sent_at": time.time()}
        cases = [  # (node, body, token) -> the same status and body on either path
            ("a", good, None), ("a", good, "hct_unknown"), ("a", good, other), ("a", good, read),
            ("a", {**good, "node_id": "b"}, tok), ("a", {**good, "seq": -1}, tok), ("a", b"{not json", tok),
            ("a", {**good, "sent_at": "soon"}, tok), ("bad id!", good, tok),
        ]
        for node, body, token in cases:
            lean = post(node, body, token, headers={"Content-Type": "application/json"})
            full = post(node, body, token, headers=fastapi_path)
            assert lean.status_code == full.status_code and lean.status_code in (401, 403, 404, 422), (node, body)
            assert lean.json() == full.json(), (node, body)
        assert not any(lean_answered[2:])  # every error is FastAPI's
        assert post("a", good, None, headers={"Content-Type": "application/json"}).status_code == 401
        assert post("a", good, other, headers={"Content-Type": "application/json"}).status_code == 403
        assert post("a", {**good, "node_id": "b"}, tok, headers={"Content-Type": "application/json"}).status_code == 422

        op = client.get("/openapi.json").json()["paths"]["/api/v1/nodes/{node_id}/heartbeats"]["post"]
        assert op["operationId"] == "postHeartbeat" and op["tags"] == ["agents"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Heartbeat"}
        assert op["responses"]["200"]["content"]["application/json"]["schema"] == \
            {"$ref": "#/components/schemas/HeartbeatAnswer"}
        assert set(op["responses"]) == {"200", "400", "401", "403", "413", "422"}
        assert op["security"] == [{"HTTPBearer": []}] and op["parameters"][0]["name"] == "node_id"


def test_token_table_sees_other_processes(plane):
    control = plane()
    other = TokenService(control.db)  # another process on the same database
    _, secret = other.create("late", "node", "late")
    assert control.tokens.cached(secret) is False  # not in the table yet: only the database can tell
    c = control.tokens.authenticate(secret)
    assert c is not None and c.node_id == "late"
    assert control.tokens.cached(secret) == c  # now answered from memory
    # revoked by the other process: applies at the next reload (token_cache_seconds)
    row_id = c.id
    other.revoke(row_id)
    assert control.tokens.cached(secret) == c
    control.tokens.refresh(force=True)
    assert control.tokens.cached(secret) is None and control.tokens.authenticate(secret) is None
    # an unknown secret costs one query, then is answered from memory until the next reload
    assert control.tokens.authenticate("hct_nobody") is None
    assert control.tokens.cached("hct_nobody") is None
    # revoked through this process: at once
    _, mine = control.tokens.create("mine", "read")
    mine_id = control.tokens.authenticate(mine).id
    control.tokens.revoke(mine_id)
    assert control.tokens.cached(mine) is None


STATUSES = [
    {"policy": "lru", "watermarks": {"high": 0.9, "low": 0.7},
     "tiers": {"fast": {"capacity": 1 << 30, "device_capacity": 2 << 30, "used": 5, "files": 1, "device_free": 9,
                        "write_ceiling": 3 << 29, "remote_cache_bytes": 2},
               "slow": {"capacity": 1 << 40, "used": 7, "files": 2, "device_free": 10}},
     "migrations": {"migrations_done": 3, "bytes_promoted": 10, "bytes_demoted": 5, "evictions": 2,
                    "evictions_taken_back": 1, "promotions": 1,
                    "active": [{"path": "/a", "src": "slow", "dst": "fast", "copied": 1, "total": 9}]},
     "cluster": {"state": "ok", "backlog": 0, "copies_kept": {"files": 1, "bytes": 4, "adopted": 0}}, "hccache": {"mode": "on", "hit_ratio": 0.5},
     "passthrough": {"enabled": True, "reason": None}},
    # what a broken or hostile agent could send: the views must still conform
    {"policy": 7, "watermarks": {"high": "x", "low": None},
     "tiers": {"fast": {"capacity": "big", "used": 1.5, "files": True, "device_free": float("nan"),
                        "write_ceiling": "high", "remote_cache_bytes": [1]}, "slow": []},
     "migrations": {"migrations_done": "many", "bytes_promoted": None, "evictions": "x", "evictions_taken_back": None,
                    "active": [{"path": 3, "copied": "x"}, 5]},
     "cluster": {"state": 1, "backlog": "x", "copies_kept": {"files": "x", "bytes": None}}, "hccache": "yes", "passthrough": [1]},
    {"tiers": "none", "migrations": [], "cluster": "down"},
    {"cluster": {"copies_kept": 3}, "tiers": {"fast": {"write_ceiling": 2}}},
    None,
]


@pytest.mark.parametrize("status", STATUSES)
def test_node_views_conform_to_the_schema_as_built(status):
    now = time.time()
    n = LiveNode(id="n1", first_seen=now, state="up", state_since=now, address="h:1", version="0.1.0", boot_id="b",
                 seq=3, sent_at=now, last_heartbeat=now, heartbeats=3, status=status,
                 counters={"fast": {"read_bytes": 1}}, updated_at=now,
                 rates={"node_id": "n1", "ts": now, "resolution": 1, **dict.fromkeys(S.Rates.model_fields, 1.0)},
                 registry={"addr": "h:1", "load": 0, "last_beat": now})
    for policy in ({"policy": "lru", "high_watermark": 0.9, "low_watermark": 0.7, "version": 2,
                    "applied_version": 1},
                   {"policy": 5, "high_watermark": "x", "low_watermark": None, "version": 0, "applied_version": 0}):
        v = node_view(n, policy)
        # what the route sends as is, pydantic would send the same
        assert S.NodeOut.model_validate(v).model_dump(mode="json", by_alias=True) == v


def test_adaptive_interval_and_the_down_window_follow_the_node_count(plane):
    control = plane(max_heartbeats_per_second=10)  # base 0.5 s, grace 0.5 s, 3 missed
    nodes = control.nodes
    t0 = time.time()
    answers = [control.heartbeat(beat(f"n{i}"), db=False)["interval"] for i in range(30)]
    # Nomad's rule: max(base, nodes / rate), rounded up to 0.1 s, from the first node that makes it exceed
    assert answers[:5] == [0.5] * 5 and answers[5] == 0.6 and answers[-1] == 3.0
    nodes.tick(now=t0 + 0.1)
    assert nodes.interval == 3.0
    assert all(n.state == "up" for n in nodes.snapshot())
    # a node handed 3 s is not down after the base window (3 x 0.5 + 0.5) but after its own (3 x 3 + 0.5)
    nodes.tick(now=t0 + 3 * 0.5 + 0.5 + 1)
    assert nodes.get("n29").state == "up"
    nodes.tick(now=t0 + 3 * 3.0 + 0.5 + 1)
    assert {n.state for n in nodes.snapshot()} == {"down"}
    # nobody beats now: the interval is back to the base for the next node
    assert nodes.interval == 0.5
    assert control.heartbeat(beat("n0", seq=2), db=False)["interval"] == 0.5
    control.stop()


def test_the_monitor_looks_at_the_nodes_due_and_a_shared_beat_keeps_the_stretched_window(plane):
    """The monitor's deadline heap (only the nodes whose window passed are looked at; the
    summary's totals follow each transition) and a heartbeat heard by another process: the
    node's window follows the cluster's interval, not an older, shorter one handed here."""
    from hycache_control.models import Node
    from sqlalchemy import update
    control = plane(max_heartbeats_per_second=10)  # base 0.5 s, grace 0.5 s, 3 missed
    nodes = control.nodes
    t0 = time.time()
    for i in range(30):
        control.heartbeat(beat(f"n{i}"), db=False)  # handed 0.5 s (n0-n4) ... 3.0 s (n29)
    nodes.tick(now=t0 + 0.1)
    last = max(nodes.get(f"n{i}").last_heartbeat for i in range(5))
    nodes.tick(now=last + 3 * 0.5 + 0.5 + 0.05)  # past the window of the nodes handed 0.5 s only (n5: 0.6 s)
    states = {n.id: n.state for n in nodes.snapshot()}
    assert {i for i, st in states.items() if st == "down"} == {f"n{i}" for i in range(5)}
    s = control.summary()
    assert (s["up"], s["down"]) == (25, 5) and {**s, "ts": 0} == {**summarise(nodes.refs(), nodes.interval), "ts": 0}
    assert nodes.interval == 2.5  # 25 nodes still beating at 10/s
    # another process heard n0 (its batched UPDATE of the last heartbeat) and handed it the
    # cluster's interval: here, n0's window follows that interval, not the 0.5 s handed here
    control.writer.flush()
    heard = time.time()
    with control.db.session() as sess:
        sess.execute(update(Node).where(Node.id == "n0").values(last_heartbeat=heard))
    nodes.shared = lambda: True
    assert nodes.merge_shared() == 1
    assert nodes.get("n0").interval == 2.5
    nodes.tick(now=heard + 0.1)
    assert nodes.get("n0").state == "up"
    nodes.tick(now=heard + 3 * 0.5 + 0.5 + 1)  # the old window (2 s) passed: still up
    assert nodes.get("n0").state == "up"
    nodes.tick(now=heard + 3 * 2.5 + 0.5 + 1)
    assert nodes.get("n0").state == "down"
    nodes.shared = lambda: False
    control.stop()


def test_restart_keeps_the_stretched_window(plane):
    control = plane(max_heartbeats_per_second=10)
    for i in range(30):
        control.heartbeat(beat(f"n{i}"), db=False)
    control.nodes.tick()
    control.nodes.save_all()
    control.writer.flush()
    control.stop()
    again = plane(max_heartbeats_per_second=10)
    # the agents still beat every 3 s: the restarted plane starts from that interval
    assert again.nodes.interval == 3.0 and again.nodes.get("n7").interval == 3.0
    again.stop()


def test_summary_and_the_node_table_over_every_node(plane):
    control = plane()
    st = {"tiers": {"fast": {"capacity": 100, "used": 10, "files": 1}, "slow": {"capacity": 1000, "used": 50, "files": 2}}}
    for i in range(150):  # more than one page
        control.heartbeat(beat(f"node-{i:03d}", status={**st, "tiers": {
            "fast": {**st["tiers"]["fast"], "used": i}, "slow": st["tiers"]["slow"]}},
            counters={"fast": {"read_bytes": 0, "hits": 0}, "misses": 0}), db=False)
    for i in range(150):  # a second beat: rates (node i read 1,000 x i bytes, i hits, 1 miss)
        control.heartbeat(S.Heartbeat(node_id=f"node-{i:03d}", boot_id="b1", seq=2, sent_at=time.time() + 1,
                                      status=st, counters={"fast": {"read_bytes": 1000 * i, "hits": i}, "misses": 1}),
                          db=False)
    # a node the registry knows but that stopped long ago: down
    control.nodes.registry_reader = lambda: {"node-999": {"addr": "h:1", "load": 0, "last_beat": 0.0}}
    control.nodes.refresh_registry()
    control.nodes.registry_reader = None
    with TestClient(create_app(control.settings, control)) as client:
        admin = control.tokens.create("a", "admin")[1]
        h = {"Authorization": f"Bearer {admin}"}
        s = client.get("/api/v1/summary", headers=h).json()
        assert (s["nodes"], s["up"], s["degraded"], s["down"]) == (151, 150, 0, 1)
        # the totals kept as nodes change are the fold over every node
        assert {**s, "ts": 0} == {**summarise(control.nodes.refs(), control.nodes.interval), "ts": 0}
        assert s["tiers"]["fast"] == {"capacity": 150 * 100, "used": 150 * 10, "files": 150}
        assert s["tiers"]["slow"]["capacity"] == 150 * 1000 and s["interval"] == 0.5
        rates = s["rates"]
        assert rates["hits"] > 0 and s["hit_ratio"] == pytest.approx(rates["hits"] / (rates["hits"] + rates["misses"]))
        # the node table: filter by state and name, sort, page
        page = client.get("/api/v1/nodes", headers=h, params={"state": "up", "limit": 10}).json()
        assert page["total"] == 150 and [v["id"] for v in page["items"]][:2] == ["node-000", "node-001"]
        page = client.get("/api/v1/nodes", headers=h, params={"q": "NODE-14", "limit": 100}).json()
        assert page["total"] == 10 and all(v["id"].startswith("node-14") for v in page["items"])
        page = client.get("/api/v1/nodes", headers=h,
                          params={"sort": "hit_ratio", "desc": "true", "limit": 3, "offset": 0}).json()
        assert [v["id"] for v in page["items"]] == ["node-149", "node-148", "node-147"]
        last = client.get("/api/v1/nodes", headers=h, params={"sort": "hit_ratio", "offset": 150}).json()
        assert [v["id"] for v in last["items"]] == ["node-999"]  # no value: last either way
        assert client.get("/api/v1/nodes", headers=h, params={"sort": "nope"}).status_code == 422
        # the overview's charts: the summary over time, points recorded by the monitor
        hist = None
        for _ in range(100):
            hist = client.get("/api/v1/summary/history", headers=h, params={"seconds": 60}).json()
            if hist["points"]:
                break
            time.sleep(0.1)
        assert hist["period"] > 0 and hist["points"], hist
        p = S.SummaryPoint.model_validate(hist["points"][-1])
        assert (p.nodes, p.up, p.down) == (151, 150, 1)
        assert (p.fast_capacity, p.fast_used, p.fast_used_pct) == (15000, 1500, 10.0)
        assert p.slow_used_pct == 5.0 and p.read_bps == rates["fast_read_bps"] + rates["slow_read_bps"]
        assert client.get("/api/v1/summary/history", headers=h, params={"seconds": 0}).status_code == 422
    control.stop()


def test_the_last_active_admin_token_cannot_be_revoked(plane):
    control = plane()
    first, first_secret = control.tokens.create("first", "admin")
    second, second_secret = control.tokens.create("second", "admin")
    reader, _ = control.tokens.create("reader", "read")
    with TestClient(create_app(control.settings, control)) as client:
        def revoke(token_id: int, secret: str):
            return client.delete(f"/api/v1/tokens/{token_id}", headers={"Authorization": f"Bearer {secret}"})
        assert revoke(reader.id, first_secret).status_code == 200  # other scopes: as before
        assert revoke(second.id, first_secret).status_code == 200  # another admin remains
        r = revoke(first.id, first_secret)  # its own, the last one: refused, and it still works
        assert r.status_code == 409, r.text
        assert r.json()["detail"][0]["loc"] == ["path", "token_id"] and "last active admin" in r.json()["detail"][0]["msg"]
        assert client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {first_secret}"}).status_code == 200
        third, third_secret = control.tokens.create("third", "admin")
        assert revoke(first.id, third_secret).status_code == 200  # now there is another
        assert revoke(third.id, third_secret).status_code == 409
    control.stop()


def _sse(msg: bytes) -> tuple[str, object]:
    import json
    head, _, data = msg.decode().partition("\r\ndata: ")
    return head.removeprefix("event: "), json.loads(data)


def test_the_stream_sends_what_changed(plane):
    """A snapshot of every node, then per period only the nodes that changed and only their
    changed fields; a client that fell behind the deltas kept gets a snapshot again."""
    from hycache_control import nodefeed
    control = plane(heartbeat_interval=60)
    try:
        for i in range(3):
            control.heartbeat(beat(f"q{i}", status={"tiers": {"fast": {"capacity": 100, "used": i}}}), db=False)
        seq, snap = control.feed.snapshot(0)
        event, views = _sse(snap)
        assert event == "nodes" and [v["id"] for v in views] == ["q0", "q1", "q2"]
        assert all(S.NodeOut.model_validate(v) for v in views)
        assert control.feed.after(seq, 0) == (seq + 1, [])  # nothing moved: no delta at all
        control.heartbeat(beat("q1", seq=2, status={"tiers": {"fast": {"capacity": 100, "used": 1}}}), db=False)
        control.heartbeat(beat("q3"), db=False)  # a new node comes whole
        seq2, msgs = control.feed.after(seq + 1, 0)
        assert len(msgs) == 1
        event, delta = _sse(msgs[0])
        assert event == "nodes-delta" and delta["seq"] == seq2 and delta["removed"] == []
        q1, q3 = delta["changed"]
        assert q1["id"] == "q1" and "last_heartbeat" in q1 and "heartbeats" in q1
        assert "tiers" not in q1 and "policy" not in q1  # unchanged fields stay out
        assert S.NodeOut.model_validate(q3).id == "q3"
        # a client further behind than the deltas kept: None (the stream sends a snapshot)
        for k in range(nodefeed.KEEP + 1):
            control.heartbeat(beat("q0", seq=3 + k), db=False)
            control.feed.advance(0)
        assert control.feed.after(seq2, 0) is None
        last, snap = control.feed.snapshot(0)
        assert {v["id"]: v["heartbeats"] for v in _sse(snap)[1]}["q0"] == nodefeed.KEEP + 2
        assert control.feed.after(last, 0) == (last + 1, [])
        control.nodes.save_all()  # (the writer thread was not started: its rows by hand)
        control.writer.flush()
    finally:
        control.stop()
    # a restarted control plane's first snapshot has the stored nodes (before they beat)
    again = plane(heartbeat_interval=60)
    try:
        assert [v["id"] for v in _sse(again.feed.snapshot(0)[1])[1]] == ["q0", "q1", "q2", "q3"]
    finally:
        again.stop()


def test_kept_rate_totals_never_read_below_zero():
    """Adding and taking away float rates leaves a residue; a sum of rates that are all >= 0
    must never read negative (seen: -3.6e-12 B/s on the demo's summary)."""
    from hycache_control.services.accounting import SUMMED_RATES, TIERING_FIELDS, Totals

    t = Totals()
    zero = tuple(0.0 for _ in SUMMED_RATES)
    rest = ((0,) * len(TIERING_FIELDS), "agent")  # the cumulative counters, how counted
    a = ("up", (0,) * 6, tuple(0.7 for _ in SUMMED_RATES), *rest)
    b = ("up", (0,) * 6, tuple(0.1 for _ in SUMMED_RATES), *rest)
    t.add(a)
    t.add(b)
    t.add(a, -1)  # a's rates went back to 0: taken away, then added as 0
    t.add(("up", (0,) * 6, zero, *rest))
    t.add(b, -1)
    t.add(("up", (0,) * 6, zero, *rest))  # 0.7 + 0.1 - 0.7 - 0.1 = -2.8e-17 in floats
    assert any(v < 0 for v in t.rates), "the residue this test is about did not occur"
    assert all(v >= 0.0 for v in t.summary(1.0)["rates"].values())

"""The control plane as a real process (uvicorn): the CLI, the SSE stream with
Last-Event-ID, kill -9 during a stream of heartbeats, and fuzzing from its OpenAPI."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import httpx
import pytest
from hycache_harness import wait_for

from .conftest import REPO, cli, make_token


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def read_sse(resp: httpx.Response, want, timeout: float = 30.0) -> list[dict]:
    """Parse SSE messages from a streaming response until ``want(messages)`` is true (the
    messages of this call only)."""
    if not hasattr(resp, "_sse_lines"):
        resp._sse_lines = resp.iter_lines()
    msgs, cur = [], {}
    deadline = time.monotonic() + timeout
    for line in resp._sse_lines:
        if line == "":
            if cur:
                msgs.append(cur)
                cur = {}
                if want(msgs):
                    return msgs
        elif not line.startswith(":"):
            k, _, v = line.partition(":")
            v = v[1:] if v.startswith(" ") else v
            cur[k] = cur.get(k, "") + v if k == "data" and k in cur else v
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"the stream did not deliver what was expected: {msgs[-5:]}")


def test_cli_tokens(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = cli("token", "create", "--db", db, "--scope", "read", "--name", "dash")
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("hct_") and "shown once" in r.stderr
    r = cli("token", "create", "--db", db, "--scope", "node", check=False)
    assert r.returncode == 2 and "--node-id" in r.stderr and r.stdout == ""
    cli("token", "create", "--db", db, "--scope", "node", "--node-id", "n1")
    rows = [json.loads(line) for line in cli("token", "list", "--db", db).stdout.splitlines()]
    assert [(t["name"], t["scope"], t["node_id"]) for t in rows] == [("dash", "read", None), ("node-n1", "node", "n1")]
    assert all("hash" not in t for t in rows)
    cli("token", "revoke", "--db", db, "1")
    assert json.loads(cli("token", "list", "--db", db).stdout.splitlines()[0])["revoked_at"] is not None
    assert cli("token", "revoke", "--db", db, "99", check=False).returncode == 2
    doc = json.loads(cli("openapi").stdout)
    assert "/api/v1/nodes/{node_id}/heartbeats" in doc["paths"]
    r = cli("serve", "--listen", "nope", "--db", db, check=False)
    assert r.returncode == 2 and "listen" in r.stderr
    secret = tmp_path / "admin"
    secret.write_text("changeme")
    secret.chmod(0o600)
    r = cli("serve", "--db", db, "--admin-token-file", str(secret), check=False)
    assert r.returncode == 2 and "default or short secret" in r.stderr
    secret.chmod(0o644)
    r = cli("serve", "--db", db, "--admin-token-file", str(secret), check=False)
    assert r.returncode == 2 and "chmod 600" in r.stderr


def test_first_start_says_how_to_make_an_admin_token(control_server, tmp_path):
    srv = control_server(f"sqlite:///{tmp_path / 'empty.db'}", admin="")
    wait_for(lambda: "token create" in srv.tail(), what="the first-token hint in the log")
    assert "--scope admin" in srv.tail()


def test_stream_nodes_events_and_last_event_id(control_server, tmp_path):
    srv = control_server(f"sqlite:///{tmp_path / 's.db'}")
    url, h = srv.url, _h(srv.admin)
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/api/v1/stream").status_code == 401
        first = c.post("/api/v1/tokens", json={"name": "one", "scope": "read"}, headers=h)
        assert first.status_code == 201
        # a fresh stream (token in the query, as EventSource does) gets every node once and
        # the summary each second...
        with c.stream("GET", "/api/v1/stream", params={"access_token": srv.admin}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            msgs = read_sse(resp, lambda m: sum(x.get("event") == "summary" for x in m) >= 2)
            assert [m["event"] for m in msgs if m.get("event", "").startswith("nodes")] == ["nodes"]
            assert isinstance(json.loads([m for m in msgs if m.get("event") == "nodes"][0]["data"]), list)
            # ... and events as they happen, with ids
            c.post("/api/v1/tokens", json={"name": "two", "scope": "read"}, headers=h)
            msgs = read_sse(resp, lambda m: any(x.get("event") == "event" for x in m))
            ev = [m for m in msgs if m.get("event") == "event"][0]
            seen_id = int(ev["id"])
            assert json.loads(ev["data"])["action"] == "POST /api/v1/tokens"
        # events that happen while disconnected are replayed after Last-Event-ID
        for name in ("three", "four"):
            c.post("/api/v1/tokens", json={"name": name, "scope": "read"}, headers=h)
        with c.stream("GET", "/api/v1/stream", headers={**h, "Last-Event-ID": str(seen_id)}) as resp:
            msgs = read_sse(resp, lambda m: sum(x.get("event") == "event" for x in m) >= 2)
            ids = [int(m["id"]) for m in msgs if m.get("event") == "event"]
            assert ids[:2] == [seen_id + 1, seen_id + 2]
        # an older id replays from there: the first token's audit event comes back too
        with c.stream("GET", "/api/v1/stream", headers={**h, "Last-Event-ID": "0"}) as resp:
            msgs = read_sse(resp, lambda m: sum(x.get("event") == "event" for x in m) >= 4)
            assert [int(m["id"]) for m in msgs if m.get("event") == "event"][:4] == [1, 2, 3, 4]


def test_kill9_during_heartbeats_then_restart(control_server, tmp_path, db_url):
    srv = control_server(db_url, "--heartbeat-interval", "0.2")
    node_tok = make_token(db_url, "node", "node-k", "k")
    url = srv.url
    state = {"seq": 0, "ok": 0, "errors": 0, "stop": False, "url": url}
    boot = "boot-k"

    def agent():  # a heartbeat stream like the agent's: retry on errors, counters keep growing
        with httpx.Client(timeout=2) as c:
            while not state["stop"]:
                state["seq"] += 1
                body = {"node_id": "k", "boot_id": boot, "seq": state["seq"], "sent_at": time.time(),
                        "counters": {"fast": {"read_bytes": state["seq"] * 1000}}}
                try:
                    r = c.post(state["url"] + "/api/v1/nodes/k/heartbeats", json=body, headers=_h(node_tok))
                    state["ok"] += r.status_code == 200
                except httpx.HTTPError:
                    state["errors"] += 1
                time.sleep(0.1)
    t = threading.Thread(target=agent, daemon=True)
    t.start()
    try:
        wait_for(lambda: state["ok"] >= 30, what="30 heartbeats")
        srv.kill9()
        killed_at = time.time()
        ok_before = state["ok"]
        wait_for(lambda: state["errors"] >= 3, what="heartbeats failing while the control plane is dead")
        srv2 = control_server(db_url, "--heartbeat-interval", "0.2", admin=srv.admin,
                              port=int(url.rsplit(":", 1)[1]))
        wait_for(lambda: state["ok"] >= ok_before + 20, what="heartbeats accepted again after the restart")
    finally:
        state["stop"] = True
        t.join(timeout=10)
    with httpx.Client(base_url=srv2.url, headers=_h(srv.admin), timeout=30) as c:
        node = c.get("/api/v1/nodes/k").json()
        assert node["state"] == "up" and node["boot_id"] == boot
        # history up to the kill: samples within a flush interval of it, and new ones after
        samples = c.get("/api/v1/nodes/k/metrics", params={"since": killed_at - 120}).json()["samples"]
        before = [s for s in samples if s["ts"] <= killed_at]
        after = [s for s in samples if s["ts"] > killed_at]
        assert len(before) >= 20 and before[-1]["ts"] > killed_at - 3, (len(before), killed_at)
        assert len(after) >= 10
        assert all(s["fast_read_bps"] > 0 for s in samples)  # no reset or negative spike
        ev = c.get("/api/v1/events", params={"kind": "node", "node": "k"}).json()["items"]
        assert ev and ev[0]["result"] == "up"  # newest first


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_fuzz_every_endpoint_from_openapi(control_server, tmp_path, db_url, redis_cluster, dht_namespace):
    from .conftest import redis_seeds
    srv = control_server(db_url, "--redis", redis_seeds(redis_cluster), "--dht-namespace", dht_namespace)
    for i in range(20):  # low ids the fuzzer likes are these tokens, not its own admin token
        make_token(db_url, "read", f"decoy{i}")
    admin = make_token(db_url, "admin", "fuzzer")
    argv = [str(REPO / ".venv" / "bin" / "schemathesis"), "run", srv.url + "/openapi.json",
            "-H", f"Authorization: Bearer {admin}", "--checks", "not_a_server_error,response_schema_conformance,"
            "status_code_conformance,content_type_conformance", "--max-examples", "15", "--seed", "1",
            "--exclude-path", "/api/v1/stream", "--phases", "examples,coverage,fuzzing", "--workers", "1",
            "--request-timeout", "20", "--no-color", "--generation-database", "none"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                       env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:] + srv.tail()

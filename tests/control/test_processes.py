"""Several control-plane processes, one cluster (issue 20): two real ``hycache-control
serve`` processes on one real PostgreSQL behind a real HAProxy, simulated agents beating
through the load balancer, actions in flight, a stream client; one process is killed -9.
No node flaps to ``down``, every action item is applied once and reaches ``done``, the
stream resumes on the other process with ``Last-Event-ID`` without a gap or a repeat.
Also ``serve --workers 2``."""

from __future__ import annotations

import collections
import threading
import time

import httpx
import pytest
from hycache_control.testing import start_haproxy
from hycache_harness import free_port, wait_for

from .conftest import make_token, redis_seeds
from .test_api import file_meta
from .test_server import _h, read_sse

NODES = 12
INTERVAL = 0.5


class Agents:
    """Simulated agents behind the load balancer: heartbeats every INTERVAL, each action
    applied once per id (as the agent does), results reported until acknowledged."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.url, self.tokens = url, tokens
        self.seq = collections.Counter()
        self.applied: set[int] = set()
        self.delivered: collections.Counter[int] = collections.Counter()
        self.results: dict[str, dict[int, dict]] = {n: {} for n in tokens}
        self.acked: set[int] = set()
        self.after_ack: list[int] = []  # deliveries of an item whose result was acknowledged
        self.ok = self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                for node, tok in self.tokens.items():
                    self.seq[node] += 1
                    body = {"node_id": node, "boot_id": f"boot-{node}", "seq": self.seq[node], "sent_at": time.time(),
                            "counters": {"fast": {"read_bytes": self.seq[node] * 100}},
                            "action_results": list(self.results[node].values())}
                    try:
                        r = c.post(f"/api/v1/nodes/{node}/heartbeats", json=body, headers=_h(tok))
                    except httpx.HTTPError:
                        self.errors += 1
                        continue
                    if r.status_code != 200:
                        self.errors += 1
                        continue
                    self.ok += 1
                    ans = r.json()
                    for i in ans["acked_results"]:
                        self.results[node].pop(i, None)
                        self.acked.add(i)
                    for a in ans["actions"]:
                        self.delivered[a["id"]] += 1
                        if a["id"] in self.acked:
                            self.after_ack.append(a["id"])
                        if a["id"] not in self.applied:  # the agent applies an id once (re-sent until reported)
                            self.applied.add(a["id"])
                            self.results[node][a["id"]] = {"id": a["id"], "state": "done", "detail": "fast",
                                                           "tier": "fast"}
                self.stop.wait(max(0.0, INTERVAL - (time.monotonic() - t0)))


class StreamClient:
    """Reads the stream's events through the load balancer; reconnects with Last-Event-ID."""

    def __init__(self, url: str, admin: str) -> None:
        self.url, self.admin = url, admin
        self.ids: list[int] = []
        self.resumes = 0
        self.served_by: list[str] = []  # the backend of each connection (HAProxy's X-Served-By)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            h = _h(self.admin)
            if self.ids:
                h["Last-Event-ID"] = str(self.ids[-1])
            try:
                with httpx.Client(base_url=self.url, timeout=httpx.Timeout(5, read=30)) as c, \
                        c.stream("GET", "/api/v1/stream", headers=h) as resp:
                    if resp.status_code != 200:
                        raise httpx.HTTPError(str(resp.status_code))
                    self.served_by.append(resp.headers.get("x-served-by", "?"))
                    read_sse(resp, self._take, timeout=3600)
            except (httpx.HTTPError, AssertionError):
                if not self.stop.is_set():
                    self.resumes += 1
                    time.sleep(0.2)

    def _take(self, msgs) -> bool:
        m = msgs[-1]
        if m.get("event") == "event":
            self.ids.append(int(m["id"]))
        return self.stop.is_set()


@pytest.fixture
def pg_url(postgres) -> str:
    return postgres.create_database()


def test_kill9_one_of_two_processes_behind_haproxy(control_server, tmp_path, pg_url, redis_cluster, dht_namespace):
    from hycache_dht.meta import dir_meta
    from hycache_dht.redis_store import RedisClusterStore
    store = RedisClusterStore(redis_cluster.nodes[:3], namespace=dht_namespace)
    try:
        store.create(b"/k", dir_meta())
        for j in range(2 * NODES):
            store.create(f"/k/f{j}".encode(), file_meta(f"k{j % NODES}"))
    finally:
        store.close()
    flags = ("--redis", redis_seeds(redis_cluster), "--dht-namespace", dht_namespace,
             "--heartbeat-interval", str(INTERVAL))
    a = control_server(pg_url, *flags)
    b = control_server(pg_url, *flags, admin=a.admin)
    lb_port = free_port()
    lb = start_haproxy(tmp_path, lb_port, [int(a.url.rsplit(":", 1)[1]), int(b.url.rsplit(":", 1)[1])])
    url = f"http://127.0.0.1:{lb_port}"
    tokens = {f"k{i}": make_token(pg_url, "node", f"node-k{i}", f"k{i}") for i in range(NODES)}
    agents = Agents(url, tokens)
    stream = StreamClient(url, a.admin)
    agents.thread.start()
    stream.thread.start()
    c = httpx.Client(base_url=url, headers=_h(a.admin), timeout=30)
    try:
        for srv in (a, b):  # each process: the nodes it hears and those the other one hears
            wait_for(lambda: httpx.get(f"{srv.url}/api/v1/nodes", params={"state": "up"}, headers=_h(a.admin),
                                       timeout=10).json()["total"] == NODES, 60, f"every node up on {srv.url}")
        wait_for(lambda: len(stream.ids) >= 1, 30, "the stream to carry an event")
        # the process to kill: the one the stream client is on (so it must resume elsewhere)
        victim, survivor = (a, b) if stream.served_by[0] == "cp0" else (b, a)
        # an action in flight (some items delivered, not yet reported) when a process dies
        first = c.post("/api/v1/files/actions", json={"action": "promote",
                                                      "paths": [f"/k/f{j}" for j in range(NODES)]})
        assert first.status_code == 202, first.text
        victim.kill9()
        killed = time.time()
        second = c.post("/api/v1/files/actions", json={"action": "promote",
                                                       "paths": [f"/k/f{j}" for j in range(NODES, 2 * NODES)]})
        assert second.status_code == 202, second.text
        ids = [first.json()["id"], second.json()["id"]]
        try:
            wait_for(lambda: all(c.get(f"/api/v1/actions/{i}").json()["state"] == "done" for i in ids), 60,
                     "both actions done on the surviving process")
        except AssertionError:
            print([c.get(f"/api/v1/actions/{i}").json() for i in ids], dict(agents.delivered), agents.ok,
                  agents.errors, survivor.tail())
            raise
        ok_at_done = agents.ok
        wait_for(lambda: agents.ok >= ok_at_done + 3 * NODES, 30, "more heartbeats after the kill")
        wait_for(lambda: len(stream.ids) >= 2 and stream.ids[-1] >= max(
            e["id"] for e in c.get("/api/v1/events", params={"limit": 1}).json()["items"]), 30,
            "the stream to catch up on the surviving process")
    finally:
        agents.stop.set()
        stream.stop.set()
        agents.thread.join(timeout=10)
        lb.terminate()
        lb.wait(timeout=10)
        stream.thread.join(timeout=40)
    c = httpx.Client(base_url=survivor.url, headers=_h(a.admin), timeout=30)  # the survivor, directly
    downs = c.get("/api/v1/events", params={"kind": "node", "limit": 1000}).json()["items"]
    assert [e for e in downs if e["result"] != "up"] == []  # no node flapped
    assert c.get("/api/v1/nodes", params={"state": "up"}).json()["total"] == NODES
    items = [it for i in ids for it in c.get(f"/api/v1/actions/{i}").json()["items"]]
    assert len(items) == 2 * NODES and {it["state"] for it in items} == {"done"}
    assert sorted(agents.applied) == sorted(it["id"] for it in items)  # none lost
    # none applied twice: no item is sent again once its result was acknowledged (an agent
    # that restarted in between would apply it again)
    assert agents.after_ack == []
    # the stream: every event once, in order, across the kill (resumed with Last-Event-ID)
    assert stream.resumes >= 1 and len(set(stream.served_by)) == 2, stream.served_by
    # (ids are a sequence: a transaction the killed process had open leaves a gap, so the
    # truth is the table)
    table = [e["id"] for e in c.get("/api/v1/events", params={"since_id": stream.ids[0] - 1,
                                                              "limit": 1000}).json()["items"]]
    assert stream.ids == [i for i in table if i <= stream.ids[-1]], (stream.ids, table)
    assert killed > 0


def test_serve_workers_2_share_one_cluster(control_server, pg_url):
    srv = control_server(pg_url, "--workers", "2", "--heartbeat-interval", str(INTERVAL))
    tokens = {f"w{i}": make_token(pg_url, "node", f"node-w{i}", f"w{i}") for i in range(6)}
    with httpx.Client(base_url=srv.url, timeout=10) as c:  # new connections: both workers take some
        for seq in range(1, 6):
            for node, tok in tokens.items():
                r = httpx.post(f"{srv.url}/api/v1/nodes/{node}/heartbeats", headers=_h(tok), timeout=10,
                               json={"node_id": node, "boot_id": "b", "seq": seq, "sent_at": time.time()})
                assert r.status_code == 200, r.text
        # whichever worker answers (a new connection each time, and the kept-alive one) knows
        # every node as up.  (Stop 40's CI: six new connections can all land on one worker,
        # so the kept-alive connection's worker is asked in the same wait, not after it.)
        def all_up() -> bool:
            fresh = all(httpx.get(f"{srv.url}/api/v1/nodes", params={"state": "up"}, headers=_h(srv.admin),
                                  timeout=10).json()["total"] == 6 for _ in range(6))
            return fresh and c.get("/api/v1/nodes", params={"state": "up"},
                                   headers=_h(srv.admin)).json()["total"] == 6
        wait_for(all_up, 30, "every worker to see every node up")
        assert c.get("/api/v1/nodes", headers=_h(srv.admin)).json()["total"] == 6


def test_every_process_shows_the_boot_an_agent_runs_now(control_server, pg_url):
    """An agent restarted (a new boot id) beats to one process only (its keep-alive
    connection through the load balancer): the other process shows the new boot within a few
    seconds. Before, a process kept the boot of the last heartbeat it heard itself: the
    rollout test read an old boot id through one process, took the boot id before the restart
    that the other one showed for new, and looked for the mount before the restarted agent
    had made it."""
    flags = ("--heartbeat-interval", str(INTERVAL))
    a = control_server(pg_url, *flags)
    b = control_server(pg_url, *flags, admin=a.admin)
    tok = make_token(pg_url, "node", "node-r1", "r1")

    def beat(boot: str, seq: int) -> None:
        r = httpx.post(f"{a.url}/api/v1/nodes/r1/heartbeats", headers=_h(tok), timeout=10,
                       json={"node_id": "r1", "boot_id": boot, "seq": seq, "sent_at": time.time(),
                             "counters": {"fast": {"read_bytes": seq * 100}}})
        assert r.status_code == 200, r.text

    def shown_by_b() -> str | int:  # 404: not known there yet
        r = httpx.get(f"{b.url}/api/v1/nodes/r1", headers=_h(a.admin), timeout=10)
        return r.json()["boot_id"] if r.status_code == 200 else r.status_code

    for seq in range(1, 4):
        beat("boot-1", seq)
    wait_for(lambda: shown_by_b() == "boot-1", 30, "the other process to show boot-1")
    t0 = time.monotonic()
    for seq in range(1, 4):
        beat("boot-2", seq)
        time.sleep(INTERVAL)
    wait_for(lambda: shown_by_b() == "boot-2", 10, "the other process to show boot-2 after the restart")
    print(f"\nthe other process showed the new boot {time.monotonic() - t0:.1f} s after its first heartbeat")
    node = httpx.get(f"{b.url}/api/v1/nodes/r1", headers=_h(a.admin), timeout=10).json()
    assert node["state"] == "up" and node["counters"]["fast"]["read_bytes"] >= 100, node


def test_workers_need_postgresql(tmp_path):
    from .conftest import cli
    r = cli("serve", "--db", f"sqlite:///{tmp_path / 'c.db'}", "--workers", "2", "--listen",
            f"127.0.0.1:{free_port()}", check=False)
    assert r.returncode == 2 and "needs PostgreSQL" in r.stderr

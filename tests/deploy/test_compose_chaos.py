"""The compose cluster heals itself: each part killed once (SIGKILL) under load comes back
by itself within its bound, and nothing acknowledged is lost.

One stack (test_compose_up's `running_stack`), then, in turn, the main process of an
agent, a control-plane process, a Redis master (once killed outright, once hung until the
cluster has failed it over), a Redis replica, PostgreSQL and HAProxy gets SIGKILL from the
host — a crash, not `docker compose kill`, which Docker counts as an
operator's stop — while

* writers on agent-1 and agent-3 write small files of random bytes into /mnt/hycache/chaos
  (`cat > FILE && sync FILE` through `docker exec`); a write answered 0 is acknowledged and
  its sha256 kept, a write that fails or hangs during the outage is attempted, not lost;
* a workflow is run: the tiny WfFormat instance is POSTed before the first kill and one
  of its jobs is started before each kill and finished after it;
* probes GET /api/v1/nodes through the published port, four times a second.

Back means: the container running and healthy again with its RestartCount one higher,
and for an agent `up` in /api/v1/nodes with a new boot_id; for Redis `cluster_state:ok` on
every node and every node connected; for PostgreSQL, HAProxy and a control-plane process
the API answering 200 (nodes and manifests). Then the writers stop and every file
acknowledged so far must read back byte-identical on agent-1..3. One report line per part
(`-s` shows them; the last test prints the table): time to come back, writes attempted /
acknowledged / lost / changed, API errors during the outage. docs/deployment.md ("When
something dies") states the same bounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time

import httpx
import pytest
from test_compose_up import AGENT_BACK_BOUND, AGENTS, REDIS, TINY, Stack, running_stack, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.mount, pytest.mark.timeout(1800)]

# part -> the bound in seconds from the SIGKILL until it is back as defined above. Docker
# restarts a crashed container at once; the rest is the service's own start and its
# healthcheck's interval (agent 10 s, control plane 5 s, the others 2 s), on a loaded
# 2-core machine. "redis master hung": the master is stopped (SIGSTOP) until the cluster
# has promoted its replica (cluster-node-timeout 5 s), then killed; its bound counts from
# the SIGSTOP and it is back as a replica.
BOUNDS = {
    "agent-2": AGENT_BACK_BOUND,
    "control-plane": 90.0,
    "redis master": 90.0,
    "redis master hung": 120.0,
    "redis replica": 60.0,
    "postgres": 90.0,
    "haproxy": 60.0,
}
PARTS = list(BOUNDS)
WRITERS = ["agent-1", "agent-3"]
DIR = "/mnt/hycache/chaos"
WRITE_TIMEOUT = 30.0
SETTLE = 3.0  # load before the kill and after the part is back


def _docker(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout)


class Writers:
    """One thread per agent in WRITERS writing files until stopped."""

    def __init__(self, stack: Stack, acked: dict[str, str], tag: str):
        self.stack, self.acked, self.tag = stack, acked, tag
        self.attempted = 0
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(a,), daemon=True) for a in WRITERS]

    def _run(self, agent: str) -> None:
        cid = self.stack.container(agent)
        n = 0
        while not self.stopping.is_set():
            n += 1
            name = f"{self.tag}-{agent}-{n}-{secrets.token_hex(3)}.bin"
            data = os.urandom(1024 + int.from_bytes(os.urandom(2)))
            with self.lock:
                self.attempted += 1
            try:
                out = _docker("exec", "-i", cid, "sh", "-c", f"cat > {DIR}/{name} && sync {DIR}/{name}",
                              stdin=data, timeout=WRITE_TIMEOUT)
                ok = out.returncode == 0
                why = out.stderr.decode(errors="replace").strip()[-200:]
            except subprocess.TimeoutExpired:
                ok, why = False, f"no answer in {WRITE_TIMEOUT} s"
            with self.lock:
                if ok:
                    self.acked[name] = hashlib.sha256(data).hexdigest()
                else:
                    self.failed.append(f"{name}: {why}")
            time.sleep(0.2)

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(WRITE_TIMEOUT + 30)


class Probes:
    """GET /api/v1/nodes through the published port, 4 times a second: (time, ok), and
    agent-2's (time, state, boot_id) as the answers show it."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.seen: list[tuple[float, bool]] = []
        self.agent_2: list[tuple[float, str, str | None]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            t = time.monotonic()
            try:
                r = self.stack.api("/api/v1/nodes", timeout=5)
                ok = r.status_code == 200
                if ok:
                    n = next((n for n in r.json()["items"] if n["id"] == "agent-2"), None)
                    if n is not None:
                        self.agent_2.append((t, n["state"], n.get("boot_id")))
            except (httpx.HTTPError, ValueError):
                ok = False
            self.seen.append((t, ok))
            time.sleep(0.25)

    def start(self) -> Probes:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(15)

    def errors(self, t0: float, t1: float) -> tuple[int, int]:
        window = [ok for t, ok in self.seen if t0 <= t <= t1]
        return sum(not ok for ok in window), len(window)


def sums_on(stack: Stack, agent: str, names: list[str]) -> dict[str, str]:
    """sha256 of each named file in DIR as agent reads it (a missing file is absent)."""
    out = _docker("exec", "-i", stack.container(agent), "sh", "-c", f"cd {DIR} && xargs -0 sha256sum",
                  stdin="\0".join(names).encode(), timeout=300)
    got = {}
    for line in out.stdout.decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        got[name] = digest
    return got


def check_files(stack: Stack, acked: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """Every acknowledged file on every agent: {agent: {"lost": [...], "changed": [...]}}
    for the agents where something is wrong (empty when all is well)."""
    names = sorted(acked)
    bad = {}
    for agent in AGENTS:
        got = sums_on(stack, agent, names)
        lost = [n for n in names if n not in got]
        changed = [n for n in names if n in got and got[n] != acked[n]]
        if lost or changed:
            bad[agent] = {"lost": lost, "changed": changed}
    return bad


def redis_cli(stack: Stack, node: str, *args: str) -> str:
    out = _docker("exec", stack.container(node), "sh", "-c",
                  'REDISCLI_AUTH="$(cat /run/secrets/hycache_redis_admin_password)" '
                  'exec redis-cli --user hycache-admin -p 6379 "$@"', "sh", *args, timeout=30)
    return out.stdout.decode(errors="replace")


def redis_roles(stack: Stack) -> dict[str, str]:
    """service -> master | replica, from `cluster nodes` on a node that answers."""
    prefix = stack.env["HYCACHE_NET_PREFIX"]
    for node in REDIS:
        text = redis_cli(stack, node, "cluster", "nodes")
        roles = {}
        for line in text.splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            ip = f[1].split(":")[0]
            if not ip.startswith(prefix + ".") or "fail" in f[2]:
                continue
            roles[f"redis-{int(ip.rsplit('.', 1)[1]) - 10}"] = "master" if "master" in f[2] else "replica"
        if len(roles) == len(REDIS):
            return roles
    raise AssertionError(f"no Redis node lists six healthy nodes:\n{text}")


def replica_of(stack: Stack, master: str) -> str:
    """The service that replicates the Redis master `master`."""
    prefix = stack.env["HYCACHE_NET_PREFIX"]
    lines = [ln.split() for ln in redis_cli(stack, master, "cluster", "nodes").splitlines() if ln.strip()]
    me = next(f[0] for f in lines if "myself" in f[2])
    ip = next(f[1].split(":")[0] for f in lines if f[3] == me)
    assert ip.startswith(prefix + "."), lines
    return f"redis-{int(ip.rsplit('.', 1)[1]) - 10}"


def is_master(stack: Stack, node: str) -> bool:
    mine = [ln for ln in redis_cli(stack, node, "cluster", "nodes").splitlines() if "myself" in ln]
    return bool(mine) and "master" in mine[0].split()[2]


def redis_whole(stack: Stack) -> bool:
    """cluster_state:ok on every node, and every node sees the five others connected."""
    for node in REDIS:
        if "cluster_state:ok" not in redis_cli(stack, node, "cluster", "info"):
            return False
        lines = [ln.split() for ln in redis_cli(stack, node, "cluster", "nodes").splitlines() if ln.strip()]
        if len(lines) != len(REDIS) or any("fail" in f[2] or f[7] != "connected" for f in lines):
            return False
    return True


def container_back(stack: Stack, service: str, restarts: int) -> bool:
    info = stack.inspect(service)
    state = info["State"]
    return (state["Running"] and state.get("Health", {}).get("Status") == "healthy"
            and info["RestartCount"] == restarts + 1)


def api_answers(stack: Stack) -> bool:
    return all(stack.api(p, timeout=5).status_code == 200 for p in ("/api/v1/nodes", "/api/v1/manifests"))


def last_event_id(stack: Stack) -> int:
    items = stack.api("/api/v1/events", params={"limit": 1}).json()["items"]
    return max((e["id"] for e in items), default=0)


@pytest.fixture(scope="module")
def stack():
    with running_stack() as s:
        yield s


@pytest.fixture(scope="module")
def chaos(stack):
    """What the parts share: the acknowledged files, the workflow, the report lines."""
    wait_for(lambda: all(stack.states().get(a) == "up" for a in AGENTS), 120, "agent-1..3 up")
    stack.exec("agent-1", "mkdir", "-p", DIR)
    wait_for(lambda: all(stack.exec(a, "test", "-d", DIR, check=False).returncode == 0 for a in AGENTS),
             60, f"{DIR} on every agent")
    r = stack.api("/api/v1/manifests", "POST", params={"nodes": ",".join(AGENTS), "plans": "false"},
                  json=json.loads(TINY.read_text()), timeout=60)
    assert r.status_code == 201, r.text
    manifest = r.json()
    assert len(manifest["jobs"]) >= 6, manifest["jobs"]
    return {"acked": {}, "manifest": manifest, "finished": {}, "report": []}


def _kill_target(stack: Stack, part: str) -> str:
    if part.startswith("redis"):
        want = part.split()[1]
        roles = redis_roles(stack)
        return next(n for n in REDIS if roles[n] == want)
    return part


def _back(stack: Stack, part: str, service: str, restarts: int, boot: str | None) -> bool:
    if not container_back(stack, service, restarts):
        return False
    if part == "agent-2":
        n = stack.nodes().get("agent-2", {})
        return n.get("state") == "up" and n.get("boot_id") != boot
    if part == "redis master hung" and is_master(stack, service):
        return False
    if part.startswith("redis"):
        return redis_whole(stack)
    return api_answers(stack)


def kill(stack: Stack, part: str, service: str) -> float:
    """SIGKILL to the service's main process (a hung Redis master: SIGSTOP until its
    replica is promoted, then SIGKILL); the time the outage began."""
    pid = stack.main_pid(service)
    t0 = time.monotonic()
    if part == "redis master hung":
        replica = replica_of(stack, service)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: is_master(stack, replica), 60, f"{replica} promoted while {service} hangs", interval=1)
        finally:
            os.kill(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
    return t0


def _job(stack: Stack, mid: int, job: str, what: str) -> dict:
    def done():
        r = stack.api(f"/api/v1/manifests/{mid}/jobs/{job}/{what}", "POST", timeout=15)
        return r.status_code == 200 and r.json()
    return wait_for(done, 120, f"POST …/jobs/{job}/{what} answered 200", interval=1)


@pytest.mark.parametrize("part", PARTS)
def test_a_killed_part_comes_back_by_itself_and_nothing_is_lost(stack, chaos, part):
    index = PARTS.index(part)
    mid = chaos["manifest"]["id"]
    jobs = chaos["manifest"]["jobs"]  # a job per part while there are jobs
    job = jobs[index]["id"] if index < len(jobs) else None
    service = _kill_target(stack, part)
    restarts = stack.inspect(service)["RestartCount"]
    boot = stack.nodes()["agent-2"].get("boot_id")
    since = last_event_id(stack)
    if job is not None:
        _job(stack, mid, job, "start")

    writers = Writers(stack, chaos["acked"], f"p{index}").start()
    probes = Probes(stack).start()
    try:
        time.sleep(SETTLE)
        t0 = kill(stack, part, service)
        try:
            wait_for(lambda: _back(stack, part, service, restarts, boot), BOUNDS[part],
                     f"{part} ({service}) back by itself", interval=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{stack.logs(service, tail=40)[-6000:]}") from None
        t1 = time.monotonic()
        time.sleep(SETTLE)
    finally:
        writers.stop()
        probes.stop()
    back = t1 - t0
    errors, probed = probes.errors(t0, t1)
    # the writes made during this part: the acknowledged ones are kept for every later part
    mine = {n for n in chaos["acked"] if n.startswith(f"p{index}-")}
    deadline = time.monotonic() + 60  # (a file just written may take a moment to be everywhere)
    while (bad := check_files(stack, chaos["acked"])) and time.monotonic() < deadline:
        time.sleep(5)
    lost = {n for v in bad.values() for n in v["lost"]}
    changed = {n for v in bad.values() for n in v["changed"]}
    line = (f"{part:<14} {service:<14} back in {back:5.1f} s (bound {BOUNDS[part]:.0f} s)  "
            f"writes attempted {writers.attempted} / acknowledged {len(mine)} / lost {len(lost)} / "
            f"changed {len(changed)} (all files so far: {len(chaos['acked'])})  "
            f"API errors during the outage {errors}/{probed}"
            f" ({100 * errors / max(probed, 1):.0f} %)")
    chaos["report"].append(line)
    print("\n" + line)
    assert not bad, {a: {k: v[:5] for k, v in d.items()} for a, d in bad.items()}
    assert writers.attempted > 0 and mine, (writers.attempted, writers.failed[:5])

    if job is not None:
        chaos["finished"][job] = _job(stack, mid, job, "finish").get("finished_at")
    # the whole cluster is whole again: every agent up
    wait_for(lambda: all(stack.states().get(a) == "up" for a in AGENTS), 60, "agent-1..3 up after the part")
    if part == "agent-2":
        api_says_what_happened(stack, probes, t0, boot, since)
    if part.startswith("redis"):
        roles = redis_roles(stack)
        print(f"Redis after the part: masters {sorted(n for n in REDIS if roles[n] == 'master')}, "
              f"{service} is a {roles[service]}")


def api_says_what_happened(stack: Stack, probes: Probes, t0: float, boot: str | None, since: int) -> None:
    """agent-2 in the API after its crash: a new boot_id, a `restarted` node event naming
    the old and the new boot, and every state it was seen in other than `up` (degraded,
    then down once its DHT registry entry aged out) in the node events, followed by `up`."""
    after = [(t - t0, state, b) for t, state, b in probes.agent_2 if t >= t0]
    gone = [state for _, state, b in after if state != "up"]
    reboot = next((t for t, state, b in after if b != boot and state == "up"), None)
    assert reboot is not None, after[-5:]
    events = stack.api("/api/v1/events", params={"kind": "node", "node": "agent-2", "since_id": since,
                                                 "limit": 100}).json()["items"]
    print(f"agent-2 in the API: up with a new boot_id {reboot:.1f} s after the SIGKILL; states seen "
          f"{sorted(set(gone)) or 'only up'}; node events: {[e['detail'] for e in events] or 'none'}")
    def restarted():
        return [e for e in stack.api("/api/v1/events", params={
            "kind": "node", "node": "agent-2", "since_id": since, "limit": 100}).json()["items"]
            if e["action"] == "restarted" and e["detail"].startswith(f"boot {boot} -> ")] or None
    wait_for(restarted, 60, "agent-2's restart in /api/v1/events")
    if gone:
        def told():
            results = [e["result"] for e in stack.api("/api/v1/events", params={
                "kind": "node", "node": "agent-2", "since_id": since, "limit": 100}).json()["items"]]
            first = next((i for i, r in enumerate(results) if r in gone), None)
            return first is not None and "up" in results[first:] and results
        wait_for(told, 60, f"agent-2's node events: {sorted(set(gone))}, then up")


def test_the_workflow_lost_nothing_and_ran_nothing_twice(stack, chaos):
    before = chaos["manifest"]
    got = stack.api(f"/api/v1/manifests/{before['id']}").json()
    assert got["placement"] == before["placement"]
    assert [(j["id"], j["node"]) for j in got["jobs"]] == [(j["id"], j["node"]) for j in before["jobs"]]
    jobs = {j["id"]: j for j in got["jobs"]}
    for job, finished_at in chaos["finished"].items():
        assert jobs[job]["state"] == "done" and jobs[job]["finished_at"] == finished_at, jobs[job]
    # reported again (a runner retrying after an outage): the same result, not a second run
    job = next(iter(chaos["finished"]))
    again = stack.api(f"/api/v1/manifests/{before['id']}/jobs/{job}/finish", "POST")
    assert again.status_code == 200 and again.json()["finished_at"] == chaos["finished"][job], again.text
    assert stack.api(f"/api/v1/manifests/{before['id']}/jobs/{job}/start", "POST").status_code == 409
    assert stack.api("/api/v1/manifests").json()["total"] == 1


def test_report(chaos):
    print("\nWhen something dies (compose, SIGKILL of the main process under load):")
    for line in chaos["report"]:
        print("  " + line)
    assert len(chaos["report"]) == len(PARTS)

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

import os
import signal
import subprocess
import time

import pytest
from chaoskit import (
    SETTLE,
    Probes,
    Writers,
    api_says_what_happened,
    check_workflow,
    job_step,
    last_event_id,
    post_workflow,
    report_line,
    settled_check,
)
from test_compose_up import AGENT_BACK_BOUND, AGENTS, REDIS, Stack, running_stack, wait_for

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


def _docker(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout)


def _containers(stack: Stack, services: list[str]) -> dict[str, str]:
    return {s: stack.container(s) for s in services}


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
    manifest = post_workflow(stack.api, AGENTS)
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


@pytest.mark.parametrize("part", PARTS)
def test_a_killed_part_comes_back_by_itself_and_nothing_is_lost(stack, chaos, part):
    index = PARTS.index(part)
    mid = chaos["manifest"]["id"]
    jobs = chaos["manifest"]["jobs"]  # a job per part while there are jobs
    job = jobs[index]["id"] if index < len(jobs) else None
    service = _kill_target(stack, part)
    restarts = stack.inspect(service)["RestartCount"]
    boot = stack.nodes()["agent-2"].get("boot_id")
    since = last_event_id(stack.api)
    if job is not None:
        job_step(stack.api, mid, job, "start")

    writers = Writers(_containers(stack, WRITERS), DIR, chaos["acked"], f"p{index}").start()
    probes = Probes(stack.api, "agent-2").start()
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
    bad = settled_check(_containers(stack, AGENTS), DIR, chaos["acked"])
    line = report_line(part, service, back, BOUNDS[part], writers, len(mine), bad, len(chaos["acked"]), errors, probed)
    chaos["report"].append(line)
    print("\n" + line)
    assert not bad, {a: {k: v[:5] for k, v in d.items()} for a, d in bad.items()}
    assert writers.attempted > 0 and mine, (writers.attempted, writers.failed[:5])

    if job is not None:
        chaos["finished"][job] = job_step(stack.api, mid, job, "finish").get("finished_at")
    # the whole cluster is whole again: every agent up
    wait_for(lambda: all(stack.states().get(a) == "up" for a in AGENTS), 60, "agent-1..3 up after the part")
    if part == "agent-2":
        api_says_what_happened(stack.api, probes, t0, boot, since)
    if part.startswith("redis"):
        roles = redis_roles(stack)
        print(f"Redis after the part: masters {sorted(n for n in REDIS if roles[n] == 'master')}, "
              f"{service} is a {roles[service]}")


def test_the_workflow_lost_nothing_and_ran_nothing_twice(stack, chaos):
    check_workflow(stack.api, chaos["manifest"], chaos["finished"])


def test_report(chaos):
    print("\nWhen something dies (compose, SIGKILL of the main process under load):")
    for line in chaos["report"]:
        print("  " + line)
    assert len(chaos["report"]) == len(PARTS)

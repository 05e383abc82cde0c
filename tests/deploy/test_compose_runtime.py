"""The compose demo's scripts and settings, run for real without Docker.

* deploy/redis/redis.conf starts six real redis-server processes (on loopback ports: the
  file's port/bind/dir are overridden, every other directive is the file's);
* deploy/redis/cluster-init.sh forms the cluster from them (3 masters + 3 replicas), and
  a second run leaves it alone;
* deploy/agent-entrypoint.sh starts the real agent with agent-1's command line and
  deploy/agent.toml (paths, ports and Redis addresses mapped to this machine), with the
  secret written by deploy/gen-secret.sh; the compose healthcheck answers; after a SIGKILL
  the entry point removes the dead FUSE mount but not the bind mount under it, and
  SIGTERM ends the agent cleanly within the service's stop_grace_period.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from hycache_dht.localcluster import find_free_base
from hycache_harness import free_port
from test_compose import SERVICES, as_argv, effective_agent_config

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
REDIS_CONF = REPO / "deploy" / "redis" / "redis.conf"
INIT = REPO / "deploy" / "redis" / "cluster-init.sh"
ENTRYPOINT = REPO / "deploy" / "agent-entrypoint.sh"
ORDER = ["redis-1", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6"]


def _have(cmd: str) -> bool:
    return any(os.access(os.path.join(d, cmd), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))


def cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.replace("\r", "")


@pytest.fixture(scope="module")
def redis_nodes(tmp_path_factory):
    """Six redis-server processes started from deploy/redis/redis.conf: compose service
    name -> loopback port."""
    if not (_have("redis-server") and _have("redis-cli")):
        pytest.skip("redis-server/redis-cli not installed (scripts/bootstrap.sh installs them)")
    base = find_free_base(6)
    root = tmp_path_factory.mktemp("redis")
    procs, ports = [], {}
    try:
        for i, name in enumerate(ORDER):
            port = base + i
            d = root / str(port)
            d.mkdir()
            # `dir` takes effect while the file is read (chdir): the container's /data
            # becomes the node's directory here; every other line is the file's
            conf, n = re.subn(r"^dir\s+\S+\s*$", f"dir {d}", REDIS_CONF.read_text(), flags=re.MULTILINE)
            assert n == 1
            (d / "redis.conf").write_text(conf)
            procs.append(subprocess.Popen(
                ["redis-server", str(d / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
                 "--logfile", str(d / "redis.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            ports[name] = port
        deadline = time.monotonic() + 20
        for (name, port), proc in zip(ports.items(), procs):
            while cli(port, "ping").strip() != "PONG":
                if proc.poll() is not None:
                    log = root / str(port) / "redis.log"
                    pytest.fail(f"redis-server rejected deploy/redis/redis.conf:\n{proc.stderr.read()}"
                                + (log.read_text()[-2000:] if log.exists() else ""))
                assert time.monotonic() < deadline, f"{name} on {port} did not answer"
                time.sleep(0.05)
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def formed(redis_nodes, tmp_path_factory):
    """The cluster as deploy/redis/cluster-init.sh forms it (the first run's result, and
    what the script asked getent). Half the nodes are named by a host name (as compose
    does), half by an IP address (as ansible does: an IP need not resolve back)."""
    nodes = [f"{'localhost' if i % 2 else '127.0.0.1'}:{redis_nodes[n]}" for i, n in enumerate(ORDER)]
    shim = tmp_path_factory.mktemp("shim")
    log = shim / "getent.log"
    real = shutil.which("getent") or "/usr/bin/getent"
    (shim / "getent").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    (shim / "getent").chmod(0o755)
    out = subprocess.run(["sh", str(INIT), *nodes], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "REPLICAS": "1", "TIMEOUT": "60",
                              "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"})
    asked = log.read_text().splitlines() if log.exists() else []
    return redis_nodes, nodes, out, asked


def test_redis_conf_is_what_the_nodes_run(redis_nodes):
    port = redis_nodes["redis-1"]
    assert cli(port, "config", "get", "cluster-enabled").split() == ["cluster-enabled", "yes"]
    assert cli(port, "config", "get", "appendonly").split() == ["appendonly", "yes"]
    assert cli(port, "config", "get", "cluster-require-full-coverage").split()[1] == "no"


def test_cluster_init_forms_three_masters_with_one_replica_each_once(formed):
    ports, nodes, out, asked = formed
    assert out.returncode == 0, out.stdout + out.stderr
    assert "creating the cluster" in out.stdout
    # names resolved to IPv4 (CLUSTER MEET takes IPs), addresses used as they are
    assert asked == ["ahostsv4 localhost"] * 3, asked
    assert "localhost" not in out.stdout.split("creating the cluster:")[1].splitlines()[0]
    for port in ports.values():
        info = cli(port, "cluster", "info")
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info
    roles = [line.split()[2] for line in cli(ports["redis-1"], "cluster", "nodes").splitlines()]
    assert sum("master" in r for r in roles) == 3 and sum("slave" in r for r in roles) == 3, roles
    again = subprocess.run(["sh", str(INIT), *nodes], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "not creating it again" in again.stdout and "creating the cluster:" not in again.stdout


def test_cluster_init_gives_up_on_a_node_that_never_answers(formed):
    _, nodes, _, _ = formed
    dead = f"127.0.0.1:{find_free_base(1, start=29100, stop=29900)}"
    out = subprocess.run(["sh", str(INIT), *nodes[:5], dead], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TIMEOUT": "2"})
    assert out.returncode != 0 and "timed out waiting for" in out.stderr


# --------------------------------------------------------------------------- the agent
def fuse_mounts_at(path: Path) -> list[str]:
    """Types of the mounts stacked at ``path`` (from /proc/self/mountinfo), bottom first."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        if re.sub(r"\\040", " ", f[4]) == str(path):
            out.append(f[f.index("-") + 1])
    return out


def wait_healthy(health: list[str], proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(health, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return json.loads(out.stdout)
        if proc.poll() is not None:
            pytest.fail(f"the agent exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"healthcheck never passed: {out.stderr}\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.mark.mount
def test_agent_entrypoint_with_the_compose_settings(formed, tmp_path):
    ports, _, init, _ = formed
    assert init.returncode == 0
    name = "agent-1"
    args, config = effective_agent_config(name)
    svc = SERVICES[name]

    # the container's paths and addresses, mapped to this machine
    root, mnt, export = tmp_path / "root", tmp_path / "mnt", tmp_path / "export"
    for d in (root, mnt, export):
        d.mkdir()
    secret = tmp_path / "secrets" / "cluster-secret"
    subprocess.run(["sh", str(REPO / "deploy" / "gen-secret.sh"), str(secret)], check=True, capture_output=True)
    toml = tomllib.loads((REPO / "deploy" / "agent.toml").read_text())
    section = toml["agent"]
    section["redis"] = ",".join(f"127.0.0.1:{ports[h]}" for h, p in config.redis_nodes)
    section["cluster_secret_file"] = str(secret)
    # the Redis ACL user of deploy/redis/redis-start.sh: these nodes run redis.conf alone
    # (no ACL; test_compose_up.py runs the real thing), so the agent connects without it
    assert section.pop("redis_user") == "hycache-agent"
    assert section.pop("redis_password_file") == "/run/secrets/hycache_redis_agent_password"
    assert "hycache_redis_agent_password" in SERVICES[name]["secrets"]
    conf = tmp_path / "agent.toml"
    conf.write_text("[agent]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items()))
    port = free_port()
    argv = as_argv(svc["command"])
    # the node token the control-plane-tokens one-shot would make; no control plane runs
    # here (the agent serves files without one and reports the link unreachable)
    token = tmp_path / "node-token"
    token.write_text("hcn_runtime-test-token\n")
    token.chmod(0o600)
    swap = {str(args.root): str(root), str(args.mountpoint): str(mnt), str(args.config): str(conf),
            config.listen: f"127.0.0.1:{port}", config.advertise: f"127.0.0.1:{port}",
            str(config.control_token_file): str(token), config.control_plane: "http://127.0.0.1:9"}
    argv = [swap.get(a, a) for a in argv]
    health = [swap.get(a, a) for a in as_argv(svc["healthcheck"]["test"])[1:]]
    health[0] = str(VENV_BIN / "hycache-agent")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}

    # the compose bind mount that exports the file system (it must survive everything)
    bind = subprocess.run(["mount", "--bind", str(export), str(mnt)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.strip()}")
    procs = []
    log = tmp_path / "agent.log"

    def start() -> subprocess.Popen:
        with open(log, "a") as out:
            p = subprocess.Popen(["sh", str(ENTRYPOINT), *argv], env=env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        agent = start()
        status = wait_healthy(health, agent, log)
        assert status["cluster"]["node_id"] == name
        assert status["control"]["url"] == "http://127.0.0.1:9"
        assert status["policy"] == config.policy and status["tiers"]["fast"]["capacity"] == config.fast_capacity
        deadline = time.monotonic() + 20
        while status["cluster"]["state"] != "ok":
            assert time.monotonic() < deadline, f"never reached the Redis Cluster: {status['cluster']}"
            time.sleep(0.3)
            status = wait_healthy(health, agent, log)
        (mnt / "hello").write_text("hi")
        assert fuse_mounts_at(mnt)[-1].startswith("fuse")

        # a crash leaves a dead FUSE mount on top of the bind mount ...
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        assert fuse_mounts_at(mnt)[-1].startswith("fuse")
        # ... which the entry point removes (and only that one) before mounting again
        agent = start()
        wait_healthy(health, agent, log)
        assert "removing a stale FUSE mount" in log.read_text()
        stack = fuse_mounts_at(mnt)
        assert [t.startswith("fuse") for t in stack] == [False, True], stack
        assert (mnt / "hello").read_text() == "hi"

        grace = int(svc["stop_grace_period"].rstrip("s"))
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(grace) == 0, log.read_text()[-3000:]
        assert [t.startswith("fuse") for t in fuse_mounts_at(mnt)] == [False], "SIGTERM must unmount"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for _ in range(3):
            if not fuse_mounts_at(mnt):
                break
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)

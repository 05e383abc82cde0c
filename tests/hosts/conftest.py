"""Fixtures for tests where every agent is its own host (see ``netns.py``).

* ``host_network`` (module): a bridge and 3 network namespaces on it; skipped with the
  reason when network namespaces cannot be made here (not root, no iproute2 ...).
* ``bridge_redis`` (module): a Redis Cluster (3 masters + 3 replicas) bound to the
  bridge address, so that agents inside the namespaces reach it and the addresses the
  nodes announce (CLUSTER SLOTS / MOVED) are reachable from there too.
* ``cluster_secret`` (module): a shared secret file (mode 0600).
* ``agents`` (function): ``agents.start(i, "a")`` starts an agent inside host ``i``
  (``nsenter --net``) listening on the host's own address, in a global namespace of the
  test's own; ``agents.wait_for``/``agents.check`` fail with the agents' log tails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hycache_dht.localcluster import LocalRedisCluster, find_free_base
from hycache_harness import cluster_secret as new_cluster_secret
from hycache_harness import executable, redis_seeds

from .netns import Host, HostNetwork, unusable_reason

HOSTS = 3


@pytest.fixture(scope="module")
def host_network():
    reason = unusable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unusable: {reason}")
    net = HostNetwork(HOSTS).create()
    try:
        yield net
    finally:
        problems = net.destroy()
    if problems:
        pytest.fail("host network teardown:\n" + "\n".join(problems), pytrace=False)


def announced_addresses(cluster: LocalRedisCluster) -> set[str]:
    """Every node address (``ip:port``) that a node of the cluster gives out: in CLUSTER
    NODES and in CLUSTER SLOTS (what clients, and so MOVED redirects, use)."""
    addrs = set()
    for host, port in cluster.nodes:
        with redis.Redis(host=host, port=port, socket_timeout=5, decode_responses=True) as r:
            for line in str(r.execute_command("CLUSTER", "NODES")).splitlines():
                fields = line.split()
                if len(fields) > 2 and "noaddr" not in fields[2]:
                    addrs.add(fields[1].split("@")[0])
            for _lo, _hi, *holders in r.execute_command("CLUSTER", "SLOTS"):
                addrs.update(f"{h[0]}:{h[1]}" for h in holders)
    return addrs


@pytest.fixture(scope="module")
def bridge_redis(host_network):
    base_dir = Path(tempfile.mkdtemp(prefix="hycache-hosts-redis-"))
    # client ports 21000-22400 and bus ports (+10000) stay below the ephemeral range
    cluster = LocalRedisCluster(base_dir, find_free_base(6, start=21000, stop=22400), host=host_network.bridge_ip)
    try:
        cluster.start()
        addrs = announced_addresses(cluster)
        expected = {f"{host_network.bridge_ip}:{p}" for p in cluster.ports}
        assert addrs == expected, f"the Redis nodes announce {sorted(addrs)}, not the bridge address"
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_secret():
    d = Path(tempfile.mkdtemp(prefix="hycache-hosts-secret-"))
    yield new_cluster_secret(d / "cluster.secret")
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- agents
PEER_PORT = 7070  # every host has its own address, so every agent listens on the same port
AGENT = executable("hycache-agent")
RETRYABLE = (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError)


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return "\n".join(lines[-n:]) or "<empty>"


@dataclass
class Agent:
    """One agent on one host."""

    name: str
    host: Host
    mount: Any  # tests/conftest.py's HyCacheMount

    @property
    def mnt(self) -> Path:
        return self.mount.mountpoint

    def status(self) -> dict:
        """``hycache-agent status ROOT --json`` → its "cluster" part (over the agent's Unix
        socket, which works across network namespaces)."""
        out = subprocess.run([AGENT, "status", str(self.mount.root), "--json"], capture_output=True, text=True,
                             timeout=20, check=True)
        return json.loads(out.stdout)["cluster"]


class Agents:
    """Starts agents in host namespaces, all in one global namespace of their own, and
    keeps their logs for failure messages."""

    def __init__(self, hycache_mount, net: HostNetwork, redis_cluster: LocalRedisCluster, secret: Path) -> None:
        self.hycache_mount = hycache_mount
        self.net = net
        self.redis = redis_cluster
        self.secret = secret
        self.namespace = f"hosts-{uuid.uuid4().hex[:10]}"
        self.started: list[Agent] = []

    def start(self, index: int, name: str, *, joined: bool = True, **opts) -> Agent:
        """An agent inside host ``index`` (``opts``: more agent flags); with ``joined``,
        once it is in the global namespace (status state "ok": connected and registered)."""
        host = self.net.hosts[index]
        m = self.hycache_mount(
            fast_capacity="256M", wrapper=host.prefix, node_id=name, listen=f"{host.ip}:{PEER_PORT}",
            redis=redis_seeds(self.redis.nodes, None), dht_namespace=self.namespace,
            cluster_secret_file=self.secret, log_level=os.environ.get("HYCACHE_HOSTS_LOG_LEVEL"), **opts)
        agent = Agent(name, host, m)
        self.started.append(agent)
        if joined:
            self.wait_joined(agent)
        return agent

    def wait_joined(self, agent: Agent, timeout: float = 30.0) -> None:
        self.wait_for(lambda: agent.status()["state"] == "ok", f"agent {agent.name} to join", timeout=timeout,
                      describe=agent.status)

    def restart_after_kill(self, agent: Agent) -> Agent:
        """The same agent again (root, mount point, options, host) after a kill -9."""
        m = self.hycache_mount.remount(agent.mount, after_kill=True)
        again = Agent(agent.name, agent.host, m)
        self.started.append(again)
        self.wait_joined(again)
        return again

    def logs(self) -> str:
        parts, seen = [], set()
        for a in reversed(self.started):
            if a.mount.log in seen:
                continue
            seen.add(a.mount.log)
            parts.append(f"--- agent {a.name} on {a.host.name} ({a.host.ip}), last lines of {a.mount.log} ---\n"
                         f"{tail(a.mount.log)}")
        return "\n".join(reversed(parts))

    def check(self, condition: Any, what: str) -> None:
        if not condition:
            raise AssertionError(f"{what}\n{self.logs()}")

    def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 30.0,
                 describe: Callable[[], Any] | None = None) -> Any:
        """Poll ``predicate`` until it is truthy (errors count as not yet); on timeout fail
        with ``what``, ``describe()`` and the agents' log tails."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                value = predicate()
            except RETRYABLE as exc:
                value, last = None, exc
            if value:
                return value
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        extra = ""
        if describe is not None:
            try:
                extra = f"\nnow: {describe()}"
            except RETRYABLE as exc:
                extra = f"\nnow: <{exc!r}>"
        if last is not None:
            extra += f"\nlast error: {last!r}"
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}\n{self.logs()}")


@pytest.fixture
def agents(hycache_mount, host_network, bridge_redis, cluster_secret):
    """Factory of agents on the hosts: ``agents.start(host_index, node_id)``. Agents are
    stopped by ``hycache_mount``; every host is plugged back in at the end."""
    a = Agents(hycache_mount, host_network, bridge_redis, cluster_secret)
    yield a
    for h in host_network.hosts:
        if not h.connected():
            h.heal()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test of this directory shows its agents' log tails, whatever failed."""
    outcome = yield
    report = outcome.get_result()
    agents_ = getattr(item, "funcargs", {}).get("agents")
    if report.failed and isinstance(agents_, Agents) and agents_.started:
        report.sections.append(("agent logs", agents_.logs()))

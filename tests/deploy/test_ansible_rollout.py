"""The ansible rollout, for real, onto hosts booted with systemd as PID 1, over SSH.

Four containers of tests/deploy/systemd-host.Dockerfile (Debian bookworm, systemd, sshd;
nothing of HyCache) on a network of their own; ansible-playbook reaches each over real SSH
(a key made for this run) through its port 22 published on 127.0.0.1; the hosts talk to
each other on their network (Redis Cluster, agents). Only the roles install things.

What runs so far (the issue's order, first part): `site.yml --tags common,redis` from
scratch on the [redis] hosts: packages, the redis-cluster@ units, the cluster formed across
three hosts (3 masters + 3 replicas, each replica on another host than its master), with
access control (every node refuses a client without credentials; the agents' user works);
a second run changes nothing. Not yet here: the agents' release build, the control plane,
reboot, upgrade (docs/deployment.md says so).

Where Docker cannot run (deploy/local-images.sh exits 3) the module skips with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from test_ansible import ANSIBLE, REPO, ansible_env, playbook_bin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
IMAGE = "hycache-test/systemd-host:bookworm"
HOSTS = ["h1", "h2", "h3", "h4"]
REDIS_HOSTS = ["h1", "h2", "h3"]
PASSWORDS = {"hycache_redis_admin_password": "rollout-admin-" + "x1" * 10,
             "hycache_redis_agent_password": "rollout-agent-" + "y2" * 10,
             "hycache_redis_control_password": "rollout-control-" + "z3" * 10,
             "hycache_cluster_secret": "rollout-cluster-secret-" + "w4" * 10}
SYSTEMD_FLAGS = ["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--security-opt",
                 "apparmor=unconfined", "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                 "--tmpfs", "/run", "--tmpfs", "/run/lock"]


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    prep = subprocess.run(["bash", str(REPO / "deploy" / "local-images.sh")], cwd=REPO, capture_output=True,
                          text=True, timeout=3600)
    if prep.returncode == 3:
        pytest.skip(prep.stderr.strip().splitlines()[-1])
    assert prep.returncode == 0, prep.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("rollout")
    base = "hycache-local/debian:bookworm"
    if docker("image", "inspect", base, check=False).returncode != 0:
        base = "debian:bookworm-slim"
    build = subprocess.run(["nice", "docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", IMAGE, "-f",
                            str(REPO / "tests" / "deploy" / "systemd-host.Dockerfile"), str(tmp)],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    tag = f"hcroll{os.getpid()}"
    prefix = f"172.29.{100 + os.getpid() % 100}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "id")], check=True)
    made: list[str] = []
    try:
        docker("network", "create", "--subnet", f"{prefix}.0/24", "--label", f"hycache.test={tag}", tag)
        made.append("network")
        info = {}
        for i, h in enumerate(HOSTS, start=11):
            name = f"{tag}-{h}"
            docker("run", "-d", "--name", name, "--hostname", h, "--label", f"hycache.test={tag}",
                   "--network", tag, "--ip", f"{prefix}.{i}", "-p", "127.0.0.1::22", *SYSTEMD_FLAGS, IMAGE)
            info[h] = {"container": name, "ip": f"{prefix}.{i}"}
        for h, d in info.items():
            subprocess.run(["docker", "exec", "-i", d["container"], "sh", "-c",
                            "cat > /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys"],
                           input=(tmp / "id.pub").read_text(), text=True, check=True)
            d["port"] = int(docker("port", d["container"], "22").stdout.strip().rsplit(":", 1)[1])
            wait_for(lambda c=d["container"]: docker("exec", c, "systemctl", "is-active", "ssh",
                                                     check=False).stdout.strip() == "active", 120, f"{h}: sshd")
        inventory = {"all": {
            "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(tmp / "id"),
                     "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                     "ansible_python_interpreter": "/usr/bin/python3", **PASSWORDS},
            "children": {
                "redis": {"hosts": {h: {} for h in REDIS_HOSTS}},
                "agents": {"hosts": {h: {} for h in ("h2", "h3", "h4")}},
                "control_plane": {"hosts": {"h4": {}}},
            }}}
        hostvars = {h: {"ansible_host": "127.0.0.1", "ansible_port": d["port"], "redis_cluster_ip": d["ip"]}
                    for h, d in info.items()}
        inventory["all"]["hosts"] = hostvars
        (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
        yield {"tmp": tmp, "info": info, "inventory": tmp / "inventory.yml"}
    finally:
        for h in HOSTS:
            docker("rm", "-f", "-v", f"{tag}-{h}", check=False)
        if made:
            docker("network", "rm", tag, check=False)


def playbook(hosts, *args: str) -> subprocess.CompletedProcess:
    env = ansible_env(hosts["tmp"])
    env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
    return subprocess.run([playbook_bin(), "-i", str(hosts["inventory"]), str(ANSIBLE / "site.yml"), *args],
                          capture_output=True, text=True, env=env, cwd=ANSIBLE, timeout=2400)


def recap(out: str) -> dict[str, int]:
    return {h: int(c) for h, c in re.findall(r"^(h\d)\s+:\s+ok=\d+\s+changed=(\d+)", out, re.MULTILINE)}


@pytest.fixture(scope="module")
def redis_rolled_out(hosts):
    first = playbook(hosts, "--tags", "common,redis", "--limit", "redis")
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    for pw in PASSWORDS.values():
        assert pw not in first.stdout + first.stderr
    return first


def _cli(hosts, host: str, *args: str, user: str | None = None, password: str | None = None) -> str:
    c = hosts["info"][host]["container"]
    env = ["env", f"REDISCLI_AUTH={password}"] if password else []
    cmd = [*env, "redis-cli", "--no-auth-warning", *(["--user", user] if user else []), *args]
    out = docker("exec", c, *cmd, check=False)
    return (out.stdout + out.stderr).replace("\r", "")


def test_the_redis_cluster_forms_across_the_hosts(hosts, redis_rolled_out):
    admin = ("hycache-admin", PASSWORDS["hycache_redis_admin_password"])
    ip1 = hosts["info"]["h1"]["ip"]
    nodes = _cli(hosts, "h1", "-h", ip1, "-p", "7000", "cluster", "nodes", user=admin[0], password=admin[1])
    rows = [ln.split() for ln in nodes.splitlines() if ln.strip()]
    assert len(rows) == 6, nodes
    ids = {r[0]: r[1].split("@")[0].rsplit(":", 1)[0] for r in rows}
    masters = [r for r in rows if "master" in r[2] and len(r) > 8]
    replicas = [r for r in rows if "slave" in r[2]]
    assert len(masters) == 3 and len(replicas) == 3, nodes
    for r in replicas:  # each replica on another host than its master
        assert ids[r[0]] != ids[r[3]], nodes
    assert {ids[r[0]] for r in rows} == {hosts["info"][h]["ip"] for h in REDIS_HOSTS}
    info = _cli(hosts, "h2", "-h", ip1, "-p", "7001", "cluster", "info", user=admin[0], password=admin[1])
    assert "cluster_state:ok" in info, info


def test_every_node_refuses_a_client_without_credentials(hosts, redis_rolled_out):
    agent = ("hycache-agent", PASSWORDS["hycache_redis_agent_password"])
    for h in REDIS_HOSTS:
        ip = hosts["info"][h]["ip"]
        for port in ("7000", "7001"):
            out = _cli(hosts, "h1", "-h", ip, "-p", port, "get", "hc:x")
            assert "NOAUTH" in out, (h, port, out)
            out = _cli(hosts, "h1", "-c", "-h", ip, "-p", port, "get", "hc:x", user=agent[0], password=agent[1])
            assert "NOAUTH" not in out and "NOPERM" not in out and "WRONGPASS" not in out, (h, port, out)
            out = _cli(hosts, "h1", "-h", ip, "-p", port, "config", "get", "dir", user=agent[0], password=agent[1])
            assert "NOPERM" in out, (h, port, out)
    # bound to the host's cluster address, not every interface
    listen = docker("exec", hosts["info"]["h1"]["container"], "ss", "-ltnH").stdout
    assert f"{hosts['info']['h1']['ip']}:7000" in listen and "0.0.0.0:7000" not in listen, listen


def test_the_units_run_under_systemd(hosts, redis_rolled_out):
    for h in REDIS_HOSTS:
        c = hosts["info"][h]["container"]
        for port in ("7000", "7001"):
            assert docker("exec", c, "systemctl", "is-active", f"redis-cluster@{port}").stdout.strip() == "active"
            assert docker("exec", c, "systemctl", "is-enabled", f"redis-cluster@{port}").stdout.strip() == "enabled"


def test_a_second_run_changes_nothing(hosts, redis_rolled_out):
    second = playbook(hosts, "--tags", "common,redis", "--limit", "redis")
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap(second.stdout) == {h: 0 for h in REDIS_HOSTS}, second.stdout[-4000:]

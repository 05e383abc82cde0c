"""The ansible rollout, for real, onto hosts booted with systemd as PID 1, over SSH.

Four containers of tests/deploy/systemd-host.Dockerfile (Debian bookworm, systemd, sshd;
nothing of HyCache) on a network of their own; ansible-playbook reaches each over real SSH
(a key made for this run) through its port 22 published on 127.0.0.1; the hosts talk to
each other on their network (Redis Cluster, agents, control plane). Only the roles install
things: h1-h3 are [redis], h2-h4 [agents], h4 also [control_plane] (PostgreSQL installed
by the play, hycache-control with 2 server processes behind HAProxy, its port 8080
published on 127.0.0.1 for the test).

One module-scoped fixture boots the hosts and runs `site.yml` from scratch once; the tests
then check, each its own step: the Redis Cluster and its ACL, the services under systemd,
every agent `up` in the API, a file written on one host read intact on the others,
`systemctl restart`/`stop`+`start` of an agent, a reboot (container restart) bringing the
mount back by itself, a second run with `changed=0`, an upgrade to a newer commit
rolled through the agents one at a time while a reader on another host keeps reading,
and then each part killed once under load (kill -9; an agent host restarted): it comes
back by itself within its bound with nothing lost (CHAOS below; docs/deployment.md,
"When something dies (the rollout's systemd hosts)").

Caches between runs (downloads only; the roles still install everything): each host's
/var/cache/apt/archives and uv's cache are bind-mounted from HYCACHE_CACHE
(~/.cache/hycache)/rollout/. The hosts trust the host's CA bundle (mounted read-only;
the roles' hycache_agent_uv_environment points pip and uv at it), as hosts behind a
TLS-inspecting proxy would. HYCACHE_TEST_HOST_CPUS caps every host container
(`docker run --cpus`), for runs on a shared machine.

Where Docker cannot run (deploy/local-images.sh exits 3) the module skips with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import chaoskit
import httpx
import pytest
import yaml
from hycache_harness import wait_for as _wait_for
from test_ansible import ANSIBLE, REPO, ansible_env, playbook_bin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]
IMAGE = "hycache-test/systemd-host:bookworm"
HOSTS = ["h1", "h2", "h3", "h4"]
REDIS_HOSTS = ["h1", "h2", "h3"]
AGENTS = ["h2", "h3", "h4"]  # serial: the agents play restarts them in this order
CONTROL = "h4"
MNT = "/mnt/hycache"
CA_IN_HOST = "/usr/local/share/hycache-test/ca.pem"
ADMIN_TOKEN = "rollout-admin-token-" + "v5" * 12
PASSWORDS = {"hycache_redis_admin_password": "rollout-admin-" + "x1" * 10,
             "hycache_redis_agent_password": "rollout-agent-" + "y2" * 10,
             "hycache_redis_control_password": "rollout-control-" + "z3" * 10,
             "hycache_cluster_secret": "rollout-cluster-secret-" + "w4" * 10,
             "control_plane_db_password": "rolloutdb" + "u6" * 10,
             "control_plane_admin_token": ADMIN_TOKEN}
SYSTEMD_FLAGS = ["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--security-opt",
                 "apparmor=unconfined", "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                 "--tmpfs", "/run", "--tmpfs", "/run/lock", "--device", "/dev/fuse"]
# the control plane's defaults (docs/control-plane.md): down after 3 heartbeats + 2 s, and the
# DHT registry's entry lives 10 s: generous bounds for Docker round trips under load
DOWN_BOUND = 3 * 1.0 + 2.0 + 10.0


def docker(*args: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    return _wait_for(pred, timeout, what, interval)


class Cluster:
    """The host containers, their inventory and the control plane's API."""

    def __init__(self, tmp: Path, tag: str, prefix: str):
        self.tmp, self.tag, self.prefix = tmp, tag, prefix
        self.info = {h: {"container": f"{tag}-{h}", "ip": f"{prefix}.{i}"} for i, h in enumerate(HOSTS, start=11)}
        self.inventory = tmp / "inventory.yml"
        self.source = tmp / "src"  # a clone of the repository: the upgrade commits in it
        self.api_url = ""
        self.reused = False  # taken from a former run (HYCACHE_ROLLOUT_KEEP)

    def exec(self, host: str, *cmd: str, check: bool = True, input: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
        return docker("exec", "-i", self.info[host]["container"], *cmd, check=check, input=input, timeout=timeout)

    def sh(self, host: str, script: str, **kw) -> subprocess.CompletedProcess:
        return self.exec(host, "sh", "-c", script, **kw)

    def refresh(self) -> None:
        """Published ports (a restarted container may get new ones) -> inventory, API URL."""
        for _h, d in self.info.items():
            d["port"] = int(docker("port", d["container"], "22").stdout.split()[0].rsplit(":", 1)[1])
        api = docker("port", self.info[CONTROL]["container"], "8080").stdout.split()[0]
        self.api_url = f"http://{api}"
        ssh = {"ansible_user": "root", "ansible_ssh_private_key_file": str(self.tmp / "id"),
               "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
               "ansible_python_interpreter": "/usr/bin/python3"}
        ca_env = {"SSL_CERT_FILE": CA_IN_HOST, "PIP_CERT": CA_IN_HOST, "REQUESTS_CA_BUNDLE": CA_IN_HOST}
        inventory = {"all": {
            "vars": {**ssh, **PASSWORDS,
                     "hycache_agent_source_dir": str(self.source),
                     "hycache_agent_build_dir": str(self.tmp / "build"),
                     "hycache_agent_uv_environment": ca_env,
                     "hycache_agent_control_plane": f"http://{self.info[CONTROL]['ip']}:8080",
                     # HAProxy on :8080 in front of 2 server processes (PostgreSQL shared)
                     "control_plane_workers": 2},
            "hosts": {h: {"ansible_host": "127.0.0.1", "ansible_port": d["port"], "redis_cluster_ip": d["ip"],
                          "hycache_agent_advertise": f"{d['ip']}:7070"} for h, d in self.info.items()},
            "children": {
                "redis": {"hosts": {h: {} for h in REDIS_HOSTS}},
                "agents": {"hosts": {h: {} for h in AGENTS}},
                "control_plane": {"hosts": {CONTROL: {}}},
            }}}
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))

    def service_logs(self, lines: int = 40) -> str:
        """The state and last journal lines of HyCache's units on every host (for a failed
        play: stop 28's CI saw the control plane's /readyz refuse connections for 120 s
        and kept nothing else of why)."""
        out = []
        for h in HOSTS:
            r = self.sh(h, "systemctl --no-pager --failed; for u in hycache-control hycache-agent; do "
                           f"systemctl is-enabled $u >/dev/null 2>&1 || continue; systemctl --no-pager status $u | head -5; "
                           f"journalctl --no-pager -o short-precise -n {lines} -u $u; done", check=False, timeout=60)
            out.append(f"\n===== {h} =====\n{r.stdout[-6000:]}{r.stderr[-1000:]}")
        return "".join(out)

    def playbook(self, *args: str, log: Path | None = None) -> subprocess.CompletedProcess | subprocess.Popen:
        env = ansible_env(self.tmp)
        env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
        env["ANSIBLE_FORKS"] = "8"
        cmd = ["nice", "-n", "19", playbook_bin(), "-i", str(self.inventory), str(ANSIBLE / "site.yml"), *args]
        if log is not None:  # in the background, output to a file (the upgrade test reads it as it goes)
            return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, env=env,
                                    cwd=ANSIBLE)
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ANSIBLE, timeout=3600)

    def api(self, path: str, method: str = "GET", timeout: float = 10, **kw) -> httpx.Response:
        return httpx.request(method, self.api_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                             timeout=timeout, **kw)

    def nodes(self) -> dict[str, dict]:
        try:
            r = self.api("/api/v1/nodes")
        except httpx.HTTPError:
            return {}
        return {n["id"]: n for n in r.json()["items"]} if r.status_code == 200 else {}

    def states(self) -> dict[str, str]:
        return {k: v["state"] for k, v in self.nodes().items()}

    def mounted(self, host: str) -> bool:
        return self.exec(host, "mountpoint", "-q", MNT, check=False).returncode == 0


def recap(out: str) -> dict[str, int]:
    return {h: int(c) for h, c in re.findall(r"^(h\d)\s+:\s+ok=\d+\s+changed=(\d+)", out, re.MULTILINE)}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reused(keep: Path) -> Cluster | None:
    """The cluster a former run left in `keep` (HYCACHE_ROLLOUT_KEEP), if its hosts run."""
    state = keep / "cluster.json"
    if not state.exists():
        return None
    saved = json.loads(state.read_text())
    c = Cluster(keep, saved["tag"], saved["prefix"])
    running = [docker("inspect", "-f", "{{.State.Running}}", d["container"], check=False).stdout.strip()
               for d in c.info.values()]
    if running != ["true"] * len(HOSTS):
        return None
    c.refresh()
    return c


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """The booted hosts. HYCACHE_ROLLOUT_KEEP=DIR (for development) keeps them running
    after the module, their key and inventory in DIR; a later run with the same DIR takes
    them as they are (the rollout then runs site.yml on them again, not from scratch)."""
    keep = Path(os.environ["HYCACHE_ROLLOUT_KEEP"]) if os.environ.get("HYCACHE_ROLLOUT_KEEP") else None
    if keep is not None and (c := _reused(keep)) is not None:
        c.reused = True
        yield c
        return
    prep = subprocess.run(["bash", str(REPO / "deploy" / "local-images.sh")], cwd=REPO, capture_output=True,
                          text=True, timeout=3600)
    if prep.returncode == 3:
        pytest.skip(prep.stderr.strip().splitlines()[-1])
    assert prep.returncode == 0, prep.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("rollout") if keep is None else keep
    if keep is not None:
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
    base = "hycache-local/debian:bookworm"
    if docker("image", "inspect", base, check=False).returncode != 0:
        base = "debian:bookworm-slim"
    build = subprocess.run(["nice", "docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", IMAGE, "-f",
                            str(REPO / "tests" / "deploy" / "systemd-host.Dockerfile"), str(tmp)],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    tag = f"hcroll{os.getpid()}"
    c = Cluster(tmp, tag, f"172.29.{100 + os.getpid() % 100}")
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(c.source)], check=True, timeout=300)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "id")], check=True)
    cache = Path(os.environ.get("HYCACHE_CACHE", Path.home() / ".cache" / "hycache")) / "rollout"
    (cache / "uv").mkdir(parents=True, exist_ok=True)
    ca = os.environ.get("HYCACHE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    cpus = os.environ.get("HYCACHE_TEST_HOST_CPUS")
    made = False
    try:
        docker("network", "create", "--subnet", f"{c.prefix}.0/24", "--label", f"hycache.test={tag}", tag)
        made = True
        for h, d in c.info.items():
            (cache / f"apt-{h}" / "partial").mkdir(parents=True, exist_ok=True)
            ports = ["-p", "127.0.0.1::22"] + (["-p", "127.0.0.1::8080"] if h == CONTROL else [])
            docker("run", "-d", "--name", d["container"], "--hostname", h, "--label", f"hycache.test={tag}",
                   "--network", tag, "--ip", d["ip"], *ports, *SYSTEMD_FLAGS,
                   *(["--cpus", cpus] if cpus else []),
                   "-v", f"{ca}:{CA_IN_HOST}:ro",
                   "-v", f"{cache / f'apt-{h}'}:/var/cache/apt/archives",
                   "-v", f"{cache / 'uv'}:/opt/hycache/cache", IMAGE)
        for h in c.info:
            c.sh(h, "cat > /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys",
                 input=(tmp / "id.pub").read_text())
            wait_for(lambda h=h: c.exec(h, "systemctl", "is-active", "ssh", check=False).stdout.strip() == "active",
                     120, f"{h}: sshd")
        c.refresh()
        if keep is not None:
            (keep / "cluster.json").write_text(json.dumps({"tag": tag, "prefix": c.prefix}))
        yield c
    finally:
        for h in HOSTS if keep is None else []:
            docker("rm", "-f", "-v", f"{tag}-{h}", check=False)
        if made and keep is None:
            docker("network", "rm", tag, check=False)


@pytest.fixture(scope="module")
def rolled_out(hosts):
    """site.yml from scratch on every host: (output, seconds)."""
    t0 = time.monotonic()
    first = hosts.playbook()
    took = time.monotonic() - t0
    print(f"\nrollout: site.yml {'again on the kept hosts' if hosts.reused else 'from scratch'} took {took:.0f} s")
    assert first.returncode == 0, first.stdout[-8000:] + first.stderr[-2000:] + hosts.service_logs()
    for pw in PASSWORDS.values():
        assert pw not in first.stdout + first.stderr
    return first.stdout, took


@pytest.fixture(scope="module")
def written(hosts, rolled_out):
    """A file of random bytes written through h2's mount: (name, bytes)."""
    name = f"rollout-{secrets.token_hex(4)}.bin"
    data = os.urandom(2 * 1024 * 1024 + 33)
    subprocess.run(["docker", "exec", "-i", hosts.info["h2"]["container"], "sh", "-c", f"cat > {MNT}/{name}"],
                   input=data, check=True, timeout=120)
    return name, data


def read_sha(hosts, host: str, name: str) -> str:
    return hosts.exec(host, "sha256sum", f"{MNT}/{name}").stdout.split()[0]


def _cli(hosts, host: str, *args: str, user: str | None = None, password: str | None = None) -> str:
    env = ["env", f"REDISCLI_AUTH={password}"] if password else []
    cmd = [*env, "redis-cli", "--no-auth-warning", *(["--user", user] if user else []), *args]
    out = hosts.exec(host, *cmd, check=False)
    return (out.stdout + out.stderr).replace("\r", "")


# --------------------------------------------------------------------------- Redis
def test_the_redis_cluster_forms_across_the_hosts(hosts, rolled_out):
    admin = ("hycache-admin", PASSWORDS["hycache_redis_admin_password"])
    ip1 = hosts.info["h1"]["ip"]
    nodes = _cli(hosts, "h1", "-h", ip1, "-p", "7000", "cluster", "nodes", user=admin[0], password=admin[1])
    rows = [ln.split() for ln in nodes.splitlines() if ln.strip()]
    assert len(rows) == 6, nodes
    ids = {r[0]: r[1].split("@")[0].rsplit(":", 1)[0] for r in rows}
    masters = [r for r in rows if "master" in r[2] and len(r) > 8]
    replicas = [r for r in rows if "slave" in r[2]]
    assert len(masters) == 3 and len(replicas) == 3, nodes
    for r in replicas:  # each replica on another host than its master
        assert ids[r[0]] != ids[r[3]], nodes
    assert {ids[r[0]] for r in rows} == {hosts.info[h]["ip"] for h in REDIS_HOSTS}
    info = _cli(hosts, "h2", "-h", ip1, "-p", "7001", "cluster", "info", user=admin[0], password=admin[1])
    assert "cluster_state:ok" in info, info


def test_every_node_refuses_a_client_without_credentials(hosts, rolled_out):
    agent = ("hycache-agent", PASSWORDS["hycache_redis_agent_password"])
    for h in REDIS_HOSTS:
        ip = hosts.info[h]["ip"]
        for port in ("7000", "7001"):
            out = _cli(hosts, "h1", "-h", ip, "-p", port, "get", "hc:x")
            assert "NOAUTH" in out, (h, port, out)
            out = _cli(hosts, "h1", "-c", "-h", ip, "-p", port, "get", "hc:x", user=agent[0], password=agent[1])
            assert "NOAUTH" not in out and "NOPERM" not in out and "WRONGPASS" not in out, (h, port, out)
            out = _cli(hosts, "h1", "-h", ip, "-p", port, "config", "get", "dir", user=agent[0], password=agent[1])
            assert "NOPERM" in out, (h, port, out)
    # bound to the host's cluster address, not every interface
    listen = hosts.exec("h1", "ss", "-ltnH").stdout
    assert f"{hosts.info['h1']['ip']}:7000" in listen and "0.0.0.0:7000" not in listen, listen


# --------------------------------------------------------------------------- services
def test_the_services_run_under_systemd(hosts, rolled_out):
    def unit(h, name):
        return (hosts.exec(h, "systemctl", "is-active", name, check=False).stdout.strip(),
                hosts.exec(h, "systemctl", "is-enabled", name, check=False).stdout.strip())
    for h in REDIS_HOSTS:
        for port in ("7000", "7001"):
            assert unit(h, f"redis-cluster@{port}") == ("active", "enabled"), h
    for h in AGENTS:
        assert unit(h, "hycache-agent") == ("active", "enabled"), h
        assert hosts.mounted(h), h
        # the release built on the node: current -> releases/<HEAD of the deployed clone>
        head = subprocess.run(["git", "-C", str(hosts.source), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert hosts.exec(h, "readlink", "/opt/hycache/current").stdout.strip() == f"/opt/hycache/releases/{head}"
        # this node's own token from the control plane's host, and the secrets: 0600
        for f in ("control-token", "cluster-secret", "redis-password"):
            assert hosts.exec(h, "stat", "-c", "%a", f"/etc/hycache/{f}").stdout.strip() == "600", (h, f)
    tokens = {h: hosts.exec(h, "cat", "/etc/hycache/control-token").stdout.strip() for h in AGENTS}
    assert len(set(tokens.values())) == 3 and all(tokens.values())
    for name in ("hycache-control", "postgresql", "haproxy"):
        assert unit(CONTROL, name) == ("active", "enabled"), name
    # PostgreSQL: the play's database, on localhost only; the URL only in the 0600 env file
    for f in ("control-plane.env", "control-redis-password", "control-admin-token"):
        assert hosts.exec(CONTROL, "stat", "-c", "%a", f"/etc/hycache/{f}").stdout.strip() == "600", f
    # h4 runs an agent and the control plane: each has its own Redis user's password
    assert hosts.exec(CONTROL, "cat", "/etc/hycache/control-redis-password").stdout.strip() == \
        PASSWORDS["hycache_redis_control_password"]
    assert hosts.exec(CONTROL, "cat", "/etc/hycache/redis-password").stdout.strip() == \
        PASSWORDS["hycache_redis_agent_password"]
    assert "@127.0.0.1:5432/hycache" in hosts.exec(CONTROL, "cat", "/etc/hycache/control-plane.env").stdout
    listen = hosts.exec(CONTROL, "ss", "-ltnH").stdout
    assert "127.0.0.1:5432" in listen and "0.0.0.0:5432" not in listen, listen
    # HAProxy on :8080, hycache-control (2 server processes) behind it on 127.0.0.1:8081
    assert "0.0.0.0:8080" in listen and "127.0.0.1:8081" in listen, listen
    exec_start = hosts.exec(CONTROL, "systemctl", "show", "-p", "ExecStart", "hycache-control").stdout
    assert "--listen 127.0.0.1:8081" in exec_start and "--workers 2" in exec_start, exec_start
    assert "server control1 127.0.0.1:8081 check" in hosts.exec(CONTROL, "cat", "/etc/haproxy/haproxy.cfg").stdout


def test_every_agent_is_up_in_the_api(hosts, rolled_out):
    assert httpx.get(hosts.api_url + "/readyz", timeout=10).status_code == 200
    assert httpx.get(hosts.api_url + "/api/v1/nodes", timeout=10).status_code == 401
    states = wait_for(lambda: (s := hosts.states()) and all(s.get(h) == "up" for h in AGENTS) and s, 120,
                      "h2, h3, h4 up in /api/v1/nodes")
    assert set(states) == set(AGENTS), states
    nodes = hosts.nodes()
    for h in AGENTS:
        assert nodes[h]["address"].startswith(hosts.info[h]["ip"]), nodes[h]


def test_a_file_written_on_one_host_reads_intact_on_another(hosts, written):
    name, data = written
    for h in AGENTS:
        assert read_sha(hosts, h, name) == _sha(data), h

    def listed():
        r = hosts.api("/api/v1/files", params={"path": "/"})
        return next((i for i in r.json()["items"] if i["name"] == name), None) if r.status_code == 200 else None
    entry = wait_for(listed, 60, f"/{name} in /api/v1/files")
    assert entry["primary"] == "h2" and entry["size"] == len(data), entry


def test_systemctl_restart_and_stop_start_of_an_agent(hosts, written):
    name, data = written
    def restarts() -> int:  # the agent's restarts by systemd (Restart=on-failure): its crashes
        out = hosts.exec("h3", "systemctl", "show", "-p", "NRestarts", "--value", "hycache-agent").stdout
        return int(out.strip())

    before, crashes = hosts.nodes()["h3"]["boot_id"], restarts()
    hosts.exec("h3", "systemctl", "restart", "hycache-agent", timeout=120)
    # the agent mounts before its first heartbeat; the API shows the new boot id as soon as
    # any control-plane process heard it (every process takes it from the others' rows)
    wait_for(lambda: (n := hosts.nodes().get("h3")) and n["state"] == "up" and n["boot_id"] != before, 120,
             "h3 up again with a new boot id after systemctl restart")
    assert hosts.mounted("h3"), "h3's agent is up but its mount is not there:\n" + hosts.service_logs(80)
    assert restarts() == crashes, "h3's agent crashed after the restart:\n" + hosts.service_logs(80)
    assert read_sha(hosts, "h3", name) == _sha(data)
    # stop: down in the API; start: up
    hosts.exec("h3", "systemctl", "stop", "hycache-agent", timeout=120)
    assert not hosts.mounted("h3")
    wait_for(lambda: hosts.states().get("h3") == "down", DOWN_BOUND + 60, "h3 down in the API")
    assert read_sha(hosts, "h4", name) == _sha(data)  # the others keep serving the file
    hosts.exec("h3", "systemctl", "start", "hycache-agent", timeout=120)
    wait_for(lambda: hosts.states().get("h3") == "up", 120, "h3 up in the API after start")
    assert read_sha(hosts, "h3", name) == _sha(data)


def test_a_rebooted_host_mounts_again_by_itself(hosts, written):
    """h3 rebooted (its container restarted): systemd starts its Redis nodes and its agent,
    which mounts again by itself. h3 holds two of the six Redis nodes, so the cluster fails
    over and back meanwhile: the file must read intact on h3 once the cluster is whole."""
    name, data = written
    admin = ("hycache-admin", PASSWORDS["hycache_redis_admin_password"])
    docker("restart", "-t", "60", hosts.info["h3"]["container"], timeout=300)
    hosts.refresh()
    wait_for(lambda: hosts.mounted("h3"), 180, "h3's mount back after the reboot")
    assert hosts.exec("h3", "systemctl", "is-active", "hycache-agent").stdout.strip() == "active"
    wait_for(lambda: hosts.states().get("h3") == "up", 120, "h3 up in the API after the reboot")
    wait_for(lambda: all("cluster_state:ok" in _cli(hosts, "h1", "-h", hosts.info[h]["ip"], "-p", p, "cluster", "info",
                                                    user=admin[0], password=admin[1])
                         for h in REDIS_HOSTS for p in ("7000", "7001")), 120, "cluster_state:ok on every node")
    t0, errors = time.monotonic(), []

    def intact():
        out = hosts.exec("h3", "sha256sum", f"{MNT}/{name}", check=False)
        if out.returncode != 0:
            errors.append(out.stderr.strip())
        return out.returncode == 0 and out.stdout.split()[0] == _sha(data)
    try:
        wait_for(intact, 60, f"{name} intact on h3 after the reboot", interval=2)
    finally:
        print(f"\nrollout: after the reboot, {name} read intact on h3 after {time.monotonic() - t0:.0f} s"
              f" and {len(errors)} failed reads ({errors[:1]})")
        if errors:
            print(hosts.exec("h3", "journalctl", "-b", "-u", "hycache-agent", "--no-pager", check=False).stdout[-4000:])


def test_a_second_run_changes_nothing(hosts, rolled_out):
    t0 = time.monotonic()
    second = hosts.playbook()
    print(f"\nrollout: second run took {time.monotonic() - t0:.0f} s")
    assert second.returncode == 0, second.stdout[-6000:]
    assert recap(second.stdout) == {h: 0 for h in HOSTS}, second.stdout[-6000:]


def test_an_upgrade_rolls_through_the_agents_one_at_a_time(hosts, written):
    name, data = written
    src = hosts.source
    (src / "UPGRADE-TEST").write_text("a newer commit for the rollout test\n")
    git = ["git", "-C", str(src), "-c", "user.name=rollout", "-c", "user.email=rollout@localhost"]
    subprocess.run([*git, "add", "UPGRADE-TEST"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "rollout test: a newer commit"], check=True)
    new = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    boots = {h: n["boot_id"] for h, n in hosts.nodes().items()}
    # a reader on h4 (the last of the batch order) reads the file written on h2 while h2 and
    # h3 restart; it stops when the agents play reaches h4 itself (its own mount goes away then)
    expected = _sha(data)
    reader = subprocess.Popen(
        ["docker", "exec", hosts.info["h4"]["container"], "sh", "-c",
         f"rm -f /tmp/stop-reader; n=0; e=0; while [ ! -e /tmp/stop-reader ] && [ $n -lt 20000 ]; do "
         f"if ls {MNT} >/dev/null && [ \"$(sha256sum < {MNT}/{name} | cut -c1-64)\" = {expected} ]; "
         f"then n=$((n+1)); else e=$((e+1)); echo \"read error $(date +%T.%N)\"; fi; sleep 0.1; done; "
         f"echo reads=$n errors=$e"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = hosts.tmp / "upgrade.log"
    t0 = time.monotonic()
    run = hosts.playbook("-e", f"hycache_version={new}", log=log)
    try:
        def h4_turn():
            out = log.read_text()
            i = out.find("PLAY [HyCache agents]")
            return i >= 0 and "[h4]" in out[i:]
        deadline = time.monotonic() + 3600
        while run.poll() is None and not h4_turn() and time.monotonic() < deadline:
            time.sleep(0.2)
        hosts.exec("h4", "touch", "/tmp/stop-reader")
        rc = run.wait(timeout=max(60, deadline - time.monotonic()))
    finally:
        if run.poll() is None:
            run.kill()
        hosts.exec("h4", "touch", "/tmp/stop-reader", check=False)
        read_log = reader.communicate(timeout=120)[0]
    print(f"\nrollout: upgrade took {time.monotonic() - t0:.0f} s; reader: {read_log.strip()[-200:]}")
    out = log.read_text()
    assert rc == 0, out[-8000:]
    reads, errors = map(int, re.search(r"reads=(\d+) errors=(\d+)", read_log).groups())
    assert errors == 0 and reads > 0, read_log
    # one at a time: the agents play ran in three batches of one host each, each restarting it
    batches = out.split("PLAY [HyCache agents]")[1:]
    assert len(batches) == 3, out[-6000:]
    for h, batch in zip(AGENTS, batches):
        assert set(re.findall(r"\[(h\d)\]", batch.split("PLAY RECAP")[0])) == {h}, batch[-3000:]
        assert "RUNNING HANDLER [hycache_agent : Restart hycache-agent]" in batch, batch[-3000:]
    for h in AGENTS:
        assert hosts.exec(h, "readlink", "/opt/hycache/current").stdout.strip() == f"/opt/hycache/releases/{new}"
        assert hosts.exec(h, "cat", "/etc/hycache/agent.release").stdout.strip() == f"/opt/hycache/releases/{new}"
    assert hosts.exec(CONTROL, "cat", "/var/lib/hycache-control/release").stdout.strip() == \
        f"/opt/hycache/releases/{new}"
    # every agent up again as a new process (the last one restarted just before the play ended)
    wait_for(lambda: (n := hosts.nodes()) and all(n.get(h, {}).get("state") == "up" and n[h]["boot_id"] != boots[h]
                                                  for h in AGENTS), 120, "every agent up with a new boot id")
    for h in AGENTS:
        assert read_sha(hosts, h, name) == _sha(data), h


# --------------------------------------------------------------------------- when something dies
# Each part killed once (kill -9 of its main process inside its host, as a crash would;
# the whole host: `docker restart`) while writers on CHAOS_WRITERS write files through
# their mounts (chaoskit.Writers), probes read /api/v1/nodes through HAProxy and the
# workflow's jobs are started before each kill and finished after it. Part -> (the bound
# in seconds from the kill until it is back, what restarts it):
CHAOS = {
    # systemd: Restart=on-failure, RestartSec=5, then the mount and the first heartbeat
    "agent": (60.0, "hycache-agent.service Restart=on-failure"),
    # uvicorn's supervisor starts a new server process in the killed one's place
    "control process": (30.0, "hycache-control's uvicorn supervisor"),
    # systemd: the unit's Restart=on-failure, RestartSec=5, then the database and /readyz
    "control main": (60.0, "hycache-control.service Restart=on-failure"),
    # systemd: Restart=always, RestartSec=2; back = the cluster whole (cluster_state:ok,
    # every node connected) again
    "redis master": (60.0, "redis-cluster@.service Restart=always"),
    "redis replica": (60.0, "redis-cluster@.service Restart=always"),
    # the roles' drop-ins on Debian's units
    "postgresql": (60.0, "postgresql@.service drop-in Restart=on-failure"),
    "haproxy": (30.0, "haproxy.service drop-in Restart=always"),
    # the container restarted: systemd boots, starts Redis and the agent, which mounts again
    "host restart": (180.0, "systemd at boot (units enabled)"),
}
CHAOS_PARTS = list(CHAOS)
CHAOS_DIR = f"{MNT}/chaos"
CHAOS_WRITERS = ["h2", "h4"]
KILLED_AGENT = "h3"
REBOOTED = "h2"  # an agent host holding two of the six Redis nodes


def unit_prop(hosts, host: str, unit: str, prop: str) -> str:
    return hosts.exec(host, "systemctl", "show", "-p", prop, "--value", unit, check=False).stdout.strip()


def redis_all(hosts, *args: str) -> dict[str, str]:
    """`redis-cli ARGS` against each of the six nodes, from h1 in one exec: "ip:port" -> output."""
    addrs = " ".join(f"{hosts.info[h]['ip']}:{p}" for h in REDIS_HOSTS for p in ("7000", "7001"))
    script = (f'for a in {addrs}; do echo "=== $a"; timeout 5 redis-cli --no-auth-warning --user hycache-admin '
              f'-h "${{a%:*}}" -p "${{a#*:}}" "$@"; done')
    out = hosts.exec("h1", "env", f"REDISCLI_AUTH={PASSWORDS['hycache_redis_admin_password']}", "sh", "-c",
                     script, "sh", *args, check=False, timeout=60).stdout.replace("\r", "")
    return {b.split("\n", 1)[0].strip(): b.split("\n", 1)[1] if "\n" in b else "" for b in out.split("=== ")[1:]}


def redis_whole(hosts) -> bool:
    """cluster_state:ok on every node, and every node sees all six connected, none failed."""
    infos, nodes = redis_all(hosts, "cluster", "info"), redis_all(hosts, "cluster", "nodes")
    if len(infos) != 6 or any("cluster_state:ok" not in v for v in infos.values()):
        return False
    for text in nodes.values():
        rows = [ln.split() for ln in text.splitlines() if ln.strip()]
        if len(rows) != 6 or any("fail" in f[2] or f[7] != "connected" for f in rows):
            return False
    return True


def redis_node(hosts, role: str) -> tuple[str, str]:
    """(host, port) of a Redis node in `role` (master | slave) as the cluster sees it."""
    by_ip = {d["ip"]: h for h, d in hosts.info.items()}
    for text in redis_all(hosts, "cluster", "nodes").values():
        for f in (ln.split() for ln in text.splitlines() if ln.strip()):
            if role in f[2].split(",") and "fail" not in f[2]:
                ip, port = f[1].split("@")[0].rsplit(":", 1)
                return by_ip[ip], port
    raise AssertionError("no Redis node answers `cluster nodes`")


def control_workers(hosts) -> list[int]:
    """The server processes of hycache-control: the children of its main process that
    multiprocessing spawned (uvicorn's workers)."""
    main = unit_prop(hosts, CONTROL, "hycache-control", "MainPID")
    out = hosts.sh(CONTROL, f"for c in $(cat /proc/{main}/task/*/children); do "
                            f"tr '\\0' ' ' < /proc/$c/cmdline | grep -q spawn_main && echo $c; done",
                   check=False).stdout
    return [int(x) for x in out.split()]


def api_answers(hosts) -> bool:
    try:
        return all(hosts.api(p, timeout=5).status_code == 200 for p in ("/api/v1/nodes", "/api/v1/manifests"))
    except httpx.HTTPError:
        return False


def chaos_target(hosts, part: str) -> tuple[str, str]:
    """(host, systemd unit) the part's kill goes to."""
    if part.startswith("redis"):
        host, port = redis_node(hosts, "master" if part == "redis master" else "slave")
        return host, f"redis-cluster@{port}"
    if part == "postgresql":
        units = hosts.exec(CONTROL, "systemctl", "list-units", "--plain", "--no-legend", "postgresql@*").stdout
        return CONTROL, units.split()[0]
    return {"agent": (KILLED_AGENT, "hycache-agent"), "control process": (CONTROL, "hycache-control"),
            "control main": (CONTROL, "hycache-control"), "haproxy": (CONTROL, "haproxy"),
            "host restart": (REBOOTED, "hycache-agent")}[part]


class Outage:
    """One part's kill and the test of its coming back."""

    def __init__(self, hosts, part: str):
        self.hosts, self.part = hosts, part
        self.host, self.unit = chaos_target(hosts, part)
        self.node = REBOOTED if part == "host restart" else KILLED_AGENT  # whose state the probes follow
        self.restarts = int(unit_prop(hosts, self.host, self.unit, "NRestarts"))
        self.boot = hosts.nodes()[self.node]["boot_id"]
        self.killed = 0

    def kill(self) -> float:
        """kill -9 (the host: docker restart); the time the outage began."""
        hosts = self.hosts
        if self.part == "control process":
            self.killed = control_workers(hosts)[0]
        elif self.part != "host restart":
            self.killed = int(unit_prop(hosts, self.host, self.unit, "MainPID"))
        t0 = time.monotonic()
        if self.part == "host restart":
            docker("restart", "-t", "60", hosts.info[self.host]["container"], timeout=300)
            hosts.refresh()
        else:
            hosts.exec(self.host, "kill", "-9", str(self.killed))
        return t0

    def back(self) -> bool:
        hosts, part = self.hosts, self.part
        if part == "control process":
            workers = control_workers(hosts)
            return len(workers) == 2 and self.killed not in workers and api_answers(hosts)
        if part == "host restart":
            if hosts.exec(self.host, "systemctl", "is-active", self.unit, check=False).stdout.strip() != "active":
                return False
        elif (hosts.exec(self.host, "systemctl", "is-active", self.unit, check=False).stdout.strip() != "active"
              or int(unit_prop(hosts, self.host, self.unit, "NRestarts")) != self.restarts + 1):
            return False
        if part in ("agent", "host restart"):
            n = hosts.nodes().get(self.node, {})
            if not (hosts.mounted(self.host) and n.get("state") == "up" and n.get("boot_id") != self.boot):
                return False
        if part.startswith("redis") or part == "host restart":
            return redis_whole(hosts)
        return api_answers(hosts)


@pytest.fixture(scope="module")
def chaos(hosts, rolled_out):
    """What the parts share: the acknowledged files, the workflow, the report lines."""
    wait_for(lambda: all(hosts.states().get(h) == "up" for h in AGENTS), 120, "h2, h3, h4 up")
    hosts.exec(CHAOS_WRITERS[0], "mkdir", "-p", CHAOS_DIR)
    wait_for(lambda: all(hosts.exec(h, "test", "-d", CHAOS_DIR, check=False).returncode == 0 for h in AGENTS),
             60, f"{CHAOS_DIR} on every agent")
    return {"acked": {}, "manifest": chaoskit.post_workflow(hosts.api, AGENTS), "finished": {}, "report": []}


def _containers(hosts, names: list[str]) -> dict[str, str]:
    return {h: hosts.info[h]["container"] for h in names}


@pytest.mark.parametrize("part", CHAOS_PARTS)
def test_a_killed_part_comes_back_by_itself_and_nothing_is_lost(hosts, chaos, part):
    index = CHAOS_PARTS.index(part)
    bound = CHAOS[part][0]
    mid, jobs = chaos["manifest"]["id"], chaos["manifest"]["jobs"]
    job = jobs[index]["id"] if index < len(jobs) else None  # a job per part while there are jobs
    outage = Outage(hosts, part)
    since = chaoskit.last_event_id(hosts.api)
    if job is not None:
        chaoskit.job_step(hosts.api, mid, job, "start")
    tag = f"r{index}"
    writers = chaoskit.Writers(_containers(hosts, CHAOS_WRITERS), CHAOS_DIR, chaos["acked"], tag).start()
    probes = chaoskit.Probes(hosts.api, outage.node).start()
    try:
        time.sleep(chaoskit.SETTLE)
        t0 = outage.kill()
        try:
            chaoskit.wait_for(outage.back, bound, f"{part} ({outage.host} {outage.unit}) back by itself", interval=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{hosts.service_logs(60)}") from None
        t1 = time.monotonic()
        time.sleep(chaoskit.SETTLE)
    finally:
        writers.stop()
        probes.stop()
    errors, probed = probes.errors(t0, t1)
    mine = [n for n in chaos["acked"] if n.startswith(f"{tag}-")]
    bad = chaoskit.settled_check(_containers(hosts, AGENTS), CHAOS_DIR, chaos["acked"])
    line = chaoskit.report_line(part, f"{outage.host} {outage.unit}", t1 - t0, bound, writers, len(mine), bad,
                                len(chaos["acked"]), errors, probed)
    chaos["report"].append(line)
    print("\n" + line)
    assert not bad, {a: {k: v[:5] for k, v in d.items()} for a, d in bad.items()}
    assert writers.attempted > 0 and mine, (writers.attempted, writers.failed[:5])
    if job is not None:
        chaos["finished"][job] = chaoskit.job_step(hosts.api, mid, job, "finish").get("finished_at")
    wait_for(lambda: all(hosts.states().get(h) == "up" for h in AGENTS), 60, "h2, h3, h4 up after the part")
    if part in ("agent", "host restart"):
        chaoskit.api_says_what_happened(hosts.api, probes, t0, outage.boot, since)


def test_the_workflow_lost_nothing_and_ran_nothing_twice(hosts, chaos):
    chaoskit.check_workflow(hosts.api, chaos["manifest"], chaos["finished"])


def test_chaos_report(chaos):
    print("\nWhen something dies (the ansible rollout on systemd hosts, kill -9 under load):")
    for line in chaos["report"]:
        print("  " + line)
    assert len(chaos["report"]) == len(CHAOS_PARTS)

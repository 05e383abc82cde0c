"""ansible/: syntax, and the files the roles write, rendered by ansible itself.

``ansible-playbook site.yml --tags hycache_config,redis_config`` runs on localhost
(connection local) against a YAML inventory whose two agents write into a temporary
directory: ``n1`` with the roles' defaults, ``n2`` with every optional setting. The
rendered files are then checked by the programs that will read them:

* agent.toml + the unit's ExecStart: the agent's own ``build_parser`` and ``load_config``
  (as ``hycache-agent mount`` does), so a key the agent does not know fails here;
* the cluster secret: mode 0600 and the agent's ``load_secret``;
* redis.conf: a real redis-server started from it;
* both systemd units: ``systemd-analyze verify`` (skipped where it is missing).
"""

from __future__ import annotations

import grp
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hycache_agent.cli import build_parser
from hycache_agent.config import AgentConfig, load_config
from hycache_agent.control.link import load_token
from hycache_agent.transport.auth import load_secret

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent
SECRET = "s3cret-for-the-render-test-0123456789"
CONTROL_TOKEN = "hcn_node-token-for-the-render-test-42"
ADMIN_TOKEN = "hca_admin-token-for-the-render-test-0123456789"
DB_URL = "postgresql+psycopg://hycache:p%40ss%25word@db.example:5432/hycache"
# the managed host's interpreter for modules: the system one starts faster than the venv's
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def ansible_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_HOME=str(tmp / "ansible-home"),
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def playbook_bin() -> str:
    exe = BIN / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-core is not installed in this environment (root dev group: uv sync)")
    return str(exe)


REDIS_PASSWORDS = {"hycache_redis_admin_password": "admin-pw-" + "a1" * 12,
                   "hycache_redis_agent_password": "agent-pw-" + "b2" * 12,
                   "hycache_redis_control_password": "control-pw-" + "c3" * 12}


def test_site_yml_syntax(tmp_path):
    inv = tmp_path / "inventory.ini"
    shutil.copy(ANSIBLE / "inventory.example.ini", inv)
    out = subprocess.run([playbook_bin(), "-i", str(inv), str(ANSIBLE / "site.yml"), "--syntax-check"],
                         capture_output=True, text=True, env=ansible_env(tmp_path), cwd=ANSIBLE, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stderr.upper(), out.stderr


def test_role_files_exist():
    link = ANSIBLE / "roles" / "redis_cluster" / "files" / "cluster-init.sh"
    assert link.resolve() == REPO / "deploy" / "redis" / "cluster-init.sh", \
        "the role runs the compose demo's cluster-init.sh (tested in test_compose_runtime.py)"
    defaults = yaml.safe_load((ANSIBLE / "roles" / "hycache_agent" / "defaults" / "main.yml").read_text())
    versions = dict(line.split("=", 1) for line in (REPO / "scripts" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    assert defaults["hycache_agent_uv_version"] == versions["UV_VERSION"]


def local_uv() -> str | None:
    """This machine's uv if it is the version the role pins (then the install tasks can
    run offline from uv's cache instead of pip-installing uv from PyPI)."""
    want = yaml.safe_load((ANSIBLE / "roles" / "hycache_agent" / "defaults" / "main.yml").read_text())[
        "hycache_agent_uv_version"]
    hint = REPO / ".work" / "uv-path"
    for cand in ([hint.read_text().strip()] if hint.exists() else []) + [shutil.which("uv") or ""]:
        if cand and os.access(cand, os.X_OK):
            out = subprocess.run([cand, "--version"], capture_output=True, text=True)
            if out.stdout.split()[1:2] == [want]:
                return cand
    return None


def run_playbook(inv: Path, tmp: Path, tags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [playbook_bin(), "-i", str(inv), str(ANSIBLE / "site.yml"), "--limit", "n1,n2,cp",
         "--tags", tags, "--skip-tags", "hycache_agent_build_packages"],
        capture_output=True, text=True, env=ansible_env(tmp), cwd=ANSIBLE, timeout=300)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Run the file-writing tags on localhost, twice: {host: its directory}, plus
    "_install" (whether hycache_install ran) and "_second" (the second run's output)."""
    if os.geteuid() != 0:
        pytest.skip("the roles set root ownership on what they write: run as root")
    tmp = tmp_path_factory.mktemp("ansible")
    group = grp.getgrgid(os.getgid()).gr_name
    uv = local_uv()
    hosts = {}
    for name in ("n1", "n2"):
        d = tmp / name
        for sub in ("etc", "systemd", "redis"):
            (d / sub).mkdir(parents=True)
        if uv:  # the role's "which uv" check finds the pinned version: no pip install
            (d / "opt" / "tools" / "bin").mkdir(parents=True)
            (d / "opt" / "tools" / "bin" / "uv").symlink_to(uv)
        else:  # no install: ExecStart must still exist for systemd-analyze verify
            (d / "opt" / "current" / ".venv" / "bin").mkdir(parents=True)
            (d / "opt" / "current" / ".venv" / "bin" / "hycache-agent").symlink_to(BIN / "hycache-agent")
        hosts[name] = d
    cp = tmp / "cp"  # the control plane's host (not an agent: nothing installed there)
    for sub in ("etc", "systemd", "state"):
        (cp / sub).mkdir(parents=True)
    (cp / "opt" / "current" / ".venv" / "bin").mkdir(parents=True)
    control_bin = BIN / "hycache-control" if (BIN / "hycache-control").exists() else BIN / "hycache-agent"
    (cp / "opt" / "current" / ".venv" / "bin" / "hycache-control").symlink_to(control_bin)
    hosts["cp"] = cp
    uv_cache = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True).stdout.strip() if uv else ""
    local = {"ansible_connection": "local", "ansible_python_interpreter": PY,
             "ansible_become": False}
    def common(d):
        return {
            "hycache_agent_config_dir": str(d / "etc"), "hycache_agent_systemd_dir": str(d / "systemd"),
            "hycache_agent_install_dir": str(d / "opt"), "redis_cluster_config_dir": str(d / "redis"),
            "redis_cluster_systemd_dir": str(d / "systemd"), "redis_cluster_group": group,
            "hycache_agent_restart_on_change": False}
    inventory = {"all": {
        "vars": {"hycache_cluster_secret": SECRET, "hycache_agent_build_dir": str(tmp / "build"),
                 **REDIS_PASSWORDS,
                 "hycache_agent_python": sys.executable,
                 # libfuse 3.17 for passthrough: this machine's build (bootstrap made it)
                 "hycache_agent_libfuse_tools_dir": os.environ.get(
                     "HYCACHE_TOOLS_DIR", str(Path.home() / ".cache" / "hycache")),
                 # offline from this machine's uv cache (what the variable is for: mirrors)
                 "hycache_agent_uv_environment": {"UV_CACHE_DIR": uv_cache, "UV_OFFLINE": "1",
                                            "UV_LINK_MODE": "hardlink", "UV_COMPILE_BYTECODE": "0"}},
        "children": {
            "agents": {"hosts": {
                "n1": {**local, "ansible_host": "127.0.0.1", **common(hosts["n1"])},
                "n2": {**local, "ansible_host": "127.0.0.2", **common(hosts["n2"]),
                       "hycache_agent_fast": "/nvme/hycache", "hycache_agent_slow": "/lustre/hycache/n2",
                       "hycache_agent_fast_capacity": "100G", "hycache_agent_policy": "gdsf",
                       "hycache_agent_promote_mode": "before-open", "hycache_agent_log_level": "debug",
                       "hycache_agent_high_watermark": 0.8, "hycache_agent_low_watermark": 0.5,
                       "hycache_agent_listen_port": 7171, "hycache_agent_root": "/srv/hycache root",
                       "hycache_agent_extra_options": {"kernel_cache": False, "writeback_cache": False},
                       "hycache_agent_control_plane": "https://control.example:8080",
                       "hycache_agent_control_token": CONTROL_TOKEN,
                       "hycache_agent_metrics_listen": "127.0.0.1:9170"},
            }},
            "control_plane": {"hosts": {
                "cp": {**local, "ansible_host": "127.0.0.3",
                       "control_plane_config_dir": str(cp / "etc"), "control_plane_systemd_dir": str(cp / "systemd"),
                       "control_plane_install_dir": str(cp / "opt"),
                       "control_plane_state_dir": str(cp / "state"),
                       "control_plane_restart_on_change": False,
                       "control_plane_admin_token": ADMIN_TOKEN, "control_plane_db_url": DB_URL},
            }},
            "redis": {"hosts": {
                "n1": {},
                "r2": {"ansible_host": "10.0.0.2"},
                "r3": {"ansible_host": "10.0.0.3", "redis_cluster_ports": [7000, 7001, 7002]},
            }},
        }}}
    inv = tmp / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory))
    tags = "hycache_config,redis_config,hycache_control_config" + (",hycache_install" if uv else "")
    first = run_playbook(inv, tmp, tags)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    second = run_playbook(inv, tmp, tags)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr
    for out in (first, second):
        assert SECRET not in out.stdout + out.stderr, "the secret leaked into ansible's output"
        for pw in REDIS_PASSWORDS.values():
            assert pw not in out.stdout + out.stderr, "a Redis password leaked into ansible's output"
        assert CONTROL_TOKEN not in out.stdout + out.stderr, "the token leaked into ansible's output"
        assert ADMIN_TOKEN not in out.stdout + out.stderr and "p%40ss" not in out.stdout + out.stderr
    return {**hosts, "_install": bool(uv), "_second": second.stdout}


def exec_start(unit: Path) -> list[str]:
    (line,) = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def effective_config(d: Path) -> tuple[object, AgentConfig]:
    """What the unit's command line gives `hycache-agent mount` (as cli.main merges it)."""
    argv = exec_start(d / "systemd" / "hycache-agent.service")
    assert Path(argv[0]).name == "hycache-agent"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "mount"
    overrides = {k: v for k, v in vars(args).items() if k in AgentConfig.model_fields}
    assert args.config == d / "etc" / "agent.toml"
    return args, load_config(args.config, overrides)


def test_agent_config_with_the_role_defaults(rendered):
    d = rendered["n1"]
    args, config = effective_config(d)
    defaults = yaml.safe_load((ANSIBLE / "roles" / "hycache_agent" / "defaults" / "main.yml").read_text())
    assert str(args.root) == defaults["hycache_agent_root"]
    assert str(args.mountpoint) == defaults["hycache_agent_mountpoint"]
    assert config.clustered
    # every node of every [redis] host, whatever --limit said
    assert config.redis_nodes == [("127.0.0.1", 7000), ("127.0.0.1", 7001), ("10.0.0.2", 7000),
                                  ("10.0.0.2", 7001), ("10.0.0.3", 7000), ("10.0.0.3", 7001), ("10.0.0.3", 7002)]
    assert config.node_id == "n1"
    assert config.listen == "0.0.0.0:7070" and config.advertise == "127.0.0.1:7070"
    assert config.dht_namespace == "hc"
    assert (config.policy, config.high_watermark, config.low_watermark) == ("lru", 0.9, 0.7)
    assert config.fast is None and config.slow is None and config.fast_capacity is None
    # the secret file: where the config says, mode 0600, accepted by the agent
    assert config.cluster_secret_file == d / "etc" / "cluster-secret"
    assert config.cluster_secret_file.stat().st_mode & 0o777 == 0o600
    assert load_secret(config.cluster_secret_file) == SECRET.encode()
    # no control plane unless asked for
    assert config.control_plane is None and config.control_token_file is None
    assert not (d / "etc" / "control-token").exists()


def test_agent_config_with_every_option(rendered):
    args, config = effective_config(rendered["n2"])
    assert str(args.root) == "/srv/hycache root", "a path with a space survives the unit's quoting"
    assert (str(config.fast), str(config.slow)) == ("/nvme/hycache", "/lustre/hycache/n2")
    assert config.fast_capacity == 100 * 2**30
    assert (config.policy, config.promote_mode, config.log_level) == ("gdsf", "before-open", "DEBUG")
    assert (config.high_watermark, config.low_watermark) == (0.8, 0.5)
    assert config.listen == "0.0.0.0:7171" and config.advertise == "127.0.0.2:7171"
    assert config.kernel_cache is False and config.writeback_cache is False
    # the control-plane link: the token file where the config says, accepted by the agent
    assert config.control_plane == "https://control.example:8080"
    assert config.control_token_file == rendered["n2"] / "etc" / "control-token"
    assert config.control_token_file.stat().st_mode & 0o777 == 0o600
    assert load_token(config.control_token_file) == CONTROL_TOKEN
    assert config.metrics_listen == "127.0.0.1:9170"


def test_unknown_extra_option_is_rejected_by_the_agent(rendered, tmp_path):
    """The check above has teeth: the loader refuses a key the agent does not know."""
    text = (rendered["n1"] / "etc" / "agent.toml").read_text() + "no_such_option = 1\n"
    bad = tmp_path / "agent.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match="no_such_option"):
        load_config(bad, {"root": Path("/r"), "mountpoint": Path("/m")})


def test_agent_unit(rendered):
    unit = (rendered["n1"] / "systemd" / "hycache-agent.service").read_text()
    service = dict(ln.split("=", 1) for ln in unit.split("[Service]")[1].split("[Install]")[0].splitlines()
                   if "=" in ln and not ln.startswith("#"))
    assert service["KillSignal"] == "SIGTERM"
    assert service["Restart"] == "on-failure"
    assert service["ExecStopPost"] == "-/bin/fusermount3 -uz /mnt/hycache"
    assert service["Type"] in ("exec", "simple"), "the agent stays in the foreground"
    assert "2" in service["RestartPreventExitStatus"].split(), "exit 2 = bad configuration"
    from hycache_agent.mount import SHUTDOWN_GRACE

    assert int(service["TimeoutStopSec"]) > SHUTDOWN_GRACE


def _systemd_verify(unit_path: Path, instance: str | None = None) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: units not verified")
    target = unit_path if instance is None else unit_path.with_name(unit_path.name.replace("@", f"@{instance}"))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(target)],
                         capture_output=True, text=True, timeout=60)
    # verify exits 0 even for directives it ignores ("Failed to parse ..., ignoring"):
    # any message about our unit is a failure
    ours = [ln for ln in out.stderr.splitlines() if unit_path.stem.split("@")[0] in ln]
    assert out.returncode == 0 and not ours, out.stderr


def test_systemd_verify_agent_unit(rendered):
    _systemd_verify(rendered["n1"] / "systemd" / "hycache-agent.service")


def test_systemd_verify_redis_template_unit(rendered):
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("/usr/bin/redis-server (ExecStart) is not installed: redis-cluster@.service not verified")
    _systemd_verify(rendered["n1"] / "systemd" / "redis-cluster@.service", instance="7000")


def _redis_server(conf: Path, port: int) -> subprocess.Popen:
    """redis-server from `conf` on 127.0.0.1:port in the foreground, once it answers PING."""
    proc = subprocess.Popen(["redis-server", str(conf), "--port", str(port), "--bind", "127.0.0.1",
                             "--supervised", "no", "--cluster-announce-ip", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    admin = {**os.environ, "REDISCLI_AUTH": REDIS_PASSWORDS["hycache_redis_admin_password"]}
    deadline = time.monotonic() + 15
    while subprocess.run(["redis-cli", "--user", "hycache-admin", "-p", str(port), "ping"], capture_output=True,
                         text=True, env=admin).stdout.strip() != "PONG":
        assert proc.poll() is None, f"redis-server refused the rendered configuration:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _cluster_ok(as_admin) -> None:
    deadline = time.monotonic() + 15
    while "cluster_state:ok" not in as_admin("cluster", "info"):
        assert time.monotonic() < deadline, as_admin("cluster", "info")
        time.sleep(0.1)


def test_rendered_redis_conf_starts_redis_server(rendered, tmp_path):
    """redis-server accepts the role's configuration (its own dir, port and supervision
    replaced for a foreground run here), and a restart keeps what a script wrote (its
    effects are a MULTI/EXEC in the AOF, which Redis 7.0 replays with the default user's
    permissions: redis/redis#14541)."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server/redis-cli not installed")
    from hycache_dht.localcluster import find_free_base

    confs = sorted((rendered["n1"] / "redis").glob("*.conf"))
    assert [c.name for c in confs] == ["7000.conf", "7001.conf"]
    text = confs[0].read_text()
    assert re.search(r"^cluster-announce-ip 127\.0\.0\.1$", text, re.MULTILINE)
    assert re.search(r"^supervised systemd$", text, re.MULTILINE), "the unit is Type=notify"
    conf, n = re.subn(r"^dir .*$", f"dir {tmp_path}", text, flags=re.MULTILINE)
    assert n == 1
    (tmp_path / "node.conf").write_text(conf)
    port = find_free_base(1)
    admin = {**os.environ, "REDISCLI_AUTH": REDIS_PASSWORDS["hycache_redis_admin_password"]}
    agent = {**os.environ, "REDISCLI_AUTH": REDIS_PASSWORDS["hycache_redis_agent_password"]}
    as_agent = lambda *a: subprocess.run(["redis-cli", "--user", "hycache-agent", "-p", str(port), *a],  # noqa: E731
                                         capture_output=True, text=True, env=agent).stdout.strip()
    as_admin = lambda *a: subprocess.run(["redis-cli", "--user", "hycache-admin", "-p", str(port), *a],  # noqa: E731
                                         capture_output=True, text=True, env=admin).stdout.strip()
    proc = _redis_server(tmp_path / "node.conf", port)
    try:
        got = subprocess.run(["redis-cli", "--user", "hycache-admin", "-p", str(port), "config", "get",
                              "cluster-enabled"], capture_output=True, text=True, env=admin).stdout.split()
        assert got == ["cluster-enabled", "yes"]
        # access control: nothing without credentials, nor as the default user; the agents'
        # user reaches its keys but no dangerous command; a wrong password is refused
        anon = subprocess.run(["redis-cli", "-p", str(port), "get", "hc:x"], capture_output=True, text=True)
        assert "NOAUTH" in anon.stdout + anon.stderr, anon
        as_default = subprocess.run(["redis-cli", "-p", str(port), "auth", "default", ""], capture_output=True,
                                    text=True)
        assert "WRONGPASS" in as_default.stdout + as_default.stderr, as_default
        assert as_agent("time") and "NOPERM" not in as_agent("time")
        assert "NOPERM" in as_agent("config", "get", "dir") and "NOPERM" in as_agent("get", "other:x")
        wrong = subprocess.run(["redis-cli", "--user", "hycache-agent", "-p", str(port), "ping"], capture_output=True,
                               text=True, env={**os.environ, "REDISCLI_AUTH": "not-the-password-000"})
        assert "WRONGPASS" in wrong.stdout + wrong.stderr, wrong
        assert as_admin("cluster", "addslotsrange", "0", "16383") == "OK"
        _cluster_ok(as_admin)
        script = "redis.call('hincrby', KEYS[1], '/v', 1); return redis.call('hset', KEYS[1], 'f', 'entry')"
        assert as_agent("eval", script, "1", "hc:{t}:d") == "1"
    finally:
        proc.terminate()
        proc.wait(10)
    proc = _redis_server(tmp_path / "node.conf", port)  # the same dir: it loads its AOF
    try:
        _cluster_ok(as_admin)
        assert as_agent("hget", "hc:{t}:d", "f") == "entry", proc.terminate() or proc.communicate(timeout=10)[0][-3000:]
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_unit_runs_the_rendered_configs(rendered):
    unit = (rendered["n1"] / "systemd" / "redis-cluster@.service").read_text()
    argv = exec_start(rendered["n1"] / "systemd" / "redis-cluster@.service")
    assert argv == ["/usr/bin/redis-server", f"{rendered['n1'] / 'redis'}/%i.conf"]
    assert "Type=notify" in unit
    assert json.dumps(sorted(p.stem for p in (rendered["n1"] / "redis").glob("*.conf"))) == '["7000", "7001"]'


def test_second_run_changes_nothing(rendered):
    recap = re.findall(r"^(n[12]|cp)\s+:\s+ok=\d+\s+changed=(\d+)", rendered["_second"], re.MULTILINE)
    assert sorted(recap) == [("cp", "0"), ("n1", "0"), ("n2", "0")], rendered["_second"][-3000:]


def test_install_tasks_deploy_the_committed_workspace(rendered):
    if not rendered["_install"]:
        pytest.skip("uv at the role's pinned version is not on this machine: hycache_install not run")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for name in ("n1", "n2"):
        opt = rendered[name] / "opt"
        current = opt / "current"
        assert current.is_symlink() and current.resolve() == opt / "releases" / head
        agent = current / ".venv" / "bin" / "hycache-agent"
        out = subprocess.run([str(agent), "mount", "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "--cluster-secret-file" in out.stdout, out.stderr
        # the unit runs that agent
        assert exec_start(rendered[name] / "systemd" / "hycache-agent.service")[0] == str(agent)


# --------------------------------------------------------------------------- control plane
def test_control_plane_files(rendered):
    d = rendered["cp"]
    unit = d / "systemd" / "hycache-control.service"
    argv = exec_start(unit)
    assert argv[0] == str(d / "opt" / "current" / ".venv" / "bin" / "hycache-control")
    assert argv[1] == "serve"
    opts = dict(zip(argv[2::2], argv[3::2]))
    assert opts["--listen"] == "0.0.0.0:8080" and opts["--state-dir"] == str(d / "state")
    assert opts["--dht-namespace"] == "hc"
    # the agents' Redis Cluster: every node of every [redis] host, as the agents get it
    _, agent_config = effective_config(rendered["n1"])
    assert opts["--redis"] == agent_config.redis
    # Redis ACL users: the control plane's and the agents' own, passwords in 0600 files
    assert opts["--redis-user"] == "hycache-control" and agent_config.redis_user == "hycache-agent"
    for f, pw in ((Path(opts["--redis-password-file"]), REDIS_PASSWORDS["hycache_redis_control_password"]),
                  (agent_config.redis_password_file, REDIS_PASSWORDS["hycache_redis_agent_password"])):
        assert f.stat().st_mode & 0o777 == 0o600 and f.read_text().strip() == pw
    assert REDIS_PASSWORDS["hycache_redis_control_password"] not in unit.read_text()
    # the admin token: mode 0600, the exact secret; the database URL only in a 0600 env file
    token = Path(opts["--admin-token-file"])
    assert token == d / "etc" / "control-admin-token"
    assert token.stat().st_mode & 0o777 == 0o600 and token.read_text().strip() == ADMIN_TOKEN
    env_file = d / "etc" / "control-plane.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert DB_URL not in unit.read_text() and ADMIN_TOKEN not in unit.read_text()
    assert f"EnvironmentFile={env_file}" in unit.read_text()
    env = {k: v.strip('"') for k, v in (ln.split("=", 1) for ln in env_file.read_text().splitlines()
                                        if ln and not ln.startswith("#"))}
    assert env == {"HYCACHE_CONTROL_DB": DB_URL}


def test_control_plane_command_is_what_hycache_control_accepts(rendered):
    cli = pytest.importorskip("hycache_control.cli", reason="hycache-control (backend/) is not installed")
    argv = exec_start(rendered["cp"] / "systemd" / "hycache-control.service")
    args = cli.parser().parse_args(argv[1:])
    assert args.cmd == "serve"


def test_systemd_verify_control_plane_unit(rendered):
    _systemd_verify(rendered["cp"] / "systemd" / "hycache-control.service")

"""docker-compose.yml and deploy/, checked without a Docker engine.

The file is parsed the way Compose would (YAML with merge keys, ``${VAR:-default}``
interpolation with an empty environment, i.e. the shipped defaults) and every property
the demo relies on is checked against the real thing it names: the repository's files,
the agent's own argument parser and configuration loader, redis.conf's port, the
Dockerfile's COPY sources and its .dockerignore. The build stage's ``uv sync`` steps are
replayed on the files the Dockerfile copies (tests/deploy/test_compose_runtime.py runs
the init script and the entry point for real).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml
from hycache_agent.cli import build_parser
from hycache_agent.config import AgentConfig, load_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
AGENT_DOCKERFILE = "deploy/agent.Dockerfile"


# --------------------------------------------------------------------------- loading
_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's variable substitution on every string of a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        have = name in env and (env[name] != "" or op not in (":-", ":?"))
        if have:
            return env[name]
        if op in (":-", "-"):
            return arg
        raise AssertionError(f"${{{name}}} has no value and no default in {value!r}")

    return _VAR.sub(sub, value)


def load_compose(path: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> dict:
    with open(path) as f:
        data = yaml.safe_load(f)  # SafeLoader resolves `<<: *anchor` merge keys
    return interpolate(data, env or {})


COMPOSE = load_compose()
SERVICES: dict[str, dict] = COMPOSE["services"]
HOSTVIEW = load_compose(REPO / "deploy" / "compose.hostview.yml")  # the opt-in host view of the mounts


def agent_services() -> list[str]:
    return [n for n, s in SERVICES.items()
            if isinstance(s.get("build"), dict) and s["build"].get("dockerfile") == AGENT_DOCKERFILE]


def redis_services() -> list[str]:
    """The Redis nodes: started by deploy/redis/redis-start.sh (which runs redis-server)."""
    return [n for n, s in SERVICES.items()
            if as_argv(s.get("entrypoint"))[-1:] == ["/usr/local/bin/redis-start"]
            or as_argv(s.get("command"))[:1] == ["redis-server"]]


def as_argv(command) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def repo_file(relative: str) -> Path:
    p = (REPO / relative).resolve()
    assert p.is_relative_to(REPO), f"{relative} points outside the repository"
    return p


def service_files(name: str) -> dict[str, Path]:
    """Container path -> repository file for a service's configs, secrets and bind mounts."""
    svc, out = SERVICES[name], {}
    for item in svc.get("configs", []):
        item = {"source": item} if isinstance(item, str) else item
        target = item.get("target", "/" + item["source"])
        out[target] = repo_file(COMPOSE["configs"][item["source"]]["file"])
    for item in svc.get("secrets", []):
        item = {"source": item} if isinstance(item, str) else item
        target = item.get("target", item["source"])
        target = target if target.startswith("/") else f"/run/secrets/{target}"
        out[target] = repo_file(COMPOSE["secrets"][item["source"]]["file"])
    for v in volumes_of(name):
        if v["type"] == "bind":
            out[v["target"]] = repo_file(v["source"])
    return out


def volumes_of(name: str) -> list[dict]:
    """A service's volumes in long syntax."""
    out = []
    for v in SERVICES[name].get("volumes", []):
        if isinstance(v, dict):
            out.append(v)
            continue
        parts = v.split(":")
        source, target = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
        kind = "volume" if source is None or not source.startswith((".", "/", "~")) else "bind"
        out.append({"type": kind, "source": source, "target": target})
    return out


def redis_server_argv(name: str) -> list[str]:
    """redis-server's arguments of a Redis service: its command after redis-start.sh (which
    adds only the ACL include), or after `redis-server`."""
    argv = as_argv(SERVICES[name]["command"])
    return argv[1:] if argv[:1] == ["redis-server"] else argv


def redis_conf_port(name: str) -> int:
    argv = redis_server_argv(name)
    conf = service_files(name)[argv[0]]
    ports = re.findall(r"^port\s+(\d+)\s*$", conf.read_text(), re.MULTILINE)
    assert len(ports) == 1, f"{conf}: expected one `port` line"
    if "--port" in argv:
        return int(argv[argv.index("--port") + 1])
    return int(ports[0])


def effective_agent_config(name: str) -> tuple[object, AgentConfig]:
    """What `hycache-agent mount` would run with in the container: the service's command
    parsed by the agent's own parser, merged with the TOML file compose mounts, by the
    agent's own loader (as cli.main does)."""
    args = build_parser().parse_args(as_argv(SERVICES[name]["command"]))
    assert args.command == "mount"
    overrides = {k: v for k, v in vars(args).items() if k in AgentConfig.model_fields}
    config_file = None
    if args.config is not None:
        files = service_files(name)
        assert str(args.config) in files, f"{name}: --config {args.config} is not mounted into the container"
        config_file = files[str(args.config)]
    return args, load_config(config_file, overrides)


AGENTS = agent_services()
REDIS = redis_services()


# --------------------------------------------------------------------------- the file
def test_the_demo_has_a_redis_cluster_and_agents():
    assert len(REDIS) == 6, REDIS
    assert "redis-cluster-init" in SERVICES
    assert 2 <= len(AGENTS) <= 3, AGENTS


def test_interpolation_follows_compose_rules():
    env = {"A": "x", "E": ""}
    assert interpolate("${A:-d} ${E:-d} ${E-d} ${U:-d} ${U-d} $$A $A", env) == "x d  d d $A x"
    with pytest.raises(AssertionError):
        interpolate("${U}", env)


@pytest.mark.parametrize("name", list(SERVICES))
def test_image_or_build_context_exists(name):
    svc = SERVICES[name]
    assert "image" in svc or "build" in svc, f"{name}: neither image nor build"
    if "build" in svc:
        build = svc["build"] if isinstance(svc["build"], dict) else {"context": svc["build"]}
        context = repo_file(build.get("context", "."))
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
    else:
        image = svc["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), \
            f"{name}: image {image!r} should name a tag"


@pytest.mark.parametrize("name", list(SERVICES))
def test_references_are_defined(name):
    svc = SERVICES[name]
    for v in volumes_of(name):
        if v["type"] == "volume":
            assert v["source"] in (COMPOSE.get("volumes") or {}), f"{name}: volume {v['source']} not defined"
        elif v["type"] == "bind":
            src = repo_file(v["source"])
            assert src.exists() or v.get("bind", {}).get("create_host_path"), f"{name}: bind source {src} missing"
    for kind in ("configs", "secrets"):
        for item in svc.get(kind, []):
            source = item if isinstance(item, str) else item["source"]
            assert source in (COMPOSE.get(kind) or {}), f"{name}: {kind[:-1]} {source} not defined"
    nets = svc.get("networks", [])
    for net in (nets if isinstance(nets, list) else list(nets)):
        assert net in (COMPOSE.get("networks") or {}), f"{name}: network {net} not defined"
    deps = svc.get("depends_on", {})
    deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
    for dep, spec in deps.items():
        assert dep in SERVICES, f"{name} depends on unknown service {dep}"
        cond = spec.get("condition", "service_started")
        assert cond in ("service_started", "service_healthy", "service_completed_successfully"), cond
        if cond == "service_healthy":
            assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep} to be healthy: it has no healthcheck"
        if cond == "service_completed_successfully":
            assert str(SERVICES[dep].get("restart", "no")) == "no", f"{dep} is one-shot: restart must be 'no'"


def test_top_level_definitions_are_used_and_their_files_exist():
    used: dict[str, set] = {"volumes": set(), "configs": set(), "secrets": set(), "networks": set()}
    for name, svc in SERVICES.items():
        used["volumes"] |= {v["source"] for v in volumes_of(name) if v["type"] == "volume"}
        for kind in ("configs", "secrets"):
            used[kind] |= {i if isinstance(i, str) else i["source"] for i in svc.get(kind, [])}
        if isinstance(svc.get("build"), dict):  # build secrets (the optional CA bundle)
            used["secrets"] |= {i if isinstance(i, str) else i["source"] for i in svc["build"].get("secrets", [])}
        nets = svc.get("networks", [])
        used["networks"] |= set(nets)  # a list or a mapping: the names either way
    for kind, names in used.items():
        assert set(COMPOSE.get(kind) or {}) == names, f"top-level {kind} defined but unused (or the reverse)"
    for name, spec in COMPOSE["configs"].items():
        assert repo_file(spec["file"]).is_file(), f"config {name}: {spec['file']} missing"


def test_secret_files_are_generated_ignored_by_git_and_accepted_by_their_readers(tmp_path):
    """The secrets are not in git: deploy/gen-secret.sh writes each where compose reads
    it, git ignores them, and their readers accept what the script writes (the agent's
    load_secret; 24+ random characters for the control plane's admin token)."""
    from hycache_agent.transport.auth import load_secret

    rels = {name: PurePosixPath(os.path.normpath(spec["file"])) for name, spec in COMPOSE["secrets"].items()
            if name != "ca_bundle"}  # the build secret: an empty file in git unless HYCACHE_CA_BUNDLE is set
    assert set(rels) == {"hycache_cluster_secret", "hycache_db_password", "hycache_admin_token",
                         "hycache_redis_admin_password", "hycache_redis_agent_password",
                         "hycache_redis_control_password"}
    assert COMPOSE["secrets"]["ca_bundle"]["file"] == "./deploy/no-extra-ca.pem"
    assert (REPO / "deploy" / "no-extra-ca.pem").read_bytes() == b""
    for rel in rels.values():
        assert rel.parts[:2] == ("deploy", "secrets"), rel
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(rel)])
        assert ignored.returncode == 0, f"{rel} is not ignored by git: a generated secret could be committed"
    # run a copy of the script from a fake repository: its default output paths must be
    # the files compose reads
    fake = tmp_path / "repo"
    (fake / "deploy").mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "gen-secret.sh", fake / "deploy" / "gen-secret.sh")
    subprocess.run(["sh", str(fake / "deploy" / "gen-secret.sh")], check=True, capture_output=True)
    values = {}
    for name, rel in rels.items():
        out = fake / rel
        assert out.is_file(), f"gen-secret.sh did not write {rel}"
        assert out.stat().st_mode & 0o777 == 0o600
        values[name] = out.read_text()
        assert len(values[name].strip()) >= 24
    assert len(set(values.values())) == len(rels), "each secret is drawn separately"
    secret = load_secret(fake / rels["hycache_cluster_secret"])
    assert len(secret) >= 32
    subprocess.run(["sh", str(fake / "deploy" / "gen-secret.sh")], check=True, capture_output=True)
    assert load_secret(fake / rels["hycache_cluster_secret"]) == secret, "a second run must keep the existing secret"
    assert all((fake / rel).read_text() == values[n] for n, rel in rels.items())
    for agent in AGENTS:
        bind = next(v for v in HOSTVIEW["services"][agent]["volumes"] if v["type"] == "bind")
        assert subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                               os.path.normpath(bind["source"])]).returncode == 0, \
            f"{agent}: the host mount directory {bind['source']} should be ignored by git"


def test_redis_nodes_have_fixed_unique_addresses_in_the_subnet():
    (net,) = COMPOSE["networks"].values()
    subnet = ipaddress.ip_network(net["ipam"]["config"][0]["subnet"])
    seen = set()
    for name in REDIS:
        nets = SERVICES[name]["networks"]
        assert isinstance(nets, dict), f"{name}: needs a fixed ipv4_address (nodes.conf keeps IPs)"
        (spec,) = nets.values()
        ip = ipaddress.ip_address(spec["ipv4_address"])
        assert ip in subnet and ip not in (subnet.network_address, subnet.broadcast_address), (name, ip)
        assert ip not in seen, f"{name}: {ip} used twice"
        seen.add(ip)


def test_the_subnet_can_be_moved_with_one_variable():
    moved = load_compose(env={"HYCACHE_NET_PREFIX": "10.99.0"})
    (net,) = moved["networks"].values()
    assert net["ipam"]["config"][0]["subnet"] == "10.99.0.0/24"
    assert all(next(iter(moved["services"][n]["networks"].values()))["ipv4_address"].startswith("10.99.0.")
               for n in REDIS)


@pytest.mark.parametrize("name", REDIS)
def test_redis_node(name):
    svc = SERVICES[name]
    argv = redis_server_argv(name)
    files = service_files(name)
    assert argv[0] in files, f"{name}: {argv[0]} is not mounted"
    assert files[as_argv(svc["entrypoint"])[-1]] == REPO / "deploy" / "redis" / "redis-start.sh"
    conf = files[argv[0]].read_text()
    assert re.search(r"^cluster-enabled\s+yes\s*$", conf, re.MULTILINE)
    assert re.search(r"^appendonly\s+yes\s*$", conf, re.MULTILINE)
    data_dir = re.search(r"^dir\s+(\S+)", conf, re.MULTILINE).group(1)
    assert any(v["type"] == "volume" and v["target"] == data_dir for v in volumes_of(name)), \
        f"{name}: redis.conf's dir {data_dir} must be a named volume (nodes.conf, AOF)"
    health = as_argv(svc["healthcheck"]["test"])
    assert health[0] == "CMD-SHELL" and "redis-cli --user hycache-admin" in health[1]
    assert f"-p {redis_conf_port(name)} ping" in health[1]
    # the ACL's passwords: secrets of the service, never in the file itself
    assert {"hycache_redis_admin_password", "hycache_redis_agent_password",
            "hycache_redis_control_password"} <= set(svc["secrets"])


def test_cluster_init_forms_the_cluster_from_every_node():
    svc = SERVICES["redis-cluster-init"]
    entry = as_argv(svc["entrypoint"])
    assert entry[0] == "sh"
    files = service_files("redis-cluster-init")
    assert files[entry[1]] == REPO / "deploy" / "redis" / "cluster-init.sh"
    nodes = as_argv(svc["command"])
    hosts = [n.rsplit(":", 1)[0] for n in nodes]
    assert sorted(hosts) == sorted(REDIS), "the init service must name every redis node once"
    for node in nodes:
        host, port = node.rsplit(":", 1)
        assert int(port) == redis_conf_port(host), f"{node}: {host} listens on {redis_conf_port(host)}"
    replicas = int(svc.get("environment", {}).get("REPLICAS", 1))
    assert len(nodes) >= 3 * (1 + replicas), "Redis Cluster needs 3 masters, each with its replicas"
    assert svc["depends_on"] == {n: {"condition": "service_healthy"} for n in REDIS}
    assert str(svc.get("restart")) == "no"


# --------------------------------------------------------------------------- agents
@pytest.mark.parametrize("name", AGENTS)
def test_agent_command_and_config_are_what_the_agent_accepts(name):
    args, config = effective_agent_config(name)
    svc = SERVICES[name]
    vols = volumes_of(name)
    # ROOT on the agent's own named volume; the mount point in the container's own mount
    # namespace (no bind: a dead FUSE mount must go with its container, or the restart
    # policy cannot bring the agent back), exported to the host only by the opt-in override
    assert any(v["type"] == "volume" and v["target"] == str(args.root) for v in vols), \
        f"{name}: ROOT {args.root} is not a named volume"
    assert not [v for v in vols if v["target"] == str(args.mountpoint)], \
        f"{name}: the mount point {args.mountpoint} is a volume: a crashed agent could not restart over it"
    assert svc.get("restart") == "unless-stopped", f"{name}: a crashed agent must come back by itself"
    view = [v for v in HOSTVIEW["services"][name]["volumes"] if v["target"] == str(args.mountpoint)]
    assert view and view[0]["type"] == "bind", f"{name}: deploy/compose.hostview.yml does not export the mount"
    assert view[0].get("bind", {}).get("propagation") == "rshared", \
        "without rshared the FUSE mount made inside the container never reaches the host"
    # the global namespace: every startup node is a redis service on its port
    assert config.clustered and config.redis is not None
    for host, port in config.redis_nodes:
        assert host in REDIS, f"{name}: --redis names {host}, not a redis service"
        assert port == redis_conf_port(host), f"{name}: {host}:{port}, but redis.conf says {redis_conf_port(host)}"
    assert {h for h, _ in config.redis_nodes} == set(REDIS), f"{name}: give the agent every node"
    # the secret is the compose secret
    secrets = {t: p for t, p in service_files(name).items() if t.startswith("/run/secrets/")}
    assert str(config.cluster_secret_file) in secrets, \
        f"{name}: cluster_secret_file {config.cluster_secret_file} is not a secret of the service"
    # peers reach it by its service name on its listen port
    adv_host, _, adv_port = config.advertise.rpartition(":")
    assert adv_host in (name, svc.get("hostname")), f"{name}: advertises {config.advertise}"
    assert adv_port == config.listen.rpartition(":")[2], f"{name}: advertise and listen ports differ"
    # the healthcheck asks this agent
    health = as_argv(svc["healthcheck"]["test"])
    assert health[:2] == ["CMD", "hycache-agent"], health
    hargs = build_parser().parse_args(health[2:])
    assert hargs.command == "status" and hargs.json
    assert hargs.root == args.root, f"{name}: the healthcheck asks {hargs.root}, the agent's ROOT is {args.root}"
    assert svc["depends_on"].get("redis-cluster-init") == {"condition": "service_completed_successfully"}
    # the control plane: its service and port, and this node's token from the one-shot
    # that makes it, in a volume the agent mounts
    assert config.control_plane is not None, f"{name}: not linked to the control plane"
    url = config.control_plane.removeprefix("http://")
    host, _, port = url.partition(":")
    # through HAProxy, whose backend is the control-plane processes on their port
    assert host == "haproxy" and int(port) == haproxy_port(), f"{name}: --control-plane {url}"
    assert svc["depends_on"].get("haproxy") == {"condition": "service_healthy"}
    token_dir = str(PurePosixPath(str(config.control_token_file)).parent)
    (vol,) = [v for v in vols if v["target"] == token_dir]
    assert vol["type"] == "volume" and vol["source"] == "node-tokens"
    assert PurePosixPath(str(config.control_token_file)).name == config.node_id
    assert config.node_id in as_argv(SERVICES["control-plane-tokens"]["command"]), \
        f"{name}: control-plane-tokens makes no token for node {config.node_id}"
    assert svc["depends_on"].get("control-plane-tokens") == {"condition": "service_completed_successfully"}


def test_agents_have_unique_node_ids_and_ports():
    configs = {name: effective_agent_config(name)[1] for name in AGENTS}
    ids = [c.node_id for c in configs.values()]
    assert all(i is not None for i in ids) and len(set(ids)) == len(ids), ids
    listen = [c.listen.rpartition(":")[2] for c in configs.values()]
    assert len(set(listen)) == len(listen), listen
    advertise = [c.advertise for c in configs.values()]
    assert len(set(advertise)) == len(advertise), advertise


@pytest.mark.parametrize("name", AGENTS)
def test_agent_can_mount_fuse_and_stop_cleanly(name):
    from hycache_agent.mount import SHUTDOWN_GRACE

    svc = SERVICES[name]
    assert svc.get("privileged") or (
        "SYS_ADMIN" in svc.get("cap_add", []) and any(d.split(":")[0] == "/dev/fuse" for d in svc.get("devices", []))
    ), f"{name}: FUSE needs /dev/fuse and CAP_SYS_ADMIN (or privileged)"
    grace = svc.get("stop_grace_period", "10s")
    seconds = int(re.fullmatch(r"(\d+)s", grace).group(1))
    assert seconds > SHUTDOWN_GRACE, f"{name}: the agent may take {SHUTDOWN_GRACE} s after SIGTERM; compose kills at {grace}"
    assert svc.get("init") is True, f"{name}: tini forwards SIGTERM to the agent and reaps children"


# --------------------------------------------------------------------------- Dockerfile
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    lines, out, cur = path.read_text().splitlines(), [], ""
    for line in lines:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def split_flags(rest: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(rest) if not rest.startswith("[") else __import__("json").loads(rest)
    flags = {}
    while words and words[0].startswith("--"):
        k, _, v = words.pop(0)[2:].partition("=")
        flags[k] = v
    return flags, words


class DockerIgnore:
    """Docker's .dockerignore rules: the last matching pattern wins, `!` re-includes, a
    pattern matching a directory covers what is inside it."""

    def __init__(self, path: Path):
        self.rules = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            pat = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            rx = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*") \
                .replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
            self.rules.append((re.compile(rx + r"\Z"), neg))

    def excluded(self, rel: str) -> bool:
        parts = PurePosixPath(rel).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        result = False
        for rx, neg in self.rules:
            if any(rx.match(p) for p in prefixes):
                result = not neg
        return result


DOCKERFILE = REPO / AGENT_DOCKERFILE
DOCKERIGNORE = DockerIgnore(REPO / (AGENT_DOCKERFILE + ".dockerignore"))


def test_dockerignore_matcher():
    ig = DOCKERIGNORE
    assert ig.excluded(".venv/bin/python") and ig.excluded("tests/agent/test_mount.py")
    assert ig.excluded("deploy/secrets/cluster-secret"), "the secret must never enter the build context"
    assert not ig.excluded("agent/src/hycache_agent/cli.py")
    assert ig.excluded("agent/src/hycache_agent/__pycache__/cli.cpython-311.pyc")


def test_dockerfile_copy_sources_exist_and_are_in_the_context():
    copies = 0
    for word, rest in dockerfile_instructions(DOCKERFILE):
        if word not in ("COPY", "ADD"):
            continue
        flags, words = split_flags(rest)
        if "from" in flags:
            continue
        for src in words[:-1]:
            path = repo_file(src)
            assert path.exists(), f"COPY {src}: missing from the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            kept = [p for p in files if not DOCKERIGNORE.excluded(str(p.relative_to(REPO)))]
            assert kept, f"COPY {src}: everything is excluded by the .dockerignore"
            if path.is_file():
                assert kept == files, f"COPY {src}: excluded by the .dockerignore"
            copies += 1
    assert copies >= 5


def test_dockerfile_pins_uv_as_scripts_versions_env_and_runs_the_entrypoint():
    versions = dict(line.split("=", 1) for line in (REPO / "scripts" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    instrs = dockerfile_instructions(DOCKERFILE)
    args = dict(r.split("=", 1) for w, r in instrs if w == "ARG" and "=" in r)
    assert args["UV_VERSION"] == versions["UV_VERSION"]
    # base images are build arguments whose defaults are the official images; compose
    # passes the same defaults (deploy/local-images.sh points them elsewhere in .env)
    assert args["HYCACHE_UV_IMAGE"] == "ghcr.io/astral-sh/uv:${UV_VERSION}"
    assert args["HYCACHE_BASE_IMAGE"] == "debian:bookworm-slim"
    build_args = SERVICES[AGENTS[0]]["build"]["args"]
    assert build_args["HYCACHE_UV_IMAGE"] == f"ghcr.io/astral-sh/uv:{versions['UV_VERSION']}"
    assert build_args["HYCACHE_BASE_IMAGE"] == "debian:bookworm-slim"
    froms = [re.sub(r"\$\{(HYCACHE_\w+)\}", lambda m: args[m.group(1)], r) for w, r in instrs if w == "FROM"]
    assert any(f.startswith("ghcr.io/astral-sh/uv:${UV_VERSION}") for f in froms)
    assert all(":" in f.split()[0] and ":latest" not in f for f in froms), froms
    assert "debian:bookworm-slim" in froms[-1], "the runtime stage is Debian bookworm-slim"
    entry = [r for w, r in instrs if w == "ENTRYPOINT"][-1]
    import json

    entry_path = json.loads(entry)[0]
    copied = {split_flags(r)[1][-1]: split_flags(r)[1][0] for w, r in instrs if w == "COPY"}
    assert copied.get(entry_path) == "deploy/agent-entrypoint.sh"
    script = (REPO / "deploy" / "agent-entrypoint.sh").read_text()
    assert script.rstrip().splitlines()[-1] == 'exec hycache-agent "$@"', \
        "the entry point must exec the agent (PID 1's signals go to the agent)"
    # the runtime stage has the venv where the build stage made it, on PATH
    env_text = " ".join(r for w, r in instrs if w == "ENV")
    venv = re.search(r"UV_PROJECT_ENVIRONMENT=(\S+)", env_text).group(1)
    assert any(w == "COPY" and split_flags(r)[0].get("from") == "build" and split_flags(r)[1] == [venv, venv]
               for w, r in instrs), "the runtime stage must copy the build stage's venv"
    assert f"PATH={venv}/bin:" in env_text


def _uv() -> str | None:
    hint = REPO / ".work" / "uv-path"
    if hint.exists() and os.access(hint.read_text().strip(), os.X_OK):
        return hint.read_text().strip()
    return shutil.which("uv")


def test_dockerfile_build_stage_installs_the_agent(tmp_path):
    """Replay the build stage on the files it copies: its COPY steps (through the
    .dockerignore) into a scratch image root, and its `uv sync` RUN steps with its ENV
    (offline, from uv's cache; bytecode compilation off). Catches a workspace file the
    build needs but does not copy, and a broken lock."""
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not installed (scripts/bootstrap.sh installs it)")
    instrs = dockerfile_instructions(DOCKERFILE)
    stages, cur = [], None
    for w, r in instrs:
        if w == "FROM":
            cur = {"name": r.split()[-1] if " AS " in r.upper() else None, "steps": []}
            stages.append(cur)
        elif cur is not None:
            cur["steps"].append((w, r))
    (build,) = [s for s in stages if s["name"] == "build"]
    root = tmp_path / "image"
    workdir, env = PurePosixPath("/"), {}

    def host(p: str) -> Path:
        pp = PurePosixPath(p) if p.startswith("/") else workdir / p
        return root / str(pp).lstrip("/")

    ran = 0
    for w, r in build["steps"]:
        if w == "WORKDIR":
            workdir = PurePosixPath(r)
            host(r).mkdir(parents=True, exist_ok=True)
        elif w == "ENV":
            for item in shlex.split(r):
                k, _, v = item.partition("=")
                env[k] = v
        elif w == "COPY":
            flags, words = split_flags(r)
            if "from" in flags:
                continue
            *srcs, dest = words
            for src in srcs:
                s = REPO / src
                files = [s] if s.is_file() else sorted(p for p in s.rglob("*") if p.is_file())
                for f in files:
                    rel = str(f.relative_to(REPO))
                    if DOCKERIGNORE.excluded(rel):
                        continue
                    if s.is_file():
                        target = host(dest) / f.name if dest.endswith("/") or len(srcs) > 1 else host(dest)
                    else:
                        target = host(dest) / f.relative_to(s)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, target)
        elif w == "RUN":
            _, words = split_flags(r)
            if words[:1] == ["hycache-ca"]:
                words = words[1:]  # runs the command trusting the optional CA bundle secret
            if "scripts/build-libfuse.sh" in r:
                # libfuse + patched pyfuse3: the same script as bootstrap, with this host's
                # tools directory (built there already) instead of the image's
                tools = Path(os.environ.get("HYCACHE_TOOLS_DIR", Path.home() / ".cache" / "hycache"))
                src = subprocess.run(["bash", str(host("scripts/build-libfuse.sh")), str(tools), _uv()],
                                     capture_output=True, text=True, timeout=600)
                assert src.returncode == 0, f"RUN {r}\n{src.stderr[-2000:]}"
                shutil.copytree(src.stdout.strip(), host(".work/pyfuse3"), symlinks=True)
                continue
            if words[:1] != ["uv"]:
                continue  # apt-get: the image's business
            run_env = dict(os.environ)
            run_env.update(env)
            run_env.update({
                "UV_PROJECT_ENVIRONMENT": str(host(env["UV_PROJECT_ENVIRONMENT"])),
                "UV_PYTHON": sys.executable,      # the image's /usr/bin/python3.11 is not ours
                "UV_COMPILE_BYTECODE": "0",       # speed
                "UV_LINK_MODE": "hardlink",       # speed
                "UV_OFFLINE": "1",
            })
            run_env.pop("VIRTUAL_ENV", None)
            out = subprocess.run([uv, *words[1:]], cwd=host(str(workdir)), env=run_env,
                                 capture_output=True, text=True, timeout=120)
            if out.returncode != 0 and "Network connectivity is disabled" in out.stderr:
                pytest.skip(f"uv's cache lacks a package for the offline replay: {out.stderr.strip()[-300:]}")
            assert out.returncode == 0, f"RUN {r}\n{out.stderr}"
            ran += 1
    assert ran == 2, "expected the two uv sync steps (dependencies, then the workspace)"
    venv = host(env["UV_PROJECT_ENVIRONMENT"])
    agent = venv / "bin" / "hycache-agent"
    assert agent.exists()
    out = subprocess.run([str(agent), "mount", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--cluster-secret-file" in out.stdout
    # non-editable: the packages are in the venv (the runtime stage copies only the venv)
    for pkg in ("hycache_agent", "hycache_dht", "hycache_core"):
        assert list(venv.glob(f"lib/python*/site-packages/{pkg}/__init__.py")), f"{pkg} not installed as a wheel"


# --------------------------------------------------------------------------- docker compose
def test_docker_compose_config():
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed: `docker compose config` not run (static checks above only)")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        why = " ".join((probe.stderr or probe.stdout).split())
        pytest.skip(f"the docker compose plugin is not installed ({why}): "
                    "`docker compose config` not run (static checks above only)")
    secrets = [REPO / spec["file"] for spec in COMPOSE["secrets"].values()]
    made = [s for s in secrets if not s.exists()]
    for secret in made:  # compose wants the files to exist; they are git-ignored
        subprocess.run(["sh", str(REPO / "deploy" / "gen-secret.sh"), str(secret)], check=True, capture_output=True)
    try:
        out = subprocess.run([docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                             capture_output=True, text=True, cwd=REPO)
    finally:
        for secret in made:
            secret.unlink()
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- control plane
def control_plane_argv() -> list[str]:
    return as_argv(SERVICES["control-plane"]["command"])


def control_plane_port() -> int:
    argv = control_plane_argv()
    return int(argv[argv.index("--listen") + 1].rpartition(":")[2])


def haproxy_port() -> int:
    (bind,) = re.findall(r"^\s*bind\s+\S*:(\d+)\s*$", HAPROXY_CFG.read_text(), re.MULTILINE)
    return int(bind)


HAPROXY_CFG = REPO / "deploy" / "haproxy" / "haproxy.cfg"


def test_haproxy_fronts_both_control_plane_processes():
    """HAProxy publishes the control plane (loopback only) and balances the two processes,
    each checked on GET /readyz; the two run the same command on the same database."""
    svc = SERVICES["haproxy"]
    assert svc["build"]["context"] == "./deploy/haproxy" and (REPO / "deploy" / "haproxy" / "Dockerfile").is_file()
    assert svc["ports"] == [f"127.0.0.1:8080:{haproxy_port()}"]  # interpolated: HYCACHE_CONTROL_PORT unset
    assert "ports" not in SERVICES["control-plane"] and "ports" not in SERVICES["control-plane-2"]
    cfg = HAPROXY_CFG.read_text()
    servers = re.findall(r"^\s*server\s+\S+\s+(\S+):(\d+)", cfg, re.MULTILINE)
    assert sorted(servers) == [("control-plane", str(control_plane_port())),
                               ("control-plane-2", str(control_plane_port()))], servers
    assert re.search(r"option httpchk GET /readyz", cfg) and "http-check expect status 200" in cfg
    one, two = SERVICES["control-plane"], SERVICES["control-plane-2"]
    assert as_argv(one["command"]) == as_argv(two["command"]) and one["environment"] == two["environment"]
    assert two["image"] == one["image"] and two["depends_on"] == {"control-plane": {"condition": "service_healthy"}}
    dockerfile = (REPO / "deploy" / "haproxy" / "Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends haproxy" in dockerfile
    assert as_argv(svc["healthcheck"]["test"]) == ["CMD", "hycache-haproxy-health"]
    assert "hycache-haproxy-health" in dockerfile


def test_control_plane_service():
    svc = SERVICES["control-plane"]
    argv = control_plane_argv()
    assert argv[0] == "serve"
    # the agents' Redis Cluster, every node on its port
    seeds = [s.rsplit(":", 1) for s in argv[argv.index("--redis") + 1].split(",")]
    assert sorted(h for h, _ in seeds) == sorted(REDIS)
    assert all(int(p) == redis_conf_port(h) for h, p in seeds)
    agent_ns = {effective_agent_config(a)[1].dht_namespace for a in AGENTS}
    assert agent_ns == {argv[argv.index("--dht-namespace") + 1]}, "the control plane reads the agents' namespace"
    # the admin token and the database password are compose secrets
    files = service_files("control-plane")
    assert argv[argv.index("--admin-token-file") + 1] in files
    env = svc["environment"]
    assert env["HYCACHE_DB_PASSWORD_FILE"] in files
    pg = SERVICES["postgres"]
    assert pg["environment"]["POSTGRES_PASSWORD_FILE"] in service_files("postgres")
    assert service_files("postgres")[pg["environment"]["POSTGRES_PASSWORD_FILE"]] == \
        files[env["HYCACHE_DB_PASSWORD_FILE"]], "the control plane and PostgreSQL share one password"
    assert env["HYCACHE_DB_USER"] == pg["environment"]["POSTGRES_USER"]
    assert env["HYCACHE_DB_NAME"] == pg["environment"]["POSTGRES_DB"]
    assert env["HYCACHE_DB_HOST"] == "postgres"
    assert svc["depends_on"]["postgres"] == {"condition": "service_healthy"}
    # the healthcheck asks its own port; PostgreSQL's asks for its database
    health = " ".join(as_argv(svc["healthcheck"]["test"]))
    assert f"127.0.0.1:{control_plane_port()}/readyz" in health
    assert as_argv(pg["healthcheck"]["test"])[:2] == ["CMD", "pg_isready"]
    assert any(v["type"] == "volume" and v["target"] == "/var/lib/postgresql/data" for v in volumes_of("postgres"))
    # the token one-shot runs the script compose mounts, in the control plane's image
    tok = SERVICES["control-plane-tokens"]
    assert tok["image"] == svc["image"] and str(tok.get("restart")) == "no"
    entry = as_argv(tok["entrypoint"])
    assert service_files("control-plane-tokens")[entry[1]] == REPO / "deploy" / "node-tokens.sh"
    assert tok["depends_on"] == {"control-plane": {"condition": "service_healthy"}}
    assert tok["environment"]["HYCACHE_DB_PASSWORD_FILE"] in service_files("control-plane-tokens")
    assert sorted(as_argv(tok["command"])) == sorted(effective_agent_config(a)[1].node_id for a in AGENTS)


def test_control_plane_command_is_what_hycache_control_accepts():
    cli = pytest.importorskip("hycache_control.cli", reason="hycache-control (backend/) is not installed")
    args = cli.parser().parse_args(control_plane_argv())
    assert args.cmd == "serve"
    tok_argv = ["token", "create", "--scope", "node", "--node-id", "agent-1", "--name", "agent-1"]
    assert cli.parser().parse_args(tok_argv).scope == "node"


def test_node_tokens_script_makes_each_token_once(tmp_path):
    """deploy/node-tokens.sh with a stand-in for the image's entry point (the real one is
    `hycache-control`): one 0600 file per node, kept on a second run."""
    script = (REPO / "deploy" / "node-tokens.sh").read_text()
    entry = "/usr/local/bin/hycache-control-entrypoint"
    assert entry in script
    fake = tmp_path / "entry"
    fake.write_text('#!/bin/sh\necho "tok-$6-$$"\n')  # token create --scope node --node-id ID ...
    fake.chmod(0o755)
    (tmp_path / "node-tokens.sh").write_text(script.replace(entry, str(fake)))
    env = {**os.environ, "TOKEN_DIR": str(tmp_path / "tokens")}
    def run():
        return subprocess.run(["sh", str(tmp_path / "node-tokens.sh"), "agent-1", "agent-2"], env=env,
                                     check=True, capture_output=True, text=True)
    run()
    from hycache_agent.control.link import load_token

    first = {n: load_token(tmp_path / "tokens" / n) for n in ("agent-1", "agent-2")}
    assert first["agent-1"].startswith("tok-agent-1-") and first["agent-2"].startswith("tok-agent-2-")
    run()
    assert {n: load_token(tmp_path / "tokens" / n) for n in first} == first


def test_control_plane_entrypoint_builds_the_database_url(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("a+b/c=d@e\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "hycache-control").write_text('#!/bin/sh\necho "$HYCACHE_CONTROL_DB" "$@"\n')
    (bindir / "hycache-control").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HYCACHE_DB_PASSWORD_FILE": str(pw), "HYCACHE_DB_HOST": "pg"}
    out = subprocess.run(["sh", str(REPO / "deploy" / "control-plane-entrypoint.sh"), "serve", "--x"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["postgresql+psycopg://hycache:a%2Bb%2Fc%3Dd%40e@pg:5432/hycache", "serve", "--x"]
    env["HYCACHE_CONTROL_DB"] = "sqlite:///x.db"  # an explicit URL wins
    out = subprocess.run(["sh", str(REPO / "deploy" / "control-plane-entrypoint.sh")], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["sqlite:///x.db"]


CP_DOCKERFILE = REPO / "deploy" / "control-plane.Dockerfile"


def test_control_plane_dockerfile_copy_sources_are_in_the_context():
    ignore = DockerIgnore(REPO / "deploy" / "control-plane.Dockerfile.dockerignore")
    assert ignore.excluded("deploy/secrets/admin-token") and ignore.excluded(".venv/bin/python")
    instrs = dockerfile_instructions(CP_DOCKERFILE)
    versions = dict(line.split("=", 1) for line in (REPO / "scripts" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    assert dict(r.split("=", 1) for w, r in instrs if w == "ARG" and "=" in r)["UV_VERSION"] == versions["UV_VERSION"]
    # every workspace member's pyproject.toml (uv sync --frozen resolves the whole lock)
    import tomllib

    members = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    copied = [split_flags(r)[1][0] for w, r in instrs if w == "COPY" and "from" not in split_flags(r)[0]]
    for m in members:
        assert f"{m}/pyproject.toml" in copied, f"control-plane.Dockerfile must COPY {m}/pyproject.toml"
    if not (REPO / "backend" / "pyproject.toml").exists():
        pytest.skip("backend/ (hycache-control) is not in this tree yet: COPY sources not checked")
    for src in copied:
        path = repo_file(src)
        assert path.exists(), f"COPY {src}: missing from the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        assert any(not ignore.excluded(str(p.relative_to(REPO))) for p in files), f"COPY {src}: excluded"

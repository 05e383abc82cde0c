"""A real Redis Cluster on loopback: N masters + N*R replicas, one redis-server each.

    hycache-redis-cluster start [--dir DIR] [--base-port 7000] [--masters 3] [--replicas 1]
    hycache-redis-cluster status [--dir DIR]
    hycache-redis-cluster stop [--dir DIR]

Each node gets ``DIR/<port>/`` (redis.conf, nodes.conf, appendonly files, log, pid) and
runs detached (its own session), so ``start`` returns while the cluster keeps running;
``stop`` and ``status`` find the nodes again through ``DIR/cluster.json``. Python API:
:class:`LocalRedisCluster` (tests use it through :mod:`hycache_dht.testing`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

HOST = "127.0.0.1"
BUS_OFFSET = 10000  # Redis Cluster's bus port is the client port + 10000

CONF = """\
port {port}
bind {host}
protected-mode no
daemonize no
dir {dir}
pidfile {dir}/redis.pid
logfile {dir}/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout {node_timeout}
cluster-require-full-coverage no
repl-diskless-sync-delay 0
appendonly yes
appendfsync everysec
save ""
"""


class ClusterError(RuntimeError):
    pass


def redis_server_bin() -> str:
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(exe).exists():
        raise ClusterError("redis-server not found (apt-get install redis-server)")
    return exe


def redis_cli_bin() -> str:
    exe = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    if not Path(exe).exists():
        raise ClusterError("redis-cli not found (apt-get install redis-tools)")
    return exe


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def find_free_base(count: int, start: int = 20000, stop: int = 29000, step: int = 17) -> int:
    """A base port such that base..base+count-1 and their bus ports are all free."""
    base = start + (os.getpid() * 7) % (stop - start)
    for _ in range((stop - start) // step):
        if all(port_free(p) and port_free(p + BUS_OFFSET) for p in range(base, base + count)):
            return base
        base = start + (base - start + step) % (stop - start)
    raise ClusterError("no free port range for a local Redis Cluster")


def _client(port: int, host: str = HOST, timeout: float = 2.0) -> redis.Redis:
    import redis

    return redis.Redis(host=host, port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, decode_responses=True)


def _raw(port: int, *args: str, host: str = HOST, timeout: float = 2.0) -> str:
    """A command's reply as text ('' if the node does not answer)."""
    import redis

    try:
        with _client(port, host, timeout) as r:
            out = r.execute_command(*args)
    except (redis.RedisError, OSError):
        return ""
    return out if isinstance(out, str) else str(out)


def _ping(port: int, host: str = HOST) -> bool:
    return _raw(port, "PING", host=host) in ("True", "PONG")


def _info(port: int, section: str, host: str = HOST) -> dict[str, str]:
    """``INFO section`` or ``CLUSTER INFO`` as a flat dict of strings."""
    import redis

    if section.startswith("cluster"):
        text = _raw(port, *section.split(), host=host)
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        with _client(port, host) as r:
            return {k: str(v) for k, v in r.info(section).items()}
    except (redis.RedisError, OSError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


@dataclass
class NodeStatus:
    port: int
    pid: int | None
    alive: bool
    role: str
    state: str
    master_port: int | None


class LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each, on ``base_port``..."""

    def __init__(self, base_dir: str | Path, base_port: int = 7000, *, masters: int = 3,
                 replicas: int = 1, node_timeout_ms: int = 2000, host: str = HOST) -> None:
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.base_dir = Path(base_dir)
        self.base_port = int(base_port)
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.host = host

    @property
    def ports(self) -> list[int]:
        return list(range(self.base_port, self.base_port + self.masters * (1 + self.replicas)))

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """Startup nodes for a client."""
        return [(self.host, p) for p in self.ports]

    def node_dir(self, port: int) -> Path:
        return self.base_dir / str(port)

    def pid(self, port: int) -> int | None:
        try:
            return int((self.node_dir(port) / "redis.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LocalRedisCluster:
        """Start every node (creating the cluster the first time) and wait until healthy."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "cluster.json").write_text(json.dumps({
            "base_port": self.base_port, "masters": self.masters, "replicas": self.replicas,
            "node_timeout_ms": self.node_timeout_ms, "host": self.host}))
        fresh = not all((self.node_dir(p) / "nodes.conf").exists() for p in self.ports)
        for p in self.ports:
            self.start_node(p)
        if fresh:
            addrs = [f"{self.host}:{p}" for p in self.ports]
            out = subprocess.run(
                [redis_cli_bin(), "--cluster", "create", *addrs, "--cluster-replicas",
                 str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0 or "[OK] All 16384 slots covered" not in out.stdout:
                raise ClusterError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
        self.wait_healthy(timeout)
        return self

    def start_node(self, port: int, timeout: float = 15.0) -> None:
        d = self.node_dir(port)
        d.mkdir(parents=True, exist_ok=True)
        pid = self.pid(port)
        if pid and _pid_alive(pid) and _ping(port, self.host):
            return
        conf = d / "redis.conf"
        conf.write_text(CONF.format(port=port, host=self.host, dir=d,
                                    node_timeout=self.node_timeout_ms))
        subprocess.Popen([redis_server_bin(), str(conf)], cwd=d, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not _ping(port, self.host):
            if time.monotonic() > deadline:
                log = (d / "redis.log").read_text()[-2000:] if (d / "redis.log").exists() else ""
                raise ClusterError(f"redis-server on port {port} did not start\n{log}")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> None:
        """Shut every node down (SIGTERM: the append-only files are flushed)."""
        pids = {p: self.pid(p) for p in self.ports}
        for pid in pids.values():
            if pid and _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for pid in pids.values():
            while pid and _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid and _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)

    def kill_node(self, port: int) -> None:
        """SIGKILL one node (no shutdown, no flush: a crash)."""
        pid = self.pid(port)
        if not pid:
            raise ClusterError(f"no pid for port {port}")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill_master(self, port: int | None = None, *, slot: int | None = None) -> int:
        """SIGKILL a master (the one on ``port``, the one serving ``slot``, or the first);
        returns its port."""
        if port is None:
            masters = [s for s in self.status() if s.alive and s.role == "master"]
            if slot is not None:
                port = self.master_of_slot(slot)
            elif masters:
                port = masters[0].port
            else:
                raise ClusterError("no live master")
        self.kill_node(port)
        return port

    def master_of_slot(self, slot: int) -> int:
        """The port of the live master serving ``slot`` (from CLUSTER NODES)."""
        for p in self.ports:
            if not self._alive(p):
                continue
            for line in _raw(p, "CLUSTER", "NODES", host=self.host).splitlines():
                f = line.split()
                if len(f) < 8 or "master" not in f[2] or "fail" in f[2]:
                    continue
                for rng in f[8:]:
                    if rng.startswith("["):
                        continue  # a slot being migrated
                    lo, _, hi = rng.partition("-")
                    if int(lo) <= slot <= int(hi or lo):
                        return int(f[1].split("@")[0].rsplit(":", 1)[1])
            break
        raise ClusterError(f"no master for slot {slot}")

    def _alive(self, port: int) -> bool:
        pid = self.pid(port)
        return bool(pid and _pid_alive(pid))

    # -- health ---------------------------------------------------------------------------

    def status(self) -> list[NodeStatus]:
        out = []
        for p in self.ports:
            pid = self.pid(p)
            alive = bool(pid and _pid_alive(pid))
            repl = _info(p, "replication", self.host) if alive else {}
            cl = _info(p, "cluster info", self.host) if alive else {}
            mp = repl.get("master_port")
            out.append(NodeStatus(p, pid, alive, repl.get("role", "-"),
                                  cl.get("cluster_state", "-"), int(mp) if mp else None))
        return out

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok, all slots are served, and every master
        that the topology expects to have replicas has them connected."""
        live = [s for s in self.status() if s.alive]
        if not live or any(s.state != "ok" for s in live):
            return False
        masters = [s for s in live if s.role == "master"]
        if len(masters) < self.masters:
            return False
        info = _info(live[0].port, "cluster info", self.host)
        if info.get("cluster_slots_ok") != "16384":
            return False
        for m in masters:
            # a replica counts once its first sync is done (before that it holds no data
            # and cannot be promoted)
            r = _info(m.port, "replication", self.host)
            online = sum(1 for k, v in r.items() if k.startswith("slave") and "online" in v)
            if online < sum(1 for s in live if s.master_port == m.port):
                return False
        for s in live:
            if s.role == "slave" and _info(s.port, "replication", self.host).get(
                    "master_link_status") != "up":
                return False
        return True

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise ClusterError("cluster not healthy in time:\n" + self.describe())
            time.sleep(0.1)

    def wait_failover(self, dead_port: int, timeout: float = 30.0) -> int:
        """Wait until a replica of ``dead_port`` is master and the cluster is ok again;
        returns the new master's port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [s for s in self.status() if s.alive]
            promoted = [s for s in live if s.role == "master" and s.port != dead_port]
            if len(promoted) >= self.masters and all(s.state == "ok" for s in live):
                old = {s.port for s in live if s.master_port == dead_port}
                news = [s.port for s in promoted if s.port not in old]
                if not old:  # no node still follows the dead master
                    return news[-1] if news else promoted[-1].port
            time.sleep(0.1)
        raise ClusterError("no failover in time:\n" + self.describe())

    def describe(self) -> str:
        rows = [f"{'port':>6} {'pid':>8} {'alive':>5} {'role':>7} {'state':>6} master"]
        for s in self.status():
            rows.append(f"{s.port:>6} {s.pid or '-':>8} {str(s.alive):>5} {s.role:>7} "
                        f"{s.state:>6} {s.master_port or ''}")
        return "\n".join(rows)

    @classmethod
    def from_dir(cls, base_dir: str | Path) -> LocalRedisCluster:
        meta = json.loads((Path(base_dir) / "cluster.json").read_text())
        return cls(base_dir, meta["base_port"], masters=meta["masters"],
                   replicas=meta["replicas"], node_timeout_ms=meta["node_timeout_ms"],
                   host=meta["host"])


def default_dir(base_port: int = 7000) -> Path:
    root = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(root) / "hycache" / f"redis-cluster-{base_port}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="hycache-redis-cluster",
        description="Run a local Redis Cluster (real redis-server processes on loopback) "
                    "for HyCache's global namespace.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (("start", "start the nodes (create the cluster the first time)"),
                       ("stop", "shut the nodes down"),
                       ("status", "print each node's role and cluster state")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--base-port", type=int, default=7000,
                       help="first client port (bus ports are +10000; default 7000)")
        p.add_argument("--dir", type=Path, default=None,
                       help="data directory (default $XDG_STATE_HOME/hycache/redis-cluster-PORT)")
        if name == "start":
            p.add_argument("--masters", type=int, default=3)
            p.add_argument("--replicas", type=int, default=1, help="replicas per master")
            p.add_argument("--node-timeout", type=int, default=2000,
                           help="cluster-node-timeout in ms (failover speed; default 2000)")
    a = ap.parse_args(argv)
    d = a.dir or default_dir(a.base_port)
    try:
        if a.cmd == "start":
            c = LocalRedisCluster(d, a.base_port, masters=a.masters, replicas=a.replicas,
                                  node_timeout_ms=a.node_timeout).start()
            print(c.describe())
            print("startup nodes: " + ",".join(f"{h}:{p}" for h, p in c.nodes))
            return 0
        if not (d / "cluster.json").exists():
            print(f"no cluster in {d}", file=sys.stderr)
            return 1
        c = LocalRedisCluster.from_dir(d)
        if a.cmd == "stop":
            c.stop()
            print(f"stopped {len(c.ports)} nodes")
            return 0
        print(c.describe())
        return 0 if c.healthy() else 3
    except ClusterError as e:
        print(f"hycache-redis-cluster: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The whole product on one machine: a local Redis Cluster, the control plane and N real
agents with FUSE mounts, on free loopback ports in one directory.

Used by the dashboard's browser tests (tests/web) and reusable by the demo::

    python -m hycache_control.stack up --dir /tmp/hc --agents 2 --fast-capacity 8M
        # runs until SIGINT/SIGTERM, then stops everything; writes DIR/stack.json
    python -m hycache_control.stack kill-agent --state DIR/stack.json a     # SIGKILL
    python -m hycache_control.stack restart-agent --state DIR/stack.json a  # same argv
    python -m hycache_control.stack stop-control --state DIR/stack.json     # SIGTERM
    python -m hycache_control.stack start-control --state DIR/stack.json    # same argv
    python -m hycache_control.stack down --state DIR/stack.json

The state file (JSON) holds what a client needs: ``base_url``, ``admin_token``,
``read_token``, and per agent its ``mountpoint``, ``root``, ``pid``, ``argv`` (the command
line that restarts it) and ``log``; plus the Redis seeds and the control plane's pid.
As a library: ``with Stack(workdir) as st: st.state[...]`` (or ``start()``/``stop()``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hycache_dht.localcluster import LocalRedisCluster
from hycache_harness import (
    Agent,
    ControlPlane,
    FuseDaemon,
    HarnessError,
    control_cli,
    create_token,
    executable,
    force_unmount,
    free_port,
    kill_pid,
    pid_alive,
    redis_seeds,
    start_redis_cluster,
    stop_pid,
    wait_ready,
    write_secret,
)

HOST = "127.0.0.1"

# a stack's failures are the harness's: a process that did not come up
StackError = HarnessError
__all__ = ["HOST", "AgentInfo", "Stack", "StackError", "force_unmount", "free_port", "kill_agent", "main",
           "restart_agent", "start_agent", "start_control", "stop_control", "stop_state", "wait_ready"]


@dataclass
class AgentInfo:
    node_id: str
    root: Path
    mountpoint: Path
    argv: list[str]
    log: Path
    pid: int | None = None


def start_agent(a: dict, timeout: float = 60.0) -> int:
    """Start an agent from its state entry (argv, mountpoint, log) and wait for its mount."""
    mnt = Path(a["mountpoint"])
    force_unmount(mnt)  # a killed agent leaves a dead mount behind
    daemon = FuseDaemon(f"agent {a['node_id']}", a["argv"], mnt, Path(a["log"]), cwd=Path(a["root"]).parent,
                        append_log=True)
    daemon.start(timeout)
    assert daemon.pid is not None
    return daemon.pid


class Stack:
    """Redis Cluster + control plane + ``agents`` agents under ``workdir``."""

    def __init__(self, workdir: str | Path | None = None, *, agents: int = 2, fast_capacity: str = "8M",
                 redis_seeds: list[tuple[str, int]] | None = None, namespace: str | None = None,
                 heartbeat_interval: float = 1.0, state_file: str | Path | None = None,
                 agent_args: list[str] | None = None, passthrough: str = "off") -> None:
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="hycache-stack-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        self.n_agents = agents
        self.fast_capacity = fast_capacity
        self.external_redis = redis_seeds
        self.namespace = namespace or f"stack-{secrets.token_hex(4)}"
        self.heartbeat_interval = heartbeat_interval
        self.state_file = Path(state_file) if state_file else self.workdir / "stack.json"
        # Without passthrough (the stack's default) the agents count every byte they serve;
        # with it the kernel moves the bytes and an agent counts the reads only where it can
        # trace the kernel's (agent fs/kreads.py) and the writes as the files' growth.
        self.agent_args = ["--passthrough", passthrough, *(agent_args or [])]
        self.redis: LocalRedisCluster | None = None
        self.state: dict = {}

    # ------------------------------------------------------------------ start
    def start(self) -> dict:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.state

    def _start(self) -> None:
        w = self.workdir
        if self.external_redis:
            seeds = self.external_redis
        else:
            self.redis = start_redis_cluster(w / "redis")
            seeds = self.redis.nodes
        seeds_s = redis_seeds(seeds, None)
        control = executable("hycache-control")
        cp_dir = w / "control"
        cp_dir.mkdir(exist_ok=True)
        db = f"sqlite:///{cp_dir / 'control.db'}"
        control_cli("db", "upgrade", "--db", db, "--dev", binary=control, cwd=cp_dir)

        def token(scope: str, name: str, node: str | None = None) -> str:
            return create_token(db, scope, name, node, "--dev", binary=control, cwd=cp_dir)

        cp = ControlPlane("--dev", "--redis", seeds_s, "--dht-namespace", self.namespace, "--heartbeat-interval",
                          str(self.heartbeat_interval), db=db, host=HOST, log=cp_dir / "control.log", binary=control,
                          cwd=cp_dir)
        self.state = {
            "workdir": str(w), "base_url": cp.url, "admin_token": token("admin", "stack-admin"),
            "read_token": token("read", "stack-read"), "namespace": self.namespace,
            "redis": [f"{h}:{p}" for h, p in seeds], "redis_dir": str(w / "redis") if self.redis else None,
            "control": {"pid": None, "argv": cp.argv, "log": str(cp.log), "db": db},
            "agents": {},
        }
        try:
            cp.start()
        finally:
            self.state["control"]["pid"] = cp.pid
            self._save()
        secret = write_secret(w / "cluster-secret", secrets.token_hex(24))
        for i in range(self.n_agents):
            node = chr(ord("a") + i)
            self._start_agent(node, seeds_s, secret, cp.url, token("node", f"node-{node}", node))

    def _start_agent(self, node: str, seeds: str, secret: Path, base_url: str, node_token: str) -> None:
        base = self.workdir / f"node-{node}"
        root = base / "root"
        root.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        tok = write_secret(base / "control-token", node_token)
        agent = Agent(root, node, *self.agent_args, mountpoint=base / "mnt", log=base / "agent.log", redis=seeds,
                      secret=secret, namespace=self.namespace, listen=f"{HOST}:{free_port()}", log_level=None,
                      agent_bin=executable("hycache-agent"), cwd=base, append_log=True,
                      fast_capacity=self.fast_capacity, control_plane=base_url, control_token_file=tok)
        entry: dict[str, Any] = {"node_id": node, "root": str(root), "mountpoint": str(agent.mnt), "argv": agent.argv,
                 "log": str(agent.logfile), "pid": None}
        self.state["agents"][node] = entry
        entry["pid"] = start_agent(entry)
        self._save()

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds tokens
        with os.fdopen(fd, "w") as f:
            json.dump(self.state, f, indent=2)
        os.replace(tmp, self.state_file)

    def reload(self) -> dict:
        """Re-read the state file (another process may have restarted an agent)."""
        if self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())
        return self.state

    # ------------------------------------------------------------------ agents
    def kill_agent(self, node: str) -> None:
        kill_agent(self.state_file, node)
        self.reload()

    def restart_agent(self, node: str) -> None:
        restart_agent(self.state_file, node)
        self.reload()

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Stop the agents (unmounted), the control plane and Redis. Idempotent."""
        self.reload()
        stop_state(self.state)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _load(state_file: str | Path) -> dict:
    return json.loads(Path(state_file).read_text())


def _save_to(state_file: str | Path, state: dict) -> None:
    p = Path(state_file)
    tmp = p.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, p)


def kill_agent(state_file: str | Path, node: str) -> None:
    """SIGKILL an agent (its mount stays, dead, until restart_agent or stop)."""
    kill_pid(_load(state_file)["agents"][node]["pid"])


def restart_agent(state_file: str | Path, node: str) -> None:
    """Start an agent again with its own command line (after kill_agent or a crash)."""
    st = _load(state_file)
    a = st["agents"][node]
    stop_pid(a["pid"], 30, Path(a["mountpoint"]))
    a["pid"] = start_agent(a)
    _save_to(state_file, st)


def stop_control(state_file: str | Path) -> None:
    """Stop the control plane (the agents keep serving their mounts)."""
    stop_pid(_load(state_file)["control"]["pid"], 15)


def start_control(state_file: str | Path, timeout: float = 60.0) -> None:
    """Start the control plane again with its own command line; wait until it is ready."""
    st = _load(state_file)
    saved = st["control"]
    if pid_alive(saved["pid"]):
        return
    log = Path(saved["log"])
    cp = ControlPlane(argv=saved["argv"], log=log, cwd=log.parent, host=HOST, port=urlsplit(st["base_url"]).port)
    try:
        cp.start(timeout)
    finally:
        saved["pid"] = cp.pid
        _save_to(state_file, st)


def stop_state(st: dict) -> None:
    for a in (st.get("agents") or {}).values():
        stop_pid(a.get("pid"), 30, Path(a["mountpoint"]))
        force_unmount(Path(a["mountpoint"]))
    stop_pid((st.get("control") or {}).get("pid"), 15)


# ---------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hycache_control.stack",
                                 description="Redis Cluster + control plane + agents on loopback (tests, demo)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start everything, write the state file, run until SIGINT/SIGTERM")
    up.add_argument("--dir", help="working directory (default: a new temp dir)")
    up.add_argument("--state", help="state file (default DIR/stack.json)")
    up.add_argument("--agents", type=int, default=2, help="number of agents (default 2)")
    up.add_argument("--fast-capacity", default="8M", help="each agent's fast tier (default 8M)")
    for name, hlp in (("kill-agent", "SIGKILL an agent"), ("restart-agent", "start a stopped agent again")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("--state", required=True, help="the state file written by up")
        p.add_argument("node", help="node id (a, b, …)")
    for name, hlp in (("stop-control", "stop the control plane (SIGTERM)"),
                      ("start-control", "start the control plane again and wait until ready")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("--state", required=True, help="the state file written by up")
    down = sub.add_parser("down", help="stop what a state file describes (agents, control plane)")
    down.add_argument("--state", required=True)
    args = ap.parse_args(argv)

    if args.cmd == "up":
        if args.agents < 1 or args.agents > 26:
            ap.error("--agents: must be between 1 and 26")
        stack = Stack(args.dir, agents=args.agents, fast_capacity=args.fast_capacity, state_file=args.state)
        stopping = {"sig": None}

        def on_signal(signum, _frame):
            stopping["sig"] = signum

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            stack.start()
            print(json.dumps({"state_file": str(stack.state_file), "base_url": stack.state["base_url"]}), flush=True)
            while stopping["sig"] is None:
                time.sleep(0.2)
        finally:
            stack.stop()
        return 0
    if args.cmd == "kill-agent":
        kill_agent(args.state, args.node)
    elif args.cmd == "restart-agent":
        restart_agent(args.state, args.node)
    elif args.cmd == "stop-control":
        stop_control(args.state)
    elif args.cmd == "start-control":
        start_control(args.state)
    elif args.cmd == "down":
        st = _load(args.state)
        stop_state(st)
        if st.get("redis_dir"):
            LocalRedisCluster.from_dir(st["redis_dir"]).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hycache_dht.localcluster import LocalRedisCluster, find_free_base

HOST = "127.0.0.1"
BIN = Path(sys.executable).parent


def _bin(name: str) -> str:
    p = BIN / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found next to {sys.executable} nor on PATH (run scripts/bootstrap.sh)")
    return found


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _in_mount_table(mountpoint: Path) -> bool:
    target = os.fsencode(os.path.abspath(mountpoint))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(len(fields) > 4 and fields[4].replace(b"\\040", b" ") == target
                   for fields in (line.split(b" ") for line in f))


def force_unmount(mountpoint: Path) -> None:
    """Lazy-unmount a FUSE mount whatever state its daemon is in (a killed agent's too)."""
    if _in_mount_table(mountpoint):
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
    if _in_mount_table(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stop_pid(pid: int | None, timeout: float, mountpoint: Path | None = None) -> None:
    """SIGTERM, wait; unmount lazily (ends a daemon stuck on its mount); SIGKILL."""
    if not _pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if _pid_alive(pid):
        if mountpoint is not None:
            force_unmount(mountpoint)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(100):
            _reap(pid)
            if not _pid_alive(pid):
                break
            time.sleep(0.1)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


def wait_ready(base_url: str, alive: Callable[[], bool], log: Path | None = None, timeout: float = 60.0,
               path: str = "/readyz") -> None:
    """Wait until the control plane at ``base_url`` answers ``path`` with 200; raise
    :class:`StackError` (with the tail of ``log``) when ``alive()`` turns false first or
    ``timeout`` seconds pass.  Used by the stack, the benchmarks and the tests that start
    a server of their own."""
    deadline = time.monotonic() + timeout
    last = ""
    tail = (lambda: "\n" + _tail(log)) if log is not None else (lambda: "")
    while time.monotonic() < deadline:
        if not alive():
            raise StackError(f"the control plane exited{tail()}")
        try:
            with urllib.request.urlopen(base_url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    raise StackError(f"the control plane did not answer {path} within {timeout:.0f} s ({last}){tail()}")


def _spawn(argv: list[str], log: Path, cwd: Path) -> int:
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)
    return proc.pid


def _write_secret(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path


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
    pid = _spawn(a["argv"], Path(a["log"]), Path(a["root"]).parent)
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        if not _pid_alive(pid):
            raise StackError(f"agent {a['node_id']} exited before mounting\n{_tail(Path(a['log']))}")
        if time.monotonic() > deadline:
            _stop_pid(pid, 10, mnt)
            raise StackError(f"agent {a['node_id']} did not mount within {timeout:.0f} s\n{_tail(Path(a['log']))}")
        time.sleep(0.05)
    return pid


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
        # The dashboard's throughput charts need the agents to see reads and writes; with
        # kernel passthrough the kernel moves the bytes and an agent counts only opens
        # (hits, misses), so the stack runs its agents without it unless asked.
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
            self.redis = LocalRedisCluster(w / "redis", find_free_base(6))
            self.redis.start()
            seeds = self.redis.nodes
        seeds_s = ",".join(f"{h}:{p}" for h, p in seeds)
        control = _bin("hycache-control")
        cp_dir = w / "control"
        cp_dir.mkdir(exist_ok=True)
        db = f"sqlite:///{cp_dir / 'control.db'}"
        common = ["--db", db, "--dev"]
        subprocess.run([control, "db", "upgrade", *common], check=True, capture_output=True, cwd=cp_dir)

        def token(scope: str, name: str, node: str | None = None) -> str:
            argv = [control, "token", "create", *common, "--scope", scope, "--name", name]
            if node:
                argv += ["--node-id", node]
            r = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=cp_dir)
            return r.stdout.strip().splitlines()[-1]

        admin = token("admin", "stack-admin")
        read = token("read", "stack-read")
        port = free_port()
        base_url = f"http://{HOST}:{port}"
        cp_argv = [control, "serve", *common, "--listen", f"{HOST}:{port}", "--redis", seeds_s,
                   "--dht-namespace", self.namespace, "--heartbeat-interval", str(self.heartbeat_interval)]
        cp_log = cp_dir / "control.log"
        self.state = {
            "workdir": str(w), "base_url": base_url, "admin_token": admin, "read_token": read,
            "namespace": self.namespace, "redis": [f"{h}:{p}" for h, p in seeds],
            "redis_dir": str(w / "redis") if self.redis else None,
            "control": {"pid": None, "argv": cp_argv, "log": str(cp_log), "db": db},
            "agents": {},
        }
        self.state["control"]["pid"] = _spawn(cp_argv, cp_log, cp_dir)
        self._save()
        self._wait_ready(base_url, cp_log)

        secret = _write_secret(w / "cluster-secret", secrets.token_hex(24))
        agent = _bin("hycache-agent")
        for i in range(self.n_agents):
            node = chr(ord("a") + i)
            base = w / f"node-{node}"
            root, mnt = base / "root", base / "mnt"
            root.mkdir(parents=True, exist_ok=True)
            mnt.mkdir(parents=True, exist_ok=True)
            base.chmod(0o755)
            tok = _write_secret(base / "control-token", token("node", f"node-{node}", node))
            argv = [agent, "mount", str(root), str(mnt), "--fast-capacity", self.fast_capacity,
                    "--redis", seeds_s, "--dht-namespace", self.namespace, "--node-id", node,
                    "--listen", f"{HOST}:{free_port()}", "--cluster-secret-file", str(secret),
                    "--control-plane", base_url, "--control-token-file", str(tok), *self.agent_args]
            entry = {"node_id": node, "root": str(root), "mountpoint": str(mnt), "argv": argv,
                     "log": str(base / "agent.log"), "pid": None}
            self.state["agents"][node] = entry
            entry["pid"] = start_agent(entry)
            self._save()

    def _wait_ready(self, base_url: str, log: Path, timeout: float = 60.0) -> None:
        wait_ready(base_url, lambda: _pid_alive(self.state["control"]["pid"]), log, timeout)

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
    st = _load(state_file)
    pid = st["agents"][node]["pid"]
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            _reap(pid)
            if not _pid_alive(pid):
                break
            time.sleep(0.05)


def restart_agent(state_file: str | Path, node: str) -> None:
    """Start an agent again with its own command line (after kill_agent or a crash)."""
    st = _load(state_file)
    a = st["agents"][node]
    if _pid_alive(a["pid"]):
        _stop_pid(a["pid"], 30, Path(a["mountpoint"]))
    a["pid"] = start_agent(a)
    _save_to(state_file, st)


def stop_control(state_file: str | Path) -> None:
    """Stop the control plane (the agents keep serving their mounts)."""
    st = _load(state_file)
    _stop_pid(st["control"]["pid"], 15)


def start_control(state_file: str | Path, timeout: float = 60.0) -> None:
    """Start the control plane again with its own command line; wait until it is ready."""
    st = _load(state_file)
    cp = st["control"]
    if _pid_alive(cp["pid"]):
        return
    log = Path(cp["log"])
    cp["pid"] = _spawn(cp["argv"], log, log.parent)
    _save_to(state_file, st)
    wait_ready(st["base_url"], lambda: _pid_alive(cp["pid"]), log, timeout)


def stop_state(st: dict) -> None:
    for a in (st.get("agents") or {}).values():
        _stop_pid(a.get("pid"), 30, Path(a["mountpoint"]))
        force_unmount(Path(a["mountpoint"]))
    cp = st.get("control") or {}
    _stop_pid(cp.get("pid"), 15)


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

"""Running FUSE daemons and never leaving their mounts behind (standard library only).

Shared by the test fixtures (``tests/conftest.py``, which loads it by path) and the
benchmarks (``bench/fs_bench.py``, ``cluster_bench.py``, ``hccache_bench.py``): they run
FUSE daemons (hycache-agent, mergerfs, pyfuse3's examples) in the foreground as child
processes. ``FuseDaemon`` starts one and waits for its mount; ``Agent`` is the one
launcher of ``hycache-agent mount`` (standalone or joined to a Redis Cluster).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def is_mounted(mountpoint: Path) -> bool:
    try:
        return os.path.ismount(mountpoint)
    except OSError:  # ENOTCONN on a dead FUSE mount still means "mounted"
        return True


def in_mount_table(mountpoint: Path) -> bool:
    target = os.fsencode(os.path.abspath(mountpoint))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(len(fields) > 4 and fields[4].replace(b"\\040", b" ") == target
                   for fields in (line.split(b" ") for line in f))


def force_unmount(mountpoint: Path) -> None:
    """Lazy-unmount a FUSE mount whatever state its daemon is in."""
    # Ask the mount table, not stat(): a dead FUSE mount answers stat() with ENOTCONN,
    # which os.path.ismount() reports as "not a mount point".
    if in_mount_table(mountpoint):
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
    if in_mount_table(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def stop_daemon(proc: subprocess.Popen, mountpoint: Path | None, timeout: float) -> int:
    """SIGTERM a running FUSE daemon and wait ``timeout`` s for it to exit; if it does
    not, lazy-unmount ``mountpoint`` (that ends a daemon stuck on its mount), wait 10 s
    more, then SIGKILL. Returns its exit code. The mount may still need ``force_unmount``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if mountpoint is not None:
                force_unmount(mountpoint)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode


# ----------------------------------------------------------------------------- launchers
REPO = Path(__file__).resolve().parent.parent
AGENT_BIN = REPO / ".venv" / "bin" / "hycache-agent"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for an agent's --listen)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class FuseDaemon:
    """A FUSE daemon run in the foreground as a child process until ``stop()``.

    ``argv`` must mount ``mountpoint`` and stay in the foreground; its output goes to
    ``logfile``. ``start()`` waits until the mount is up (or raises ``RuntimeError`` with
    the log's tail). The daemon runs in its own session, so a terminal's Ctrl-C reaches
    only the caller, which then stops it in order. ``unmount_to_stop``: stop it with
    ``fusermount3 -u`` (for daemons that exit cleanly on unmount but not on SIGTERM,
    e.g. pyfuse3's examples) instead of SIGTERM."""

    def __init__(self, name: str, argv: list[str], mountpoint: Path, logfile: Path, *,
                 unmount_to_stop: bool = False, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.mountpoint, self.logfile = name, list(argv), Path(mountpoint), Path(logfile)
        self.unmount_to_stop, self.env = unmount_to_stop, env
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> FuseDaemon:
        import time

        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before mounting "
                                   f"{self.mountpoint}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not mount {self.mountpoint} within {timeout:.0f} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.05)
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """Stop the daemon and make sure nothing stays mounted; returns its exit code."""
        if self.proc is None:
            return None
        if self.unmount_to_stop and self.proc.poll() is None and in_mount_table(self.mountpoint):
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        rc = stop_daemon(self.proc, self.mountpoint, timeout=timeout)
        force_unmount(self.mountpoint)
        return rc


class Agent(FuseDaemon):
    """``hycache-agent mount ROOT ROOT/mnt`` (tiers in ROOT/fast and ROOT/slow), standalone
    or, with ``redis``, joined to a Redis Cluster as node ``name`` (its peer service on a
    free loopback port, authenticated by ``secret``, keys under ``namespace``). ``extra``:
    more ``mount`` options. The log is ROOT/agent.log."""

    def __init__(self, root: Path, name: str, *extra: str, redis: str | None = None,
                 secret: Path | None = None, namespace: str | None = None,
                 log_level: str = "WARNING", agent_bin: Path | str = AGENT_BIN) -> None:
        self.root = Path(root)
        self.mnt = self.root / "mnt"
        self.agent_bin = str(agent_bin)
        argv = [self.agent_bin, "mount", str(self.root), str(self.mnt), "--log-level", log_level]
        if redis:
            if secret is None:
                raise ValueError("Agent: a cluster agent needs secret= (the cluster secret file)")
            argv += ["--redis", redis, "--node-id", name, "--listen", f"127.0.0.1:{free_port()}",
                     "--cluster-secret-file", str(secret),
                     "--dht-namespace", namespace or f"bench-{os.getpid()}"]
        argv += list(extra)
        super().__init__(name, argv, self.mnt, self.root / "agent.log")

    def status(self) -> dict:
        """``hycache-agent status ROOT --json``."""
        import json

        out = subprocess.run([self.agent_bin, "status", str(self.root), "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"hycache-agent status {self.root} failed ({out.returncode}): "
                               f"{out.stderr.strip()[-500:]}")
        return json.loads(out.stdout)

    def backlog(self) -> int:
        """Entries in the agent's outbox not yet published to the DHT (0 standalone)."""
        cluster = self.status().get("cluster")
        return int(cluster["backlog"]) if cluster else 0

    def wait_published(self, timeout: float = 300.0, poll: float = 0.05) -> float:
        """Wait until the outbox is empty; returns the seconds waited."""
        import time

        t0 = time.perf_counter()
        while self.backlog():
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{self.name}: the outbox did not drain within {timeout:.0f} s")
            time.sleep(poll)
        return time.perf_counter() - t0

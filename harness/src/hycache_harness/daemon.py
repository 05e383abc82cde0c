"""The one launcher of ``hycache-agent mount`` (and of any FUSE daemon run in the
foreground): start it, wait for its mount, stop it with a clean unmount."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from .mounts import force_unmount, in_mount_table, is_mounted
from .net import free_port
from .procs import HarnessError, executable, log_tail, spawn, stop_daemon


class FuseDaemon:
    """A FUSE daemon run in the foreground as a child process until ``stop()``.

    ``argv`` must mount ``mountpoint`` and stay in the foreground; its output goes to
    ``logfile`` (appended to with ``append_log``, else truncated). ``start()`` waits until
    the mount is up, or raises :class:`HarnessError` with the command line and the log's
    tail. The daemon runs in its own session, so a terminal's Ctrl-C reaches only the
    caller, which then stops it in order. ``unmount_to_stop``: stop it with
    ``fusermount3 -u`` (for daemons that exit cleanly on unmount but not on SIGTERM, e.g.
    pyfuse3's examples) instead of SIGTERM."""

    def __init__(self, name: str, argv: list[str], mountpoint: Path, logfile: Path, *,
                 unmount_to_stop: bool = False, env: dict[str, str] | None = None, cwd: Path | None = None,
                 append_log: bool = False) -> None:
        self.name, self.argv, self.mountpoint, self.logfile = name, list(argv), Path(mountpoint), Path(logfile)
        self.unmount_to_stop, self.env, self.cwd, self.append_log = unmount_to_stop, env, cwd, append_log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 30.0) -> Self:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc = spawn(self.argv, self.logfile, self.cwd, self.env, append=self.append_log)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise HarnessError(self._failure(f"exited with {self.proc.returncode} before mounting"))
            if time.monotonic() > deadline:
                self.stop()
                raise HarnessError(self._failure(f"did not mount {self.mountpoint} within {timeout:.0f} s"))
            time.sleep(0.05)
        return self

    def _failure(self, what: str) -> str:
        return (f"{self.name} {what}\nargv: {' '.join(self.argv)}\n"
                f"--- {self.name} output ---\n{log_tail(self.logfile)}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0, *, check: bool = False) -> int | None:
        """Stop the daemon and make sure nothing stays mounted; returns its exit code.
        ``check``: raise :class:`HarnessError` unless it exited 0 and left no mount."""
        if self.proc is None:
            return None
        if self.unmount_to_stop and self.proc.poll() is None and in_mount_table(self.mountpoint):
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        rc = stop_daemon(self.proc, self.mountpoint, timeout=timeout)
        still_mounted = in_mount_table(self.mountpoint)
        force_unmount(self.mountpoint)
        if check and (rc != 0 or still_mounted):
            raise HarnessError(self._failure(f"exited with {rc} on SIGTERM"
                                             + (f", leaving {self.mountpoint} mounted" if still_mounted else "")))
        return rc


def opts_to_argv(opts: Mapping[str, object]) -> list[str]:
    """Keyword options as flags: ``log_level="debug"`` -> ``--log-level debug``; ``True`` ->
    the bare flag; ``None`` and ``False`` -> nothing."""
    argv: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


class Agent(FuseDaemon):
    """``hycache-agent mount ROOT MOUNTPOINT`` (tiers in ROOT/fast and ROOT/slow unless
    ``fast=``/``slow=`` say otherwise), standalone or, with ``redis``, joined to a Redis
    Cluster as node ``name`` (its peer service on ``listen``, a free loopback port by
    default, authenticated by ``secret``, keys under ``namespace``).

    ``mountpoint`` defaults to ROOT/mnt and ``log`` to ROOT/agent.log. ``extra``: more
    ``mount`` arguments as they are; ``opts``: more as keywords (:func:`opts_to_argv`).
    ``agent_bin``: the command that runs the agent (a path, or a list such as
    ``[sys.executable, "-m", "hycache_agent.cli"]``); ``wrapper``: a command prefix that
    execs it (``nsenter --net=...``), keeping the mount namespace."""

    def __init__(self, root: Path, name: str = "hycache-agent", *extra: str, mountpoint: Path | None = None,
                 log: Path | None = None, redis: str | None = None, secret: Path | None = None,
                 namespace: str | None = None, listen: str | None = None, log_level: str | None = "WARNING",
                 agent_bin: Path | str | list[str] | None = None, wrapper: list[str] | None = None,
                 cwd: Path | None = None, env: dict[str, str] | None = None, append_log: bool = False,
                 **opts: object) -> None:
        self.root = Path(root)
        self.mnt = Path(mountpoint) if mountpoint is not None else self.root / "mnt"
        if agent_bin is None:
            agent_bin = executable("hycache-agent")
        self.agent_cmd = [str(a) for a in agent_bin] if isinstance(agent_bin, list) else [str(agent_bin)]
        self.agent_bin = self.agent_cmd[0] if len(self.agent_cmd) == 1 else " ".join(self.agent_cmd)
        argv = [*(wrapper or []), *self.agent_cmd, "mount", str(self.root), str(self.mnt)]
        if log_level is not None:
            argv += ["--log-level", log_level]
        if redis:
            if secret is None:
                raise ValueError("Agent: a cluster agent needs secret= (the cluster secret file)")
            argv += ["--redis", redis, "--node-id", name, "--listen", listen or f"127.0.0.1:{free_port()}",
                     "--cluster-secret-file", str(secret),
                     "--dht-namespace", namespace or f"bench-{os.getpid()}"]
        argv += [*extra, *opts_to_argv(opts)]
        super().__init__(name, argv, self.mnt, Path(log) if log is not None else self.root / "agent.log",
                         env=env, cwd=cwd, append_log=append_log)

    def start(self, timeout: float = 30.0) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        return super().start(timeout)

    def cli(self, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
        """``hycache-agent ARGS`` with the same agent command."""
        return subprocess.run([*self.agent_cmd, *args], check=check, text=True,
                              capture_output=capture)

    def status(self) -> dict[str, Any]:
        """``hycache-agent status ROOT --json``."""
        out = self.cli("status", str(self.root), "--json", check=False)
        if out.returncode != 0:
            raise HarnessError(f"hycache-agent status {self.root} failed ({out.returncode}): "
                               f"{out.stderr.strip()[-500:]}")
        status: dict[str, Any] = json.loads(out.stdout)
        return status

    def backlog(self) -> int:
        """Entries in the agent's outbox not yet published to the DHT (0 standalone)."""
        cluster = self.status().get("cluster")
        return int(cluster["backlog"]) if cluster else 0

    def wait_published(self, timeout: float = 300.0, poll: float = 0.05) -> float:
        """Wait until the outbox is empty; returns the seconds waited."""
        t0 = time.perf_counter()
        while self.backlog():
            if time.perf_counter() - t0 > timeout:
                raise HarnessError(f"{self.name}: the outbox did not drain within {timeout:.0f} s")
            time.sleep(poll)
        return time.perf_counter() - t0

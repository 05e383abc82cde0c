"""The one launcher of ``hycache-control serve``, and the control plane's CLI for the
database and tokens a launcher needs first."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .net import free_port
from .procs import HarnessError, executable, log_tail, spawn, stop_daemon


def wait_ready(base_url: str, alive: Callable[[], bool], log: Path | None = None, timeout: float = 60.0,
               path: str = "/readyz") -> None:
    """Wait until the control plane at ``base_url`` answers ``path`` with 200; raise
    :class:`HarnessError` (with the tail of ``log``) when ``alive()`` turns false first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last = ""

    def tail() -> str:
        return "\n" + log_tail(log, 40) if log is not None else ""

    while time.monotonic() < deadline:
        if not alive():
            raise HarnessError(f"the control plane exited{tail()}")
        try:
            with urllib.request.urlopen(base_url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    raise HarnessError(f"the control plane did not answer {path} within {timeout:.0f} s ({last}){tail()}")


def control_cli(*args: str, binary: str | None = None, cwd: Path | None = None) -> str:
    """``hycache-control ARGS``; returns its stdout (raises CalledProcessError on failure)."""
    return subprocess.run([binary or executable("hycache-control"), *args], check=True, capture_output=True,
                          text=True, cwd=cwd).stdout


def create_token(db: str, scope: str, name: str | None = None, node_id: str | None = None, *extra: str,
                 binary: str | None = None, cwd: Path | None = None) -> str:
    """A new token made by ``hycache-control token create`` (its secret, the last line
    printed); ``name`` defaults to the CLI's (the scope, or the node id)."""
    argv = ["token", "create", "--db", db, *extra, "--scope", scope]
    if name:
        argv += ["--name", name]
    if node_id:
        argv += ["--node-id", node_id]
    return control_cli(*argv, binary=binary, cwd=cwd).strip().splitlines()[-1]


class ControlPlane:
    """``hycache-control serve --db DB --listen HOST:PORT [--state-dir DIR] ARGS`` as a child
    process in its own session, its output in ``log``; ``start()`` waits until ``ready_path``
    answers 200 (or raises :class:`HarnessError` with the log's tail), ``stop()`` SIGTERMs it.
    ``argv``: a whole command line to run instead (a restart with the one saved before)."""

    def __init__(self, *args: str, db: str | None = None, log: Path, port: int | None = None,
                 host: str = "127.0.0.1", state_dir: Path | str | None = None, binary: str | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None, append_log: bool = True,
                 ready_path: str = "/readyz", argv: list[str] | None = None) -> None:
        self.host, self.port = host, port or free_port()
        if argv is None:
            if db is None:
                raise ValueError("ControlPlane: db= or argv= is needed")
            argv = [binary or executable("hycache-control"), "serve", "--db", db, "--listen", f"{host}:{self.port}"]
            if state_dir is not None:
                argv += ["--state-dir", str(state_dir)]
            argv += list(args)
        self.argv, self.log, self.env, self.cwd = list(argv), Path(log), env, cwd
        self.append_log, self.ready_path = append_log, ready_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> ControlPlane:
        self.proc = spawn(self.argv, self.log, self.cwd, self.env, append=self.append_log)
        try:
            wait_ready(self.url, self.alive, self.log, timeout, self.ready_path)
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log, lines)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout`` s); returns the exit code."""
        if self.proc is None:
            return None
        return stop_daemon(self.proc, None, timeout)

    def __enter__(self) -> ControlPlane:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

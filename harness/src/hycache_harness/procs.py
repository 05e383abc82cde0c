"""Child processes by handle or by pid: start one in its own session with its output in a
log, stop it (SIGTERM, a lazy unmount for a FUSE daemon stuck on its mount, SIGKILL)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .mounts import force_unmount


class HarnessError(RuntimeError):
    """A process the harness started did not come up."""


def executable(name: str) -> str:
    """The console script ``name`` of the running interpreter's environment, else the one on PATH."""
    p = Path(sys.executable).parent / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if not found:
        raise HarnessError(f"{name} not found next to {sys.executable} nor on PATH (run scripts/bootstrap.sh)")
    return found


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return "\n".join(text[-lines:]) or "<empty>"


def spawn(argv: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None,
          *, append: bool = True) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (a terminal's Ctrl-C reaches only the caller, which
    then stops it in order), stdin closed, stdout and stderr into ``log``."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=cwd, env=env, start_new_session=True)


def stop_daemon(proc: subprocess.Popen[bytes], mountpoint: Path | None, timeout: float) -> int:
    """SIGTERM a running daemon and wait ``timeout`` s for it to exit; if it does not,
    lazy-unmount ``mountpoint`` (that ends a FUSE daemon stuck on its mount), wait 10 s
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


# ---------------------------------------------------------------- by pid (another process started it)
def pid_alive(pid: int | None) -> bool:
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


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal_and_wait(pid: int, sig: int, wait: float, poll: float) -> None:
    """Send ``sig`` to ``pid`` and wait up to ``wait`` seconds for it to be gone."""
    os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while pid_alive(pid) and time.monotonic() < deadline:
        reap(pid)
        time.sleep(poll)


def kill_pid(pid: int | None, wait: float = 5.0) -> None:
    """SIGKILL ``pid`` and wait until it is gone."""
    if not pid_alive(pid):
        return
    assert pid is not None
    _signal_and_wait(pid, signal.SIGKILL, wait, 0.05)


def stop_pid(pid: int | None, timeout: float, mountpoint: Path | None = None) -> None:
    """SIGTERM, wait; unmount lazily (ends a daemon stuck on its mount); SIGKILL."""
    if not pid_alive(pid):
        return
    assert pid is not None
    _signal_and_wait(pid, signal.SIGTERM, timeout, 0.1)
    if pid_alive(pid):
        if mountpoint is not None:
            force_unmount(mountpoint)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(100):
            reap(pid)
            if not pid_alive(pid):
                break
            time.sleep(0.1)


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` (and a newline) to a file only its owner can read (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return Path(path)


_OPEN_LOOP = ("import os, sys, time\n"
              "end = time.monotonic() + float(sys.argv[2])\n"
              "os.close(os.open(sys.argv[1], os.O_RDONLY))\n"
              "print('storming', flush=True)\n"
              "while time.monotonic() < end:\n"
              "    os.close(os.open(sys.argv[1], os.O_RDONLY))\n")


def open_storm(path: Path, seconds: float, processes: int = 2) -> list[subprocess.Popen[bytes]]:
    """``processes`` processes that open and close ``path`` without a pause for ``seconds``:
    a stream of requests a FUSE mount answers (wait for them to end: ``p.wait()``).  It
    returns once every one of them has opened the file (an interpreter's start can take
    longer than a test's pause on a loaded machine: the storm would begin late)."""
    storm = [subprocess.Popen([sys.executable, "-c", _OPEN_LOOP, str(path), str(seconds)],
                              stdout=subprocess.PIPE)
             for _ in range(processes)]
    for p in storm:
        assert p.stdout is not None
        line = p.stdout.readline()
        p.stdout.close()
        if line != b"storming\n":
            raise RuntimeError(f"a storm process ended before its first open of {path} ({p.wait()})")
    return storm

"""Helpers for the agent's mount, model and crash tests.

The mount machinery (starting ``hycache-agent mount``, waiting for the mount, SIGTERM and
lazy-unmount teardown) is the one of ``tests/conftest.py``, which hands its starter to the
fixtures here as the session fixture ``start_mount``; the rest comes from the harness.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from hycache_agent.control import local as control
from hycache_harness import executable, fuse_unusable_reason, is_mounted, log_tail, shared_tmpdir
from hycache_harness import wait_for as _wait_for

AGENT_BIN = executable("hycache-agent")
FUSE_REASON = fuse_unusable_reason()
make_shared_tmpdir = shared_tmpdir


def tail(path: Path, n: int = 60) -> str:
    return log_tail(path, n)




def require_fuse() -> None:
    if FUSE_REASON is not None:
        pytest.skip(f"FUSE unusable: {FUSE_REASON}")


# --------------------------------------------------------------------------- CLI
def cli(*args, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``hycache-agent ARGS`` (bytes or str arguments); text output."""
    argv = [os.fsencode(str(AGENT_BIN))] + [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    p = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                       env={**os.environ, "COLUMNS": "200"})
    p.stdout, p.stderr = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if check:
        assert p.returncode == 0, f"hycache-agent {args} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


# --------------------------------------------------------------------------- agent state
def status(m) -> dict:
    return control.request(m.root / "state", {"op": "status"})


def info(path) -> dict:
    return json.loads(os.getxattr(path, "user.hycache.info"))


def wait_idle(m, timeout: float = 60.0) -> dict:
    """Wait until the agent runs no migration (twice in a row, 50 ms apart)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while True:
        st = status(m)
        quiet = quiet + 1 if not st["migrations"]["active"] else 0
        if quiet >= 2:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"agent still migrating after {timeout} s: {st['migrations']['active']}")
        time.sleep(0.05)


def wait_for(pred, timeout: float = 30.0, what: str = "condition", interval: float = 0.02):
    """The harness's ``wait_for``, polling every 20 ms: an agent's state changes fast."""
    return _wait_for(pred, timeout, what, interval)


def recovery_reports(log_text: str) -> list[dict]:
    """The recovery dicts the agent logged at each start ("... recovery {...}"), oldest first."""
    return [ast.literal_eval(m.group(1)) for m in re.finditer(r"recovery (\{[^}]*\})", log_text)]


def tier_blobs(tier_dir: Path) -> dict[str, int]:
    """Every file under <tier>/data: path -> size."""
    out = {}
    data = tier_dir / "data"
    if not data.is_dir():
        return out
    for shard in os.scandir(data):
        for entry in os.scandir(shard.path):
            try:
                out[entry.path] = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:  # removed or recycled (renamed) meanwhile
                continue
    return out


def check_tiers_from_outside(m, attempts: int = 5, subtree: Path | None = None) -> int:
    """The tier invariants as seen from outside the agent, once it is idle: every regular
    file under the mount has exactly one blob, on the tier it reports, with its size;
    no temp file and no blob without a file remains.  Returns the number of files.

    ``subtree``: check only the files below it (and no temp file anywhere); blobs of
    files elsewhere are not reported as orphans."""
    last = None
    for _ in range(attempts):
        st = wait_idle(m)
        problems = []
        blobs = {**tier_blobs(m.fast), **tier_blobs(m.slow)}
        claimed = set()
        n = 0
        for dirpath, _dirnames, filenames in os.walk(os.fsencode(subtree or m.mountpoint)):
            for name in filenames:
                p = os.path.join(dirpath, name)
                st_ = os.lstat(p)
                if not (st_.st_mode & 0o170000 == 0o100000):
                    continue
                n += 1
                i = info(p)
                blob = i["blob"]
                claimed.add(blob)
                if i["tier"] not in ("fast", "slow"):
                    problems.append(f"{p!r}: tier {i['tier']!r}")
                elif blob not in blobs:
                    problems.append(f"{p!r}: blob {blob} missing")
                elif blobs[blob] != st_.st_size:
                    problems.append(f"{p!r}: blob size {blobs[blob]} != st_size {st_.st_size}")
                other = (m.slow if i["tier"] == "fast" else m.fast) / "data" / Path(blob).parent.name / Path(blob).name
                if str(other) in blobs:
                    problems.append(f"{p!r}: a second blob {other}")
                    claimed.add(str(other))
        for b in blobs:
            if b.endswith(".migrating"):
                problems.append(f"temp file {b} left while idle")
            elif b not in claimed and st["open_handles"] == 0 and subtree is None:
                if blobs[b] == 0 and Path(b).is_relative_to(m.fast):
                    continue  # the agent may keep empty blobs ready for future creates
                problems.append(f"blob {b} ({blobs[b]} bytes) belongs to no file")
        if not problems and not status(m)["migrations"]["active"]:
            return n
        last = problems
        time.sleep(0.2)
    raise AssertionError("tier invariants violated:\n  " + "\n  ".join(last or ["agent kept migrating"]))


# --------------------------------------------------------------------------- fixtures
def stop_mount(m, base: Path | None = None) -> int:
    rc = m.unmount()
    if base is not None and not is_mounted(m.mountpoint):
        shutil.rmtree(base, ignore_errors=True)
    return rc


@pytest.fixture(scope="module")
def shared_mount(start_mount):
    """One agent (1 MiB fast tier) for a whole test module; it must exit 0 at the end."""
    require_fuse()
    base = make_shared_tmpdir("hycache-agent-tests-")
    m = start_mount(base, "1M")
    yield m
    died = m.proc.poll() is not None
    rc = m.unmount()
    log = tail(m.log)
    still = is_mounted(m.mountpoint)
    if not still:
        shutil.rmtree(base, ignore_errors=True)
    assert not died, f"the shared agent died during the module (exit {rc})\n{log}"
    assert rc == 0 and not still, f"the shared agent exited {rc} on SIGTERM (mounted: {still})\n{log}"


@pytest.fixture
def fresh_dir(shared_mount, request):
    """A new directory under the shared mount for one test."""
    d = shared_mount.mountpoint / request.node.name.replace("[", "_").replace("]", "").replace("/", "_")
    d.mkdir()
    return d


@pytest.fixture
def tmpfs_dir():
    """A small tmpfs (8 MiB), unmounted at teardown."""
    require_fuse()
    d = make_shared_tmpdir("hycache-tmpfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield d
    for _ in range(50):
        r = subprocess.run(["umount", str(d)], capture_output=True, text=True)
        if r.returncode == 0:
            break
        time.sleep(0.1)
    else:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
    os.rmdir(d)


@contextlib.contextmanager
def commits_held(m):
    """SQLite's write lock on m's metadata store while the block runs: the agent's commits
    wait (and fail, and retry), so only the redo log keeps what the block changes."""
    db = sqlite3.connect(m.root / "state" / "meta.db", isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def kill_agent(m) -> None:
    """SIGKILL the agent, then lazily detach its dead mount."""
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(timeout=30)
    m._stopped = True
    r = subprocess.run(["fusermount3", "-uz", str(m.mountpoint)], capture_output=True, text=True)
    assert r.returncode == 0 or not is_mounted(m.mountpoint), r.stderr
    wait_for(lambda: not is_mounted(m.mountpoint), 10, "the dead mount to go away")


class Agents:
    """Starts agents, restarts them on the same root after a crash, and stops every one
    at teardown (each that the test did not kill itself must exit 0 on SIGTERM)."""

    def __init__(self, start_mount) -> None:
        self.start_mount = start_mount  # tests/conftest.py's start_hycache_mount
        self.started: list = []
        self.bases: list[Path] = []

    def start(self, fast_capacity="1G", **opts):
        base = make_shared_tmpdir("hycache-agent-crash-")
        self.bases.append(base)
        m = self.start_mount(base, fast_capacity, **opts)
        self.started.append(m)
        return m

    def restart(self, m, **extra_opts):
        """A new agent on m's root and mount point (m must be stopped or killed)."""
        assert m._stopped or m.proc.poll() is not None
        opts = {k: v for k, v in m.opts.items() if k != "fast_capacity"}
        opts.update(extra_opts)
        m2 = self.start_mount(m.base, m.fast_capacity, **opts)
        self.started.append(m2)
        return m2

    def close(self) -> list[str]:
        problems = []
        for m in reversed(self.started):
            killed_by_test = m._stopped
            died = not m._stopped and m.proc.poll() is not None
            rc = m.unmount()
            if died:
                problems.append(f"agent for {m.mountpoint} died during the test (exit {rc})\n{tail(m.log)}")
            elif not killed_by_test and rc != 0:
                problems.append(f"agent for {m.mountpoint} exited {rc} on SIGTERM\n{tail(m.log)}")
        for base in self.bases:
            if not is_mounted(base / "mnt"):
                shutil.rmtree(base, ignore_errors=True)
            else:
                problems.append(f"{base / 'mnt'} is still mounted after teardown")
        return problems


@pytest.fixture
def agents(start_mount):
    require_fuse()
    a = Agents(start_mount)
    yield a
    problems = a.close()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


ENOSPC = errno.ENOSPC

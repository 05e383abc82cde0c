"""Shared pytest fixtures for the whole test tree.

``hycache_mount`` starts the real agent (``hycache-agent mount``, with the harness's
launcher, :class:`hycache_harness.Agent`) on temporary directories and tears it down
afterwards::

    @pytest.mark.mount
    def test_something(hycache_mount):
        m = hycache_mount(fast_capacity="1M", log_level="debug")
        (m.mountpoint / "f").write_text("hi")
        assert (m.fast / "f").exists() or (m.slow / "f").exists()

Contract with the agent (``hycache-agent mount ROOT MOUNTPOINT [--fast-capacity SIZE]
[--log-level LEVEL] [--fast DIR --slow DIR]``): it runs in the foreground, the mount is
ready when ``os.path.ismount(MOUNTPOINT)``, and SIGTERM (or ``fusermount3 -u``) unmounts
it and the process exits 0.

Mount tests are marked ``@pytest.mark.mount``; they are skipped (with the reason) only
when /dev/fuse cannot be used on this machine.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hycache_harness import (
    Agent,
    HarnessError,
    executable,
    force_unmount,
    fuse_unusable_reason,
    is_mounted,
    log_tail,
    opts_to_argv,
    shared_tmpdir,
)

REPO = Path(__file__).resolve().parent.parent
AGENT_BIN = Path(executable("hycache-agent"))

# the real local Redis Cluster fixtures (redis_cluster, dht_namespace) for every test dir
pytest_plugins = ["hycache_dht.testing"]

MOUNT_TIMEOUT = float(os.environ.get("HYCACHE_MOUNT_TIMEOUT", "30"))
UNMOUNT_TIMEOUT = float(os.environ.get("HYCACHE_UNMOUNT_TIMEOUT", "30"))


# --------------------------------------------------------------------------- FUSE probe
_FUSE_REASON = fuse_unusable_reason()


# `--passthrough on|off|auto`: the agent's kernel FUSE passthrough mode for every mount the
# tests start (unset: the agent's default, auto). scripts/test.sh runs the mount suites
# once as they are (passthrough on where the host allows it) and a subset with it off.
_PASSTHROUGH: str | None = None
_FUSE_URING: str | None = None


def pytest_addoption(parser):
    parser.addoption("--passthrough", choices=("auto", "on", "off"), default=None,
                     help="hycache-agent --passthrough for the mounts the tests start")
    parser.addoption("--fuse-uring", choices=("auto", "on", "off"), default=None,
                     help="hycache-agent --fuse-uring for the mounts the tests start")


def pytest_configure(config):
    global _PASSTHROUGH, _FUSE_URING
    _PASSTHROUGH = config.getoption("--passthrough")
    _FUSE_URING = config.getoption("--fuse-uring")


def pytest_collection_modifyitems(config, items):
    if _FUSE_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"FUSE unusable: {_FUSE_REASON}")
    for item in items:
        if "mount" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------- helpers
def _tail(path: Path, n: int = 60) -> str:
    return log_tail(path, n)


def make_shared_tmpdir(prefix: str) -> Path:
    """A temp dir that every user can traverse (pytest's tmp_path is 0700 root-only,
    which would hide a mount from other users, e.g. pjdfstest's dummy users)."""
    return shared_tmpdir(prefix)


@dataclass
class HyCacheMount:
    """One agent the tests started: its tiers, mount point and process (``agent``, the
    harness's launcher, holds the command line and the log)."""
    root: Path
    fast: Path
    slow: Path
    agent: Agent
    base: Path | None = None
    fast_capacity: str | int | None = None
    opts: dict = field(default_factory=dict)
    wrapper: list[str] | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def mountpoint(self) -> Path:
        return self.agent.mountpoint

    @property
    def proc(self):
        return self.agent.proc

    @property
    def log(self) -> Path:
        return self.agent.logfile

    @property
    def argv(self) -> list[str]:
        return self.agent.argv

    @property
    def stderr(self) -> str:
        """Everything the agent wrote to stdout/stderr so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def unmount(self) -> int:
        """SIGTERM the agent, wait; lazy-unmount as a last resort. Returns its exit code
        (-9 if it had to be killed). Idempotent."""
        if self._stopped:
            return self.proc.returncode
        self._stopped = True
        return self.agent.stop(UNMOUNT_TIMEOUT)

    def __enter__(self) -> HyCacheMount:
        return self

    def __exit__(self, *exc) -> None:
        self.unmount()


def start_hycache_mount(base: Path, fast_capacity: str | int | None = "1G", *,
                        separate_tiers: bool = False, timeout: float = MOUNT_TIMEOUT,
                        wrapper: list[str] | None = None, **opts) -> HyCacheMount:
    """Start ``hycache-agent mount BASE/root BASE/mnt`` and wait until it is mounted.

    ``opts`` become flags: ``log_level="debug"`` -> ``--log-level debug``;
    ``True`` -> bare flag; ``None``/``False`` -> omitted.
    ``separate_tiers=True`` passes ``--fast DIR --slow DIR`` explicitly.
    ``wrapper`` is a command prefix for the agent, e.g. ``["nsenter", "--net=/run/netns/h1"]``
    to run it in another network namespace (``tests/hosts``); it must exec the agent (so
    that signals reach it) and keep the mount namespace, so the mount stays visible here.
    """
    root, mountpoint = base / "root", base / "mnt"
    fast, slow = root / "fast", root / "slow"
    if separate_tiers:
        fast, slow = base / "fast-tier", base / "slow-tier"
        fast.mkdir(mode=0o755, exist_ok=True)
        slow.mkdir(mode=0o755, exist_ok=True)
        opts = {"fast": fast, "slow": slow, **opts}
    root.mkdir(mode=0o755, exist_ok=True)
    mountpoint.mkdir(mode=0o755, exist_ok=True)
    if fast_capacity is not None:
        opts = {"fast_capacity": fast_capacity, **opts}
    if _PASSTHROUGH is not None and "passthrough" not in opts:
        opts = {**opts, "passthrough": _PASSTHROUGH}
    if _FUSE_URING is not None and "fuse_uring" not in opts:
        opts = {**opts, "fuse_uring": _FUSE_URING}
    agent = Agent(root, "hycache-agent", *opts_to_argv(opts), mountpoint=mountpoint, log=base / "agent.log",
                  log_level=None, agent_bin=AGENT_BIN, wrapper=wrapper, cwd=base, append_log=True)
    m = HyCacheMount(root=root, fast=fast, slow=slow, agent=agent, base=base, fast_capacity=fast_capacity,
                     opts=dict(opts), wrapper=wrapper)
    try:
        agent.start(timeout)
    except HarnessError as e:
        m._stopped = True
        pytest.fail(str(e), pytrace=False)
    return m


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def start_mount():
    """``start_hycache_mount`` for fixtures and tests that own their agent's lifetime (a
    module's shared mount, a crash test's restarts): they get it from here, not by importing
    this file."""
    return start_hycache_mount


@pytest.fixture
def hycache_mount():
    """Factory: ``hycache_mount(fast_capacity="1G", wrapper=None, **opts) -> HyCacheMount``.

    Each call starts one agent on fresh temp dirs (world-traversable, on the same file
    system as /tmp). ``hycache_mount.remount(m)`` stops ``m`` (asserting exit 0) and
    starts a new agent on the same root, mount point, options and wrapper (restart/recovery
    tests).
    At teardown every mount is stopped with SIGTERM (then ``fusermount3 -uz`` as a last
    resort) and the test fails unless the agent exited 0.
    """
    if _FUSE_REASON is not None:
        pytest.skip(f"FUSE unusable: {_FUSE_REASON}")
    started: list[tuple[HyCacheMount, Path]] = []

    def factory(fast_capacity: str | int | None = "1G", *, wrapper: list[str] | None = None,
                **opts) -> HyCacheMount:
        base = make_shared_tmpdir("hycache-mnt-")
        m = start_hycache_mount(base, fast_capacity, wrapper=wrapper, **opts)
        started.append((m, base))
        return m

    def remount(m: HyCacheMount, *, after_kill: bool = False) -> HyCacheMount:
        """Restart the agent on the same root.  ``after_kill``: the test killed it on
        purpose (SIGKILL); the dead mount is lazily unmounted instead of expecting exit 0."""
        if after_kill:
            m._stopped = True
            m.killed_on_purpose = True
            force_unmount(m.mountpoint)
        else:
            rc = m.unmount()
            assert rc == 0, f"agent exited {rc} on SIGTERM before the remount\n{_tail(m.log)}"
        opts = {k: v for k, v in m.opts.items() if k != "fast_capacity"}
        m2 = start_hycache_mount(m.base, m.fast_capacity, wrapper=m.wrapper, **opts)
        started.append((m2, m.base))
        return m2

    factory.remount = remount
    yield factory

    problems = []
    seen_bases = set()
    for m, base in reversed(started):
        was_killed = not m._stopped and m.proc.poll() is not None
        rc = m.unmount()
        if getattr(m, "killed_on_purpose", False):
            pass
        elif was_killed:
            problems.append(f"agent for {m.mountpoint} died during the test (exit {rc})\n{_tail(m.log)}")
        elif rc != 0:
            problems.append(f"agent for {m.mountpoint} exited {rc} on SIGTERM\n{_tail(m.log)}")
        if is_mounted(m.mountpoint):
            problems.append(f"{m.mountpoint} is still mounted after teardown")
            seen_bases.add(base)  # keep it: never rmtree through a live mount
    for _m, base in started:
        if base not in seen_bases:
            seen_bases.add(base)
            shutil.rmtree(base, ignore_errors=True)
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def shared_tmp_path():
    """Like tmp_path, but traversable by every user (mode 0755) and removed afterwards."""
    d = make_shared_tmpdir("hycache-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pytest_report_header(config):
    return [f"fuse: {'usable' if _FUSE_REASON is None else 'UNUSABLE: ' + _FUSE_REASON}",
            f"agent passthrough: {_PASSTHROUGH or 'agent default (auto)'}",
            f"agent fuse io_uring: {_FUSE_URING or 'agent default (auto)'}",
            f"python: {sys.executable}"]

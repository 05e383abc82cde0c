"""The agent grows its descriptor table once, at start-up (mount.py ``_reserve_fd_table``).

A process with threads that outgrows its descriptor table waits for an RCU grace period
in the open(2) that grew it (4-16 ms: the ~105th cold small remote file of a pass,
docs/archive/benchmarks-history.md "The cold small-file tail").  The agent reserves the slots it may use
before it serves anything, so no later open pays for a growth.
"""

from __future__ import annotations

import re
from pathlib import Path

from hycache_agent.fs.passthrough import MAX_PARKED
from hycache_agent.mount import FD_TABLE_RESERVE

from .conftest import status


def _status_field(pid: int, name: str) -> int:
    m = re.search(rf"^{name}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m, f"no {name} in /proc/{pid}/status"
    return int(m.group(1))


def _soft_nofile(pid: int) -> int | None:
    m = re.search(r"^Max open files\s+(\S+)", Path(f"/proc/{pid}/limits").read_text(), re.M)
    assert m, f"no 'Max open files' in /proc/{pid}/limits"
    return None if m.group(1) == "unlimited" else int(m.group(1))


def test_the_descriptor_table_is_reserved_before_the_first_request(hycache_mount):
    m = hycache_mount()
    pid = m.proc.pid
    soft = _soft_nofile(pid)
    want = FD_TABLE_RESERVE if soft is None else min(soft, FD_TABLE_RESERVE)
    # the table holds at least the reserved slots, though the agent uses a few dozen
    assert _status_field(pid, "FDSize") >= want
    open_fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    assert open_fds < want // 2, f"{open_fds} descriptors open: the reserve must not hold any"
    # and files work through the mount as before
    (m.mountpoint / "f").write_bytes(b"x" * 1000)
    assert (m.mountpoint / "f").read_bytes() == b"x" * 1000


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(hycache_mount):
    """Started with a shell's soft limit (1024), the agent raises it to the hard limit
    (mount.py ``_raise_fd_limit``), and sizes what it keeps open from the raised one: a
    quarter of it in parked passthrough registrations (fs/passthrough.py)."""
    hard = 4096
    m = hycache_mount(wrapper=["prlimit", f"--nofile=1024:{hard}"])
    assert _soft_nofile(m.proc.pid) == hard
    st = status(m)
    if st["passthrough"]["enabled"]:
        assert st["passthrough"]["parked_max"] == min(MAX_PARKED, hard // 4)
    # the reserve follows the raised limit too
    assert _status_field(m.proc.pid, "FDSize") >= min(hard, FD_TABLE_RESERVE)
    (m.mountpoint / "f").write_bytes(b"y" * 10)
    assert (m.mountpoint / "f").read_bytes() == b"y" * 10

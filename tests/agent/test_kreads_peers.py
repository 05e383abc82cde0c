"""Agents on one host leave each other's reads out of their kernel read counts
(fs/kreads.py, ``KernelReads._untrace_peers``).

Tests, benches and a demo cluster run several agents on one machine and one device: each
agent's pushes, peer reads, moves and metadata reads are reads of that device, and every
other agent's tracer parsed them (the replica bench's sync row lost 0.62 -> 0.71x of its
no-replica writes to it).  At start an agent lists its threads in every other agent's
tracefs instance (``set_event_notrace_pid``) and theirs in its own; ``event-fork`` on
both sides adds the threads each starts later.  Checked here on the kernel's own lists.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hycache_agent.fs.kreads import PREFIX, TRACEFS

from .conftest import status


def _instance(pid: int) -> Path:
    found = sorted((TRACEFS / "instances").glob(f"{PREFIX}{pid}-*"))
    assert len(found) == 1, f"agent {pid}: instances {found}"
    return found[0]


def _notrace(inst: Path) -> set[int]:
    return {int(x) for x in (inst / "set_event_notrace_pid").read_text().split()}


def _tids(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.mount
def test_two_agents_leave_each_others_threads_out_of_their_traces(agents):
    a = agents.start("256M")
    counting = status(a)["counters"]["counting"]
    if not counting["kernel_reads"]["active"]:
        pytest.skip(f"no kernel read counts here: {counting['kernel_reads']['reason']}")
    b = agents.start("256M")  # the later agent does both sides
    ia, ib = _instance(a.proc.pid), _instance(b.proc.pid)
    # each agent's own threads, and the other's, as the kernel lists them
    assert _tids(a.proc.pid) <= _notrace(ia)
    assert _tids(b.proc.pid) <= _notrace(ib)
    assert _tids(b.proc.pid) & _notrace(ia), "b's threads missing from a's trace exclusions"
    assert _tids(a.proc.pid) & _notrace(ib), "a's threads missing from b's trace exclusions"
    # threads b starts from now on (worker threads for its files' I/O) are left out of a's
    # trace too: the kernel adds them on fork (event-fork)
    before = _tids(b.proc.pid)
    for i in range(64):
        (b.mountpoint / f"f{i}").write_bytes(os.urandom(64 << 10))
    for i in range(64):
        assert len((b.mountpoint / f"f{i}").read_bytes()) == 64 << 10
    now = _tids(b.proc.pid)
    assert now <= _notrace(ia), f"b's threads {sorted(now - _notrace(ia))} (new: {sorted(now - before)}) traced by a"
    # and the exclusion is the other agents', not everybody's: this test's process is traced
    assert os.getpid() not in _notrace(ia) and os.getpid() not in _notrace(ib)

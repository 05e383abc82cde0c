"""Per-tier bytes with kernel FUSE passthrough (the default): the kernel reads and writes
the blobs itself, so the agent counts writes as the files' growth (seen when it fstat()s
the blob) and reads from the kernel's filemap trace point (fs/kreads.py)."""

from __future__ import annotations

import os
import time

import pytest

from .conftest import cli, status, wait_idle

MiB = 1 << 20
N = 16  # MiB written, then read twice


def _counters_when(m, done, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    c = status(m)["counters"]
    while not done(c) and time.monotonic() < deadline:
        time.sleep(0.3)
        c = status(m)["counters"]
    return c


@pytest.mark.mount
def test_passthrough_reads_and_writes_are_counted_per_tier(agents):
    m = agents.start("256M")
    st = status(m)
    if not st["passthrough"]["enabled"]:
        pytest.skip(f"no FUSE passthrough here: {st['passthrough']['reason']}")
    counting = st["counters"]["counting"]
    assert counting["passthrough"] is True and counting["writes"] == "growth"
    if counting["reads"] != "traced":
        pytest.skip(f"no kernel read counts here: {counting['kernel_reads']['reason']}")
    before = st["counters"]["fast"]

    chunk = os.urandom(MiB)
    path = m.mountpoint / "big"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for _ in range(N):
            assert os.write(fd, chunk) == MiB
    finally:
        os.close(fd)
    assert os.stat(path).st_size == N * MiB
    for _ in range(2):  # the second read is served from the page cache: it counts too
        with open(path, "rb", buffering=0) as f:
            got = 0
            while b := f.read(MiB):
                got += len(b)
        assert got == N * MiB

    c = _counters_when(m, lambda c: c["fast"]["kernel_read_bytes"] - before["kernel_read_bytes"] >= 2 * N * MiB
                       and c["fast"]["grown_bytes"] - before["grown_bytes"] >= N * MiB)
    fast, slow = c["fast"], c["slow"]
    grown = fast["grown_bytes"] - before["grown_bytes"]
    kread = fast["kernel_read_bytes"] - before["kernel_read_bytes"]
    assert grown == N * MiB, c  # the file grew by exactly what was written
    assert fast["write_bytes"] - before["write_bytes"] == N * MiB, c  # the agent served none of it
    # whole pages asked of the page cache, by this test's reads only (the agent's own are
    # left out); a little more only if another reader touched the blob meanwhile
    assert 2 * N * MiB <= kread <= 2 * N * MiB + MiB, c
    assert fast["read_bytes"] - before["read_bytes"] == kread, c
    assert slow["kernel_read_bytes"] == 0 and slow["grown_bytes"] == 0, c
    assert c["counting"]["kernel_reads"]["active"] is True

    # evicted to the slow tier, then read from there (the promotion waits for the close)
    cli("demote", path, check=True)
    wait_idle(m)
    before = _counters_when(m, lambda c: True)
    assert before["evicted_bytes"] - c["evicted_bytes"] == N * MiB, before
    with open(path, "rb", buffering=0) as f:
        while f.read(MiB):
            pass
    after = _counters_when(m, lambda c: c["slow"]["kernel_read_bytes"] - before["slow"]["kernel_read_bytes"] >= N * MiB
                           and c["promoted_bytes"] - before["promoted_bytes"] >= N * MiB)
    assert N * MiB <= after["slow"]["kernel_read_bytes"] - before["slow"]["kernel_read_bytes"] <= N * MiB + MiB, after
    assert after["fast"]["kernel_read_bytes"] == before["fast"]["kernel_read_bytes"], after  # (the copy is the agent's)
    assert after["promoted_bytes"] - before["promoted_bytes"] == N * MiB, after  # promoted after the close


@pytest.mark.mount
def test_without_kernel_read_counts_the_page_says_so(agents):
    m = agents.start("64M", no_kernel_read_counts=True)
    st = status(m)
    if not st["passthrough"]["enabled"]:
        pytest.skip(f"no FUSE passthrough here: {st['passthrough']['reason']}")
    counting = st["counters"]["counting"]
    assert counting == {"passthrough": True, "reads": "none", "writes": "growth",
                        "kernel_reads": {"active": False, "reason": counting["kernel_reads"]["reason"],
                                         "other_bytes": 0, "lost_events": 0}}
    (m.mountpoint / "f").write_bytes(b"x" * 8192)
    assert (m.mountpoint / "f").read_bytes() == b"x" * 8192
    c = _counters_when(m, lambda c: c["fast"]["grown_bytes"] >= 8192)
    assert c["fast"]["grown_bytes"] == 8192 and c["fast"]["kernel_read_bytes"] == 0, c

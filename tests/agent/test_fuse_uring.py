"""FUSE over io_uring (pyfuse3 patched here, ``hycache_uring.h``; the agent's
``--fuse-uring``): requests come from a ring per CPU queue instead of ``read(2)`` on
``/dev/fuse``; the answer table answers what it can on the ring's thread, the rest is handed
to the event loop, whose replies go back through the request's own ring entry.

Each test checks the transport's counters (``status`` -> ``request_loop.fuse_uring``) so
that what it exercised did go through the rings, and what the files hold through the mount
and on the tiers.  Skipped where the kernel has no fuse io_uring (before Linux 6.14).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import status, wait_for

URING_PARAMETER = Path("/sys/module/fuse/parameters/enable_uring")

pytestmark = pytest.mark.skipif(not URING_PARAMETER.exists(),
                                reason="this kernel's fuse has no io_uring (Linux 6.14 and later)")


def uring(m) -> dict:
    u = status(m)["request_loop"]["fuse_uring"]
    assert u is not None, "pyfuse3 without io_uring (scripts/bootstrap.sh builds passthrough28)"
    return u


def uring_mount(hycache_mount, **opts):
    m = hycache_mount(fuse_uring="on", **opts)
    u = uring(m)
    assert u["wanted"] and u["offered"], u
    wait_for(lambda: uring(m)["active"], timeout=10, what="the rings to be set up")
    return m


def stat_from_cpu(cpu: int, paths: list[Path]) -> list[int]:
    """``stat --cached=never`` (a GETATTR each) from a process held on one CPU: its requests
    go to that CPU's queue (a queue with no thread serving it would hang here)."""
    out = subprocess.run(["taskset", "-c", str(cpu), "stat", "--cached=never", "-c", "%s", *map(str, paths)],
                         check=True, timeout=60, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_every_cpu_queue_answers_and_python_replies_go_back_through_the_rings(hycache_mount):
    m = uring_mount(hycache_mount)
    u0 = uring(m)
    assert u0["queues"] == os.cpu_count(), u0  # one per CPU the kernel may run a caller on
    d = m.mountpoint / "d"
    d.mkdir()  # a MKDIR: Python's, its reply through a ring entry
    files = []
    for i in range(50):
        p = d / f"f{i}"
        p.write_bytes(os.urandom(4096 + i))
        files.append(p)
    for cpu in sorted(os.sched_getaffinity(0)):
        assert stat_from_cpu(cpu, files) == [4096 + i for i in range(len(files))]
    os.rename(d / "f0", d / "g0")
    (d / "f1").unlink()
    sub = d / "sub"
    sub.mkdir()
    sub.rmdir()
    assert sorted(os.listdir(d)) == sorted([f"f{i}" for i in range(2, 50)] + ["g0"])
    u1 = uring(m)
    assert u1["active"] and u1["serving"], u1  # set up, and the kernel sends requests there
    assert u1["requests"] - u0["requests"] >= 2 * len(files), (u0, u1)
    assert u1["answered"] > u0["answered"], "the table answered nothing from the rings"
    assert u1["handed_on"] > u0["handed_on"], "no request went from a ring to Python"
    assert u1["loop_replies"] - u0["loop_replies"] == u1["handed_on"] - u0["handed_on"], \
        "a request handed to Python has no reply through its entry"
    # what went through the rings reads back whole, and the tiers hold it
    for i, p in enumerate(files[2:], start=2):
        assert p.stat().st_size == 4096 + i


def test_large_writes_and_reads_through_the_rings_with_passthrough_off(hycache_mount):
    """With kernel passthrough off every READ and WRITE is a request: up to max_write
    bytes in a ring entry's payload each way."""
    m = uring_mount(hycache_mount, passthrough="off")
    u0 = uring(m)
    data = os.urandom(8 << 20) + os.urandom(12345)
    p = m.mountpoint / "big"
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    Path("/proc/sys/vm/drop_caches").write_text("3")  # the next reads are READ requests
    fd = os.open(p, os.O_RDONLY)
    try:
        got = b""
        while chunk := os.read(fd, 1 << 20):
            got += chunk
    finally:
        os.close(fd)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    u1 = uring(m)
    assert u1["handed_on"] - u0["handed_on"] >= 8, (u0, u1)  # the WRITEs and READs at least


def test_the_device_serves_when_io_uring_is_off(hycache_mount):
    m = hycache_mount(fuse_uring="off")
    (m.mountpoint / "a").write_bytes(b"x")
    subprocess.run(["stat", "--cached=never", str(m.mountpoint / "a")], check=True, capture_output=True)
    u = uring(m)
    assert not u["wanted"] and not u["active"] and not u["serving"] and u["requests"] == 0, u
    assert status(m)["request_loop"]["reader_thread"]["read"] > 0


def test_an_unmount_with_the_rings_running_ends_cleanly(hycache_mount):
    m = uring_mount(hycache_mount)
    (m.mountpoint / "x").write_bytes(b"y" * 10000)
    assert m.unmount() == 0
    assert not os.path.ismount(m.mountpoint)
    assert "hycache-ring" not in m.stderr, "a ring thread reported an error"

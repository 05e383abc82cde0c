"""A freed fast-tier file's blob goes back to the blob pool, still registered as a backing
file (fs/blobpool.py, "Recycling"): the next creates take it.  What must hold: a new file
made from a recycled blob starts empty and holds exactly what is written to it, the old
file's bytes are gone from every new file, and after a crash the recovery pass removes the
recycled blobs nobody took (orphans) while every file keeps its bytes."""

from __future__ import annotations

import array
import fcntl
import os
import struct
from pathlib import Path

import pytest
from hycache_agent.fuse.answers import CREATE_STOCK

from .conftest import kill_agent, status, tier_blobs, wait_for


def pool(m) -> dict:
    return status(m)["blob_pool"]


def recycled(m, d, prefix: str, count: int, data: bytes) -> None:
    """Write ``count`` files of ``data`` in ``d`` and remove them: their blobs go back to
    the pool (skips where passthrough, which recycling needs, is off)."""
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("blobs are recycled with their passthrough registration")
    for i in range(count):
        (d / f"{prefix}{i}").write_bytes(data)
    for i in range(count):
        os.unlink(d / f"{prefix}{i}")
    wait_for(lambda: pool(m)["recycled"] >= count, 30, "the freed files' blobs to be recycled")


def test_recycled_blobs_start_empty_and_hold_what_is_written(hycache_mount):
    m = hycache_mount()
    d = m.mountpoint / "d"
    d.mkdir()
    recycled(m, d, "old", 50, b"O" * 65536)
    # the background refill settled (drains hand removals over after a burst now): the
    # pool holds what the creates below take
    wait_for(lambda: pool(m)["ready"] >= 50, 30, "the pool ready for the creates")
    misses = pool(m)["misses"]

    for i in range(50):
        p = d / f"new{i}"
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            assert os.fstat(fd).st_size == 0
            assert os.pread(fd, 65536, 0) == b"", "a recycled blob starts empty"
            os.write(fd, b"n%d" % i)
        finally:
            os.close(fd)
    for i in range(50):
        data = (d / f"new{i}").read_bytes()
        assert data == b"n%d" % i, f"new{i}: {data[:16]!r}"
    # no create found the pool empty and made its blob on the request path (the count of
    # blobs is no measure: the pools top themselves up in the background meanwhile)
    assert pool(m)["misses"] == misses, "the creates took pool blobs"
    fast_bytes = sum(tier_blobs(m.fast).values())
    assert fast_bytes < 50 * 65536, "the old files' bytes are gone from the fast tier"


FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_DELALLOC = 0x4


def delalloc(path) -> bool | None:
    """Whether the first extent of ``path`` is still a delayed allocation (no block chosen,
    nothing written back yet); None where FIEMAP does not say (not ext4, no extent)."""
    buf = array.array("B", struct.pack("=QQLLLL", 0, 2**64 - 1, 0, 0, 1, 0) + bytes(56))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
    except OSError:
        return None
    finally:
        os.close(fd)
    mapped = struct.unpack_from("=L", buf, 20)[0]
    if not mapped:
        return None
    flags = struct.unpack_from("=L", buf, 32 + 40)[0]
    return bool(flags & FIEMAP_EXTENT_DELALLOC)


def test_a_create_on_a_recycled_blob_starts_no_writeback_at_close(hycache_mount):
    """ext4 marks a file truncated to size 0 so that the next release of one of its open
    files flushes it (``auto_da_alloc``): the recycling releases that once itself, so the
    close(2) of a create that takes the blob leaves its bytes to the kernel's writeback as
    on a new file (it used to start the writeback, ~20 µs in every such close)."""
    m = hycache_mount()
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("blobs are recycled with their passthrough registration")
    probe = m.fast / "probe"  # on the fast tier's file system, beside the agent's blobs
    probe.write_bytes(b"p" * 4096)
    if delalloc(probe) is not True:
        pytest.skip("the fast tier's file system does not report delayed allocations (FIEMAP)")

    def blob(path) -> Path:
        ino = os.stat(path).st_ino
        return m.fast / "data" / f"{ino & 0xFF:02x}" / f"{ino:x}"

    d = m.mountpoint / "d"
    d.mkdir()
    old = set()  # the old files' blobs, by their inode numbers on the fast tier's file system
    for i in range(300):
        (d / f"old{i}").write_bytes(b"O" * 4096)
        old.add(os.stat(blob(d / f"old{i}")).st_ino)
    recycled_before = pool(m)["recycled"]
    for i in range(300):
        os.unlink(d / f"old{i}")
    wait_for(lambda: pool(m)["recycled"] >= recycled_before + 300, 30, "the freed files' blobs to be recycled")
    # new files: the first from the reader's stock of blobs made before (up to CREATE_STOCK:
    # a CI run's stock was full, 572 of 600 creates took its blobs), then the recycled ones,
    # which the pool keeps on top of any it makes meanwhile; right after each close, where
    # its byte went
    took = flushed = creates = 0
    while took < 300 and creates < CREATE_STOCK + 600:
        (d / f"new{creates}").write_bytes(b"N" * 4096)
        b = blob(d / f"new{creates}")
        creates += 1
        if os.stat(b).st_ino in old:
            took += 1
            flushed += delalloc(b) is False
    assert took == 300, f"only {took} of {creates} creates took a recycled blob"
    # (the kernel's own writeback may have come by for a few meanwhile)
    assert flushed <= took // 10, f"{flushed} of {took} creates on recycled blobs flushed their bytes at close"


def test_recycled_blobs_after_a_crash(agents):
    m = agents.start()
    d = m.mountpoint / "d"
    d.mkdir()
    for i in range(20):
        (d / f"kept{i}").write_bytes(b"K%d" % i * 100)
    recycled(m, d, "gone", 40, b"G" * 8192)
    for i in range(10):
        (d / f"late{i}").write_bytes(b"L%d" % i)  # made from recycled blobs
    os.sync()
    kill_agent(m)

    m = agents.restart(m)
    for i in range(20):
        assert (m.mountpoint / "d" / f"kept{i}").read_bytes() == b"K%d" % i * 100
    for i in range(10):
        assert (m.mountpoint / "d" / f"late{i}").read_bytes() == b"L%d" % i
    names = sorted(os.listdir(m.mountpoint / "d"))
    assert names == sorted([f"kept{i}" for i in range(20)] + [f"late{i}" for i in range(10)])
    # every blob left belongs to a file or to the new pool: nothing of the gone files
    assert sum(tier_blobs(m.fast).values()) == sum(len(b"K%d" % i * 100) for i in range(20)) + \
        sum(len(b"L%d" % i) for i in range(10))

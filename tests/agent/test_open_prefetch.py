"""The read-ahead of a passthrough reader's blob at open (``--open-prefetch-mb``,
fs/prefetch.py), through a real mount: a read-only open of a fast-tier file brings the
first N MiB of its blob into the page cache without a read; a writer's open, an O_DIRECT
open and a mount without the flag bring none of it."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest

from .conftest import status, tier_blobs, wait_idle

M = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)


def resident(path: str) -> list[bool]:
    """Per page of ``path``: whether it is in the page cache (mincore(2) of a mapping of it,
    which reads nothing)."""
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)  # untouched: no copy
    finally:
        os.close(fd)
    try:
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        buf = (ctypes.c_char * size).from_buffer(mm)
        addr = ctypes.addressof(buf)
        try:
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del buf
        return [bool(b & 1) for b in vec]
    finally:
        mm.close()


def evict(path: str) -> None:
    """Drop ``path``'s clean pages from the page cache (its dirty ones are written first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_mib(path: str) -> float:
    return sum(resident(path)) * PAGE / M


def big_file(m, name: str, size: int) -> tuple[Path, str]:
    """A file of ``size`` bytes written through the mount, and its blob on the fast tier."""
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    path = m.mountpoint / name
    path.write_bytes(os.urandom(size))
    wait_idle(m)
    blobs = [b for b, n in tier_blobs(m.fast).items() if n == size]
    assert len(blobs) == 1, tier_blobs(m.fast)
    return path, blobs[0]


def opened_and_waited(path: Path, flags: int, blob: str, seconds: float = 5.0) -> float:
    """Open ``path`` with ``flags`` (read nothing), wait up to ``seconds`` for its blob's
    pages to stop arriving, close: the MiB of the blob then in the page cache."""
    evict(blob)
    assert cached_mib(blob) < 1
    fd = os.open(path, flags)
    try:
        deadline, last = time.monotonic() + seconds, -1.0
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = cached_mib(blob)
            if now == last and now > 0:
                break
            last = now
        return cached_mib(blob)
    finally:
        os.close(fd)


@pytest.mark.mount
def test_a_readers_open_reads_the_blob_ahead_up_to_the_limit(hycache_mount):
    m = hycache_mount("256M", open_prefetch_mb=8)
    path, blob = big_file(m, "big", 24 * M)
    assert opened_and_waited(path, os.O_RDONLY, blob) == pytest.approx(8, abs=0.5)
    head = resident(blob)
    assert all(head[: 8 * M // PAGE])  # the first 8 MiB, nothing read through the mount
    assert opened_and_waited(path, os.O_RDWR, blob, seconds=1.0) < 1  # a writer: none
    assert opened_and_waited(path, os.O_RDONLY | os.O_DIRECT, blob, seconds=1.0) < 1


@pytest.mark.mount
def test_without_the_flag_an_open_reads_nothing_ahead(hycache_mount):
    m = hycache_mount("256M")
    path, blob = big_file(m, "big", 24 * M)
    assert opened_and_waited(path, os.O_RDONLY, blob, seconds=1.0) < 1
    with open(path, "rb") as f:  # the probe sees what a read brings in
        f.read(M)
    assert cached_mib(blob) >= 1

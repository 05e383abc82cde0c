"""The read-ahead that follows a passthrough reader (``--follow-prefetch-mb``: the kernel
read trace's reader, fs/ktrace_reader.py ``Follower``), through a real mount: a thread that
reads a fast-tier file in order gets the blob's pages well past the kernel's own read-ahead
window resident; a reader of a few bytes, or one that jumps around, gets none; a released
blob is no longer followed; a mount with 0 follows nothing; a slow-tier file is read
around in whole blocks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hycache_agent.fs.ktrace_reader import BLOCK

from .conftest import cli, info, status, tier_blobs, wait_idle
from .test_open_prefetch import PAGE, M, big_file, evict, resident

FOLLOW_MB = 40
SIZE = 64 * M
# the kernel's own read-ahead after a 4 MiB sequential read stays below this (its window
# is at most the device's read_ahead_kb, 8 MiB here, twice); the follower asks for
# chunks up to ~2 + FOLLOW_MB MiB: the pages of [FAR, NEAR_END) are the follower's alone
FAR, NEAR_END = 24 * M, 40 * M


def traced(m) -> None:
    kr = status(m)["counters"]["counting"]["kernel_reads"]
    if not kr["active"]:
        pytest.skip("no kernel read trace on this host: " + kr["reason"])


def cached_between(blob: str, start: int, end: int, seconds: float = 3.0) -> float:
    """MiB of ``blob``'s [start, end) in the page cache once they stop arriving (up to ``seconds``)."""
    deadline, last = time.monotonic() + seconds, -1.0
    now = 0.0
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = sum(resident(blob)[start // PAGE: end // PAGE]) * PAGE / M
        if now == last and now > 0:
            break
        last = now
    return now


def read_in_order(fd: int, nbytes: int, bs: int = 64 << 10) -> None:
    off = 0
    while off < nbytes:
        assert os.pread(fd, bs, off)
        off += bs


def mounted(hycache_mount, follow_mb: int = FOLLOW_MB, first_mb: int | None = None) -> tuple[object, Path, str]:
    """A mount following with a window of ``follow_mb`` MiB and a first ask of ``first_mb``
    (default: the window), and its evicted 64 MiB file."""
    m = hycache_mount("512M", follow_prefetch_mb=follow_mb,
                      follow_first_mb=follow_mb if first_mb is None else first_mb)
    path, blob = big_file(m, "big", SIZE)
    traced(m)
    evict(blob)
    assert sum(resident(blob)) == 0
    return m, path, blob


@pytest.mark.mount
def test_pages_ahead_of_a_sequential_reader_are_resident(hycache_mount):
    _, path, blob = mounted(hycache_mount)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_in_order(fd, 4 * M)
        ahead = cached_between(blob, FAR, NEAR_END)
    finally:
        os.close(fd)
    assert ahead >= 0.9 * (NEAR_END - FAR) / M, ahead
    assert sum(resident(blob)[(FOLLOW_MB + 10) * M // PAGE:]) * PAGE < M  # no further than asked


@pytest.mark.mount
def test_the_first_ask_reaches_past_the_window_and_no_further(hycache_mount):
    """A window of 8 MiB alone keeps the asked pages below ~20 MiB after a 4 MiB read; a
    first ask of 48 MiB has [FAR, NEAR_END) resident, and nothing past what it reached."""
    _, path, blob = mounted(hycache_mount, follow_mb=8, first_mb=48)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_in_order(fd, 4 * M)
        ahead = cached_between(blob, FAR, NEAR_END)
    finally:
        os.close(fd)
    assert ahead >= 0.9 * (NEAR_END - FAR) / M, ahead
    assert sum(resident(blob)[(48 + 10) * M // PAGE:]) * PAGE < M


@pytest.mark.mount
def test_without_the_flag_a_sequential_reader_gets_the_kernels_read_ahead_only(hycache_mount):
    _, path, blob = mounted(hycache_mount, follow_mb=0)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_in_order(fd, 4 * M)
        assert cached_between(blob, FAR, NEAR_END, seconds=1.5) < 1
    finally:
        os.close(fd)


@pytest.mark.mount
def test_a_reader_of_a_few_bytes_or_jumping_around_gets_nothing_ahead(hycache_mount):
    _, path, blob = mounted(hycache_mount, first_mb=SIZE // M)  # the first ask would be the whole file
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 100, 0)
        for off in range(0, SIZE, 3 * M):  # 64 KiB every 3 MiB: never 2 MiB in order
            assert os.pread(fd, 64 << 10, off)
        beyond = {i for i, r in enumerate(resident(blob)) if r}
        time.sleep(1.5)
        later = {i for i, r in enumerate(resident(blob)) if r}
        assert later <= beyond, sorted(later - beyond)[:8]  # nothing arrived after the reads
    finally:
        os.close(fd)
    # the kernel's read-ahead of each jump, not the follower's chunks
    assert sum(resident(blob)) * PAGE < SIZE // 2


@pytest.mark.mount
def test_a_released_blob_is_no_longer_followed(hycache_mount):
    """The follower goes by the blob's device and inode, so a reader of the blob file
    itself (beside the mount) is followed while the mount holds it open, and not once the
    mount's last open is released."""
    _, path, blob = mounted(hycache_mount)
    held = os.open(path, os.O_RDONLY)
    # the agent names the blob to the trace reader over a pipe the reader polls beside the
    # trace: a read of the blob file before that message arrives is nobody's to follow
    time.sleep(1.0)
    try:
        direct = os.open(blob, os.O_RDONLY)
        try:
            read_in_order(direct, 4 * M)
            assert cached_between(blob, FAR, NEAR_END) >= 0.9 * (NEAR_END - FAR) / M
        finally:
            os.close(direct)
    finally:
        os.close(held)
    time.sleep(1.0)  # the RELEASE reaches the agent after close(2) returns
    evict(blob)
    direct = os.open(blob, os.O_RDONLY)
    try:
        read_in_order(direct, 4 * M)
        assert cached_between(blob, FAR, NEAR_END, seconds=1.5) < 1
    finally:
        os.close(direct)


@pytest.mark.mount
def test_a_random_reader_of_a_slow_tier_file_gets_whole_blocks(hycache_mount):
    """A slow-tier file is read around in whole 4 MiB blocks (JuiceFS's block): one 8 KiB
    read in the middle of a block brings the rest of that block into the page cache, and
    nothing of the blocks it did not touch (a database's random page reads on an HDD:
    one seek a block, not one a page)."""
    # a writer's open of a file up to --promote-before-write-mb promotes it first: this one is larger
    m = hycache_mount("512M", follow_prefetch_mb=FOLLOW_MB, promote_before_write_mb=16)
    path, fast_blob = big_file(m, "big", 32 * M)
    traced(m)
    cli("demote", path, check=True)
    wait_idle(m)
    slow = [b for b, n in tier_blobs(m.slow).items() if n == 32 * M]
    assert len(slow) == 1 and info(path)["tier"] == "slow", (tier_blobs(m.slow), info(path))
    blob = slow[0]
    evict(blob)
    assert sum(resident(blob)) == 0
    fd = os.open(path, os.O_RDWR)  # a database opens its files for writing too
    try:
        time.sleep(1.0)  # the open's message to the trace reader (see the released-blob test)
        assert os.pread(fd, 8192, 2 * BLOCK + BLOCK // 2)
        block = cached_between(blob, 2 * BLOCK, 3 * BLOCK)
    finally:
        os.close(fd)
    assert block >= 0.9 * BLOCK / M, block
    assert sum(resident(blob)[: 2 * BLOCK // PAGE]) * PAGE < M  # the blocks before it: untouched
    assert sum(resident(blob)[4 * BLOCK // PAGE:]) * PAGE < M  # and well after it

"""A syncing writer's open of an evicted file through passthrough
(``--promote-before-write-mb``, Placement._promotes_before_write), through a real mount: the
blob a held file was opened with cannot move until its last close, so the open for writing
of an evicted file that no handle holds, when its writes will wait for the device (the file
was fsync'ed before, or the open is O_DSYNC), waits for its promotion, and its writes and
fsyncs go to the fast tier.  A plain append to a never-synced file, a file another handle
holds, a truncating open and a mount with the flag at 0 are left where they are.  When
every fast-tier file is held open (nothing can be evicted), the promotion comes in past the
write ceiling."""

from __future__ import annotations

import os

import pytest

from .conftest import cli, info, status, wait_idle

K = 1 << 10


def payload(n: int, seed: int) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(n))


def evicted(m, name: str, size: int, seed: int, *, synced: bool = True):
    """A file written through the mount (fsync'ed unless not ``synced``), then demoted."""
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    path = m.mountpoint / name
    with open(path, "wb") as f:
        f.write(payload(size, seed))
        if synced:
            f.flush()
            os.fsync(f.fileno())
    p = cli("demote", path, check=True)
    assert p.stdout.split()[0] == "slow" and info(path)["tier"] == "slow"
    return path


def tier_while_writing(path, flags: int, data: bytes, offset: int = 0, *, sync: bool = False) -> str:
    """Open ``path`` with ``flags``, note its tier while the handle holds it, write ``data``
    at ``offset`` (and fdatasync), close: the tier it was on while written."""
    fd = os.open(path, flags)
    try:
        tier = info(path)["tier"]
        assert os.pwrite(fd, data, offset) == len(data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return tier


def counters(m) -> tuple[int, int]:
    mig = status(m)["migrations"]
    return mig["promotions_for_write"], mig["promotions_past_ceiling"]


@pytest.mark.mount
def test_a_writer_of_an_evicted_file_gets_it_on_the_fast_tier_before_its_first_write(hycache_mount):
    m = hycache_mount(fast_capacity="4M")
    f = evicted(m, "log", 300 * K, 1)
    # while the writer holds it: the open waited
    assert tier_while_writing(f, os.O_RDWR, b"appended", 300 * K, sync=True) == "fast"
    assert f.read_bytes() == payload(300 * K, 1) + b"appended"
    assert counters(m) == (1, 0)

    held = evicted(m, "held", 200 * K, 2)
    reader = os.open(held, os.O_RDONLY)  # another handle holds it: its blob cannot move
    try:
        assert tier_while_writing(held, os.O_WRONLY, b"x") == "slow"
    finally:
        os.close(reader)
    truncated = evicted(m, "truncated", 200 * K, 3)
    fd = os.open(truncated, os.O_WRONLY | os.O_TRUNC)  # nothing of it is kept: nothing to copy
    os.close(fd)
    reader_only = evicted(m, "read", 200 * K, 4)
    assert reader_only.read_bytes() == payload(200 * K, 4)
    appended = evicted(m, "mail", 200 * K, 7, synced=False)  # never synced: a plain append stays
    with open(appended, "ab") as f:
        f.write(b"more")
    assert info(appended)["tier"] == "slow"
    wait_idle(m)
    assert counters(m) == (1, 0)  # none of the four waited for a promotion
    assert held.read_bytes()[:1] == b"x" and truncated.stat().st_size == 0
    assert appended.read_bytes() == payload(200 * K, 7) + b"more"

    dsync = evicted(m, "journal", 200 * K, 8, synced=False)
    assert tier_while_writing(dsync, os.O_WRONLY | os.O_DSYNC, b"z") == "fast"  # every write waits for the device
    assert counters(m) == (2, 0)


@pytest.mark.mount
def test_the_flag_at_zero_leaves_a_writer_on_the_slow_tier(hycache_mount):
    m = hycache_mount(fast_capacity="4M", promote_before_write_mb=0)
    f = evicted(m, "log", 300 * K, 5)
    assert tier_while_writing(f, os.O_RDWR, b"y") == "slow"
    assert f.read_bytes() == b"y" + payload(300 * K, 5)[1:]
    assert counters(m) == (0, 0)


@pytest.mark.mount
def test_a_fast_tier_full_of_held_files_still_takes_a_writers_file(hycache_mount):
    """1 MiB tier, write ceiling 1.5 MiB: two files of 600 KiB held open fill it and cannot
    be evicted; a third, evicted, opened for writing, comes in past the ceiling."""
    m = hycache_mount(fast_capacity="1M", write_slack=0.5)
    log = evicted(m, "log", 600 * K, 6)
    fds = []
    try:
        for i in range(2):
            path = m.mountpoint / f"table{i}"
            fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
            os.pwrite(fds[-1], payload(600 * K, 10 + i), 0)
            os.fsync(fds[-1])
        assert [info(m.mountpoint / f"table{i}")["tier"] for i in range(2)] == ["fast", "fast"]
        assert tier_while_writing(log, os.O_RDWR, b"commit", sync=True) == "fast"
        assert counters(m) == (1, 1)
        fast = status(m)["tiers"]["fast"]
        assert fast["used"] > fast["write_ceiling"] >= fast["capacity"]
    finally:
        for fd in fds:
            os.close(fd)
    assert log.read_bytes() == b"commit" + payload(600 * K, 6)[6:]
    for i in range(2):
        assert (m.mountpoint / f"table{i}").read_bytes() == payload(600 * K, 10 + i)

"""A large remote file is read while its copy fills (remote/copy.py, issue 33): real agents,
real mounts, the session's real Redis Cluster.

The ordering is observed, not timed: the holder is stopped (SIGSTOP) right after the
reader's first bytes came, and the reader's status must then still show the copy filling
(``copies_filling``), with the read counted as served from a copy not yet whole
(``filling_reads``).  A read far ahead of the stream is a range GET of its own
(``filling_ranged``).  A holder killed mid-copy is EIO to the reader, never zeros, and
leaves no copy behind; once the holder is back, the file reads whole."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import threading
from pathlib import Path

import pytest
from clusterkit import cluster_status, redis_addr, start_agents, wait_for, wait_published

pytestmark = pytest.mark.mount
MiB = 1 << 20
SIZE = 128 * MiB  # a quarter of the reader's 512 MiB fast tier: copied whole (reader.wants_copy)


def write_source(m, name: str, size: int = SIZE) -> str:
    """A file of ``size`` random bytes on ``m``; its SHA-256."""
    block = os.urandom(MiB)
    h = hashlib.sha256()
    with open(m.mountpoint / name, "wb") as f:
        for i in range(size // MiB):
            chunk = block[i % 251:] + block[:i % 251]  # every MiB differs
            f.write(chunk)
            h.update(chunk)
    return h.hexdigest()


def expected(m, name: str, off: int, n: int) -> bytes:
    with open(m.mountpoint / name, "rb") as f:
        f.seek(off)
        return f.read(n)


def remote_cache(m) -> list[str]:
    return os.listdir(m.fast / "remote-cache")


def settled(a, c, name: str) -> None:
    """a's file as a wrote it, seen on c: its final size (the file only grows while it is
    written) and its mtime published.  With passthrough off a's own stat shows its kernel's
    mtime (the writeback cache keeps it), which stays up to tens of ms before the one a's
    agent recorded at the last flush and published: the mtimes agree within a second."""
    wait_published(a)

    def same() -> bool:
        sa, sc = os.stat(a.mountpoint / name), os.stat(c.mountpoint / name)
        return sc.st_size == sa.st_size and abs(sc.st_mtime_ns - sa.st_mtime_ns) < 1_000_000_000
    wait_for(same, what=f"a's final entry of {name} on c")


@pytest.mark.parametrize("hccache_size", ["0", "256M"], ids=["off", "hybrid"])
def test_first_bytes_come_while_the_copy_fills_and_every_byte_is_the_sources(
        hycache_mount, redis_cluster, dht_namespace, secret_file, hccache_size):
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a", "c"),
                        hccache_size=hccache_size, fast_capacity="512M")
    digest = write_source(a, "big")
    far = SIZE - 3 * MiB + 12345
    far_bytes = expected(a, "big", far, 4096)
    head = expected(a, "big", 0, 4096)
    settled(a, c, "big")
    # c's inode stays known (a cache drop by any process would make the kernel forget it,
    # and its copy with it: test_hccache.py's large-file test says more)
    pin = os.open(c.mountpoint / "big", os.O_PATH)
    f = open(c.mountpoint / "big", "rb", buffering=0)
    stopped = False
    try:
        assert f.read(4096) == head
        f.seek(far)
        assert f.read(4096) == far_bytes  # far ahead of the stream: a range GET of its own
        os.kill(a.proc.pid, signal.SIGSTOP)  # the copy cannot progress from here
        stopped = True
        st = cluster_status(c)
        assert st["copies_filling"] == 1, st  # the first bytes came before the copy was whole
        assert st["filling_reads"] >= 1 and st["filling_ranged"] >= 1, st
        assert st["remote_fetches"] == 0, st  # (a whole copy counts one fetch when it lands)
        os.kill(a.proc.pid, signal.SIGCONT)
        stopped = False
        digests: list[str] = []

        def whole() -> None:  # a second opener shares the copy
            digests.append(hashlib.sha256((c.mountpoint / "big").read_bytes()).hexdigest())

        t = threading.Thread(target=whole)
        t.start()
        f.seek(0)
        h = hashlib.sha256()
        while chunk := f.read(MiB):
            h.update(chunk)
        t.join()
        assert h.hexdigest() == digest
        assert digests == [digest]
    finally:
        if stopped:
            os.kill(a.proc.pid, signal.SIGCONT)
        f.close()
    try:
        wait_for(lambda: cluster_status(c)["copies_filling"] == 0, what="c's copy whole")
        st = cluster_status(c)
        assert st["remote_fetches"] == 1 and st["remote_bytes"] == SIZE, st  # one copy for both openers
        # a later open reads the whole copy (through passthrough where the host has it)
        assert hashlib.sha256((c.mountpoint / "big").read_bytes()).hexdigest() == digest
        assert cluster_status(c)["remote_fetches"] == 1
    finally:
        os.close(pin)


def test_a_holder_killed_mid_copy_is_eio_then_the_file_reads_whole_once_it_is_back(
        hycache_mount, redis_cluster, dht_namespace, secret_file):
    a, c = start_agents(hycache_mount, redis_addr(redis_cluster), secret_file, dht_namespace, names=("a", "c"),
                        hccache_size="0", fast_capacity="512M")
    digest = write_source(a, "big")
    source = Path(a.mountpoint / "big")
    settled(a, c, "big")
    data = source.read_bytes()
    got = bytearray()
    errs: list[int] = []
    with open(c.mountpoint / "big", "rb", buffering=0) as f:
        got += f.read(4096)
        os.kill(a.proc.pid, signal.SIGSTOP)
        assert cluster_status(c)["copies_filling"] == 1  # killed mid-copy, not after it
        a.proc.kill()  # kill -9 the only holder
        a.proc.wait()
        while True:
            try:
                chunk = f.read(MiB)
            except OSError as exc:
                errs.append(exc.errno)
                break
            assert chunk, "the file ended early: the copy was served short"
            got += chunk
    assert errs == [errno.EIO]
    assert bytes(got) == data[:len(got)], "wrong bytes before the EIO"
    assert len(got) < SIZE
    # the partial copy is never c's copy: gone from the fast tier, nothing counted
    wait_for(lambda: cluster_status(c)["copies_filling"] == 0 and not remote_cache(c), what="the partial copy gone")
    st = cluster_status(c)
    assert st["remote_fetches"] == 0, st
    hycache_mount.remount(a, after_kill=True)
    wait_for(lambda: hashlib.sha256((c.mountpoint / "big").read_bytes()).hexdigest() == digest, timeout=60,
             what="the whole file once the holder is back")
    assert cluster_status(c)["remote_fetches"] == 1

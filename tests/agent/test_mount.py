"""The agent through a real FUSE mount: CLI, shutdown, space, names, sparse files,
concurrency.  Most tests share one agent (1 MiB fast tier) per module and work in their
own directory; the ones about the agent's life cycle or special tiers start their own."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hycache_agent.cli import SUBCOMMANDS

from .conftest import check_tiers_from_outside, cli, info, recovery_reports, status, tier_blobs, wait_for, wait_idle

K, M, G = 1 << 10, 1 << 20, 1 << 30


def pattern(n: int, seed: int) -> bytes:
    return hashlib.shake_256(b"%d" % seed).digest(n)


def first_word(p: subprocess.CompletedProcess) -> str:
    return p.stdout.split()[0] if p.stdout.split() else ""


# --------------------------------------------------------------------------- CLI
def test_help_of_every_subcommand():
    top = cli("--help")
    assert top.returncode == 0 and "usage: hycache-agent" in top.stdout
    for sub in SUBCOMMANDS:
        assert sub in top.stdout, f"{sub} missing from the top-level help"
        p = cli(sub, "--help")
        assert p.returncode == 0, p.stderr
        assert f"usage: hycache-agent {sub}" in p.stdout
        assert p.stderr == ""
    bare = cli()
    assert bare.returncode == 2 and "usage:" in bare.stderr


@pytest.mark.mount
def test_where_and_status(shared_mount, fresh_dir):
    m = shared_mount
    small, big = fresh_dir / "small", fresh_dir / "big"
    big.write_bytes(pattern(3 * M, 2))  # three times the fast tier: spills
    small.write_bytes(pattern(10 * K, 1))
    wait_idle(m)
    if status(m)["passthrough"]["enabled"]:
        # the kernel releases `big` asynchronously: `small` may have come while `big` still
        # held the full fast tier (and spilled); an open promotes it once it is closed
        small.read_bytes()
        wait_for(lambda: info(small)["tier"] == "fast", 60, "small to be promoted after its read")

    p = cli("where", small, check=True)
    assert first_word(p) == "fast" and str(small) in p.stdout
    assert first_word(cli("where", big, check=True)) == "slow"
    assert first_word(cli("where", fresh_dir, check=True)) == "dir"

    j = json.loads(cli("where", "--json", small, check=True).stdout)
    assert j["path"] == str(small) and j["tier"] == "fast" and j["size"] == 10 * K
    assert j["type"] == "file" and j["pinned"] is False and j["agent_root"] == str(m.root)
    assert Path(j["blob"]).parent.parent.parent == m.fast and Path(j["blob"]).stat().st_size == 10 * K
    jb = json.loads(cli("where", "--json", big, check=True).stdout)
    assert jb["tier"] == "slow" and Path(jb["blob"]).parent.parent.parent == m.slow

    st = json.loads(cli("status", m.root, "--json", check=True).stdout)
    assert st["pid"] == m.proc.pid
    assert st["mountpoint"] == str(m.mountpoint) and st["root"] == str(m.root)
    assert st["policy"] == "lru" and st["watermarks"] == {"high": 0.9, "low": 0.7}
    fast, slow = st["tiers"]["fast"], st["tiers"]["slow"]
    assert fast["capacity"] == M and 0 <= fast["used"] <= M and fast["path"] == str(m.fast)
    assert fast["files"] >= 1 and fast["bytes"] == fast["used"]
    assert slow["files"] >= 1 and slow["bytes"] >= 3 * M and slow["capacity"] > 0 and slow["device_free"] > 0
    # with passthrough the kernel writes the blob itself: the big file moves when closed
    moved = st["migrations"]["spills"] + (st["migrations"]["evictions"] if st["passthrough"]["enabled"] else 0)
    assert moved >= 1 and st["migrations"]["active"] == []
    for key in ("migrations_done", "migrations_failed", "evictions", "promotions", "bytes_demoted"):
        assert isinstance(st["migrations"][key], int)
    assert st["metadata"]["commits"] > 0 and st["metadata"]["error"] is None
    assert st["open_handles"] == 0 and st["directories"] >= 2
    # the mount point (or any path inside it) names the agent too
    assert json.loads(cli("status", m.mountpoint, "--json", check=True).stdout)["pid"] == m.proc.pid
    vfs = os.statvfs(m.mountpoint)
    assert vfs.f_namemax == 255
    assert vfs.f_blocks * vfs.f_frsize >= M + slow["capacity"] - 4 * K
    assert 0 < vfs.f_bavail * vfs.f_frsize <= vfs.f_blocks * vfs.f_frsize
    human = cli("status", m.root, check=True)
    assert "fast" in human.stdout and "slow" in human.stdout and str(m.proc.pid) in human.stdout


@pytest.mark.mount
def test_pin_and_unpin(shared_mount, fresh_dir):
    m = shared_mount
    keep = fresh_dir / "keep"
    keep.write_bytes(pattern(100 * K, 3))
    p = cli("pin", keep, check=True)
    assert "pinned" in p.stdout
    assert os.getxattr(keep, "user.hycache.pinned") == b"1"
    assert "pinned" in cli("where", keep, check=True).stdout
    for i in range(12):  # 2.4 MiB of newer files through the 1 MiB tier
        (fresh_dir / f"o{i}").write_bytes(pattern(200 * K, 100 + i))
    wait_idle(m)
    assert info(keep)["tier"] == "fast" and info(keep)["pinned"] is True
    assert any(info(fresh_dir / f"o{i}")["tier"] == "slow" for i in range(12))

    assert "unpinned" in cli("unpin", keep, check=True).stdout
    assert os.getxattr(keep, "user.hycache.pinned") == b"0"
    for i in range(12, 24):
        (fresh_dir / f"o{i}").write_bytes(pattern(200 * K, 100 + i))
    wait_idle(m)
    assert first_word(cli("where", keep, check=True)) == "slow"  # the least recently used
    assert keep.read_bytes() == pattern(100 * K, 3)
    check_tiers_from_outside(m)


@pytest.mark.mount
def test_promote_and_demote(shared_mount, fresh_dir):
    m = shared_mount
    f = fresh_dir / "f"
    f.write_bytes(pattern(200 * K, 4))
    p = cli("demote", f, check=True)
    assert first_word(p) == "slow"
    assert info(f)["tier"] == "slow" and Path(info(f)["blob"]).is_relative_to(m.slow)
    assert "already there" in cli("demote", f, check=True).stdout
    p = cli("promote", f, check=True)
    assert first_word(p) == "fast" and info(f)["tier"] == "fast"
    assert Path(info(f)["blob"]).is_relative_to(m.fast)
    # --no-wait returns at once; the move happens in the background
    p = cli("demote", "--no-wait", f, check=True)
    assert "started" in p.stdout
    wait_for(lambda: info(f)["tier"] == "slow", what="the background demotion")
    assert f.read_bytes() == pattern(200 * K, 4)
    # reading it promoted it again (promotion on open, in the background)
    wait_for(lambda: info(f)["tier"] == "fast", what="the promotion on open")
    assert f.read_bytes() == pattern(200 * K, 4)
    # errors: clear message, non-zero exit, no traceback
    big = fresh_dir / "big"
    big.write_bytes(pattern(2 * M, 5))
    p = cli("promote", big)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "space" in p.stderr.lower() and str(big) in p.stderr
    p = cli("promote", fresh_dir)
    assert p.returncode == 1 and "only regular files" in p.stderr and "Traceback" not in p.stderr
    check_tiers_from_outside(m)


@pytest.mark.mount
def test_a_demote_of_a_file_held_open_waits_for_its_close(shared_mount, fresh_dir):
    """With passthrough a blob moves only once its last handle is gone: the CLI waits for the
    requested move (``move_wanted`` in ``user.hycache.info``) instead of calling it refused."""
    f = fresh_dir / "held"
    f.write_bytes(pattern(200 * K, 6))
    fd = os.open(f, os.O_RDONLY)
    closer = threading.Timer(4.0, os.close, (fd,))  # past the CLI's start-up
    closer.start()
    try:
        p = cli("demote", f)
    finally:
        closer.join()
    assert p.returncode == 0, p.stderr
    assert first_word(p) == "slow" and info(f)["tier"] == "slow"
    assert "move_wanted" not in info(f)
    assert f.read_bytes() == pattern(200 * K, 6)


@pytest.mark.mount
def test_cli_without_an_agent(tmp_path, shared_mount):
    plain = tmp_path / "plain"
    plain.write_text("not in a mount")
    for args in (("where", plain), ("where", "--json", plain), ("pin", plain), ("unpin", plain),
                 ("promote", plain), ("demote", plain)):
        p = cli(*args)
        assert p.returncode == 3, (args, p.returncode, p.stdout, p.stderr)
        assert "no HyCache agent serves" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = cli("status", tmp_path)
    assert p.returncode == 3 and "not a HyCache agent root" in p.stderr
    p = cli("where", tmp_path / "missing")
    assert p.returncode == 1 and "no such file" in p.stderr
    # a root with state/ but no agent behind it
    (tmp_path / "root" / "state").mkdir(parents=True)
    p = cli("status", tmp_path / "root")
    assert p.returncode == 3 and "no HyCache agent is running" in p.stderr and "Traceback" not in p.stderr


# --------------------------------------------------------------------------- life cycle
@pytest.mark.mount
def test_sigterm_exits_zero_and_data_survives(hycache_mount):
    m = hycache_mount(fast_capacity="1M")
    (m.mountpoint / "d").mkdir()
    files = {m.mountpoint / "d" / f"f{i}": pattern(300 * K, i) for i in range(6)}
    for path, payload in files.items():
        path.write_bytes(payload)
    wait_idle(m)
    # idle for longer than the kernel's attribute timeout (1 s): the agent must not
    # touch its own mount point while it shuts down
    time.sleep(1.3)
    t0 = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    rc = m.proc.wait(timeout=20)
    m._stopped = True
    assert rc == 0, m.stderr[-3000:]
    assert time.monotonic() - t0 < 15
    assert not os.path.ismount(m.mountpoint)
    assert "unmounted" in m.stderr
    p = cli("status", m.root)
    assert p.returncode == 3 and "no HyCache agent is running" in p.stderr

    m2 = hycache_mount.remount(m)
    for path, payload in files.items():
        assert path.read_bytes() == payload
    reports = recovery_reports(m2.stderr)  # the log holds both starts
    assert len(reports) == 2 and not any(reports[-1].values()), reports  # a clean stop leaves nothing
    check_tiers_from_outside(m2)


@pytest.mark.mount
def test_sparse_file_demoted_stays_sparse_and_fusermount_exits_zero(hycache_mount):
    """A 5 GiB sparse file on a fast tier large enough (logically) to hold it: demoting it
    copies only its data; then `fusermount3 -u` ends the agent with exit 0."""
    m = hycache_mount(fast_capacity="8G")
    f = m.mountpoint / "sparse"
    with open(f, "wb") as fh:
        fh.write(b"head")
        fh.seek(5 * G)
        fh.write(pattern(M, 7))
    i = info(f)
    assert i["tier"] == "fast" and i["size"] == 5 * G + M
    assert os.stat(i["blob"]).st_blocks * 512 < 32 * M
    assert first_word(cli("demote", f, check=True)) == "slow"
    i = info(f)
    assert i["tier"] == "slow"
    assert os.stat(i["blob"]).st_blocks * 512 < 32 * M, "the demoted copy is not sparse"
    assert os.stat(i["blob"]).st_size == 5 * G + M
    with open(f, "rb") as fh:
        assert fh.read(4) == b"head"
        fh.seek(3 * G)
        assert fh.read(64 * K) == bytes(64 * K)
        fh.seek(5 * G)
        assert fh.read(M) == pattern(M, 7)
    wait_idle(m)

    r = subprocess.run(["fusermount3", "-u", str(m.mountpoint)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rc = m.proc.wait(timeout=20)
    m._stopped = True
    assert rc == 0, m.stderr[-3000:]
    assert not os.path.ismount(m.mountpoint)


@pytest.mark.mount
def test_sparse_file_beyond_4gib_spills(shared_mount, fresh_dir):
    f = fresh_dir / "sparse"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"middle", 4 * G + 123)
        os.pwrite(fd, pattern(M, 8), 5 * G)
        os.fsync(fd)
    finally:
        os.close(fd)
    st = os.stat(f)
    assert st.st_size == 5 * G + M
    if status(shared_mount)["passthrough"]["enabled"]:  # no spill while open: evicted at close
        wait_for(lambda: info(f)["tier"] == "slow", 120, "the 5 GiB file to leave the 1 MiB fast tier")
    i = info(f)
    assert i["tier"] == "slow" and i["size"] == 5 * G + M  # far above the 1 MiB fast tier
    blob = os.stat(i["blob"])
    assert blob.st_size == 5 * G + M and blob.st_blocks * 512 < 32 * M, "the slow blob is not sparse"
    with open(f, "rb") as fh:
        assert fh.read(8) == b"head\0\0\0\0"
        fh.seek(2 * G)
        assert fh.read(128 * K) == bytes(128 * K)
        fh.seek(4 * G + 120)
        assert fh.read(12) == b"\0\0\0middle\0\0\0"
        fh.seek(5 * G - 4)
        assert fh.read(M + 100) == bytes(4) + pattern(M, 8)  # short read at EOF
    # extending by truncate and overwriting in place keep it sparse and correct
    os.truncate(f, 6 * G)
    with open(f, "r+b") as fh:
        fh.seek(6 * G - 3)
        fh.write(b"end")
    assert os.stat(f).st_size == 6 * G
    with open(f, "rb") as fh:
        fh.seek(6 * G - 8)
        assert fh.read() == bytes(5) + b"end"
    assert os.stat(info(f)["blob"]).st_blocks * 512 < 32 * M
    os.unlink(f)


@pytest.mark.mount
def test_enospc_only_when_both_tiers_are_full(tmpfs_dir, hycache_mount):  # tmpfs outlives the agent
    m = hycache_mount(fast_capacity="1M", slow=tmpfs_dir)
    m.slow = Path(tmpfs_dir)
    assert status(m)["tiers"]["slow"]["path"] == str(tmpfs_dir)
    written: dict[Path, bytes] = {}
    failure = None
    for i in range(40):  # 20 MiB offered to 1 MiB fast + 8 MiB slow
        path = m.mountpoint / f"f{i:02d}"
        payload = pattern(512 * K, 200 + i)
        try:
            with open(path, "wb") as fh:
                for off in range(0, len(payload), 128 * K):
                    fh.write(payload[off:off + 128 * K])
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            failure = (i, exc)
            break
        written[path] = payload
    assert failure is not None, "20 MiB fitted into 9 MiB of tiers"
    i, exc = failure
    assert exc.errno == errno.ENOSPC, f"file {i} failed with {exc!r}, not ENOSPC"
    st = status(m)
    total = sum(len(p) for p in written.values())
    # the slow tier really is full, and the fast tier was used as well
    assert st["tiers"]["slow"]["device_free"] < 512 * K, st["tiers"]
    assert total >= 8 * M, f"ENOSPC after only {total} bytes (slow tier 8 MiB, fast 1 MiB)"
    assert st["tiers"]["fast"]["files"] >= 1
    # every closed file is intact, nothing half-migrated is left behind
    for path, payload in written.items():
        assert path.read_bytes() == payload, path
    (m.mountpoint / f"f{i:02d}").unlink()
    check_tiers_from_outside(m)
    # freeing space makes writes work again
    for path in list(written)[:3]:
        path.unlink()
        del written[path]
    again = m.mountpoint / "again"
    again.write_bytes(pattern(900 * K, 300))
    assert again.read_bytes() == pattern(900 * K, 300)
    assert m.proc.poll() is None
    check_tiers_from_outside(m)


@pytest.mark.mount
def test_reader_joins_a_writer_served_by_the_agent(hycache_mount):
    """With the fast tier full of pinned files, a writer of a fast-tier file is served by the
    agent (its writes could not spill otherwise).  A reader opening the same file meanwhile
    must be served the same way: the kernel refuses a passthrough open of an inode it holds
    open in cached mode (and the reverse) with EIO."""
    m = hycache_mount(fast_capacity="1M")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    hog, target = m.mountpoint / "hog", m.mountpoint / "target"
    target.write_bytes(pattern(4 * K, 2))
    hog.write_bytes(pattern(1020 * K, 1))
    for path in (target, hog):
        cli("pin", path, check=True)
        if info(path)["tier"] != "fast":
            cli("promote", path, check=True)
    assert info(hog)["tier"] == info(target)["tier"] == "fast", (info(hog), info(target))
    with open(target, "r+b") as writer:
        with open(target, "rb") as reader:  # EIO here when the agent answered it with a backing id
            assert reader.read() == pattern(4 * K, 2)
            writer.write(b"x" * 100)
            writer.flush()
            reader.seek(0)
            assert reader.read(100) == b"x" * 100
    assert target.read_bytes() == b"x" * 100 + pattern(4 * K, 2)[100:]
    with open(target, "rb") as reader:  # with no writer left, the next opens may be passthrough
        with open(target, "r+b") as writer:  # ... and a writer joining them shares the backing
            writer.write(b"y" * 10)
        assert reader.read(10) == b"y" * 10
    assert m.proc.poll() is None


def agent_blob_fds(m) -> list[str]:
    """The agent's open descriptors on blobs (passthrough registrations hold one each)."""
    out = []
    fd_dir = Path(f"/proc/{m.proc.pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if "/data/" in target:
            out.append(target)
    return out


@pytest.mark.mount
def test_reopen_after_release_moves_and_unlink(hycache_mount):
    """The last release of a fast-tier file keeps its passthrough registration (parked) for
    the next open.  A reopen reads what was written last; a migration while parked drops it
    (the next open registers the new blob, on the other tier); so does the file's end, after
    which the agent holds no descriptor on its blob any more."""
    m = hycache_mount(fast_capacity="64M")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    f = m.mountpoint / "f"
    f.write_bytes(pattern(64 * K, 1))
    for _ in range(3):  # reopens: the parked registration
        assert f.read_bytes() == pattern(64 * K, 1)
    with open(f, "r+b") as w:  # a writer takes it back, and parks it again at release
        w.write(pattern(10 * K, 2))
    expected = pattern(10 * K, 2) + pattern(64 * K, 1)[10 * K:]
    assert f.read_bytes() == expected and os.stat(f).st_size == 64 * K
    assert first_word(cli("demote", f, check=True)) == "slow"
    assert f.read_bytes() == expected  # the slow-tier blob, not the parked fast one
    assert info(f)["tier"] in ("slow", "fast")  # (the read may already promote it again)
    wait_for(lambda: info(f)["tier"] == "fast", what="the promotion on open")
    with open(f, "ab") as w:
        w.write(b"tail")
    assert f.read_bytes() == expected + b"tail" and os.stat(f).st_size == 64 * K + 4
    blob = info(f)["blob"]
    f.unlink()
    wait_for(lambda: not any(t.startswith(blob) for t in agent_blob_fds(m)), 30,
             "the agent to close the unlinked file's blob")
    check_tiers_from_outside(m)
    assert m.proc.poll() is None


@pytest.mark.mount
def test_every_ready_pool_blob_is_registered_ahead_of_its_create(hycache_mount):
    """With passthrough, the pool's blobs are registered as backing files before a create
    takes one (no thread hop in the create), those made before the kernel accepted
    passthrough too; creates served from the pool read back what was written."""
    m = hycache_mount(fast_capacity="64M")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])

    def pool() -> dict:
        return status(m)["blob_pool"]

    # the reserve an idle agent keeps (--blob-pool-reserve, 1,024), every blob registered
    wait_for(lambda: pool()["ready"] >= pool()["reserve"] == 1024 and pool()["registered"] == pool()["ready"],
             30, "the pool's reserve made, every ready blob registered")
    assert len(agent_blob_fds(m)) >= pool()["ready"]  # a registration holds its blob open
    misses = pool()["misses"]
    d = m.mountpoint / "many"
    d.mkdir()
    for i in range(300):  # more than the refill's 2 x 64, fewer than the reserve
        (d / f"f{i}").write_bytes(pattern(4 * K, i))
    assert pool()["misses"] == misses
    for i in range(300):
        assert (d / f"f{i}").read_bytes() == pattern(4 * K, i)
    wait_for(lambda: pool()["registered"] == pool()["ready"] >= 64, 30, "the pool refilled and registered")
    for i in range(300):
        (d / f"f{i}").unlink()
    check_tiers_from_outside(m)
    assert m.proc.poll() is None


@pytest.mark.mount
def test_a_passthrough_writers_close_sends_no_flush_and_its_size_counts_at_release(hycache_mount):
    """A writer through passthrough whose name is in the redo log and whose file has no
    replicas gets FOPEN_NOFLUSH: its close(2) is not a round trip to the agent (the
    kernel's own fuse trace points show no FLUSH, and a RELEASE per open); the size the
    kernel wrote still reaches the agent's records and the fast tier's accounting, at
    the RELEASE the kernel sends after close(2) returned."""
    m = hycache_mount(fast_capacity="64M")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    from fuse_requests import Trace  # bench/fuse_requests.py: the trace points it counts requests with

    d = m.mountpoint / "d"
    d.mkdir()
    used0 = status(m)["tiers"]["fast"]["used"]
    trace = Trace(f"test_noflush_{os.getpid()}")
    trace.start(os.stat(m.mountpoint).st_dev)
    try:
        for i in range(20):  # creates: open(O_CREAT) + write + close
            (d / f"f{i}").write_bytes(pattern(4 * K, i))
        with open(d / "f0", "r+b") as w:  # a writer of an existing file
            w.seek(4 * K)
            w.write(pattern(4 * K, 99))
        with open(d / "f1", "rb") as r:  # a reader (no FLUSH before this change either)
            assert r.read() == pattern(4 * K, 1)
    finally:
        lat = trace.stop()
        trace.remove()
    assert "FLUSH" not in lat, {op: len(v) for op, v in lat.items()}
    assert len(lat.get("CREATE", [])) == 20
    assert len(lat.get("RELEASE", [])) >= 22 - 1  # (the last one may come after the trace stopped)
    wait_for(lambda: info(d / "f0")["size"] == 8 * K and all(info(d / f"f{i}")["size"] == 4 * K
                                                              for i in range(1, 20)),
             30, "the sizes at release")
    wait_for(lambda: status(m)["tiers"]["fast"]["used"] - used0 == 21 * 4 * K, 30,
             "the fast tier's accounting of the bytes written")
    assert (d / "f0").read_bytes() == pattern(4 * K, 0) + pattern(4 * K, 99)
    check_tiers_from_outside(m)
    assert m.proc.poll() is None


@pytest.mark.mount
def test_stores_through_a_shared_mapping_show_in_the_times_after_the_last_close(hycache_mount):
    """A passthrough file mapped shared and writable changes under the kernel's FUSE inode
    (its stores go to the blob, and the kernel keeps the attributes it last asked for): the
    last release takes the blob's new mtime to the agent and makes the kernel ask again,
    even when that last release is of another open that could not map it (an O_WRONLY
    writer's; opens none of which could map the file send nothing at release)."""
    import mmap

    m = hycache_mount()
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("passthrough is off on this host: " + status(m)["passthrough"]["reason"])
    p = m.mountpoint / "mapped"
    p.write_bytes(pattern(8 * K, 1))
    writer = os.open(p, os.O_WRONLY)  # open across the mapping's whole life, closed last
    try:
        fd = os.open(p, os.O_RDWR)
        try:
            with mmap.mmap(fd, 8 * K, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
                mm[:4] = b"MMAP"
                mm.flush()
                seen = os.stat(p).st_mtime_ns  # the kernel asks now and keeps the answer
                time.sleep(0.05)  # past the clock's tick: the next store moves the blob's mtime
                mm[4:8] = b"MORE"  # a store after a flush: the page faults again, mtime moves
                mm.flush()
                assert os.stat(p).st_mtime_ns == seen, "the kernel answers from its cache while open"
        finally:
            os.close(fd)
    finally:
        os.close(writer)
    # no drop_caches: the kernel's own cached attributes must be the ones that change
    wait_for(lambda: os.stat(p).st_mtime_ns > seen, 10, "the mapping's last stores in the kernel's mtime")
    assert p.read_bytes() == b"MMAPMORE" + pattern(8 * K, 1)[8:]
    check_tiers_from_outside(m)


@pytest.mark.mount
def test_the_request_loop_polls_for_the_next_request_before_it_sleeps(hycache_mount):
    """After an answer, with no other request queued, the loop polls /dev/fuse for up to
    ``--loop-spin-us`` before it sleeps: a caller that sends its requests one after the
    other finds it awake (``status`` -> ``request_loop``: polls that found the next request,
    polls that ran out); ``--loop-spin-us 0`` never polls. Answers are the same either way."""
    counts = {}
    for spin in (None, 0):
        m = hycache_mount(**({} if spin is None else {"loop_spin_us": spin}))
        before = status(m)["request_loop"]
        for i in range(2000):  # one caller: a LOOKUP each (new names: negative entries)
            assert not os.path.exists(m.mountpoint / f"missing{i}")
        (m.mountpoint / "f").write_bytes(b"x")
        assert (m.mountpoint / "f").read_bytes() == b"x"
        after = status(m)["request_loop"]
        counts[spin] = (after["spin_us"], after["spin_hits"] - before["spin_hits"],
                        after["spin_misses"] - before["spin_misses"])
    spin_us, hits, misses = counts[None]
    assert spin_us == 50.0 and hits > 0 and misses > 0, counts  # the default polls, and sleeps when idle
    assert counts[0] == (0.0, 0, 0), counts


# --------------------------------------------------------------------------- names
@pytest.mark.mount
def test_name_length_limits(shared_mount, fresh_dir):
    n255 = "n" * 255
    multibyte = "é" * 127 + "x"  # 255 bytes of UTF-8
    assert len(multibyte.encode()) == 255
    for name in (n255, multibyte):
        p = fresh_dir / name
        p.write_bytes(name.encode())
        assert p.read_bytes() == name.encode() and name in os.listdir(fresh_dir)
        assert first_word(cli("where", p, check=True)) == "fast"
    os.rename(fresh_dir / n255, fresh_dir / ("m" * 255))
    os.link(fresh_dir / ("m" * 255), fresh_dir / ("l" * 255))
    os.symlink("m" * 255, fresh_dir / ("s" * 255))
    (fresh_dir / ("d" * 255)).mkdir()
    assert (fresh_dir / ("s" * 255)).read_bytes() == n255.encode()
    n256 = "x" * 256
    attempts = {
        "create": lambda: open(fresh_dir / n256, "wb"),
        "mkdir": lambda: os.mkdir(fresh_dir / n256),
        "rename": lambda: os.rename(fresh_dir / ("m" * 255), fresh_dir / n256),
        "link": lambda: os.link(fresh_dir / ("m" * 255), fresh_dir / n256),
        "symlink": lambda: os.symlink("target", fresh_dir / n256),
        "stat": lambda: os.stat(fresh_dir / n256),
        "mknod": lambda: os.mkfifo(fresh_dir / n256),
    }
    for what, op in attempts.items():
        with pytest.raises(OSError) as ei:
            op()
        assert ei.value.errno == errno.ENAMETOOLONG, f"{what}: {ei.value!r}"
    assert sorted(os.listdir(fresh_dir)) == sorted(["m" * 255, "l" * 255, "s" * 255, "d" * 255, multibyte])


@pytest.mark.mount
def test_non_utf8_names(shared_mount, fresh_dir):
    d = os.fsencode(fresh_dir)
    names = [b"caf\xe9", b"\xff\xfe\xfd", b"mixed-\xc3\x28-bad", "ünïcødé-日本語".encode(), b"\x01ctl\x7f"]
    for k, name in enumerate(names):
        fd = os.open(d + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, pattern(1000 + k, k))
        os.close(fd)
    assert sorted(os.listdir(d)) == sorted(names)
    for k, name in enumerate(names):
        with open(d + b"/" + name, "rb") as fh:
            assert fh.read() == pattern(1000 + k, k)
    os.mkdir(d + b"/dir-\xfe")
    os.rename(d + b"/caf\xe9", d + b"/dir-\xfe/caf\xe9-moved")
    assert os.listdir(d + b"/dir-\xfe") == [b"caf\xe9-moved"]
    p = cli("where", d + b"/\xff\xfe\xfd", check=True)
    assert first_word(p) == "fast"
    os.setxattr(d + b"/\xff\xfe\xfd", "user.hycache.tier", b"slow")
    wait_for(lambda: info(d + b"/\xff\xfe\xfd")["tier"] == "slow", what="demotion of a non-UTF-8 name")
    with open(d + b"/\xff\xfe\xfd", "rb") as fh:
        assert fh.read() == pattern(1001, 1)
    os.unlink(d + b"/dir-\xfe/caf\xe9-moved")
    os.rmdir(d + b"/dir-\xfe")
    assert b"dir-\xfe" not in os.listdir(d)


# --------------------------------------------------------------------------- concurrency
_CHILD = r"""
import hashlib, os, sys
path, shared, idx, stripes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def pattern(n, seed): return hashlib.shake_256(b"%d" % seed).digest(n)
with open(path, "wb") as f:
    for k in range(24):
        f.write(pattern(64 * 1024, 1000 * idx + k))
fd = os.open(shared, os.O_RDWR)
for s in range(stripes):
    if s % 6 == idx:
        os.pwrite(fd, pattern(64 * 1024, 5000 + s), s * 64 * 1024)
os.fsync(fd)
os.close(fd)
"""


@pytest.mark.mount
def test_concurrent_writers_and_readers(shared_mount, fresh_dir):
    """Threads and processes write distinct files and stripes of one shared file through a
    1 MiB fast tier (constant eviction and spilling) while readers re-read closed files;
    every byte must be where it was written."""
    m = shared_mount
    before = status(m)["migrations"]
    stable = {fresh_dir / f"stable{i}": pattern(300 * K, 700 + i) for i in range(4)}
    for path, payload in stable.items():
        path.write_bytes(payload)
    stripes = 36  # 2.25 MiB shared file, 6 writers (4 threads + 2 processes) own every 6th stripe
    shared = fresh_dir / "shared"
    with open(shared, "wb") as fh:
        fh.truncate(stripes * 64 * K)
    errors: list[str] = []
    stop = threading.Event()

    def own_file(idx: int) -> None:
        try:
            path = fresh_dir / f"own{idx}"
            with open(path, "wb") as fh:
                for k in range(24):
                    fh.write(pattern(64 * K, 1000 * idx + k))
            fd = os.open(shared, os.O_RDWR)
            try:
                for s in range(stripes):
                    if s % 6 == idx:
                        os.pwrite(fd, pattern(64 * K, 5000 + s), s * 64 * K)
            finally:
                os.close(fd)
        except Exception as exc:  # reported below
            errors.append(f"writer {idx}: {exc!r}")

    def reader() -> None:
        rounds = 0
        while not stop.is_set() or rounds < 3:
            for path, payload in stable.items():
                try:
                    got = path.read_bytes()
                except OSError as exc:
                    errors.append(f"reader: {path.name}: {exc!r}")
                    return
                if got != payload:
                    bad = next((k for k in range(min(len(got), len(payload))) if got[k] != payload[k]), None)
                    errors.append(f"reader: {path.name} changed (len {len(got)}, first bad byte {bad})")
                    return
            rounds += 1

    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(fresh_dir / f"own{idx}"), str(shared),
                               str(idx), str(stripes)]) for idx in (4, 5)]
    threads = [threading.Thread(target=own_file, args=(idx,)) for idx in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for p in procs:
        assert p.wait(timeout=120) == 0
    stop.set()
    for t in readers:
        t.join(timeout=120)
    assert not errors, "\n".join(errors)
    for idx in range(6):
        want = b"".join(pattern(64 * K, 1000 * idx + k) for k in range(24))
        assert (fresh_dir / f"own{idx}").read_bytes() == want, f"own{idx}"
    want = b"".join(pattern(64 * K, 5000 + s) for s in range(stripes))
    got = shared.read_bytes()
    assert len(got) == len(want)
    bad = [s for s in range(stripes) if got[s * 64 * K:(s + 1) * 64 * K] != want[s * 64 * K:(s + 1) * 64 * K]]
    assert not bad, f"stripes {bad} of the shared file are wrong"
    after = status(m)["migrations"]
    assert after["migrations_done"] - before["migrations_done"] >= 5, (before, after)
    assert after["migrations_failed"] == before["migrations_failed"]
    assert check_tiers_from_outside(m) >= 11
    assert not [b for b in {**tier_blobs(m.fast), **tier_blobs(m.slow)} if b.endswith(".migrating")]


@pytest.mark.mount
@pytest.mark.parametrize("gc_interval", [None, 0])
def test_the_event_loop_paces_the_garbage_collector(hycache_mount, gc_interval):
    """By default CPython's automatic collector is off in the agent and its event loop
    collects the young generations every --gc-interval (0.2 s) and all of them every
    --gc-full-interval; ``status`` -> ``gc`` shows both kinds growing and the time they
    took.  With --gc-interval 0 CPython's thresholds collect, on whichever thread; the
    status counts those collections the same way."""
    opts = {"gc_full_interval": 1} if gc_interval is None else {"gc_interval": gc_interval}
    m = hycache_mount(**opts)
    d = m.mountpoint / "d"
    d.mkdir()
    before = status(m)["gc"]
    for i in range(300):  # objects for the collector: inodes, journal and namespace rows
        (d / f"f{i}").write_bytes(b"x")
    for i in range(300):
        os.unlink(d / f"f{i}")
    assert not os.listdir(d)
    if gc_interval is None:
        assert before["paced"] and not before["automatic"] and before["interval_seconds"] == 0.2, before
        wait_for(lambda: status(m)["gc"]["collections"]["full"] >= before["collections"]["full"] + 2, 15,
                 "two full collections of the event loop")
        after = status(m)["gc"]
        # every 0.2 s: 2 s of full ones (2 of them) leave at least a few young ones between
        assert after["collections"]["middle"] >= before["collections"]["middle"] + 5, after
        assert after["collections"]["young"] == before["collections"]["young"], "automatic ones ran"
        assert not after["automatic"]
    else:
        assert not before["paced"] and before["automatic"] and before["full_interval_seconds"] is None, before
        after = status(m)["gc"]
        assert after["collections"]["young"] > before["collections"]["young"], (before, after)
    timed = "full" if gc_interval is None else "young"
    assert after["seconds"][timed] > 0 and after["cpu_seconds"][timed] > 0 and after["longest_ms"][timed] > 0, after


@pytest.mark.mount
def test_many_hard_links_come_and_go(hycache_mount):
    """An inode's names are a tuple up to a few and a set beyond (fs/namespace.py
    LINKS_IN_A_TUPLE): through both, every link counts, every name reads the bytes, and
    after a restart the names loaded from the database are the same."""
    m = hycache_mount()
    d = m.mountpoint / "d"
    d.mkdir()
    (d / "f").write_bytes(b"linked")
    for i in range(40):
        os.link(d / "f", d / f"l{i}")
        assert os.stat(d / "f").st_nlink == i + 2
    m = hycache_mount.remount(m)
    d = m.mountpoint / "d"
    assert os.stat(d / "f").st_nlink == 41 and (d / "l39").read_bytes() == b"linked"
    for n, i in enumerate([*range(0, 40, 2), *range(1, 40, 2)]):
        os.unlink(d / f"l{i}")
        assert os.stat(d / "f").st_nlink == 40 - n
    assert os.listdir(d) == ["f"] and (d / "f").read_bytes() == b"linked"

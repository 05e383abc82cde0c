"""Crash consistency: SIGKILL the agent in the middle of migrations of a large file and
restart it on the same root.  Every closed file must read back bit for bit, the large
file must be on exactly one tier, and the recovery pass must have removed the staged
copy (or the duplicate) — no temp or second blob may remain.  (DESIGN invariant 1.)
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

# bench/ is on pytest's pythonpath (pyproject.toml)
from slowtier import BLKIO, SlowTier

from .conftest import (
    check_tiers_from_outside,
    cli,
    commits_held,
    info,
    kill_agent,
    recovery_reports,
    status,
    tier_blobs,
    wait_for,
    wait_idle,
)

pytestmark = pytest.mark.mount

K, M = 1 << 10, 1 << 20
BIG = 320 * M


def digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * M):
            h.update(chunk)
    return h.hexdigest()


def write_files(root, files: dict[str, bytes]) -> None:
    for name, payload in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(payload)


def first_word(p) -> str:
    return p.stdout.split()[0] if p.stdout.split() else ""


def kill_during(m, path, tier: str, when) -> dict:
    """Start moving ``path`` to ``tier`` (CLI, --no-wait), SIGKILL the agent as soon as
    ``when(migration_info_or_None, file_info)`` is true; returns the last info seen."""
    p = cli("promote" if tier == "fast" else "demote", "--no-wait", path)
    assert p.returncode == 0, p.stderr
    seen = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = info(path)
        if when(seen.get("migration"), seen):
            break
    else:
        raise AssertionError(f"kill point never reached: {seen}")
    kill_agent(m)
    return seen


def test_sigkill_during_migrations(agents):
    m = agents.start("1G")
    big = m.mountpoint / "big"
    with open(big, "wb") as fh:
        block = hashlib.shake_256(b"big").digest(M)
        for i in range(BIG // M):
            fh.write(block[i % 7:] + block[:i % 7])  # every MiB different
    files = {f"d{i % 3}/f{i}": hashlib.shake_256(b"%d" % i).digest(1000 + 37_000 * i) for i in range(12)}
    write_files(m.mountpoint, files)
    sums = {name: hashlib.sha256(payload).hexdigest() for name, payload in files.items()}
    sums["big"] = digest(big)
    assert info(big)["tier"] == "fast"
    wait_idle(m)

    # (direction, kill condition on the migration's progress, expected leftovers)
    kill_points = [
        ("slow", lambda mig, i: mig is not None and mig["copied"] > 0, "temp"),
        ("slow", lambda mig, i: mig is not None and mig["copied"] >= mig["total"] // 2, "temp"),
        # promote back: the file is on slow after the previous (killed, rolled back) runs
        # only if a demotion finished — so first finish one, uninterrupted
        ("slow-done", None, None),
        ("fast", lambda mig, i: mig is not None and mig["copied"] >= mig["total"] // 3, "temp"),
        # as late as we can see: every byte copied, the fsync of the copy or the switch
        # is running (or, if we were too slow, it is over: nothing may be left either way)
        ("fast", lambda mig, i: i["tier"] == "fast" or (mig is not None and mig["copied"] >= mig["total"]), "any"),
    ]
    for n, (tier, when, leftover) in enumerate(kill_points):
        if when is None:
            assert first_word(cli("demote", big, check=True)) == "slow"
            continue
        before_tier = info(big)["tier"]
        # a file written and closed right before the crash (not fsync'd)
        late = m.mountpoint / f"late{n}"
        late.write_bytes(hashlib.shake_256(b"late%d" % n).digest(300 * K))
        sums[f"late{n}"] = digest(late)
        seen = kill_during(m, big, tier, when)

        dst_dir = m.fast if tier == "fast" else m.slow
        temps = [b for b in tier_blobs(dst_dir) if b.endswith(".migrating")]
        if leftover == "temp":
            assert temps, f"killed mid-copy ({seen}) but no staged copy on {tier}"

        m = agents.restart(m)
        report = recovery_reports(m.stderr)[-1]
        print(f"kill point {n}: {tier} copied {seen.get('migration', {}).get('copied')}, temps {len(temps)}, "
              f"recovery {report}")
        if leftover == "temp":
            assert report["temp_removed"] >= 1, report
            assert info(big)["tier"] == before_tier  # the switch never happened: old copy kept
        else:
            assert report["temp_removed"] + report["duplicates_removed"] <= 1, report
        assert report["missing_blobs"] == 0 and report["orphan_inodes_removed"] == 0, report
        for name, want in sums.items():
            assert digest(m.mountpoint / name) == want, f"{name} after kill point {n} ({tier}, {seen})"
        check_tiers_from_outside(m)
        assert not [b for b in {**tier_blobs(m.fast), **tier_blobs(m.slow)} if b.endswith(".migrating")]


def test_cli_on_a_dead_mount(agents):
    m = agents.start("1M")
    f = m.mountpoint / "f"
    f.write_bytes(b"x" * 1000)
    m.proc.kill()
    m.proc.wait(timeout=30)
    m._stopped = True
    try:
        p = cli("where", f)
        assert p.returncode == 3 and "not connected" in p.stderr and "Traceback" not in p.stderr, p.stderr
        p = cli("status", m.root)
        assert p.returncode == 3 and "no HyCache agent" in p.stderr, p.stderr
    finally:
        kill_agent(m)
    agents.restart(m)
    assert f.read_bytes() == b"x" * 1000
    wait_for(lambda: info(f)["size"] == 1000, what="the recovered size")



def test_sigkill_right_after_many_closes(agents):
    """A writer's close answers without waiting for the commit of the file's name (the
    name is in the redo log, fs/redolog.py).  The test holds SQLite's write lock, so no
    commit can happen: every close (and mkdir, symlink, unlink) must still return; then
    SIGKILL right after the last close, restart, and every closed file is there with its
    bytes.  (Renames and links still wait for their commit.)"""
    m = agents.start("1G")
    files = {}

    def write(i: int) -> None:
        name = f"d{i % 4}/f{i}"
        payload = hashlib.shake_256(b"c%d" % i).digest(1 + (i * 131) % 9000)
        p = m.mountpoint / name
        if i < 4:
            p.parent.mkdir()
        with open(p, "wb") as fh:
            fh.write(payload)
        files[name] = payload

    for i in range(100):  # committed as usual
        write(i)
    wait_idle(m)
    with commits_held(m):
        for i in range(100, 600):
            write(i)
            if i == 300:
                (m.mountpoint / "d1" / "f1").unlink()
                files.pop("d1/f1")
                (m.mountpoint / "late").mkdir()
            if i > 300:  # a new directory and names in it, none committed
                (m.mountpoint / "late" / f"f{i}").symlink_to(f"../d{i % 4}/f{i}")
                files[f"late/f{i}"] = files[f"d{i % 4}/f{i}"]
        kill_agent(m)
    m = agents.restart(m)
    report = recovery_reports(m.stderr)[-1]
    print(f"recovery after the kill: {report}")
    assert report["redo_replayed"] >= 500, report
    # the unlinked file's inode (its unlink replayed) is the one orphan
    assert report["missing_blobs"] == 0 and report["orphan_inodes_removed"] == 1, report
    for name, payload in files.items():
        assert (m.mountpoint / name).read_bytes() == payload, name
    assert sorted(str(p.relative_to(m.mountpoint)) for p in m.mountpoint.rglob("f*")) == sorted(files)
    check_tiers_from_outside(m)


@pytest.fixture
def hdd(tmp_path):
    """A slow device for the slow tier (the HDD model, bench/slowtier.py, 40 MB/s and 50
    IOPS: a group commit takes about a second); set up before ``agents``, so it is
    removed after their unmount."""
    if os.geteuid() != 0 or not (BLKIO / "blkio.throttle.write_iops_device").exists():
        pytest.skip("the HDD model needs root and the cgroup v1 blkio throttle")
    st = SlowTier(40, size="1G", base=tmp_path, iops=50)
    yield st
    st.close()


def test_sigkill_during_group_commits_on_a_slow_device(hdd, agents):
    """Files written and closed while evictions go in group commits to a slow device;
    SIGKILL the agent with a batch in flight (its copies staged, its syncfs or its metadata
    commit running), three times at different delays, restart on the same root: every
    closed file reads back bit for bit, on one tier, and no staged copy is left."""
    slow = hdd.share("a")
    m = agents.start("16M", slow=slow)
    m.slow = slow  # (where the checks from outside look for the slow tier's blobs)
    closed: dict[str, str] = {}
    hit = 0
    for rnd, delay in enumerate((0.0, 0.3, 0.7)):
        stop = threading.Event()

        def writer(rnd: int = rnd, stop: threading.Event = stop) -> None:
            for i in range(400):
                if stop.is_set():
                    return
                name = f"r{rnd}/f{i}"
                payload = hashlib.shake_256(b"%d/%d" % (rnd, i)).digest(200_000 + 1_000 * (i % 300))
                try:
                    (m.mountpoint / name).parent.mkdir(exist_ok=True)
                    with open(m.mountpoint / name, "wb") as fh:
                        fh.write(payload)
                except OSError:  # the agent was killed under this file: not closed, not counted
                    return
                closed[name] = hashlib.sha256(payload).hexdigest()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        wait_for(lambda: sum(a["reason"] == "evict" for a in status(m)["migrations"]["active"]) >= 2,
                 timeout=120, what="a batch of evictions in flight")
        time.sleep(delay)
        kill_agent(m)
        stop.set()
        t.join(30)
        m = agents.restart(m)
        m.slow = slow
        report = recovery_reports(m.stderr)[-1]
        print(f"round {rnd}: {len(closed)} files closed, recovery {report}")
        hit += report["temp_removed"] + report["duplicates_removed"]
        assert report["missing_blobs"] == 0, report
        for name, want in closed.items():
            assert digest(m.mountpoint / name) == want, f"{name} after the kill of round {rnd}"
        check_tiers_from_outside(m)
        assert not [b for b in {**tier_blobs(m.fast), **tier_blobs(m.slow)} if b.endswith(".migrating")]
    assert hit > 0, "no kill landed inside a group commit (no staged copy or duplicate to resolve)"

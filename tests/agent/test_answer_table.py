"""The request reader's answer table (fuse/answers.py; pyfuse3 patched here,
``hycache_answers.h``): GETATTR, LOOKUP and GETXATTR security.capability of local files
that are not open are answered in C, and every change through the mount or by the agent
itself is seen at once.

``stat --cached=never`` (statx with AT_STATX_FORCE_SYNC) makes the kernel ask for the
attributes whatever it has cached, so each check below is a GETATTR the agent or the
table answers; ``drop_caches`` makes the kernel forget names and inodes (LOOKUP, FORGET).
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hycache_harness import open_storm

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


def table(m) -> dict:
    t = status(m)["request_loop"]["answer_table"]
    assert t is not None, "pyfuse3 without the answer table (scripts/bootstrap.sh builds passthrough9)"
    return t


def unlinks_declined(before: dict, after: dict) -> dict[str, int]:
    """The UNLINKs the table handed on between two ``table`` readings, by the first
    condition that failed (only the reasons that counted)."""
    return {why: n - before["unlink_declined"][why] for why, n in after["unlink_declined"].items()
            if n > before["unlink_declined"][why]}


def attrs(path: Path) -> tuple[int, int, int, int]:
    """(size, links, mode bits, mtime seconds), asked of the file system itself."""
    out = subprocess.run(["stat", "--cached=never", "-c", "%s %h %a %Y", str(path)],
                         capture_output=True, text=True, check=True).stdout.split()
    size, links, mode, mtime = out
    return int(size), int(links), int(mode, 8), int(mtime)


def lending_mount(hycache_mount, **opts):
    """A mount whose parked registrations can be lent (kernel passthrough on), else a skip."""
    m = hycache_mount(**opts)
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("kernel passthrough is off here: no registration to lend")
    return m


def stocked_dir(m, name: str) -> Path:
    """A new directory of m whose names are all in the table (the agent answered "no such
    name" there) and a table holding pool blobs: where the reader answers CREATEs itself."""
    d = m.mountpoint / name
    d.mkdir()
    with pytest.raises(FileNotFoundError):
        os.stat(d / "nothing")  # the agent answers "no such name": the table has all of d's names
    (d / "warm").write_bytes(b"w")  # the table is given pool blobs at its drains
    wait_for(lambda: table(m)["pool"] > 0, 10, "pool blobs given to the table")
    return d


def drop_caches() -> None:
    Path("/proc/sys/vm/drop_caches").write_text("2")


def test_answers_from_the_table_follow_every_change(hycache_mount):
    m = hycache_mount()
    d = m.mountpoint / "d"
    d.mkdir()
    p = d / "f"
    p.write_bytes(b"x" * 100)
    assert table(m)["enabled"]

    before = table(m)["getattr"]
    assert attrs(p)[:2] == (100, 1)
    assert attrs(p)[:2] == (100, 1)
    assert table(m)["getattr"] >= before + 2, "a closed local file's GETATTR is answered by the table"

    os.chmod(p, 0o640)
    assert attrs(p)[2] == 0o640
    os.utime(p, ns=(1_500_000_000 * 10**9, 1_600_000_000 * 10**9))
    assert attrs(p)[3] == 1_600_000_000
    with open(p, "ab") as f:
        f.write(b"y" * 50)
        f.flush()
        assert attrs(p)[0] == 150  # open: the agent answers from the blob
    assert attrs(p)[0] == 150
    os.truncate(p, 10)
    assert attrs(p)[0] == 10

    os.link(p, d / "g")
    assert attrs(p)[1] == 2 and attrs(d / "g")[1] == 2
    os.unlink(d / "g")
    assert attrs(p)[1] == 1
    os.rename(p, d / "h")
    assert attrs(d / "h")[0] == 10
    assert not p.exists()

    links = attrs(d)[1]
    (d / "sub").mkdir()
    assert attrs(d)[1] == links + 1
    mtime = attrs(d)[3]
    os.utime(d, ns=(0, 0))
    assert attrs(d)[3] == 0 != mtime
    (d / "new").write_bytes(b"")
    assert attrs(d)[3] != 0, "a new name changes the directory's mtime, seen at once"


def test_security_capability_is_answered_until_one_is_set(hycache_mount):
    m = hycache_mount()
    p = m.mountpoint / "f"
    p.write_bytes(b"data")
    before = table(m)["getxattr"]
    with pytest.raises(OSError) as e:
        os.getxattr(p, "security.capability")
    assert e.value.errno == errno.ENODATA
    assert table(m)["getxattr"] == before + 1, "answered by the table"

    cap = struct.pack("<IIIII", 0x02000000, 0, 0, 0, 0)  # VFS_CAP_REVISION_2, no capabilities
    os.setxattr(p, "security.capability", cap)
    assert os.getxattr(p, "security.capability") == cap
    os.removexattr(p, "security.capability")
    with pytest.raises(OSError) as e:
        os.getxattr(p, "security.capability")
    assert e.value.errno == errno.ENODATA


def test_lookups_answered_by_the_table_are_counted_for_forget(hycache_mount):
    """A LOOKUP the table answers is a reference the kernel holds: the agent counts it
    (before anything else runs), so the files' blobs go once the kernel forgets them, and
    not before."""
    m = hycache_mount()

    def written() -> int:  # the blob pool's ready blobs are empty; the files' hold 4 KiB
        return sum(1 for size in tier_blobs(m.fast).values() if size == 4096)

    d = m.mountpoint / "many"
    d.mkdir()
    for i in range(60):
        (d / f"f{i}").write_bytes(b"z" * 4096)
    drop_caches()
    before = table(m)["lookup"]
    for i in range(60):
        assert attrs(d / f"f{i}")[0] == 4096
    assert table(m)["lookup"] >= before + 60, "each name looked up again from the table"

    assert written() == 60
    # removing the names keeps each open file whole
    fds = [os.open(d / f"f{i}", os.O_RDONLY) for i in range(0, 60, 10)]
    for i in range(60):
        os.unlink(d / f"f{i}")
    for fd in fds:
        assert os.pread(fd, 4096, 0) == b"z" * 4096
        os.close(fd)
    drop_caches()
    wait_for(lambda: written() == 0, 30, "the removed files' blobs to go")
    assert "answer table" not in m.log.read_text(), "lookups handed back for an inode already gone"


def test_off_answers_everything_in_python(hycache_mount):
    m = hycache_mount(no_answer_table=True)
    p = m.mountpoint / "f"
    p.write_bytes(b"abc")
    assert attrs(p)[0] == 3
    t = table(m)
    assert not t["enabled"] and t["getattr"] == 0 and t["lookup"] == 0


def test_no_such_name_is_answered_once_the_directory_is_complete(hycache_mount):
    """After one "no such name" from the agent, the table answers it for the directory's
    other missing names; every name made, removed or renamed through the mount is seen at
    once, and a removal that fails leaves the name as it was."""
    m = hycache_mount()
    d = m.mountpoint / "d"
    d.mkdir()
    for name in ("a", "b", "x" * 80):  # (a name longer than the table keeps)
        (d / name).write_bytes(name.encode())
    (d / "full").mkdir()
    (d / "full" / "inner").write_bytes(b"")

    before = table(m)["lookup_negative"]
    assert not any((d / f"missing{i}").exists() for i in range(30))
    assert table(m)["lookup_negative"] >= before + 29, "all but the first answered by the table"

    drop_caches()  # the kernel forgets names and negative entries: each LOOKUP comes again
    assert (d / "a").read_bytes() == b"a" and (d / ("x" * 80)).read_bytes() == b"x" * 80
    assert not (d / ("y" * 80)).exists()
    (d / "new").write_bytes(b"n")
    os.rename(d / "a", d / "renamed")
    os.rename(d / "b", d / "new")  # replaces a name
    os.unlink(d / "renamed")
    with pytest.raises(OSError) as e:
        os.rmdir(d / "full")  # refused: the name stays
    assert e.value.errno == errno.ENOTEMPTY
    drop_caches()
    assert sorted(os.listdir(d)) == sorted(["full", "new", "x" * 80])
    assert (d / "new").read_bytes() == b"b"
    assert (d / "full" / "inner").exists() and (d / "full").is_dir()
    for gone in ("a", "b", "renamed"):
        assert not (d / gone).exists()
    before = table(m)["lookup_negative"]
    assert not (d / "missing-again").exists()
    assert table(m)["lookup_negative"] == before + 1, "still complete after those changes"


def test_read_only_opens_of_closed_files_are_answered_with_their_registration(hycache_mount):
    """A closed fast-tier file keeps its passthrough registration (parked); the table
    answers read-only OPENs of it with that registration, and their RELEASEs. The agent
    counts them as its own opens: a writer beside such a reader shares the registration,
    a removal waits for the last close, a demotion for the file to be closed."""
    m = lending_mount(hycache_mount)
    p = m.mountpoint / "f"
    body = os.urandom(10_000)
    p.write_bytes(body)
    before = table(m)
    hits = info(p)["hits"]
    for _ in range(5):
        assert p.read_bytes() == body
    after = table(m)
    assert after["open_lent"] >= before["open_lent"] + 5, "read-only opens answered by the table"
    assert after["release_lent"] == after["open_lent"] + after["created_lent"], "and their releases (a create's too)"
    assert info(p)["hits"] >= hits + 5, "counted as the agent's opens"
    assert status(m)["counters"]["fast"]["hits"] >= 5

    # a writer while a reader the table answered holds the file: the same registration
    # (the kernel refuses an open without it: EIO), the reader sees the new bytes
    r = os.open(p, os.O_RDONLY)
    assert table(m)["open_lent"] == after["open_lent"] + 1
    w = os.open(p, os.O_WRONLY)
    os.pwrite(w, b"NEW", 0)
    os.close(w)
    assert os.pread(r, 3, 0) == b"NEW"
    os.fsync(r)  # a reader's fsync: the blob and the journal, through the agent
    assert attrs(p)[0] == 10_000
    # demoting an open file waits for its close; then its bytes are on the slow tier
    cli("demote", "--no-wait", p, check=True)
    assert os.pread(r, 10_000, 0) == b"NEW" + body[3:]
    os.close(r)
    wait_idle(m)
    assert cli("where", p, check=True).stdout.split()[0] == "slow"
    lent = table(m)["open_lent"]
    assert p.read_bytes() == b"NEW" + body[3:]
    assert table(m)["open_lent"] == lent, "a slow-tier file's opens are the agent's"

    # a removal while the table's reader holds the file: its bytes stay until the close
    q = m.mountpoint / "g"
    q.write_bytes(b"g" * 4096)
    r = os.open(q, os.O_RDONLY)
    assert table(m)["open_lent"] == lent + 1
    os.unlink(q)
    drop_caches()
    time.sleep(0.5)  # (a free would have happened by now)
    assert os.pread(r, 4096, 0) == b"g" * 4096
    assert sum(1 for size in tier_blobs(m.fast).values() if size == 4096) == 1, "kept while open"
    os.close(r)
    drop_caches()
    wait_for(lambda: not any(size == 4096 for size in tier_blobs(m.fast).values()), 30,
             "the removed file's blob to go after the last close")
    log = m.log.read_text()
    assert "no longer has" not in log and "a file that is gone" not in log


def test_opens_for_writing_are_answered_with_the_registration_standalone(hycache_mount):
    """Standalone, a closed fast-tier file's registration is lent for writers too: the
    table answers an OPEN for writing (not O_TRUNC) with it and drops the file's attributes,
    and the agent takes the size the kernel wrote from the blob at the last release — what
    it records survives a restart. O_TRUNC, a set-ID file and a tier past its high
    watermark stay the agent's."""
    m = lending_mount(hycache_mount)
    p = m.mountpoint / "f"
    body = os.urandom(8192)
    p.write_bytes(body)
    t0 = table(m)

    # O_RDWR (mdtest reads its files so): read, then grow it by a write
    fd = os.open(p, os.O_RDWR)
    t1 = table(m)
    assert t1["open_lent"] == t0["open_lent"] + 1 and t1["open_lent_writers"] == t0["open_lent_writers"] + 1
    assert os.pread(fd, 8192, 0) == body
    os.pwrite(fd, b"tail", 8192)
    assert attrs(p)[0] == 8196, "GETATTR while the writer is open: the blob's size"
    os.fsync(fd)
    os.close(fd)
    assert attrs(p)[0] == 8196
    # O_WRONLY | O_APPEND, closed, then the size asked of the agent itself (names and
    # inodes forgotten by the kernel: a fresh LOOKUP)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"more")
    os.close(fd)
    drop_caches()
    assert attrs(p)[0] == 8200
    t2 = table(m)
    assert t2["open_lent_writers"] == t0["open_lent_writers"] + 2
    assert t2["release_lent"] == t2["open_lent"] + t2["created_lent"], "every release answered by the table"
    wait_for(lambda: info(p)["size"] == 8200, 10, "the agent's record of the size")

    # what the table left the agent stays: O_TRUNC opens, a set-ID file's writers
    p.write_bytes(b"x" * 100)  # O_TRUNC
    assert table(m)["open_lent_writers"] == t2["open_lent_writers"]
    os.chmod(p, 0o4755)
    fd = os.open(p, os.O_WRONLY)
    os.close(fd)
    assert table(m)["open_lent_writers"] == t2["open_lent_writers"], "a set-ID file's writers are the agent's"
    os.chmod(p, 0o644)
    lent = table(m)["lent"]  # (not p's: a set-ID file's registration is not lent)
    fd = os.open(p, os.O_RDWR)  # (parked again after the last open: lent to writers again)
    os.close(fd)
    # the kernel sends the RELEASE after close returns, and the reader thread reads the
    # next OPEN while the agent may still be at it: the next open is the table's once
    # the registration is lent again
    wait_for(lambda: table(m)["lent"] == lent + 1, 10, "the registration lent again after the release")
    fd = os.open(p, os.O_RDWR)
    os.close(fd)
    assert table(m)["open_lent_writers"] == t2["open_lent_writers"] + 1

    # the sizes written through lent opens are in the journal: a restart sees them
    q = m.mountpoint / "g"
    q.write_bytes(b"g" * 4096)
    with open(q, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"h" * 904)
    assert table(m)["open_lent_writers"] == t2["open_lent_writers"] + 2
    m = hycache_mount.remount(m)
    q = m.mountpoint / "g"
    assert q.stat().st_size == 5000 and q.read_bytes() == b"g" * 4096 + b"h" * 904
    assert (m.mountpoint / "f").read_bytes() == b"x" * 100
    log = m.log.read_text()
    assert "no longer has" not in log and "a file that is gone" not in log


def test_a_full_tier_takes_writers_opens_back(hycache_mount):
    """Past the fast tier's high watermark a writer's open goes to the agent (which can
    spill it to the slow tier): the registrations lent for writers are lent for readers
    only."""
    m = lending_mount(hycache_mount, fast_capacity=str(1 << 20))
    p = m.mountpoint / "small"
    p.write_bytes(b"s" * 4096)
    cli("pin", p, check=True)  # (not evicted to make room: still parked, still lent)
    fd = os.open(p, os.O_RDWR)
    os.close(fd)
    w = table(m)["open_lent_writers"]
    assert w >= 1
    (m.mountpoint / "big").write_bytes(b"b" * (950 << 10))  # past the high watermark
    assert cli("where", p, check=True).stdout.split()[0] == "fast"
    lent, regs = table(m)["open_lent"], table(m)["lent"]
    fd = os.open(p, os.O_RDWR)
    os.close(fd)
    assert table(m)["open_lent_writers"] == w, "a writer of a full tier is the agent's"
    # the kernel sends the agent's RELEASE after close returns: the registration is lent
    # (for readers) again once the agent processed it (1 run in 4 opened before that)
    wait_for(lambda: table(m)["lent"] == regs, 10, "the registration lent again after the release")
    fd = os.open(p, os.O_RDONLY)
    os.close(fd)
    assert table(m)["open_lent"] >= lent + 1, "readers still answered by the table"


def test_no_answer_opens_answers_them_in_python(hycache_mount):
    m = hycache_mount(no_answer_opens=True)
    p = m.mountpoint / "f"
    p.write_bytes(b"abc")
    for _ in range(3):
        assert p.read_bytes() == b"abc"
    t = table(m)
    assert t["enabled"] and t["open_lent"] == 0 and t["lent"] == 0


def test_unlinks_answered_by_the_table_are_logged_before_the_reply(agents):
    """The reader answers the UNLINK of a closed file's name itself, and logs it in the
    agent's redo log first: with SQLite's write lock held (no commit can happen), the
    removals answered by the table survive a SIGKILL right after the last one, and the
    agent's own records (creates, mkdir) stay in the same ring, in order."""
    m = agents.start("1G")
    if not table(m)["enabled"]:
        pytest.skip("the answer table is off")
    d = m.mountpoint / "d"
    d.mkdir()
    names = [f"f{i}" for i in range(240)]
    for n in names:
        (d / n).write_bytes(n.encode() * 50)
    wait_idle(m)
    for n in names:
        attrs(d / n)
    keep = set(names[::3])
    with commits_held(m):  # only the redo log keeps what follows
        before = table(m)["unlink"]
        for n in names:
            if n not in keep:
                os.unlink(d / n)
            if n == "f100":  # the agent's own records between the table's
                (m.mountpoint / "late").mkdir()
                (m.mountpoint / "late" / "g").write_bytes(b"made between removals")
        answered = table(m)["unlink"] - before
        assert answered >= len(names) - len(keep) - 2, f"{answered} UNLINKs answered by the table"
        assert set(os.listdir(d)) == keep
        with pytest.raises(FileNotFoundError):
            os.stat(d / "f1")
        kill_agent(m)
    m = agents.restart(m)
    report = recovery_reports(m.stderr)[-1]
    print(f"{answered} UNLINKs answered by the table; recovery after the kill: {report}")
    assert report["redo_replayed"] >= len(names) - len(keep) + 2, report
    assert report["missing_blobs"] == 0, report
    assert set(os.listdir(m.mountpoint / "d")) == keep
    for n in keep:
        assert (m.mountpoint / "d" / n).read_bytes() == n.encode() * 50
    assert (m.mountpoint / "late" / "g").read_bytes() == b"made between removals"
    check_tiers_from_outside(m)


def test_unlinks_the_table_answers_leave_what_the_agent_must_see(hycache_mount):
    """Only closed regular files are removed by the table: an open file's name, a
    directory and a second link go to the agent (or are answered as the agent would:
    the other link's count), and the agent's view follows every removal at once —
    the directory's listing and times, the files' blobs once the kernel forgets them."""
    m = hycache_mount()
    if not table(m)["enabled"]:
        pytest.skip("the answer table is off")
    d = m.mountpoint / "d"
    d.mkdir()
    for i in range(20):
        (d / f"f{i}").write_bytes(b"q" * 4096)
    os.link(d / "f0", d / "hard")
    (d / "sub").mkdir()
    for i in range(20):
        attrs(d / f"f{i}")
    fd = os.open(d / "f1", os.O_RDWR)
    before = table(m)
    t0 = time.time()
    os.unlink(d / "f1")  # open through the agent: its attributes are not the table's
    os.unlink(d / "hard")
    for i in range(2, 20):
        os.unlink(d / f"f{i}")
    after = table(m)
    answered, declined = after["unlink"] - before["unlink"], unlinks_declined(before, after)
    assert answered >= 17, declined
    # every UNLINK the table did not answer is counted under the condition that failed;
    # the open file's among them (its attributes are the agent's while it is open)
    assert answered + sum(declined.values()) == 20 and declined.get("file_attr", 0) >= 1, declined
    assert attrs(d / "f0")[1] == 1, "the other name's link count"
    assert os.pread(fd, 4096, 0) == b"q" * 4096
    os.close(fd)
    with pytest.raises(OSError) as e:
        os.unlink(d / "sub")
    assert e.value.errno in (errno.EISDIR, errno.EPERM)
    assert sorted(os.listdir(d)) == ["f0", "sub"]
    assert attrs(d)[3] >= int(t0), "the directory's mtime is the removals'"
    drop_caches()
    wait_for(lambda: sum(1 for size in tier_blobs(m.fast).values() if size == 4096) == 1, 30,
             "the removed files' blobs to go")
    assert "answer table" not in m.log.read_text()


def test_a_creates_open_is_lent_and_its_release_answered_by_the_table(agents):
    """A create's open is answered with the new file's pooled registration lent for
    writers (the kernel writes the blob itself): its RELEASE is the table's, the size is
    taken from the blob at the drained release and the attributes are the table's again
    after it; a set-ID or O_DIRECT create stays the agent's; what was written survives a
    SIGKILL right after the closes."""
    m = agents.start("1G")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("kernel passthrough is off here: no registration to lend")
    d = m.mountpoint / "c"
    d.mkdir()
    before = table(m)
    bodies = {f"f{i}": b"%d," % i * (100 + 37 * i) for i in range(60)}
    for name, body in bodies.items():
        (d / name).write_bytes(body)
    after = table(m)
    assert after["created_lent"] - before["created_lent"] >= 55, "creates' opens lent"
    assert after["release_lent"] - before["release_lent"] >= 55, "their releases answered by the table"
    for name, body in bodies.items():
        assert attrs(d / name)[0] == len(body)
    g0 = table(m)["getattr"]
    for name in bodies:
        attrs(d / name)
    assert table(m)["getattr"] >= g0 + 55, "the closed files' attributes are the table's again"
    # a file mapped shared through the create's O_RDWR descriptor: stores after the last
    # write(2) show in its size and bytes once closed
    fd = os.open(d / "mapped", os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, 8192)
    import mmap
    with mmap.mmap(fd, 8192) as mm:
        mm[4096:4100] = b"MAPD"
    os.close(fd)
    assert (d / "mapped").read_bytes()[4096:4100] == b"MAPD"
    lent = table(m)["created_lent"]
    fd = os.open(d / "setid", os.O_CREAT | os.O_WRONLY, 0o2755)
    os.write(fd, b"x")
    os.close(fd)
    fd = os.open(d / "direct", os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    os.close(fd)
    assert table(m)["created_lent"] == lent, "set-ID and O_DIRECT creates are the agent's"
    bodies["mapped"] = (d / "mapped").read_bytes()
    bodies["setid"] = b"x"
    bodies["direct"] = b""
    for name, body in bodies.items():
        with open(d / name, "r+b") as f:  # written again through lent writers' opens
            f.seek(0, os.SEEK_END)
            f.write(b"+")
        bodies[name] = body + b"+"
    kill_agent(m)
    m = agents.restart(m)
    for name, body in bodies.items():
        assert (m.mountpoint / "c" / name).read_bytes() == body, name
    check_tiers_from_outside(m)


def test_creates_answered_by_the_table_are_logged_before_the_reply(agents):
    """In a directory whose names are all in the table, the reader answers a CREATE itself
    with a pool blob the agent gave it: the create is in the redo log before the reply (with
    SQLite's write lock held, creates, writes and removals answered by the table survive a
    SIGKILL right after), a name that exists goes to the agent (EEXIST), a set-group-ID
    directory's group is the new file's, and a name removed and made again in one burst
    ends as the last create made it."""
    m = agents.start("1G")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("kernel passthrough is off here: no registration to lend")
    d = stocked_dir(m, "d")
    bodies = {}
    with commits_held(m):  # only the redo log keeps what follows
        before = table(m)["create"]
        for i in range(40):
            name = f"n{i}"
            bodies[name] = b"%d;" % i * (i + 1)
            (d / name).write_bytes(bodies[name])
        made = table(m)["create"] - before
        assert made >= 35, f"{made} CREATEs answered by the table"
        with pytest.raises(FileExistsError):
            os.open(d / "n3", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        for _ in range(3):  # removed and made again: the drain keeps their order
            os.unlink(d / "n5")
            (d / "n5").write_bytes(b"again")
        bodies["n5"] = b"again"
        os.unlink(d / "n6")
        bodies.pop("n6")
        for name, body in bodies.items():
            assert (d / name).read_bytes() == body, name
        kill_agent(m)
    m = agents.restart(m)
    report = recovery_reports(m.stderr)[-1]
    assert report["redo_replayed"] >= 40, report
    assert report["missing_blobs"] == 0, report
    d = m.mountpoint / "d"
    assert set(os.listdir(d)) == set(bodies) | {"warm"}
    for name, body in bodies.items():
        assert (d / name).read_bytes() == body, name
    check_tiers_from_outside(m)
    # a set-group-ID directory: the new file takes its group, as the agent's create does
    g = m.mountpoint / "g"
    g.mkdir()
    os.chown(g, 0, 4242)
    os.chmod(g, 0o2775)
    with pytest.raises(FileNotFoundError):
        os.stat(g / "nothing")
    (g / "a").write_bytes(b"a")
    before = table(m)["create"]
    (g / "b").write_bytes(b"b")
    assert os.stat(g / "a").st_gid == os.stat(g / "b").st_gid == 4242
    assert table(m)["create"] >= before  # (whichever answered it, the group is the directory's)


def fuse_connection(mountpoint: Path) -> Path:
    """The fusectl directory of the FUSE connection behind ``mountpoint`` (fusectl is
    mounted if it is not)."""
    conns = Path("/sys/fs/fuse/connections")
    if not any(conns.iterdir()):
        subprocess.run(["mount", "-t", "fusectl", "none", str(conns)], capture_output=True)
    dev = os.stat(mountpoint).st_dev
    conn = conns / str(os.minor(dev))
    if not (conn / "abort").exists():
        pytest.skip("no fusectl here: the connection cannot be aborted")
    return conn


def test_what_the_table_answered_right_before_an_abort_is_kept(agents):
    """The connection is aborted while a writer's creates and removals are answered by the
    table back to back: the agent exits cleanly (its last commit checkpoints the redo log),
    and every create and removal whose call returned is there after a restart — the reader
    hands what it answered to the agent before its session ends, not after."""
    import threading

    m = agents.start("1G")
    if not status(m)["passthrough"]["enabled"]:
        pytest.skip("kernel passthrough is off here: no pool blobs for the table")
    d = stocked_dir(m, "d")
    conn = fuse_connection(m.mountpoint)
    made: list[str] = []
    removed: list[str] = []

    def writer() -> None:
        i = 0
        while True:
            try:
                fd = os.open(d / f"a{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
                os.close(fd)
                made.append(f"a{i}")
                if i % 50 == 0 and i >= 50:  # (an unlink's LOOKUP of a file just made is the agent's)
                    os.unlink(d / f"a{i - 50}")
                    removed.append(f"a{i - 50}")
            except OSError:
                return
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: len(made) > 300, 30, "creates answered")
    (conn / "abort").write_text("1")
    t.join(30)
    assert not t.is_alive()
    assert m.proc.wait(timeout=60) == 0, "the agent exits cleanly after an abort"
    m._stopped = True
    subprocess.run(["fusermount3", "-uz", str(m.mountpoint)], capture_output=True)
    wait_for(lambda: not os.path.ismount(m.mountpoint), 10, "the aborted mount to go away")
    m = agents.restart(m)
    names = set(os.listdir(m.mountpoint / "d"))
    want = set(made) - set(removed)
    assert want <= names, f"{len(want - names)} files created before the abort are gone"
    assert not (set(removed) & names), "files removed before the abort are back"
    check_tiers_from_outside(m)


def fresh_stat(path: Path) -> tuple[int, int, int, int]:
    """(size, mode bits, mtime ns, ctime ns) asked of the file system itself, in this
    process (statx with AT_STATX_FORCE_SYNC: a GETATTR whatever the kernel has cached),
    so that it can follow a close at once."""
    import ctypes

    buf = ctypes.create_string_buffer(256)
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, force_sync, basic_stats = -100, 0x2000, 0x7FF
    if libc.statx(at_fdcwd, os.fsencode(path), force_sync, basic_stats, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(path))
    raw = buf.raw
    mode = struct.unpack_from("<H", raw, 28)[0]
    size = struct.unpack_from("<Q", raw, 40)[0]

    def ts(off: int) -> int:
        sec, nsec = struct.unpack_from("<qI", raw, off)
        return sec * 10**9 + nsec

    return size, mode & 0o7777, ts(112), ts(96)  # stx_mtime, stx_ctime


def test_a_closed_writers_attributes_are_answered_again_by_the_table(hycache_mount):
    """The attributes of a file written only through lent opens are answered by the table
    again at the last lent release (created files' too, marked removable), with the size
    and times the agent takes from the blob — the same the agent answers once it has seen
    the release — unless the agent was asked anything about the file in between (a chmod,
    a truncate, an fsync while it was open): then they stay the agent's to give.  (Without
    the reader thread: the event loop reads the requests, the table answers there.)"""
    m = lending_mount(hycache_mount, no_reader_thread=True)
    assert not (status(m)["request_loop"]["reader_thread"] or {}).get("running")
    if "restored" not in table(m):
        pytest.skip("pyfuse3 before passthrough20: no attributes restored at release")
    d = stocked_dir(m, "w")
    t0 = table(m)
    seen: dict[str, tuple[int, int, int, int]] = {}
    for i in range(40):  # created by the table, written, closed, asked at once
        fd = os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o640)
        os.write(fd, b"c" * (100 * i))
        os.close(fd)
        seen[f"f{i}"] = fresh_stat(d / f"f{i}")
    for i in range(0, 40, 2):  # O_RDWR: read only, and grown by a write
        fd = os.open(d / f"f{i}", os.O_RDWR)
        os.read(fd, 10)
        if i % 4 == 0:
            os.pwrite(fd, b"+", 100 * i)
        os.close(fd)
        seen[f"f{i}"] = fresh_stat(d / f"f{i}")
    t1 = table(m)
    assert t1["create"] - t0["create"] >= 35, "the table made the files"
    assert t1["restored"] - t0["restored"] >= 50, "their attributes answered again at the last release"
    for name, (size, mode, mtime, ctime) in seen.items():
        i = int(name[1:])
        assert size == 100 * i + (1 if i % 4 == 0 else 0) and mode == 0o640, name
        assert mtime == ctime, name  # (a create's times, or the later write's)

    # what the table answered is what the agent answers once it has seen the releases
    # (a GETATTR the agent answers: the files' attributes dropped by a rename of the dir)
    wait_for(lambda: all(info(d / n)["size"] == seen[n][0] for n in seen), 10, "the agent's sizes")
    os.rename(d, m.mountpoint / "w2")
    d = m.mountpoint / "w2"
    for name, st in seen.items():
        assert fresh_stat(d / name) == st, name
    t2 = table(m)
    for i in range(0, 40, 10):  # removable: the table answers their UNLINKs
        os.unlink(d / f"f{i}")
    assert table(m)["unlink"] - t2["unlink"] >= 3

    # a request the agent answers about the file while it is open: no restore of what the
    # table kept aside (the mode, the size, the times would be stale)
    p = d / "f1"
    fd = os.open(p, os.O_RDWR)
    os.chmod(p, 0o600)
    os.pwrite(fd, b"x", 0)
    os.close(fd)
    assert fresh_stat(p)[1] == 0o600
    fd = os.open(p, os.O_RDWR)
    os.truncate(p, 7)
    os.close(fd)
    assert fresh_stat(p)[0] == 7
    fd = os.open(p, os.O_WRONLY)
    os.write(fd, b"abc")
    os.fsync(fd)  # (the agent answers the FSYNC: it may change what it records)
    os.close(fd)
    assert fresh_stat(p)[0] == 7 and p.read_bytes() == b"abccccc"
    assert "answer table" not in m.log.read_text()


def test_the_reader_thread_answers_a_mixed_load_and_stops_at_once(hycache_mount):
    """``--reader-thread``: a native thread reads /dev/fuse, answers what the table can
    without the GIL and queues the rest for the event loop. Four writers make, read,
    rename and remove files at once; every file reads back whole, the listing is what the
    writers left, the thread answered most requests and queued the rest, what the table
    answered is the agent's (sizes, removals) and SIGTERM ends the agent at once (the loop
    waits on the thread's eventfd, which the signal's terminate must wake: it waited for
    the harness's kill before)."""
    import threading

    m = hycache_mount(reader_thread=True)
    rt = status(m)["request_loop"]["reader_thread"]
    assert rt is not None and rt["running"], rt
    errors: list[str] = []

    def writer(w: int) -> None:
        d = m.mountpoint / f"w{w}"
        d.mkdir()
        try:
            for i in range(300):
                body = f"{w}:{i}:".encode() * 64
                (d / f"f{i}").write_bytes(body)
                if (d / f"f{i}").read_bytes() != body:
                    errors.append(f"w{w} f{i}: read back wrong")
                if i % 3 == 0:
                    os.rename(d / f"f{i}", d / f"r{i}")
                elif i % 3 == 1:
                    os.unlink(d / f"f{i}")
        except OSError as e:
            errors.append(f"w{w}: {e!r}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for w in range(4):
        names = sorted(os.listdir(m.mountpoint / f"w{w}"))
        want = sorted([f"r{i}" for i in range(0, 300, 3)] + [f"f{i}" for i in range(2, 300, 3)])
        assert names == want, w
        assert (m.mountpoint / f"w{w}" / "r3").read_bytes() == f"{w}:3:".encode() * 64
    wait_for(lambda: all(info(m.mountpoint / f"w{w}" / "f2")["size"] == len(f"{w}:2:".encode() * 64)
                         for w in range(4)), 10, "the agent's record of sizes the kernel wrote")
    rt = status(m)["request_loop"]["reader_thread"]
    t = table(m)
    if status(m)["passthrough"]["enabled"]:
        assert rt["answered"] > rt["queued"] > 0, rt
        assert t["create"] > 0 and t["getattr"] > 0, t
    else:  # no open and no create is the table's without registrations: fewer answers
        assert rt["answered"] > 0 and rt["queued"] > 0, rt
        assert t["getattr"] > 0, t
    t0 = time.monotonic()
    rc = m.unmount()
    took = time.monotonic() - t0
    assert rc == 0 and took < 5, (rc, took)


def test_what_the_table_answers_reaches_the_agent_within_its_lag_under_a_constant_stream(hycache_mount):
    """The reader thread hands what the table answered to the agent after a burst (a pause
    of 1 ms), when the agent needs it, and at the latest 100 ms after the oldest answer
    not handed over: under a stream of requests the table answers without a pause (two
    processes opening and closing a file in a loop: lent opens), ten removals the table
    answered still free their files' space in the agent within seconds (a fraction of one on
    a quiet machine), while the stream goes on (waiting for a pause, they would wait for its
    end: eight seconds)."""

    m = lending_mount(hycache_mount)
    rt = status(m)["request_loop"]["reader_thread"]
    if not (rt and rt["running"]) or not table(m)["enabled"]:
        pytest.skip("no reader thread or answer table here")
    d = m.mountpoint / "d"
    d.mkdir()
    for i in range(10):
        (d / f"f{i}").write_bytes(b"r" * 65536)
    (d / "hot").write_bytes(b"h")
    # the writers' closes settled first (their sizes taken, which drops their attributes
    # from the table: offered before that, a file under a loaded machine was not removable)
    wait_for(lambda: status(m)["tiers"]["fast"]["used"] >= 10 * 65536, 10, "the files' bytes counted")
    wait_idle(m)
    for i in range(10):
        attrs(d / f"f{i}")  # closed, their attributes offered: removable by the table
    used0 = status(m)["tiers"]["fast"]["used"]
    stream = open_storm(d / "hot", 8)
    try:
        time.sleep(0.5)
        before = table(m)
        for i in range(10):
            os.unlink(d / f"f{i}")
        t0 = time.monotonic()
        wait_for(lambda: status(m)["tiers"]["fast"]["used"] <= used0 - 10 * 65536, 5,
                 "the removals' freed space in the agent during the stream")
        took = time.monotonic() - t0
        streaming = all(p.poll() is None for p in stream)
        after = table(m)
    finally:
        for p in stream:
            p.wait(timeout=30)
    assert streaming, "the stream ended before the agent freed the removed files"
    # (all ten on a quiet machine; on a loaded one the loop of unlinks can straddle a drain,
    # and one or two that come while the agent takes over the ones before them are declined
    # by the table and answered by the agent — correct either way: seen 8 and 9 of 10 under
    # two busy loops, 1 run in 10-20)
    assert after["unlink"] - before["unlink"] >= 8, \
        f"the table answered the removals (declined: {unlinks_declined(before, after)})"
    # the stream's opens went on in the table meanwhile (the agent answering them instead
    # would leave ~0 here; the count follows the machine's load: ~1,500 on a quiet one,
    # 700-800 with both cores busy elsewhere, 170 beside a CI run and a probe)
    assert after["open_lent"] - before["open_lent"] > 50, "the table answered the stream meanwhile"
    assert took < 3.0, took


def test_a_closed_files_size_reaches_the_agent_with_no_request_after_it(hycache_mount):
    """A file the table created, written and closed (its RELEASE answered by the table) is
    the agent's, with its size, within a pause of the reader — with no request after it to
    carry it (the node may have none: a job wrote its output and ended).  Each round closes
    the file while the event loop processes a request of its own (a mkdir from another
    thread), the moment when the loop decides to wait while the reader answers: with the
    decision made on a look at the answers outside the lock, the loop could wait for a
    wake-up the reader never sent (it had found the loop busy), and the size stayed
    unknown until the next request (a Slurm stage-in waited 60 s for a file's published
    size in CI)."""
    m = lending_mount(hycache_mount)
    rt = status(m)["request_loop"]["reader_thread"]
    if not (rt and rt["running"]) or not table(m)["enabled"]:
        pytest.skip("no reader thread or answer table here")
    d = stocked_dir(m, "d")
    busy = m.mountpoint / "busy"
    busy.mkdir()
    wait_idle(m)
    rounds, late = 1000, []
    start = threading.Barrier(2)

    def mkdirs() -> None:
        for i in range(rounds):
            start.wait()
            os.mkdir(busy / f"b{i}")
            start.wait()

    t = threading.Thread(target=mkdirs)
    t.start()
    try:
        used = status(m)["tiers"]["fast"]["used"]
        for i in range(rounds):
            start.wait()
            with open(d / f"f{i}", "wb") as f:
                f.write(b"s" * 4096)
            start.wait()
            t0 = time.monotonic()
            while status(m)["tiers"]["fast"]["used"] < used + 4096:  # (the control socket: no FUSE request)
                if time.monotonic() - t0 > 2.0:
                    late.append(i)
                    break
                time.sleep(0.002)
            used = status(m)["tiers"]["fast"]["used"]
            if late and late[-1] == i:
                os.stat(d / f"f{i}")  # (a request: it carries the size; the next round starts even)
                wait_for(lambda: status(m)["tiers"]["fast"]["used"] >= used + 4096, 10, "the size after a request")
                used = status(m)["tiers"]["fast"]["used"]
    finally:
        start.abort()
        t.join()
    assert table(m)["create"] >= rounds // 2, "the table answered the creates"
    assert not late, f"rounds whose closed file's size the agent did not learn within 2 s: {late}"


def reader_thread(pid: int) -> tuple[int, int]:
    """(thread id, nice value) of the agent's native request reader, seen from outside."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == "hycache-reader":
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            return int(tid), int(stat[stat.rindex(")") + 2:].split()[16])  # field 19: nice
    raise AssertionError(f"no hycache-reader thread in agent {pid}")


@pytest.mark.parametrize("nice", [None, 3])
def test_the_reader_thread_runs_at_its_nice_value(hycache_mount, nice):
    """The native reader is its own named thread at --reader-nice (default -19, ahead of
    the callers it wakes and of the agent's background work), the process's other
    threads at theirs; it answers as before."""
    m = hycache_mount(**({} if nice is None else {"reader_nice": nice}))
    want = -19 if nice is None else nice
    wait_for(lambda: status(m)["request_loop"]["reader_thread"]["nice"] == want, 10,
             f"the reader thread at nice {want}")
    pid = m.proc.pid
    tid, seen = reader_thread(pid)
    assert seen == want and tid != pid
    assert os.getpriority(os.PRIO_PROCESS, pid) == 0, "the event loop keeps the process's nice value"
    p = m.mountpoint / "f"
    p.write_bytes(b"abc")
    before = table(m)["getattr"]
    for _ in range(20):
        assert attrs(p)[0] == 3
    assert table(m)["getattr"] >= before + 20

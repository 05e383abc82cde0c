"""The redo log (fs/redolog.py): its records, the ring, a torn record, and the replay of
what a crash left only there (the engine without a mount: the kill is simulated by
dropping the engine before any commit)."""

from __future__ import annotations

import os
import resource
import stat
import threading

import trio
from hycache_agent.fs import redolog
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import ROOT_INO
from hycache_agent.fs.redolog import START, RedoLog

from .harness import engine_config, run_engine
from .invariants import check_invariants

M = 1 << 20


def test_records_survive_a_reopen(tmp_path):
    log = RedoLog(tmp_path / "redo.log", size=1 << 16)
    payloads = [
        redolog.create(ROOT_INO, b"f", 7, stat.S_IFREG | 0o644, 1000, 100, 0, None, "fast", 123),
        redolog.create(ROOT_INO, b"l", 8, stat.S_IFLNK | 0o777, 0, 0, 0, b"target", None, 124),
        redolog.link(7, ROOT_INO, b"g"),
        redolog.unlink(ROOT_INO, b"f", False),
        redolog.rename(ROOT_INO, b"g", 9, b"h" * 255, 1),
    ]
    assert [log.append(p) for p in payloads] == [1, 2, 3, 4, 5]
    log.close()
    again = RedoLog(tmp_path / "redo.log", size=1 << 16)
    recs = again.pending(0)
    assert [seq for seq, _ in recs] == [1, 2, 3, 4, 5]
    assert [redolog.decode(p) for _, p in recs] == [
        ("create", ROOT_INO, b"f", 7, stat.S_IFREG | 0o644, 1000, 100, 0, None, "fast", 123),
        ("create", ROOT_INO, b"l", 8, stat.S_IFLNK | 0o777, 0, 0, 0, b"target", None, 124),
        ("link", 7, ROOT_INO, b"g"),
        ("unlink", ROOT_INO, b"f", False),
        ("rename", ROOT_INO, b"g", 9, b"h" * 255, 1),
    ]
    assert [seq for seq, _ in again.pending(3)] == [4, 5]
    assert again.last_seq == 5 and again.append(redolog.link(7, ROOT_INO, b"x")) == 6


def test_a_torn_record_at_the_end_is_ignored(tmp_path):
    log = RedoLog(tmp_path / "redo.log", size=1 << 16)
    for i in range(3):
        log.append(redolog.link(10 + i, ROOT_INO, b"n%d" % i))
    end = log.pos
    # a crash in the middle of the 4th record: its payload is there, its header half
    payload = redolog.link(13, ROOT_INO, b"n3")
    log._mm[end + 16:end + 16 + len(payload)] = payload
    log._mm[end:end + 4] = len(payload).to_bytes(4, "little")
    log.close()
    again = RedoLog(tmp_path / "redo.log", size=1 << 16)
    assert [redolog.decode(p)[1] for _, p in again.pending(0)] == [10, 11, 12]
    # a flipped byte in the last whole record ends the scan before it
    again._mm[end - 1:end] = b"\xff" if again._mm[end - 1:end] != b"\xff" else b"\0"
    assert [seq for seq, _ in again.records()] == [1, 2]


def test_the_ring_starts_over_only_once_everything_is_checkpointed(tmp_path):
    log = RedoLog(tmp_path / "redo.log", size=START + 200)
    payload = redolog.link(1, ROOT_INO, b"x" * 20)  # 1 + 18 + 20 bytes + a 16-byte header
    seqs = []
    while (seq := log.append(payload)) is not None:
        seqs.append(seq)
    assert seqs == [1, 2, 3] and log.refused == 1
    log.checkpoint = 2
    assert log.append(payload) is None  # record 3 is not committed yet
    log.checkpoint = 3
    assert log.append(payload) == 4 and log.pos < START + 100  # at the front again
    log.close()
    again = RedoLog(tmp_path / "redo.log", size=START + 200)
    assert [seq for seq, _ in again.records()] == [4]  # the old lap after it is not read
    assert [seq for seq, _ in again.pending(3)] == [4]


def _crashed_engine(root, body):
    """Start an engine, run ``await body(engine)`` with no background task (nothing is
    committed after start-up), then drop it as a SIGKILL would: no close, no commit."""
    engine = TieringEngine(engine_config(root, fast_capacity=M))
    engine.start()
    result = trio.run(body, engine)
    engine.store._db.close()
    engine.ns.journal.redo.close()
    for h in engine.handles.values():
        h.close_all()
    return result


def test_names_closed_before_a_crash_are_replayed(tmp_path):
    async def body(e):
        ns = e.ns
        d = ns.new_inode(ROOT_INO, b"d", stat.S_IFDIR | 0o755, 0, 0)
        files = {}
        for i in range(20):
            inode = await e.create_file(d.ino, b"f%d" % i, stat.S_IFREG | 0o640, 1000, 1000)
            fh = await e.open(inode, os.O_WRONLY, 0, created=True)
            await e.write(fh, 0, b"bytes of %d" % i * (i + 1))
            await e.flush(fh)
            assert inode.name_seq == 0  # in the redo log: the close did not wait for a commit
            await e.release(fh)
            files[b"f%d" % i] = b"bytes of %d" % i * (i + 1)
        ns.link(ns.lookup(d.ino, b"f1").ino, ROOT_INO, b"hard")
        e.ns.rename(d.ino, b"f2", ROOT_INO, b"moved", 0)
        files.pop(b"f2")
        gone = e.ns.unlink(d.ino, b"f3", rmdir=False)
        await e.maybe_free(gone)
        files.pop(b"f3")
        ns.new_inode(d.ino, b"sym", stat.S_IFLNK | 0o777, 0, 0, target=b"f0")
        assert e.ns.journal.pending > 0  # nothing committed since start-up
        return files

    files = _crashed_engine(tmp_path, body)

    async def after(h):
        assert h.report["redo_replayed"] == 25, h.report
        ns = h.ns
        d = ns.lookup(ROOT_INO, b"d")
        assert set(ns.dir(d.ino)) == set(files) | {b"sym"}
        for name, want in files.items():
            inode = ns.lookup(d.ino, name)
            assert inode.mode == stat.S_IFREG | 0o640 and inode.uid == 1000
            assert await h.read_file(inode.ino) == want
        assert ns.lookup(ROOT_INO, b"hard") is ns.lookup(d.ino, b"f1") and ns.lookup(d.ino, b"f1").nlink == 2
        assert await h.read_file(ns.lookup(ROOT_INO, b"moved").ino) == b"bytes of 2" * 3
        assert ns.lookup(d.ino, b"sym").target == b"f0"
        # replaying the same records again changes nothing (idempotent)
        recs = [(seq, p) for seq, p in RedoLog(tmp_path / "state" / "redo.log").records()]
        before = {ino: i.row() for ino, i in ns.inodes.items()}
        assert ns.replay(recs) == 0
        assert {ino: i.row() for ino, i in ns.inodes.items()} == before
        check_invariants(h.engine)

    run_engine(tmp_path, after, fast_capacity=M)

    async def third(h):  # the replay was committed: nothing to replay at the next start
        assert "redo_replayed" not in h.report
        assert set(h.ns.dir(h.ns.lookup(ROOT_INO, b"d").ino)) == set(files) | {b"sym"}

    run_engine(tmp_path, third, fast_capacity=M)


def test_a_full_ring_makes_the_close_wait_for_the_commit(tmp_path):
    async def body(h):
        journal = h.ns.journal
        journal.redo.checkpoint = -1  # as if a record in the ring were not committed yet
        journal.redo.pos = journal.redo.size - 8
        fh, ino = await h.create(b"a")
        inode = h.ns.get(ino)
        assert inode.name_seq > 0 and journal.redo.refused == 1
        await h.write(fh, 0, b"x")
        await h.ops.flush(fh)  # waits for the commit
        assert journal.is_durable(inode.name_seq)
        await h.ops.release(fh)
        journal.redo.checkpoint = journal.redo.last_seq
        fh, ino = await h.create(b"b")  # committed since: logged again, at the front
        assert h.ns.get(ino).name_seq == 0
        await h.close(fh)

    run_engine(tmp_path, body, fast_capacity=M)


def _faults_appending(log: RedoLog, n: int) -> int:
    """Page faults taken by this thread while appending ``n`` records."""
    before = resource.getrusage(resource.RUSAGE_THREAD)
    for i in range(n):
        assert log.append(redolog.unlink(ROOT_INO, b"n%05d" % i, False)) is not None
    after = resource.getrusage(resource.RUSAGE_THREAD)
    return (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt)


def test_prefault_makes_written_back_pages_writable_off_the_appending_thread(tmp_path):
    """Once the kernel has written the mapped pages back they are write-protected, and the
    next store into each faults.  prefault (called by the committer's thread after each
    commit) takes those faults itself, so the loop thread's appends take none; the records
    read back the same."""
    log = RedoLog(tmp_path / "redo.log", size=1 << 20)
    n = 2000  # ~60 KiB of records: ~15 pages, within PREFAULT_BYTES
    log._mm.flush()  # msync: written back, so write-protected again
    without = _faults_appending(log, n)
    assert without >= 5, f"{without} faults: the pages were not write-protected by the write-back"
    log.checkpoint = log.last_seq
    log.reset()  # the front again
    log._mm.flush()
    done = []
    worker = threading.Thread(target=lambda: done.append(log.prefault()))
    worker.start()
    worker.join()
    assert done == [True]
    with_prefault = _faults_appending(log, n)
    assert with_prefault <= 1, f"{with_prefault} faults on the appending thread after prefault ({without} without)"
    recs = log.records()
    assert len(recs) == n and redolog.decode(recs[-1][1]) == ("unlink", ROOT_INO, b"n%05d" % (n - 1), False)
    log.close()

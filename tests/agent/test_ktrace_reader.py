"""The kernel read trace's reader process (fs/ktrace_reader.py), driven through
fs/kreads.py against the real tracefs: it counts other processes' reads once each,
leaves the agent's own out, reports the events the ring buffer lost, and dies with the
agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hycache_agent.fs.kreads import KernelReads
from hycache_agent.fs.ktrace_reader import BLOCK, CHUNK, GROWTH, START, Follower

MiB = 1 << 20


def _started(tmp_path: Path) -> KernelReads:
    kr = KernelReads()
    dev = os.stat(tmp_path).st_dev  # two tiers on one device: bytes go by inode only
    if not kr.start({"fast": dev, "slow": dev}, tmp_path):
        pytest.skip(kr.reason)
    return kr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _other_process() -> subprocess.Popen[str]:
    """A process started before the trace, so not the agent's (the processes and threads
    the agent starts once it traces are left out by the kernel): it runs each line sent
    on its stdin (a repr'd Python string) and answers ``ok``."""
    return subprocess.Popen([sys.executable, "-c", "import os, sys\nfor line in sys.stdin:\n"
                             "    exec(eval(line))\n    print('ok', flush=True)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _run_in(p: subprocess.Popen[str], code: str) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(repr(code) + "\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ok\n"


def _drained_until(kr: KernelReads, enough: int, timeout: float = 10.0) -> int:
    got, deadline = 0, time.monotonic() + timeout
    while got < enough and time.monotonic() < deadline:
        time.sleep(0.2)
        got += kr.drain().get("fast", 0)
    time.sleep(1.2)  # two more batches: anything counted twice would show now
    return got + kr.drain().get("fast", 0)


def test_other_processes_reads_count_once_and_the_agents_own_do_not(tmp_path):
    other = _other_process()
    kr = _started(tmp_path)
    try:
        assert kr.child is not None and _alive(kr.child.pid)
        blob = tmp_path / "blob"
        with open(blob, "wb", buffering=0) as f:  # 4 KiB writes: small folios, so a long
            for _ in range(MiB // 1024):           # read is served in many batches of pages
                f.write(os.urandom(4096))
            f.write(b"x" * 100)  # counted in whole pages
        st = os.stat(blob)
        kr.learn("fast", st.st_dev, st.st_ino)
        for _ in range(3):
            assert blob.read_bytes()  # this process is "the agent": left out
        # ... and so are a thread it starts now (a migration's copy on a new worker thread:
        # the trace's tgid column may name the process that last had the thread's id, so the
        # kernel leaves these out, set_event_notrace_pid) and a process it starts
        t = threading.Thread(target=lambda: [blob.read_bytes() for _ in range(3)])
        t.start()
        t.join()
        subprocess.run([sys.executable, "-c", f"open({str(blob)!r}, 'rb').read()"], check=True)
        # another process: one 4 MiB+ read(2) (many batches of pages), then 4 KiB ones
        _run_in(other, f"fd = os.open({str(blob)!r}, os.O_RDONLY)\n"
                       "os.read(fd, (4 << 20) + 100)\n"
                       "for i in range(256): os.pread(fd, 4096, i * 4096)\n"
                       "os.close(fd)")
        want = 4 * MiB + 4096 + 256 * 4096
        got = _drained_until(kr, want, timeout=30.0)
        lost = kr.status()["lost_events"]
        # exact, unless the ring buffer overflowed (other processes reading the same device
        # share it): then short by what was lost, never more, and the loss is reported
        assert got == want or (got < want and lost > 0), (got, want, lost, kr.me, os.getpid(),
                                                          kr.other_bytes)
        assert kr.status()["active"] is True and kr.other_bytes == 0
        # a lower priority than the agent's: busy CPUs go to the readers and the agent first
        assert os.getpriority(os.PRIO_PROCESS, kr.child.pid) > os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        kr.stop()
        other.kill()
        other.wait()
    assert kr.instance is None and not kr.active


def test_lost_events_are_reported(tmp_path):
    other = _other_process()
    kr = _started(tmp_path)
    child = kr.child
    assert child is not None
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 4096)
    try:
        os.kill(child.pid, signal.SIGSTOP)  # nobody empties the ring buffer now
        _run_in(other, f"fd = os.open({str(blob)!r}, os.O_RDONLY)\n"
                       "for _ in range(200_000): os.pread(fd, 4096, 0)\n"  # ~100 bytes an event: far past 2 MiB a CPU
                       "os.close(fd)")
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while kr.status()["lost_events"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert kr.status()["lost_events"] > 0
    finally:
        os.kill(child.pid, signal.SIGCONT)
        kr.stop()
        other.kill()
        other.wait()


@pytest.mark.parametrize("how", ["SIGKILL", "exit"])
def test_the_reader_dies_with_the_agent(tmp_path, how):
    """A stand-in agent starts the reader and dies (killed, or exits without stop()):
    the reader follows within seconds, and its tracefs instance can then be reaped."""
    script = textwrap.dedent(f"""
        import os, sys, time
        from hycache_agent.fs.kreads import KernelReads
        kr = KernelReads()
        if not kr.start({{"fast": os.stat({str(tmp_path)!r}).st_dev}}, {str(tmp_path)!r}):
            print("skip", kr.reason, flush=True)
            sys.exit(0)
        print(kr.child.pid, kr.instance, flush=True)
        if {how!r} == "exit":
            os._exit(0)
        time.sleep(60)
    """)
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        first = agent.stdout.readline().split(maxsplit=1)  # type: ignore[union-attr]
        if not first or first[0] == "skip":
            pytest.skip(" ".join(first[1:]) or "the stand-in agent failed")
        reader, instance = int(first[0]), Path(first[1].strip())
        assert _alive(reader)
        if how == "SIGKILL":
            agent.kill()
        agent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(reader) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(reader)
        assert instance.exists()  # left behind by the dead agent: the next start reaps it
        kr = _started(tmp_path)
        kr.stop()
        assert not instance.exists()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


@pytest.fixture
def follower(tmp_path):
    """A Follower with a window of 4 chunks, and a real 64 MiB blob for it to ask for."""
    blob = tmp_path / "blob"
    blob.write_bytes(b"\0" * (64 * MiB))
    fo = Follower(4 * CHUNK)
    try:
        yield fo, bytes(blob)
    finally:
        fo.close()


def test_the_follower_asks_ahead_only_of_a_thread_reading_in_order(follower):
    """The follower's decisions on a real file's events (the mount tests,
    test_follow_prefetch.py, show the pages arrive): whole chunks up to ``ahead`` past a
    thread once it has read START bytes in order, counting a read(2) split in batches of
    pages once; nothing for a few bytes, for jumps, or once the blob is released."""

    fo, blob = follower
    key = (1, 2)
    fo.command(b"+ 1 2 " + blob)
    fo.saw(10, key, 0, 100)  # a few bytes
    for off in range(0, 60 * MiB, 3 * MiB):  # 64 KiB every 3 MiB
        fo.saw(11, key, off, off + (64 << 10))
    assert fo.requests == 0
    for off in range(0, START - (8 << 10), 4096):  # in order, 8 KiB short of START
        fo.saw(12, key, off, off + 4096)
    fo.saw(12, key, START - (8 << 10), START)  # a read(2) of 8 KiB in two batches:
    fo.saw(12, key, START - 4096, START)       # its second batch adds nothing
    assert fo.requests == 4 and fo.blobs[key].asked == START + 4 * CHUNK
    fo.saw(12, key, START, START + CHUNK // 2)  # half a chunk on: not a whole one missing
    assert fo.requests == 4
    fo.saw(12, key, START + CHUNK // 2, START + CHUNK)
    assert fo.requests == 5
    fo.command(b"+ 1 2 " + blob)  # a second open
    fo.command(b"- 1 2")
    assert key in fo.blobs
    fo.command(b"- 1 2")  # the last release: no longer followed
    assert not fo.blobs
    fo.command(b"+ 1 nonsense")  # ignored
    assert not fo.blobs


def test_a_slow_tier_blob_is_read_around_in_whole_blocks(follower):
    """``*``: a slow-tier blob.  Each BLOCK a jump touches is asked for once, whole (a
    random reader's 8 KiB pages: one request per block, not one per page); a thread
    reading in order from the start is left to the kernel's read-ahead; a fast-tier blob
    (``+``) random reader gets nothing."""
    fo, blob = follower
    key = (1, 3)
    fo.command(b"* 1 3 " + blob)
    assert fo.blobs[key].blocks == set()
    fo.saw(10, key, 5 * BLOCK + 8192, 5 * BLOCK + 16384)  # a page in block 5
    fo.saw(11, key, 5 * BLOCK + 65536, 5 * BLOCK + 73728)  # another page of it: asked already
    assert fo.requests == 1 and fo.blobs[key].blocks == {5}
    fo.saw(10, key, 2 * BLOCK - 4096, 2 * BLOCK + 4096)  # across blocks 1 and 2
    assert fo.requests == 3 and fo.blobs[key].blocks == {1, 2, 5}
    for off in range(0, 3 * BLOCK, 1 << 20):  # in order from the start: nothing
        fo.saw(12, key, off, off + (1 << 20))
    assert fo.requests == 3
    for off in range(8 * BLOCK, 8 * BLOCK + START, 1 << 20):  # a jump to block 8, then in order
        fo.saw(12, key, off, off + (1 << 20))
    assert fo.blobs[key].blocks == {1, 2, 5, 8}
    fo.command(b"- 1 3")
    assert not fo.blobs
    fast = (1, 4)
    fo.command(b"+ 1 4 " + blob)
    before = fo.requests
    fo.saw(13, fast, 5 * BLOCK, 5 * BLOCK + 8192)
    assert fo.requests == before  # a fast-tier blob's random reader: nothing


def test_the_followers_window_grows_when_a_reader_catches_up(tmp_path):
    """A reader seen within a chunk of what was asked (it outran the follower) doubles its
    blob's window, up to GROWTH times the first."""


    blob = tmp_path / "blob"
    blob.write_bytes(b"\0" * MiB)
    fo = Follower(2 * CHUNK)
    try:
        key = (1, 2)
        fo.command(b"+ 1 2 " + bytes(blob))
        fo.saw(1, key, 0, START)
        f = fo.blobs[key]
        assert f.asked == START + 2 * CHUNK and f.window == 2 * CHUNK
        fo.saw(1, key, START, START + CHUNK)  # a chunk short of the asked end: keeps up
        assert f.window == 2 * CHUNK
        pos = START + CHUNK
        for _ in range(10):  # the reader's next event is past what was asked each time
            new = f.asked + (64 << 10)
            fo.saw(1, key, pos, new)
            pos = new
        assert f.window == GROWTH * 2 * CHUNK and f.asked == pos + f.window
    finally:
        fo.close()


def test_the_first_ask_reaches_further_and_what_is_asked_stays_bounded(tmp_path):
    """``first``: a blob's first reader seen in order gets that much asked at once, or up
    to the blob's end (a few bytes, or jumps, still nothing); after it the window rule
    holds, and nothing is ever asked further than max(first, GROWTH x ahead) past the
    reader."""
    blob, small = tmp_path / "blob", tmp_path / "small"
    with open(blob, "wb") as f:
        f.truncate(1 << 30)  # sparse
    small.write_bytes(b"\0" * (20 * MiB))
    ahead, first = 2 * CHUNK, 16 * CHUNK
    fo = Follower(ahead, first=first)
    try:
        key = (1, 2)
        fo.command(b"+ 1 2 " + bytes(blob))
        fo.saw(10, key, 0, 100)
        for off in range(0, 60 * MiB, 3 * MiB):
            fo.saw(11, key, off, off + (64 << 10))
        assert fo.requests == 0
        fo.saw(12, key, 0, START)
        f = fo.blobs[key]
        assert fo.requests == 16 and f.asked == START + first and f.window == ahead
        fo.saw(12, key, START, START + 8 * CHUNK)  # well inside the first ask: nothing more
        assert fo.requests == 16
        pos, most = START + 8 * CHUNK, 0
        for _ in range(400):  # a long read in order, its events sometimes past what was asked
            new = pos + (CHUNK // 2 if fo.requests % 3 else f.asked - pos + CHUNK)
            fo.saw(12, key, pos, new)
            pos = new
            most = max(most, f.asked - pos)
        assert fo.requests > 16 and most <= max(first, GROWTH * ahead)
        asked = fo.requests
        assert Follower(ahead).first == ahead and Follower(ahead, first=CHUNK).first == ahead
        fo.command(b"+ 1 3 " + bytes(small))  # 20 MiB: the first ask stops at its last chunk
        fo.saw(13, (1, 3), 0, START)
        assert fo.requests == asked + 3 and fo.blobs[(1, 3)].asked == START + 3 * CHUNK
    finally:
        fo.close()


def test_the_reader_runs_at_the_agents_priority_only_while_it_reads_ahead(tmp_path):
    """A follower that waits for a CPU falls behind its reader: while it reads ahead the
    process (every thread) drops its extra niceness, and takes it back after HOLD."""


    base = os.getpriority(os.PRIO_PROCESS, 0)
    script = textwrap.dedent(f"""
        import os, threading, time
        from hycache_agent.fs.ktrace_reader import Follower, Priority, START
        os.nice(10)
        fo, pr = Follower(8 << 20), Priority({base} + 10, {base})
        fo.command(b"+ 1 2 /nonexistent")
        waiter = threading.Thread(target=time.sleep, args=(3,)); waiter.start()
        nice = lambda: {{os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}}
        pr.update(fo, time.monotonic()); idle = nice()
        fo.saw(1, (1, 2), 0, START); pr.update(fo, time.monotonic()); busy = nice()
        time.sleep(Priority.HOLD + 0.2); pr.update(fo, time.monotonic()); after = nice()
        print(sorted(idle), sorted(busy), sorted(after)); fo.close(); os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == f"[{base + 10}] [{base}] [{base + 10}]", out

"""Bytes the kernel reads from the tiers' blobs on behalf of the mount's readers.

With FUSE passthrough the kernel reads a blob itself: the agent sees the open and the
release, never the read.  The kernel's ``filemap:mm_filemap_get_pages`` trace point fires
for every buffered read of a file, with the device, the inode and the page range asked
for; one ``read(2)`` of many pages fires it once per batch of pages, each time with the
rest of the range, so a continuation (same thread, file and end, a later start) adds
nothing.  The agent follows it in a private tracefs instance (``instances/hycache-PID-RANDOM``:
its own ring buffer, so several agents on one host, in containers or not, do not steal
each other's events),
filtered in the kernel to the tiers' devices.  A child process
(``python -m hycache_agent.fs.ktrace_reader``, fs/ktrace_reader.py) reads and parses the
events off the agent's interpreter, sums them per (device, inode) and sends the agent one
batch every ``BATCH_SECONDS``; it dies with the agent.  The agent:

- counts a read by a process other than the agent itself (the agent's own reads are the
  reads it serves, counted where it serves them, and migrations' copies); the agent
  learns its own process id as the trace shows it by reading a probe file at start, then
  lists itself in the instance's ``set_event_notrace_pid`` with ``options/event-fork``,
  so the kernel records no event of the agent's threads, nor of the threads and
  processes they start later (exact: the trace's tgid column is not — the kernel fills
  it from a table it updates only when a thread is next scheduled out, so a new thread's
  first events show whatever process last had its id, and a migration's copy on a new
  worker thread was counted as a reader's; ``pid_max`` 32768 makes ids come round
  often).  The child still drops events whose tgid column is the agent's (a kernel
  without ``set_event_notrace_pid``, before 5.8; in a container, threads started before
  the trace, whose global ids the agent cannot see);
- leaves out the other agents of this host too (tests, benches and a demo cluster run
  several nodes on one machine, on one device): their pushes, peer reads and moves read
  their blobs, and each agent's reader parsed every other's (the replica bench's sync
  writes, three writer agents on one disk: 0.62x of no-replica writes with every agent
  tracing, 0.71x with only the writing pair).  At start an agent appends its threads to
  the ``set_event_notrace_pid`` of every other agent's instance and theirs to its own
  (``event-fork`` on both sides covers the threads started later; of two agents starting
  together, the later one does both).  Only agents in the trace's PID namespace (the
  instance names carry their process ids), confirmed by their command line;
- attributes it to the tier of the blob with that (device, inode): learnt when a blob is
  registered or fstat()ed as a backing file; bytes of an inode not learnt yet wait (at
  most ``PENDING_SECONDS``) and are then left out, summed in ``other_bytes`` (other
  programs' files and other agents' blobs on a shared device, this agent's remote copies).

What it counts: bytes asked of the page cache of a blob, in whole pages (a read that runs
past the end of the file counts what it asked for) — page-cache hits and device reads
alike.  Blind spots: O_DIRECT reads
(no page cache), reads through mmap (page faults, not reads), reads lost when the ring
buffer overflows (``lost_events``: the reader, one Python process, keeps up with about
100,000 reads a second on the tiers' devices — every process's, on a shared device), and
reads by any process of a blob file opened
directly on the tier rather than through the mount (indistinguishable: same inode).
Needs a writable tracefs (root on the host, or a container that mounts it); without one
``reason`` says why and nothing is counted.

With ``follow_mb`` the reader also reads ahead of the sequential readers of the blobs the
agent names (:meth:`KernelReads.follow`, fs/prefetch.py; the ``Follower`` of
fs/ktrace_reader.py): one line each on the reader's stdin, written without blocking (a
line the pipe has no room for is dropped: a reader not followed, or one followed until
the blob's next release).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import select
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from hycache_agent.fs.ktrace_reader import ENTRY, HEADER, LINE

log = logging.getLogger(__name__)

TRACEFS = Path("/sys/kernel/tracing")
EVENT = "filemap/mm_filemap_get_pages"
PREFIX = "hycache-"
BUFFER_KB = 2048  # per CPU
PENDING_SECONDS = 30.0
MAX_PENDING = 65_536
MAX_KNOWN = 1 << 20
BATCH_SECONDS = 0.5
READER_NICE = 10  # the reader yields the CPUs to the mount's readers and the agent


def kernel_dev(st_dev: int) -> int:
    """The kernel's dev_t (major << 20 | minor), as trace filters compare it."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def _instance_pid(name: str) -> int | None:
    """The process id in an instance's name (``hycache-PID-RANDOM``), or None."""
    head, _, _ = name[len(PREFIX):].partition("-")
    return int(head) if head.isdigit() else None


def _tids(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (OSError when it is gone)."""
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _append(path: Path, pids: str) -> None:
    """Add ``pids`` to a tracefs pid list (O_APPEND: a write without it replaces the list;
    Python's append mode seeks to the end first, which tracefs refuses)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        os.write(fd, pids.encode())
    finally:
        os.close(fd)


def _is_agent(pid: int) -> bool:
    """Whether ``pid`` here is a HyCache agent (an instance's name may carry the id of a
    process in another PID namespace, which here is someone else or nobody)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read()
    except OSError:
        return False
    return b"hycache-agent\0" in argv or b"hycache_agent" in argv


class KernelReads:
    """The trace reader (a child process), the thread that takes its batches, and the
    per-tier sums.  :meth:`learn` and :meth:`drain` run on the event loop thread; the batch
    thread hands them batches through a deque (append and popleft are thread-safe) and
    sets ``lost_events`` in one assignment."""

    def __init__(self, tracefs: Path = TRACEFS, follow_mb: int = 0, follow_first_mb: int = 0) -> None:
        self.tracefs = tracefs
        self.follow_mb = follow_mb  # MiB the reader keeps asked for ahead of a followed reader
        self.follow_first_mb = follow_first_mb  # MiB it asks for at once ahead of a blob's first one
        self.instance: Path | None = None
        self.reason = "not started"
        self.known: dict[tuple[int, int], str] = {}  # (st_dev, ino) -> tier
        self.by_device: dict[int, str] = {}  # st_dev -> tier, when the tiers' devices differ
        self._batches: deque[dict[tuple[int, int], int]] = deque()  # (st_dev, ino) -> bytes, not drained yet
        self._pending: dict[tuple[int, int], tuple[float, int]] = {}  # not learnt: (since, bytes)
        self.other_bytes = 0
        self.lost_events = 0
        self.me = os.getpid()  # the agent's process id as the trace shows it (start)
        self.child: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None

    # -- lifecycle (blocking: at mount and unmount) ---------------------------------------
    def start(self, tier_devices: dict[str, int], probe_dir: str | os.PathLike[str]) -> bool:
        """Trace reads of the tiers' devices (``{tier: st_dev}``); False (and ``reason``)
        when the kernel does not let us.  ``probe_dir``: a directory on a tier, where a
        read of a probe file tells the agent its own process id as the kernel sees it
        (in a container's PID namespace ``os.getpid()`` is another number)."""
        devs = set(tier_devices.values())
        if len(devs) == len(tier_devices):
            self.by_device = {d: t for t, d in tier_devices.items()}
        inst = self.tracefs / "instances" / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        fd = -1
        try:
            self._reap_stale()
            inst.mkdir()
            # open first: an open trace keeps other agents' _reap_stale from removing it
            fd = os.open(inst / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
            (inst / "buffer_size_kb").write_text(str(BUFFER_KB))
            (inst / "options" / "record-tgid").write_text("1")
            ev = inst / "events" / EVENT
            (ev / "filter").write_text(" || ".join(f"s_dev=={kernel_dev(d)}" for d in sorted(devs)))
            (ev / "enable").write_text("1")
            self.me = self._whoami(fd, probe_dir)
            tids = _tids(os.getpid()) if self.me == os.getpid() else [self.me]
            self._untrace_self(inst, tids)
            if self.me == os.getpid():
                self._untrace_peers(inst, tids)
            self.child = self._spawn(fd, inst)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)  # before the removal: an open trace keeps the instance
            self.reason = f"kernel read counts unavailable: tracefs {self.tracefs}: {exc.strerror or exc}"
            if inst.exists():
                self._remove(inst)
            return False
        os.close(fd)  # the child holds its own copy
        assert self.child.stdin is not None
        os.set_blocking(self.child.stdin.fileno(), False)  # follow() never waits for the reader
        self.instance = inst
        self.reason = "traced (filemap:mm_filemap_get_pages)"
        self._thread = threading.Thread(target=self._take_batches, args=(self.child,), name="kernel-reads",
                                        daemon=True)
        self._thread.start()
        return True

    def _untrace_self(self, inst: Path, tids: list[int]) -> None:
        """No events of the agent's threads, nor of those started from them later, in
        ``inst`` (``set_event_notrace_pid`` with ``event-fork``; the module's docstring).
        Its thread ids as the trace knows them: all of them when the agent's process id
        is the trace's (same PID namespace), else the main thread's only."""
        try:
            (inst / "options" / "event-fork").write_text("1")
            (inst / "set_event_notrace_pid").write_text(" ".join(map(str, tids)))
        except OSError as exc:  # before 5.8: the child's tgid check alone
            log.info("kernel read counts: the agent's own reads are told apart by the trace's tgid "
                     "only (%s)", exc.strerror or exc)

    def _untrace_peers(self, inst: Path, tids: list[int]) -> None:
        """This agent's threads (``tids``) in every other agent's instance, theirs in
        ``inst`` (the module's docstring); only for an agent in the trace's PID namespace."""
        mine = " ".join(map(str, tids))
        peers = 0
        for other in (self.tracefs / "instances").glob(f"{PREFIX}*"):
            pid = _instance_pid(other.name)
            if other == inst or pid is None or pid == os.getpid() or not _is_agent(pid):
                continue
            try:
                theirs = " ".join(map(str, _tids(pid)))
                _append(other / "set_event_notrace_pid", mine)
                _append(inst / "set_event_notrace_pid", theirs)
            except OSError:  # it stopped meanwhile, or a kernel before 5.8
                continue
            peers += 1
        if peers:
            log.info("kernel read counts: the reads of %d other agents on this host are left out", peers)

    def _spawn(self, fd: int, inst: Path) -> subprocess.Popen[bytes]:
        """The reader process, given the open trace; it exits at EOF on its stdin (ours)."""
        return subprocess.Popen(
            [sys.executable, "-m", "hycache_agent.fs.ktrace_reader", "--fd", str(fd), "--instance", str(inst),
             "--me", str(self.me), "--parent", str(os.getpid()), "--every", str(BATCH_SECONDS),
             "--nice", str(READER_NICE), "--follow-mb", str(self.follow_mb),
             "--follow-first-mb", str(self.follow_first_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,), close_fds=True)

    @staticmethod
    def _whoami(fd: int, probe_dir: str | os.PathLike[str]) -> int:
        """(blocking, before the reader starts) The agent's process id in the trace: the
        tgid of its own read of a probe file (OSError when none shows within 5 s).  On the
        main thread, the thread id of the read: the process id (the trace's tgid column
        comes from a table the kernel updates when the thread is next scheduled out, so
        the first events of a thread whose id was another process's show that process's)."""
        main = threading.current_thread() is threading.main_thread()
        path = os.path.join(probe_dir, f".kreads-probe-{os.getpid()}")
        pfd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(pfd, b"\0" * 4096)
            ino = os.fstat(pfd).st_ino
            deadline = time.monotonic() + 5
            buf = b""
            while time.monotonic() < deadline:
                os.pread(pfd, 4096, 0)
                if select.select([fd], [], [], 0.2)[0]:
                    try:
                        buf += os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    for m in LINE.finditer(buf):
                        if int(m.group(5), 16) == ino:
                            return int(m.group(1) if main else m.group(2))
                    buf = buf[buf.rfind(b"\n") + 1:]
        finally:
            os.close(pfd)
            os.unlink(path)
        raise OSError(errno.ETIMEDOUT, "the probe read never showed in the trace")

    def stop(self) -> None:
        child, self.child = self.child, None
        if child is not None:
            assert child.stdin is not None
            child.stdin.close()  # EOF: the reader sends what it has and exits
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.instance is not None:
            self._remove(self.instance)
            self.instance = None

    def _reap_stale(self) -> None:
        """Instances of agents that died without removing theirs: the kernel refuses to
        remove one whose trace is open (EBUSY: a live agent's, maybe in another PID
        namespace), so every other one is tried as it is."""
        for p in (self.tracefs / "instances").glob(f"{PREFIX}*"):
            try:
                p.rmdir()
            except OSError:
                pass

    @staticmethod
    def _remove(inst: Path) -> None:
        try:
            (inst / "events" / EVENT / "enable").write_text("0")
        except OSError:
            pass
        try:
            inst.rmdir()
        except OSError as exc:
            log.warning("removing tracefs instance %s: %s", inst, exc)

    # -- the batch thread (wakes once per batch) ----------------------------------------------
    def _take_batches(self, child: subprocess.Popen[bytes]) -> None:
        out = child.stdout
        assert out is not None
        try:
            while len(head := out.read(HEADER.size)) == HEADER.size:
                lost, n = HEADER.unpack(head)
                body = out.read(n * ENTRY.size)
                if len(body) != n * ENTRY.size:
                    break
                self.lost_events = lost
                self._batches.append({(dev, ino): nbytes for dev, ino, nbytes in ENTRY.iter_unpack(body)})
        except Exception:  # never let the counting take the agent down
            log.exception("kernel read counting stopped")
        finally:
            out.close()
        if self.child is child:  # not stopped by us
            log.warning("the kernel read trace reader exited (status %s)", child.wait())
            self.reason = "the trace reader exited"

    # -- the event loop's side ----------------------------------------------------------------
    @property
    def following(self) -> bool:
        return self.follow_mb > 0 and self.child is not None

    def follow(self, key: tuple[int, int], path: str, *, blocks: bool = False) -> bool:
        """One more open reads the blob ``key`` (st_dev, st_ino) at ``path``: read ahead of
        its sequential readers, or (``blocks``: a slow-tier blob) read around its readers in
        whole blocks.  False when the line could not be sent."""
        return self._tell(b"%s %d %d %s\n" % (b"*" if blocks else b"+", key[0], key[1], os.fsencode(path)))

    def unfollow(self, key: tuple[int, int]) -> None:
        """One open of the blob ``key`` is released (the last one stops its read-ahead)."""
        self._tell(b"- %d %d\n" % key)

    def _tell(self, line: bytes) -> bool:
        child = self.child
        if child is None or child.stdin is None or b"\n" in line[:-1] or len(line) > select.PIPE_BUF:
            return False
        try:
            return os.write(child.stdin.fileno(), line) == len(line)  # atomic: at most PIPE_BUF
        except OSError:  # full (BlockingIOError) or the reader is gone
            return False

    def learn(self, tier: str, st_dev: int, ino: int) -> None:
        """The blob with this device and inode number is on ``tier`` now."""
        if len(self.known) >= MAX_KNOWN:
            self.known.clear()
        self.known[(st_dev, ino)] = tier

    def drain(self) -> dict[str, int]:
        """Bytes read from each tier since the last drain (attributed ones only)."""
        raw: dict[tuple[int, int], int] = {}
        while self._batches:
            for key, n in self._batches.popleft().items():
                raw[key] = raw.get(key, 0) + n
        out: dict[str, int] = {}
        now = time.monotonic()
        for key, n in raw.items():
            since, waiting = self._pending.pop(key, (now, 0))
            n += waiting
            tier = self.known.get(key) or self.by_device.get(key[0])
            if tier is not None:
                out[tier] = out.get(tier, 0) + n
            elif now - since > PENDING_SECONDS or len(self._pending) >= MAX_PENDING:
                self.other_bytes += n
            else:
                self._pending[key] = (since, n)
        for key in [k for k in self._pending if k in self.known]:
            since, n = self._pending.pop(key)
            tier = self.known[key]
            out[tier] = out.get(tier, 0) + n
        return out

    def status(self) -> dict[str, object]:
        return {"active": self.active, "reason": self.reason, "other_bytes": self.other_bytes,
                "lost_events": self.lost_events}

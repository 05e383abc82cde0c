"""The request loop of the patched pyfuse3 (agent/patches/pyfuse3-passthrough.patch,
``_session_loop``): one task reads requests and answers those made in the callback or by
a coroutine that does not wait; only a coroutine that waits hands the reading over to
another task.  Checked on a real mount of a small file system (its own process: pyfuse3
is one session per process) whose GETXATTR ``user.slow`` waits until the test says so:

* requests keep being answered while coroutines wait (another task reads);
* at most ``max_tasks`` coroutines at once (pyfuse3's bound), and every waiting request
  is answered after the release;
* a coroutine that waits and then raises ``FUSEError``, one that answers without waiting,
  and answers from the callback all reply as before;
* SIGTERM (``pyfuse3.terminate``) ends ``main()`` and the process unmounts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hycache_harness import force_unmount, is_mounted

from .conftest import require_fuse

FS = r'''
import errno, signal, stat, sys
import pyfuse3, trio

MAX_TASKS = int(sys.argv[2])


class Ops(pyfuse3.Operations):
    def __init__(self):
        super().__init__()
        self.release = trio.Event()
        self.waiting = 0
        self.most = 0

    def _attr(self, ino):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = (stat.S_IFDIR | 0o755) if ino == pyfuse3.ROOT_INODE else (stat.S_IFREG | 0o644)
        a.st_nlink = 1
        a.entry_timeout = 0   # every stat asks again
        a.attr_timeout = 0
        return a

    def getattr_now(self, ino):
        return self._attr(ino)

    async def getattr(self, ino, ctx=None):
        return self._attr(ino)

    def lookup_now(self, parent, name):
        if name.startswith(b"fast"):
            return self._attr(2)
        return None

    async def lookup(self, parent, name, ctx=None):
        if name == b"sleepy":
            await trio.sleep(0.001)
            raise pyfuse3.FUSEError(errno.EACCES)
        if name == b"plain":   # a coroutine that answers without waiting
            return self._attr(4)
        raise pyfuse3.FUSEError(errno.ENOENT)

    # no getxattr_now: every GETXATTR is a coroutine (LOOKUPs of one directory are
    # serialized by the kernel, GETXATTRs are not)
    async def getxattr(self, ino, name, ctx=None):
        if name != b"user.slow":
            raise pyfuse3.FUSEError(errno.ENODATA)
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        print("waiting", self.waiting, flush=True)
        await self.release.wait()
        self.waiting -= 1
        return b"done"


async def signals(ops):
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM) as received:
        print("ready", flush=True)
        async for sig in received:
            ops.release.set()
            if sig == signal.SIGTERM:
                pyfuse3.terminate()
                return


async def run(ops):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signals, ops)
        await pyfuse3.main(1, MAX_TASKS)
        nursery.cancel_scope.cancel()


ops = Ops()
pyfuse3.init(ops, sys.argv[1], {"fsname=hycache-looptest"})
try:
    trio.run(run, ops)
finally:
    pyfuse3.close(unmount=True)
print("most", ops.most, flush=True)
'''


class LoopFs:
    def __init__(self, tmp_path, max_tasks: int) -> None:
        self.mnt = tmp_path / "mnt"
        self.mnt.mkdir()
        script = tmp_path / "loopfs.py"
        script.write_text(FS)
        self.proc = subprocess.Popen([sys.executable, str(script), str(self.mnt), str(max_tasks)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.expect("ready"), self.proc.stderr.read()
        deadline = time.monotonic() + 30
        while not is_mounted(str(self.mnt)):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.proc.stderr.read()
            time.sleep(0.05)

    def expect(self, prefix: str) -> str | None:
        """The next stdout line starting with ``prefix`` (None at the end of output)."""
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line.strip()
        return None

    def slow_in_threads(self, names: list[str], results: dict, *, seen: bool) -> list[threading.Thread]:
        """A GETXATTR ``user.slow`` of each name, one thread each (answered when the test
        sends SIGUSR1); ``seen``: return once the file system has printed that each waits."""
        def go(name):
            try:
                results[name] = os.getxattr(self.mnt / name, "user.slow")
            except OSError as exc:
                results[name] = exc.errno
        threads = [threading.Thread(target=go, args=(name,), daemon=True) for name in names]
        for t in threads:
            t.start()
        for _ in names if seen else ():
            assert self.expect("waiting") is not None
        return threads

    def release(self, threads: list[threading.Thread]) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        for t in threads:
            t.join(timeout=30)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            force_unmount(str(self.mnt))
        assert self.proc.returncode == 0, err
        assert not is_mounted(str(self.mnt))
        return out


@pytest.fixture
def loopfs(tmp_path):
    require_fuse()
    made = []

    def start(max_tasks: int) -> LoopFs:
        made.append(LoopFs(tmp_path, max_tasks))
        return made[-1]

    yield start
    for fs in made:
        if fs.proc.poll() is None:
            fs.proc.kill()
            fs.proc.wait()
        force_unmount(str(fs.mnt))


@pytest.mark.timeout(180)
def test_requests_are_answered_while_coroutines_wait(loopfs):
    fs = loopfs(max_tasks=99)
    results: dict[str, int] = {}
    slow = fs.slow_in_threads([f"fast-slow{i}" for i in range(4)], results, seen=True)
    # four coroutines wait: other tasks read and answer, from the callback and by coroutines
    for i in range(200):
        assert os.stat(fs.mnt / f"fast{i}").st_ino == 2
    assert os.stat(fs.mnt / "plain").st_ino == 4
    with pytest.raises(PermissionError):
        os.stat(fs.mnt / "sleepy")
    with pytest.raises(FileNotFoundError):
        os.stat(fs.mnt / "nothing")
    assert os.stat(fs.mnt).st_ino == 1
    assert not results  # still waiting
    fs.release(slow)
    assert results == {f"fast-slow{i}": b"done" for i in range(4)}
    # after the release the loop goes on as one reader
    for i in range(100):
        assert os.stat(fs.mnt / f"fast{i}").st_ino == 2
    assert fs.stop().split()[-2:] == ["most", "4"]


@pytest.mark.timeout(180)
def test_max_tasks_bounds_the_coroutines_and_every_request_is_answered(loopfs):
    fs = loopfs(max_tasks=3)
    results: dict[str, int] = {}
    slow = fs.slow_in_threads([f"fast-slow{i}" for i in range(3)], results, seen=True)
    # three tasks wait (the bound): these are read only when one of them is done
    slow += fs.slow_in_threads([f"fast-slow{i}" for i in range(3, 6)], results, seen=False)
    fs.release(slow)
    assert results == {f"fast-slow{i}": b"done" for i in range(6)}
    assert fs.stop().split()[-2:] == ["most", "3"]


@pytest.mark.timeout(180)
def test_unmount_by_the_kernel_ends_the_loop(loopfs):
    fs = loopfs(max_tasks=99)
    assert os.stat(fs.mnt / "fast").st_ino == 2
    subprocess.run(["fusermount3", "-u", str(fs.mnt)], check=True)
    out, err = fs.proc.communicate(timeout=30)
    assert fs.proc.returncode == 0, err
    assert "most 0" in out
    assert not is_mounted(str(fs.mnt))

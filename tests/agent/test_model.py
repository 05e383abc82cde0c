"""Model-based test: random operation sequences applied to a plain directory (ext4, the
model) and to a HyCache mount whose fast tier is tiny (128 KiB), so that files migrate all
the time.  After every step the two trees must agree (names, types, sizes, link counts,
symlink targets); contents are compared on every read and at the end of each example,
and every failing operation must fail with the same errno on both.

One agent serves the whole module; every example works in a fresh subdirectory.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import itertools
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from .conftest import check_tiers_from_outside, make_shared_tmpdir, require_fuse, status, tail

pytestmark = pytest.mark.mount

NAMES = ["a", "b", "x", "y"]
DIRS = ["", "x/", "y/", "x/y/"]
PATHS = [d + n for d in DIRS for n in NAMES]
paths = st.one_of(st.sampled_from(NAMES), st.sampled_from(PATHS))  # half of them at the top
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(src: str, dst: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src, None, dst)


def pattern(n: int, seed: int) -> bytes:
    return hashlib.shake_256(b"m%d" % seed).digest(n) if n else b""


def outcome(fn, *args):
    """("ok", value) or ("err", errno name) — comparable across the two trees."""
    try:
        return ("ok", fn(*args))
    except OSError as exc:
        return ("err", errno.errorcode.get(exc.errno, exc.errno))


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything comparable about a tree, without reading file contents."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            key = os.path.normpath(os.path.join(rel, name))
            s = os.lstat(p)
            if stat.S_ISDIR(s.st_mode):
                out[key] = ("dir", s.st_nlink, stat.S_IMODE(s.st_mode))
            elif stat.S_ISLNK(s.st_mode):
                out[key] = ("symlink", os.readlink(p))
            else:
                out[key] = ("file", s.st_size, s.st_nlink, stat.S_IMODE(s.st_mode))
    return out


class _Shared:
    mount = None
    model_base: Path | None = None
    counter = itertools.count()
    steps = 0


@pytest.fixture(scope="module")
def model_mount(start_mount):
    require_fuse()
    base = make_shared_tmpdir("hycache-model-")
    m = start_mount(base, "128K")
    _Shared.mount = m
    _Shared.model_base = base / "model"
    _Shared.model_base.mkdir()
    yield m
    _Shared.mount = None
    died = m.proc.poll() is not None
    rc = m.unmount()
    log = tail(m.log)
    if not os.path.ismount(m.mountpoint):
        shutil.rmtree(base, ignore_errors=True)
    assert not died and rc == 0, f"agent exit {rc} (died during the module: {died})\n{log}"


class TreeMachine(RuleBasedStateMachine):
    @initialize()
    def fresh_dirs(self):
        n = next(_Shared.counter)
        self.model = _Shared.model_base / f"ex{n}"
        self.real = _Shared.mount.mountpoint / f"ex{n}"
        self.model.mkdir()
        self.real.mkdir()
        self.fds: list[tuple[int, int, str]] = []  # (model fd, mount fd, path) unlinked while open
        self.log: list[str] = []

    # -- helpers -------------------------------------------------------------------------
    def both(self, what: str, fn, *paths: str):
        self.log.append(what)
        _Shared.steps += 1
        a = outcome(fn, *[str(self.model / p) if p else str(self.model) for p in paths])
        b = outcome(fn, *[str(self.real / p) if p else str(self.real) for p in paths])
        if a != b and _Shared.mount.proc.poll() is not None:
            pytest.fail(f"the agent died:\n{tail(_Shared.mount.log)}")
        assert a == b, f"{what}: model {a} != mount {b}\nsteps so far:\n  " + "\n  ".join(self.log)
        return a

    # -- rules ---------------------------------------------------------------------------
    @rule(path=paths, offset=st.one_of(st.integers(0, 4096), st.integers(0, 150_000)),
          size=st.one_of(st.integers(0, 5000), st.integers(0, 60_000)), seed=st.integers(0, 1 << 16),
          trunc=st.booleans())
    def write(self, path, offset, size, seed, trunc):
        data = pattern(size, seed)

        def op(p):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if trunc else 0), 0o644)
            try:
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
            finally:
                os.close(fd)

        self.both(f"write {path} off={offset} size={size} trunc={trunc}", op, path)

    @rule(path=paths, length=st.one_of(st.integers(0, 4096), st.integers(0, 300_000)))
    def truncate(self, path, length):
        self.both(f"truncate {path} {length}", lambda p: os.truncate(p, length), path)

    @rule(path=paths)
    def read(self, path):
        def op(p):
            with open(p, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()

        self.both(f"read {path}", op, path)

    @rule(path=paths, offset=st.integers(0, 250_000), size=st.integers(1, 70_000))
    def pread(self, path, offset, size):
        def op(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                return hashlib.sha256(os.pread(fd, size, offset)).hexdigest()
            finally:
                os.close(fd)

        self.both(f"pread {path} {offset}+{size}", op, path)

    @rule(src=paths, dst=paths,
          flags=st.sampled_from([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
    def rename(self, src, dst, flags):
        self.both(f"rename {src} {dst} flags={flags}", lambda a, b: renameat2(a, b, flags), src, dst)

    @rule(path=paths)
    def unlink(self, path):
        self.both(f"unlink {path}", os.unlink, path)

    @rule(path=paths)
    def mkdir(self, path):
        self.both(f"mkdir {path}", lambda p: os.mkdir(p, 0o755), path)

    @rule(path=paths)
    def rmdir(self, path):
        self.both(f"rmdir {path}", os.rmdir, path)

    @rule(src=paths, dst=paths)
    def link(self, src, dst):
        self.both(f"link {src} {dst}", os.link, src, dst)

    @rule(path=paths, dest=st.sampled_from(["a", "x/../b", "x/y/b", "nowhere", "../ex-not-there/a"]))
    def symlink(self, path, dest):
        self.both(f"symlink {path} -> {dest}", lambda p: os.symlink(dest, p), path)

    @rule(path=paths)
    def open_then_unlink(self, path):
        """Open a file in both trees and unlink it; it is read back (and closed) later."""
        a = outcome(lambda: os.open(self.model / path, os.O_RDWR))
        b = outcome(lambda: os.open(self.real / path, os.O_RDWR))
        self.log.append(f"open+unlink {path}")
        if a[0] == "ok" and b[0] == "ok":
            self.fds.append((a[1], b[1], path))
            self.both(f"unlink {path} (open)", os.unlink, path)
        else:
            for r in (a, b):
                if r[0] == "ok":
                    os.close(r[1])
            assert a == b or (a[0] == b[0] == "err" and a[1] == b[1]), f"open {path}: model {a} != mount {b}"

    @precondition(lambda self: self.fds)
    @rule(data=st.data())
    def read_unlinked_and_close(self, data):
        fa, fb, path = self.fds.pop(data.draw(st.integers(0, len(self.fds) - 1)))
        self.log.append(f"read+close unlinked {path}")
        try:
            ca = os.pread(fa, 1 << 20, 0)
            os.pwrite(fa, b"still-writable", 7)
            ca2 = os.pread(fa, 1 << 20, 0)
            cb = os.pread(fb, 1 << 20, 0)
            os.pwrite(fb, b"still-writable", 7)
            cb2 = os.pread(fb, 1 << 20, 0)
        finally:
            os.close(fa)
            os.close(fb)
        assert (ca, ca2) == (cb, cb2), f"unlinked-but-open {path} differs"

    @rule(path=paths, tier=st.sampled_from(["fast", "slow"]), wait=st.booleans())
    def migrate(self, path, tier, wait):
        """Mount only (the model has no tiers): ask for a migration, maybe racing the
        next operations with it."""
        self.log.append(f"migrate {path} -> {tier} wait={wait}")
        p = self.real / path
        try:
            if not stat.S_ISREG(os.lstat(p).st_mode):
                return
        except OSError:
            return
        try:
            os.setxattr(p, "user.hycache.tier", tier.encode())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC and tier == "fast", repr(exc)  # larger than the fast tier
            return
        if wait:
            for _ in range(200):
                if not status(_Shared.mount)["migrations"]["active"]:
                    break
                time.sleep(0.01)

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def trees_agree(self):
        if not hasattr(self, "model"):
            return
        a, b = snapshot(self.model), snapshot(self.real)
        assert a == b, ("trees differ after:\n  " + "\n  ".join(self.log[-8:]) +
                        f"\nonly in model: {sorted(set(a.items()) - set(b.items()))}"
                        f"\nonly in mount: {sorted(set(b.items()) - set(a.items()))}")

    def teardown(self):
        if not hasattr(self, "model"):
            return
        try:
            for fa, fb, _ in self.fds:
                os.close(fa)
                os.close(fb)
            # contents of every file, then the tier invariants of this example's files
            for key, kind in snapshot(self.model).items():
                if kind[0] == "file":
                    assert (self.model / key).read_bytes() == (self.real / key).read_bytes(), \
                        f"content of {key} differs after:\n  " + "\n  ".join(self.log)
            check_tiers_from_outside(_Shared.mount, attempts=3, subtree=self.real)
        finally:
            shutil.rmtree(self.model, ignore_errors=True)
            shutil.rmtree(self.real)  # removing everything must work on the mount too


TreeMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("HYCACHE_MODEL_EXAMPLES", "80")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_model(model_mount):
    """Runs the state machine (collected here so that the module fixture is active)."""
    before = status(model_mount)["migrations"]
    TreeMachine.TestCase("runTest").runTest()
    after = status(model_mount)["migrations"]
    assert _Shared.steps > 100
    assert after["migrations_done"] > before["migrations_done"], "the tiny tier never migrated anything"
    assert after["migrations_failed"] == before["migrations_failed"], after
    left = sorted(os.listdir(model_mount.mountpoint))
    assert left == [], f"examples left {left} behind: {snapshot(model_mount.mountpoint)}"
    assert check_tiers_from_outside(model_mount) == 0


"""Drive the agent's FUSE operations layer (``HyCacheOperations``) directly, without a
kernel, on temporary tier directories — the engine is real, only /dev/fuse is absent.

``run_engine(root, body, **config)`` starts a ``TieringEngine`` on ``root`` (recovery
included), runs ``await body(h)`` inside trio with the engine's background tasks in a
nursery, and closes the engine.  Calling it again on the same root is a restart.

``Harness`` wraps each operation the way the kernel would call it and checks the engine
invariants (tests/agent/invariants.py) after every one.  It plays a kernel that forgets
every looked-up inode at once, so an unlinked file lives exactly as long as its handles.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import trio
from hycache_agent.config import AgentConfig
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import ROOT_INO
from hycache_agent.fs.passthrough import Backings
from hycache_agent.fuse.operations import HyCacheOperations
from hycache_agent.vfs.layer import Vfs

from .invariants import check_invariants, check_persisted, settle

CHUNK = 128 << 10
BODY_TIMEOUT = 120.0  # the kernel sends writes of at most 128 KiB (max_write) by default


async def kernel_lookup(ops, parent: int, name: bytes, ctx) -> pyfuse3.EntryAttributes:
    """LOOKUP as the kernel takes it: a negative entry (inode 0) is ENOENT."""
    attrs = await ops.lookup(parent, name, ctx)
    if attrs.st_ino == 0:
        raise pyfuse3.FUSEError(errno.ENOENT)
    return attrs


@dataclass
class Ctx:
    """What pyfuse3 passes as ``ctx``: the caller's credentials."""

    uid: int = 0
    gid: int = 0
    pid: int = field(default_factory=os.getpid)
    umask: int = 0o022


@dataclass
class Fields:
    """Stands in for pyfuse3.SetattrFields (whose attributes are read-only from Python)."""

    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


class Harness:
    def __init__(self, engine: TieringEngine, report: dict[str, int]) -> None:
        self.engine = engine
        self.ops = HyCacheOperations(Vfs(engine, Backings(engine)))
        self.ns = engine.ns
        self.report = report
        self.ctx = Ctx()
        self.checks = 0

    # -- invariants ------------------------------------------------------------------
    async def check(self) -> None:
        await settle(self.engine)
        check_invariants(self.engine)
        self.checks += 1

    async def check_stored(self) -> None:
        await self.engine.ns.journal.sync()
        check_persisted(self.engine)

    async def _forget(self, attrs: pyfuse3.EntryAttributes) -> int:
        await self.ops.forget([(attrs.st_ino, 1)])
        return attrs.st_ino

    async def errno(self, coro) -> int:
        """Run an operation that must fail; return its errno (and check invariants)."""
        try:
            result = await coro
        except pyfuse3.FUSEError as exc:
            await self.check()
            return exc.errno
        if isinstance(result, pyfuse3.EntryAttributes) and result.st_ino == 0:
            # a negative entry: lookup's "no such name" that the kernel may cache
            assert result.entry_timeout > 0, "a negative entry without a timeout is an ENOENT to send"
            await self.check()
            return errno.ENOENT
        raise AssertionError("operation succeeded but was expected to fail")

    # -- names -----------------------------------------------------------------------
    async def lookup(self, name: bytes, parent: int = ROOT_INO) -> int:
        ino = await self._forget(await kernel_lookup(self.ops, parent, name, self.ctx))
        await self.check()
        return ino

    async def mkdir(self, name: bytes, parent: int = ROOT_INO, mode: int = 0o755) -> int:
        ino = await self._forget(await self.ops.mkdir(parent, name, mode, self.ctx))
        await self.check()
        return ino

    async def rmdir(self, name: bytes, parent: int = ROOT_INO) -> None:
        await self.ops.rmdir(parent, name, self.ctx)
        await self.check()

    async def unlink(self, name: bytes, parent: int = ROOT_INO) -> None:
        await self.ops.unlink(parent, name, self.ctx)
        await self.check()

    async def rename(self, old: bytes, new: bytes, old_parent: int = ROOT_INO, new_parent: int = ROOT_INO,
                     flags: int = 0) -> None:
        await self.ops.rename(old_parent, old, new_parent, new, flags, self.ctx)
        await self.check()

    async def link(self, ino: int, name: bytes, parent: int = ROOT_INO) -> None:
        await self._forget(await self.ops.link(ino, parent, name, self.ctx))
        await self.check()

    async def symlink(self, name: bytes, target: bytes, parent: int = ROOT_INO) -> int:
        ino = await self._forget(await self.ops.symlink(parent, name, target, self.ctx))
        await self.check()
        return ino

    async def mknod(self, name: bytes, mode: int, rdev: int = 0, parent: int = ROOT_INO) -> int:
        ino = await self._forget(await self.ops.mknod(parent, name, mode, rdev, self.ctx))
        await self.check()
        return ino

    def listing(self, parent: int = ROOT_INO) -> dict[bytes, int]:
        return dict(self.ns.dir(parent))

    # -- files -----------------------------------------------------------------------
    async def create(self, name: bytes, parent: int = ROOT_INO, mode: int = 0o644,
                     flags: int = os.O_RDWR) -> tuple[int, int]:
        fi, attrs = await self.ops.create(parent, name, stat.S_IFREG | mode, flags | os.O_CREAT, self.ctx)
        ino = await self._forget(attrs)
        await self.check()
        return fi.fh, ino

    async def open(self, ino: int, flags: int = os.O_RDWR) -> int:
        fi = await self.ops.open(ino, flags, self.ctx)
        await self.check()
        return fi.fh

    async def write(self, fh: int, off: int, data: bytes) -> int:
        """Write like the kernel does: in chunks of at most 128 KiB."""
        done = 0
        while done < len(data):
            n = await self.ops.write(fh, off + done, data[done:done + CHUNK])
            assert n > 0
            done += n
        await self.check()
        return done

    async def read(self, fh: int, off: int, size: int) -> bytes:
        out = bytearray()
        while size > 0:
            piece = await self.ops.read(fh, off, min(size, CHUNK))
            if not piece:
                break
            out += piece
            off += len(piece)
            size -= len(piece)
        await self.check()
        return bytes(out)

    async def close(self, fh: int) -> None:
        await self.ops.flush(fh)
        await self.ops.release(fh)
        await self.check()

    async def truncate(self, ino: int, size: int, fh: int | None = None) -> None:
        attr = pyfuse3.EntryAttributes()
        attr.st_size = size
        await self.ops.setattr(ino, attr, Fields(update_size=True), fh, self.ctx)
        await self.check()

    async def write_file(self, name: bytes, data: bytes, parent: int = ROOT_INO) -> int:
        fh, ino = await self.create(name, parent)
        await self.write(fh, 0, data)
        await self.close(fh)
        return ino

    async def read_file(self, ino: int) -> bytes:
        fh = await self.open(ino, os.O_RDONLY)
        data = await self.read(fh, 0, self.ns.get(ino).size + 1)
        await self.close(fh)
        return data

    # -- controls --------------------------------------------------------------------
    async def getxattr(self, ino: int, name: bytes) -> bytes:
        return await self.ops.getxattr(ino, name, self.ctx)

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        await self.ops.setxattr(ino, name, value, self.ctx)
        await self.check()

    def tier(self, ino: int) -> str:
        return self.ns.get(ino).tier

    def fast_order(self) -> list[int]:
        return list(self.engine.policy.eviction_order())


def engine_config(root: Path, **overrides) -> AgentConfig:
    return AgentConfig(root=root, mountpoint=root / "mnt", **overrides)


def run_engine(root: Path, body, **overrides):
    """Start an engine on ``root``, ``await body(harness)``, close it; returns body's
    result.  ``overrides`` are AgentConfig fields (fast_capacity=..., policy=...)."""

    async def main():
        engine = TieringEngine(engine_config(root, **overrides))
        report = engine.start()
        try:
            async with trio.open_nursery() as nursery:
                await engine.run(nursery)
                h = Harness(engine, report)
                await h.check()
                with trio.fail_after(BODY_TIMEOUT):  # a deadlock fails the test, not the suite
                    result = await body(h)
                await h.check()
                await h.check_stored()
                nursery.cancel_scope.cancel()
        finally:
            engine.close()
        return result

    return trio.run(main)


__all__ = ["Ctx", "Fields", "Harness", "run_engine", "engine_config", "CHUNK"]

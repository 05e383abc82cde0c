"""The answers made without a coroutine (``lookup_now``, ``getattr_now``,
``getxattr_now``, which the patched pyfuse3 calls from the request's callback): the same
replies and errnos as the ``async`` handlers, and the same counts (the engine's metadata
ops, the kernel's lookups of an inode), so that either path may answer a request."""

from __future__ import annotations

import errno as E

import pyfuse3
from hycache_agent.fs.namespace import ROOT_INO
from hycache_agent.vfs.names import NEGATIVE_TIMEOUT

from .harness import run_engine

M = 1 << 20


def same_attrs(a: pyfuse3.EntryAttributes, b: pyfuse3.EntryAttributes) -> None:
    for field in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_mtime_ns",
                  "st_ctime_ns", "entry_timeout", "attr_timeout"):
        assert getattr(a, field) == getattr(b, field), field


async def failure(coro) -> int:
    try:
        await coro
    except pyfuse3.FUSEError as exc:
        return exc.errno
    raise AssertionError("the async handler answered where the sync one gave an errno")


def test_lookup_now_answers_and_counts_as_lookup(tmp_path):
    async def body(h):
        ops, io = h.ops, h.engine.io
        fh, ino = await h.create(b"f")
        await h.write(fh, 0, b"hello")
        await h.close(fh)
        node = h.ns.get(ino)
        ops0, looked0 = io.metadata_ops, node.lookups

        now = ops.lookup_now(ROOT_INO, b"f")
        assert (io.metadata_ops, node.lookups) == (ops0 + 1, looked0 + 1)
        later = await ops.lookup(ROOT_INO, b"f", h.ctx)
        assert (io.metadata_ops, node.lookups) == (ops0 + 2, looked0 + 2)
        same_attrs(now, later)
        assert (now.st_ino, now.st_size) == (ino, 5)
        await ops.forget([(ino, 2)])  # the kernel forgets both entries it was given
        assert node.lookups == looked0

        # a name that is not there: a negative entry (inode 0) the kernel may keep
        neg = ops.lookup_now(ROOT_INO, b"nope")
        assert (neg.st_ino, neg.entry_timeout) == (0, NEGATIVE_TIMEOUT)
        same_attrs(neg, await ops.lookup(ROOT_INO, b"nope", h.ctx))
        assert io.metadata_ops == ops0 + 4

        # an error is an errno (no exception into pyfuse3's callback), the same as the handler's
        assert ops.lookup_now(ino, b"x") == E.ENOTDIR
        assert await failure(ops.lookup(ino, b"x", h.ctx)) == E.ENOTDIR
        assert io.metadata_ops == ops0 + 6
        return node.lookups

    assert run_engine(tmp_path, body, fast_capacity=M) == 0


def test_getattr_now_and_getxattr_now(tmp_path):
    async def body(h):
        ops, io = h.ops, h.engine.io
        d = await h.mkdir(b"d")
        fh, ino = await h.create(b"f", parent=d)
        await h.write(fh, 0, b"x" * 3000)
        await h.close(fh)
        await h.setxattr(ino, b"user.color", b"blue")
        ops0 = io.metadata_ops

        for target in (ROOT_INO, d, ino):  # the directory GETATTR of default_permissions too
            same_attrs(ops.getattr_now(target), await ops.getattr(target, h.ctx))
        assert ops.getattr_now(ino).st_size == 3000
        assert ops.getattr_now(987654) == E.ENOENT
        assert await failure(ops.getattr(987654, h.ctx)) == E.ENOENT
        assert io.metadata_ops == ops0 + 9

        # security.capability, asked once per new inode: ENODATA without an exception
        assert ops.getxattr_now(ino, b"security.capability") == E.ENODATA
        assert await failure(ops.getxattr(ino, b"security.capability", h.ctx)) == E.ENODATA
        assert ops.getxattr_now(d, b"user.hycache.tier") == E.ENODATA  # not a file
        for name in (b"user.color", b"user.hycache.tier", b"user.hycache.pinned", b"user.hycache.info"):
            value = ops.getxattr_now(ino, name)
            assert type(value) is bytes and value == await ops.getxattr(ino, name, h.ctx), name
        assert ops.getxattr_now(ino, b"user.color") == b"blue"
        assert io.metadata_ops == ops0 + 21
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)

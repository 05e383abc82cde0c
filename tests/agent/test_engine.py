"""The tiering engine through its FUSE operations layer, without a kernel.

Every test drives ``HyCacheOperations`` inside trio on temporary tier directories (see
harness.py); the harness checks the engine invariants (invariants.py) after every single
operation, and that the SQLite metadata equals the namespace when the engine closes.
"""

from __future__ import annotations

import errno as E
import json
import os
import shutil
import stat

import pyfuse3
import pytest
import trio
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO

from .harness import CHUNK, Fields, kernel_lookup, run_engine
from .invariants import check_invariants, settle

K = 1 << 10
M = 1 << 20


def data(n: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-enough bytes (distinct per seed and offset)."""
    block = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def blob_path(h, ino: int, tier: str | None = None) -> str:
    return h.engine.tiers[tier or h.tier(ino)].blob(ino)


# --------------------------------------------------------------------------- basics
def test_create_write_read_truncate(tmp_path):
    async def body(h):
        fh, ino = await h.create(b"f")
        assert h.tier(ino) == T.FAST
        assert await h.write(fh, 0, b"hello") == 5
        await h.write(fh, 10, b"world")  # a hole of 5 bytes
        assert await h.read(fh, 0, 100) == b"hello" + b"\0" * 5 + b"world"
        assert (await h.ops.getattr(ino, h.ctx)).st_size == 15
        await h.truncate(ino, 7, fh)
        assert await h.read(fh, 0, 100) == b"hello\0\0"
        await h.truncate(ino, 3 * K, fh)  # grow: zeros
        assert await h.read(fh, 0, 10 * K) == b"hello" + b"\0" * (3 * K - 5)
        await h.close(fh)
        # O_TRUNC on open empties it
        fh = await h.open(ino, os.O_WRONLY | os.O_TRUNC)
        assert h.ns.get(ino).size == 0
        await h.write(fh, 0, b"again")
        await h.close(fh)
        assert await h.read_file(ino) == b"again"
        # truncating a directory or a symlink is refused
        d = await h.mkdir(b"d")
        assert await h.errno(h.truncate(d, 0)) == E.EISDIR
        s = await h.symlink(b"s", b"f")
        assert await h.errno(h.truncate(s, 0)) == E.EINVAL
        # create over an existing name
        assert await h.errno(h.create(b"f")) == E.EEXIST
        assert await h.errno(h.ops.lookup(ROOT_INO, b"nope", h.ctx)) == E.ENOENT
        return h.checks

    assert run_engine(tmp_path, body, fast_capacity=M) > 10


def test_names_and_directories(tmp_path):
    async def body(h):
        assert await h.errno(h.create(b"x" * 256)) == E.ENAMETOOLONG
        fh, ino = await h.create(b"x" * 255)
        await h.close(fh)
        raw = bytes(range(128, 256))  # not UTF-8
        fh, ino2 = await h.create(raw)
        await h.close(fh)
        assert h.listing()[raw] == ino2
        d = await h.mkdir(b"d")
        sub = await h.mkdir(b"sub", d)
        assert h.ns.get(d).nlink == 3 and h.ns.get(ROOT_INO).nlink == 3
        assert await h.errno(h.mkdir(b"d")) == E.EEXIST
        assert await h.errno(h.rmdir(b"d")) == E.ENOTEMPTY
        assert await h.errno(h.rmdir(b"x" * 255)) == E.ENOTDIR
        assert await h.errno(h.unlink(b"d")) == E.EISDIR
        assert await h.errno(h.ops.open(d, os.O_RDONLY, h.ctx)) == E.EISDIR
        assert await h.lookup(b"..", sub) == d
        await h.rmdir(b"sub", d)
        await h.rmdir(b"d")
        assert h.ns.get(ROOT_INO).nlink == 2
        assert sub not in h.ns.inodes and d not in h.ns.inodes
        total, free, files, ffree = await h.engine.statfs()
        assert total >= M and 0 < free <= total and ffree < files

    run_engine(tmp_path, body, fast_capacity=M)


# --------------------------------------------------------------------------- rename
def test_rename_files_and_replace(tmp_path):
    async def body(h):
        a = await h.write_file(b"a", b"AAAA")
        b = await h.write_file(b"b", data(200 * K, 1))
        d = await h.mkdir(b"d")
        await h.rename(b"a", b"a2", ROOT_INO, d)  # move across directories
        assert h.listing(d) == {b"a2": a} and b"a" not in h.listing()
        # replace an existing file: the replaced inode and its blob are gone
        b_blob = blob_path(h, b)
        await h.rename(b"a2", b"b", d, ROOT_INO)
        assert h.listing()[b"b"] == a and b not in h.ns.inodes
        assert not os.path.exists(b_blob)
        assert await h.read_file(a) == b"AAAA"
        # RENAME_NOREPLACE
        c = await h.write_file(b"c", b"C")
        assert await h.errno(h.rename(b"b", b"c", flags=RENAME_NOREPLACE)) == E.EEXIST
        await h.rename(b"b", b"b3", flags=RENAME_NOREPLACE)
        # both flags at once, or unknown flags: EINVAL
        assert await h.errno(h.rename(b"b3", b"c", flags=RENAME_NOREPLACE | RENAME_EXCHANGE)) == E.EINVAL
        assert await h.errno(h.rename(b"b3", b"c", flags=8)) == E.EINVAL
        # two names of one inode: rename is a no-op, both names stay
        await h.link(c, b"c-link")
        await h.rename(b"c", b"c-link")
        assert h.listing()[b"c"] == c and h.listing()[b"c-link"] == c and h.ns.get(c).nlink == 2
        assert await h.errno(h.rename(b"missing", b"x")) == E.ENOENT
        assert await h.errno(h.rename(b"c", b"x" * 256)) == E.ENAMETOOLONG

    run_engine(tmp_path, body, fast_capacity=M)


def test_rename_exchange(tmp_path):
    async def body(h):
        f = await h.write_file(b"f", b"file")
        d1 = await h.mkdir(b"d1")
        d2 = await h.mkdir(b"d2")
        sub = await h.mkdir(b"sub", d1)
        g = await h.write_file(b"g", b"gee", d2)
        # exchange a file and a directory living in different parents
        await h.rename(b"f", b"sub", ROOT_INO, d1, RENAME_EXCHANGE)
        assert h.listing()[b"f"] == sub and h.listing(d1)[b"sub"] == f
        assert h.ns.parent[sub] == ROOT_INO
        assert h.ns.get(d1).nlink == 2 and h.ns.get(ROOT_INO).nlink == 5  # d1, d2, sub(as f)
        # exchange two files
        await h.rename(b"sub", b"g", d1, d2, RENAME_EXCHANGE)
        assert h.listing(d1)[b"sub"] == g and h.listing(d2)[b"g"] == f
        assert await h.read_file(f) == b"file" and await h.read_file(g) == b"gee"
        # exchanging with a missing name
        assert await h.errno(h.rename(b"g", b"none", d2, d2, RENAME_EXCHANGE)) == E.ENOENT
        # a directory exchanged into its own subtree
        inner = await h.mkdir(b"inner", d2)
        assert await h.errno(h.rename(b"d2", b"inner", ROOT_INO, d2, RENAME_EXCHANGE)) == E.EINVAL
        assert await h.errno(h.rename(b"inner", b"d2", d2, ROOT_INO, RENAME_EXCHANGE)) == E.EINVAL
        assert h.ns.parent[inner] == d2

    run_engine(tmp_path, body, fast_capacity=M)


def test_rename_directories(tmp_path):
    async def body(h):
        a = await h.mkdir(b"a")
        b = await h.mkdir(b"b", a)
        c = await h.mkdir(b"c", b)
        f = await h.write_file(b"f", b"x")
        # a directory into its own subtree, or onto itself
        assert await h.errno(h.rename(b"a", b"a-moved", ROOT_INO, c)) == E.EINVAL
        assert await h.errno(h.rename(b"a", b"x", ROOT_INO, a)) == E.EINVAL
        # directory over file, file over directory, over a non-empty directory
        assert await h.errno(h.rename(b"a", b"f")) == E.ENOTDIR
        assert await h.errno(h.rename(b"f", b"a")) == E.EISDIR
        e = await h.mkdir(b"e")
        assert await h.errno(h.rename(b"e", b"b", ROOT_INO, a)) == E.ENOTEMPTY
        # over an empty directory: replaced, nlinks fixed
        await h.rename(b"c", b"e", b, ROOT_INO)
        assert h.listing()[b"e"] == c and e not in h.ns.inodes
        assert h.ns.get(b).nlink == 2 and h.ns.parent[c] == ROOT_INO
        assert await h.errno(h.rename(b".", b"z")) in (E.EBUSY, E.EINVAL)
        # a whole subtree moves with its files
        g = await h.write_file(b"g", b"deep", b)
        await h.rename(b"a", b"a2", ROOT_INO, c)
        assert h.ns.path_of(g) == b"/e/a2/b/g"
        assert await h.read_file(g) == b"deep" and f in h.ns.inodes

    run_engine(tmp_path, body, fast_capacity=M)


# --------------------------------------------------------------------------- lifetimes
def test_unlink_while_open(tmp_path):
    async def body(h):
        payload = data(300 * K, 3)
        fh, ino = await h.create(b"f")
        await h.write(fh, 0, payload)
        blob = blob_path(h, ino)
        await h.unlink(b"f")
        assert b"f" not in h.listing() and h.ns.get(ino).nlink == 0
        assert os.path.exists(blob)
        assert await h.read(fh, 0, len(payload)) == payload
        await h.write(fh, len(payload), b"tail")  # still writable
        fh2 = await h.open(ino, os.O_RDONLY)  # another handle (e.g. /proc/PID/fd)
        await h.close(fh)
        assert os.path.exists(blob)
        assert await h.read(fh2, len(payload), 10) == b"tail"
        await h.close(fh2)
        assert ino not in h.ns.inodes and not os.path.exists(blob)
        assert h.engine.fast_used == 0 and ino not in h.engine.policy

        # the same while the bytes are on the slow tier
        fh, ino = await h.create(b"g")
        await h.write(fh, 0, payload)
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        assert h.tier(ino) == T.SLOW
        blob = blob_path(h, ino)
        await h.unlink(b"g")
        assert await h.read(fh, 0, len(payload)) == payload
        await h.close(fh)
        assert not os.path.exists(blob)

        # a kernel reference (lookup count) alone also keeps the inode
        ino = await h.write_file(b"k", b"kernel")
        await h.ops.lookup(ROOT_INO, b"k", h.ctx)
        await h.unlink(b"k")
        assert ino in h.ns.inodes and os.path.exists(blob_path(h, ino))
        await h.ops.forget([(ino, 1)])
        await h.check()
        assert ino not in h.ns.inodes

    run_engine(tmp_path, body, fast_capacity=M)


def test_hard_links(tmp_path):
    async def body(h):
        ino = await h.write_file(b"a", b"shared")
        d = await h.mkdir(b"d")
        await h.link(ino, b"b", d)
        assert h.ns.get(ino).nlink == 2
        assert await h.errno(h.link(ino, b"b", d)) == E.EEXIST
        assert await h.errno(h.link(d, b"dlink")) == E.EPERM
        await h.unlink(b"a")
        assert h.ns.get(ino).nlink == 1 and os.path.exists(blob_path(h, ino))
        fh = await h.open(h.listing(d)[b"b"])
        await h.write(fh, 6, b"+more")
        await h.close(fh)
        assert await h.read_file(ino) == b"shared+more"
        # migrations move the one blob, both names see it
        await h.link(ino, b"c")
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        assert h.tier(ino) == T.SLOW
        await h.unlink(b"b", d)
        await h.unlink(b"c")
        assert ino not in h.ns.inodes

    run_engine(tmp_path, body, fast_capacity=M)


def test_symlinks_and_special_files(tmp_path):
    async def body(h):
        # a symlink whose target looks like a tier path must stay a user's symlink
        target = str(h.engine.tiers[T.SLOW].blob(2)).encode()
        s = await h.symlink(b"s", target)
        assert await h.ops.readlink(s, h.ctx) == target
        assert stat.S_ISLNK(h.ns.get(s).mode) and h.ns.get(s).tier is None
        assert await h.errno(h.ops.readlink(ROOT_INO, h.ctx)) == E.EINVAL
        assert await h.errno(h.ops.open(s, os.O_RDONLY, h.ctx)) == E.ENXIO
        fifo = await h.mknod(b"fifo", stat.S_IFIFO | 0o640)
        assert stat.S_ISFIFO(h.ns.get(fifo).mode) and h.ns.get(fifo).tier is None
        chardev = await h.mknod(b"null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert h.ns.get(chardev).rdev == os.makedev(1, 3)
        reg = await h.mknod(b"reg", stat.S_IFREG | 0o600)  # mknod of a regular file gets a blob
        assert h.tier(reg) == T.FAST and os.path.exists(blob_path(h, reg))
        assert await h.errno(h.ops.getxattr(s, b"user.hycache.tier", h.ctx)) == E.ENODATA
        info = json.loads(await h.getxattr(s, b"user.hycache.info"))
        assert info["type"] == "symlink" and info["tier"] is None
        return target

    target = run_engine(tmp_path, body, fast_capacity=M)

    async def after_restart(h):
        s, fifo = h.listing()[b"s"], h.listing()[b"fifo"]
        assert await h.ops.readlink(s, h.ctx) == target
        assert stat.S_ISFIFO(h.ns.get(fifo).mode)
        assert h.ns.get(h.listing()[b"null"]).rdev == os.makedev(1, 3)
        assert h.report["orphan_blobs_removed"] == 0 and h.report["orphan_inodes_removed"] == 0

    run_engine(tmp_path, after_restart, fast_capacity=M)


def test_xattrs(tmp_path):
    async def body(h):
        ino = await h.write_file(b"f", b"x")
        assert await h.errno(h.ops.getxattr(ino, b"user.none", h.ctx)) == E.ENODATA
        await h.setxattr(ino, b"user.color", b"blue")
        await h.setxattr(ino, b"user.bin", bytes(range(256)))
        await h.setxattr(ino, b"user.color", b"red")  # replace
        assert await h.getxattr(ino, b"user.color") == b"red"
        assert sorted(await h.ops.listxattr(ino, h.ctx)) == [b"user.bin", b"user.color"]
        await h.ops.removexattr(ino, b"user.bin", h.ctx)
        assert await h.errno(h.ops.removexattr(ino, b"user.bin", h.ctx)) == E.ENODATA
        # the agent's own namespace: virtual, validated, not storable
        assert await h.getxattr(ino, b"user.hycache.tier") == b"fast"
        assert await h.getxattr(ino, b"user.hycache.pinned") == b"0"
        info = json.loads(await h.getxattr(ino, b"user.hycache.info"))
        assert info["ino"] == ino and info["tier"] == "fast" and info["size"] == 1
        assert info["blob"] == blob_path(h, ino) and info["agent_root"] == str(tmp_path)
        assert await h.errno(h.ops.setxattr(ino, b"user.hycache.other", b"1", h.ctx)) == E.EPERM
        assert await h.errno(h.ops.removexattr(ino, b"user.hycache.tier", h.ctx)) == E.EPERM
        assert await h.errno(h.ops.setxattr(ino, b"user.hycache.tier", b"medium", h.ctx)) == E.EINVAL
        assert await h.errno(h.ops.setxattr(ino, b"user.hycache.pinned", b"yes", h.ctx)) == E.EINVAL
        d = await h.mkdir(b"d")
        assert await h.errno(h.ops.setxattr(d, b"user.hycache.tier", b"slow", h.ctx)) == E.EINVAL
        await h.setxattr(d, b"user.dir", b"ok")
        big = await h.write_file(b"big", data(2 * M))
        assert await h.errno(h.ops.setxattr(big, b"user.hycache.tier", b"fast", h.ctx)) == E.ENOSPC
        return ino, d

    ino, d = run_engine(tmp_path, body, fast_capacity=M)

    async def after_restart(h):
        assert await h.getxattr(ino, b"user.color") == b"red"
        assert await h.ops.listxattr(ino, h.ctx) == [b"user.color"]
        assert await h.getxattr(d, b"user.dir") == b"ok"

    run_engine(tmp_path, after_restart, fast_capacity=M)


# --------------------------------------------------------------------------- tiering
def test_spill_never_enospc(tmp_path):
    async def body(h):
        small = await h.write_file(b"small", data(100 * K, 1))
        payload = data(3 * M + 12345, 2)
        fh, ino = await h.create(b"big")
        # every 128 KiB write is checked; none may fail while the slow tier has room
        await h.write(fh, 0, payload)
        assert h.tier(ino) == T.SLOW
        assert h.engine.counters.spills == 1
        assert await h.read(fh, 0, len(payload)) == payload
        await h.close(fh)
        assert h.engine.fast_used <= h.engine.capacity
        assert await h.read_file(ino) == payload
        # a truncate that grows past the capacity spills too
        fh, ino2 = await h.create(b"grown")
        await h.write(fh, 0, b"head")
        await h.truncate(ino2, 2 * M, fh)
        assert h.tier(ino2) == T.SLOW and h.ns.get(ino2).size == 2 * M
        assert await h.read(fh, 0, 8) == b"head\0\0\0\0"
        await h.close(fh)
        assert await h.read_file(small) == data(100 * K, 1)

    run_engine(tmp_path, body, fast_capacity=M)


def test_eviction_to_low_watermark(tmp_path):
    cap = M
    size = 100 * K

    async def body(h):
        inos = []
        for i in range(9):  # 900 KiB: just below the high watermark (0.9 * 1 MiB)
            inos.append(await h.write_file(b"f%d" % i, data(size, i)))
        assert all(h.tier(i) == T.FAST for i in inos)
        assert h.engine.counters.evictions == 0
        # read f0 and f1 again: they become the most recently used
        for i in inos[:2]:
            await h.read_file(i)
        assert h.fast_order() == inos[2:] + inos[:2]
        inos.append(await h.write_file(b"f9", data(size, 9)))  # 1000 KiB > high watermark
        assert h.engine.fast_used <= 0.7 * cap
        # the least recently used went, in order: f2, f3, f4 (700 KiB left)
        demoted = [i for i in inos if h.tier(i) == T.SLOW]
        assert demoted == inos[2:5]
        assert h.fast_order() == inos[5:9] + inos[:2] + [inos[9]]
        for n, i in enumerate(inos):
            fh = await h.open(i, os.O_RDONLY)  # promotion on open may run meanwhile
            assert await h.read(fh, 0, size) == data(size, n)
            await h.close(fh)

    run_engine(tmp_path, body, fast_capacity=cap, high_watermark=0.9, low_watermark=0.7,
               promote_on_open=False)


def test_promotion_on_open(tmp_path):
    async def body(h):
        payload = data(400 * K, 5)
        ino = await h.write_file(b"f", payload)
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        assert h.tier(ino) == T.SLOW and h.engine.fast_used == 0
        # open: reads are served at once (from the slow tier), the promotion follows
        fi = await h.ops.open(ino, os.O_RDONLY, h.ctx)
        assert await h.ops.read(fi.fh, 0, 4096) == payload[:4096]
        await settle(h.engine)
        check_invariants(h.engine)
        assert h.tier(ino) == T.FAST and h.engine.counters.promotions == 1
        assert await h.read(fi.fh, 0, len(payload)) == payload  # the handle follows the file
        await h.close(fi.fh)
        # a file larger than the high watermark is read in place, never promoted
        big = await h.write_file(b"big", data(2 * M, 6))
        assert h.tier(big) == T.SLOW
        assert await h.read_file(big) == data(2 * M, 6)
        assert h.tier(big) == T.SLOW and h.engine.counters.promotions == 1
        # writing while the promotion copies: the switch is abandoned, nothing is lost
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        fi = await h.ops.open(ino, os.O_RDWR, h.ctx)
        await h.ops.write(fi.fh, 0, b"CHANGED")
        await h.close(fi.fh)
        assert (await h.read_file(ino))[:8] == b"CHANGED" + payload[7:8]

    run_engine(tmp_path, body, fast_capacity=M)


def test_pinned_files_never_evicted(tmp_path):
    async def body(h):
        pinned = await h.write_file(b"pinned", data(300 * K, 1))
        await h.setxattr(pinned, b"user.hycache.pinned", b"1")
        assert await h.getxattr(pinned, b"user.hycache.pinned") == b"1"
        others = [await h.write_file(b"o%d" % i, data(200 * K, i)) for i in range(8)]
        # 300K pinned + 1600K of others through a 1 MiB tier: the pinned file, the
        # oldest, stays; others were evicted around it
        assert h.tier(pinned) == T.FAST
        assert any(h.tier(o) == T.SLOW for o in others)
        # a spill under pressure does not move it either
        big = await h.write_file(b"big", data(3 * M, 9))
        assert h.tier(big) == T.SLOW and h.tier(pinned) == T.FAST
        # demoting a pinned file explicitly is allowed (pinning guards only eviction)
        await h.setxattr(pinned, b"user.hycache.pinned", b"0")
        for i in range(8, 14):
            others.append(await h.write_file(b"o%d" % i, data(200 * K, i)))
        assert h.tier(pinned) == T.SLOW  # unpinned, the oldest: evicted
        return pinned

    pinned = run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)

    async def after_restart(h):
        assert h.ns.get(pinned).pinned is False
        await h.setxattr(pinned, b"user.hycache.pinned", b"1")

    run_engine(tmp_path, after_restart, fast_capacity=M)

    async def pin_survives(h):
        assert h.ns.get(pinned).pinned is True

    run_engine(tmp_path, pin_survives, fast_capacity=M)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_restart_preserves_data_policy_and_pins(tmp_path, policy):
    files = {b"f%d" % i: data((i + 1) * 37 * K, i) for i in range(12)}

    async def body(h):
        d = await h.mkdir(b"dir")
        inos = {}
        for name, payload in files.items():
            inos[name] = await h.write_file(name, payload, d)
        # a varied access history: some files read several times, some demoted
        for name in (b"f3", b"f1", b"f3", b"f7", b"f0", b"f3", b"f1"):
            await h.read_file(inos[name])
        await h.setxattr(inos[b"f5"], b"user.hycache.pinned", b"1")
        await h.setxattr(inos[b"f2"], b"user.hycache.tier", b"slow")
        await h.link(inos[b"f4"], b"f4-link")
        await h.symlink(b"sym", b"dir/f1")
        state = {
            "order": h.fast_order(),
            "tiers": {name: h.tier(ino) for name, ino in inos.items()},
            "inos": inos,
            "fast_used": h.engine.fast_used,
            "rows": {ino: inode.row() for ino, inode in h.ns.inodes.items()},
        }
        assert state["tiers"][b"f2"] == T.SLOW and any(t == T.FAST for t in state["tiers"].values())
        return state

    before = run_engine(tmp_path, body, fast_capacity=M, policy=policy, promote_on_open=False)

    async def after(h):
        assert not any(h.report.values()), h.report  # a clean shutdown leaves nothing to recover
        d = h.listing()[b"dir"]
        assert {n: i for n, i in h.listing(d).items()} == before["inos"]
        assert {ino: inode.row() for ino, inode in h.ns.inodes.items()} == before["rows"]
        assert h.fast_order() == before["order"]
        assert h.engine.fast_used == before["fast_used"]
        assert h.ns.get(before["inos"][b"f5"]).pinned
        assert h.ns.get(before["inos"][b"f4"]).nlink == 2
        assert await h.ops.readlink(h.listing()[b"sym"], h.ctx) == b"dir/f1"
        for name, payload in files.items():
            assert await h.read_file(before["inos"][name]) == payload
        # new inode numbers never reuse old ones
        fh, new = await h.create(b"new")
        await h.close(fh)
        assert new > max(before["rows"])

    run_engine(tmp_path, after, fast_capacity=M, policy=policy, promote_on_open=False)


def test_restart_policy_order_after_background_promotion(tmp_path):
    """The LRU queue in memory and the last-access order persisted for the restart must
    agree even when a promotion finishes after other files were accessed."""

    async def body(h):
        x = await h.write_file(b"x", data(100 * K, 1))
        y = await h.write_file(b"y", data(100 * K, 2))
        await h.setxattr(x, b"user.hycache.tier", b"slow")
        fx = (await h.ops.open(x, os.O_RDONLY, h.ctx)).fh  # promotion starts in the background
        fy = (await h.ops.open(y, os.O_RDONLY, h.ctx)).fh  # y is accessed after x
        await settle(h.engine)
        await h.close(fx)
        await h.close(fy)
        assert h.tier(x) == T.FAST
        return h.fast_order()

    order = run_engine(tmp_path, body, fast_capacity=M)

    async def after(h):
        assert h.fast_order() == order

    run_engine(tmp_path, after, fast_capacity=M)


# --------------------------------------------------------------------------- recovery
def test_recovery_resolves_leftovers(tmp_path):
    async def body(h):
        await h.write_file(b"a", data(50 * K, 1))
        b = await h.write_file(b"b", data(60 * K, 2))
        await h.write_file(b"c", data(70 * K, 3))
        await h.write_file(b"e", data(80 * K, 4))
        await h.setxattr(b, b"user.hycache.tier", b"slow")
        return {n: i for n, i in h.listing().items()}

    inos = run_engine(tmp_path, body, fast_capacity=M, promote_on_open=False)
    fast, slow = T.Tier(T.FAST, tmp_path / "fast"), T.Tier(T.SLOW, tmp_path / "slow")
    a, b, c, e = inos[b"a"], inos[b"b"], inos[b"c"], inos[b"e"]
    # a crash mid-copy: a half-written staged copy of b on the fast tier
    with open(fast.temp_blob(b), "wb") as f:
        f.write(data(10 * K, 2))
    # a crash after the rename but before the old copy was removed: a on both tiers
    shutil.copyfile(fast.blob(a), slow.blob(a))
    # blobs of inodes that no longer exist, and a stray file
    with open(slow.blob(4242), "wb") as f:
        f.write(b"orphan")
    with open(fast.blob(999), "wb") as f:
        f.write(b"orphan too")
    with open(fast.data_dir / "00" / "not-a-blob", "wb") as f:
        f.write(b"junk")
    # metadata says fast, only a slow copy exists (adopted, never deleted)
    os.rename(fast.blob(c), slow.blob(c))
    # bytes written after the last metadata commit: the blob is longer than the inode says
    with open(fast.blob(e), "ab") as f:
        f.write(b"extra")

    async def after(h):
        r = h.report
        assert r["temp_removed"] == 1
        assert r["duplicates_removed"] == 1
        assert r["orphan_blobs_removed"] == 3
        assert r["sizes_fixed"] == 1
        assert r["missing_blobs"] == 0
        assert not os.path.exists(fast.temp_blob(b)) and not os.path.exists(slow.blob(a))
        assert not os.path.exists(slow.blob(4242)) and not os.path.exists(fast.blob(999))
        assert h.tier(a) == T.FAST and h.tier(b) == T.SLOW and h.tier(c) == T.SLOW
        assert await h.read_file(a) == data(50 * K, 1)
        assert await h.read_file(b) == data(60 * K, 2)
        assert await h.read_file(c) == data(70 * K, 3)
        assert await h.read_file(e) == data(80 * K, 4) + b"extra"
        assert c not in h.engine.policy and a in h.engine.policy

    run_engine(tmp_path, after, fast_capacity=M, promote_on_open=False)

    async def clean(h):
        assert not any(h.report.values()), h.report

    run_engine(tmp_path, clean, fast_capacity=M)


def test_recovery_missing_blob_and_nameless_inode(tmp_path):
    async def body(h):
        a = await h.write_file(b"a", b"gone")
        fh, b = await h.create(b"b")
        await h.write(fh, 0, b"open at crash")
        await h.unlink(b"b")  # unlinked while open: the engine stops with it open
        return a, b, fh

    a, b, fh = run_engine(tmp_path, body, fast_capacity=M)
    fast = T.Tier(T.FAST, tmp_path / "fast")
    os.unlink(fast.blob(a))

    async def after(h):
        assert h.report["missing_blobs"] == 1
        assert h.report["orphan_inodes_removed"] == 1
        assert h.ns.get(a).size == 0 and await h.read_file(a) == b""
        assert b not in h.ns.inodes and not os.path.exists(fast.blob(b))

    run_engine(tmp_path, after, fast_capacity=M)


# --------------------------------------------------------------------------- concurrency
def test_concurrent_writers_and_migrations(tmp_path):
    """Many tasks write, read, truncate and delete while the tiny tier forces constant
    evictions and spills; invariants hold whenever everything has settled."""

    async def body(h):
        contents: dict[bytes, bytearray] = {}

        async def worker(w: int) -> None:
            for round_ in range(6):
                name = b"w%d-%d" % (w, round_ % 3)
                try:
                    attrs = await kernel_lookup(h.ops, ROOT_INO, name, h.ctx)
                    ino = attrs.st_ino
                    await h.ops.forget([(ino, 1)])
                    fi = await h.ops.open(ino, os.O_RDWR, h.ctx)
                    fh = fi.fh
                except pyfuse3.FUSEError:
                    fi, attrs = await h.ops.create(ROOT_INO, name, stat.S_IFREG | 0o644, os.O_RDWR, h.ctx)
                    await h.ops.forget([(attrs.st_ino, 1)])
                    fh, ino = fi.fh, attrs.st_ino
                    contents[name] = bytearray()
                buf = contents[name]
                off = (w * 7919 + round_ * 104729) % (300 * K)
                chunk = data(CHUNK, w * 10 + round_)
                n = await h.ops.write(fh, off, chunk)
                assert n == len(chunk)
                if len(buf) < off:
                    buf.extend(b"\0" * (off - len(buf)))
                buf[off:off + n] = chunk
                got = await h.ops.read(fh, 0, len(buf) + 10)
                assert got == bytes(buf)
                await h.ops.flush(fh)
                await h.ops.release(fh)
                if round_ == 4:
                    await h.ops.unlink(ROOT_INO, name, h.ctx)
                    del contents[name]
                await trio.sleep(0)

        async with trio.open_nursery() as n:
            for w in range(6):
                n.start_soon(worker, w)
        await h.check()
        for name, buf in contents.items():
            assert await h.read_file(h.ns.lookup(ROOT_INO, name).ino) == bytes(buf)
        assert h.engine.counters.migrations_failed == 0
        return h.engine.counters

    counters = run_engine(tmp_path, body, fast_capacity=512 * K)
    assert counters.evictions + counters.spills > 0


def test_victim_deleted_while_making_room(tmp_path):
    """A write that must evict several closed files: one of the chosen victims is deleted
    while an earlier one is being copied.  The write must still succeed."""

    async def body(h):
        # 900 KiB resident (below the high watermark); the next 128 KiB write needs 4 KiB
        # more than the 1 MiB capacity: v1 (1 KiB) is evicted first, then v2, then v3
        v1 = await h.write_file(b"v1", data(1 * K, 1))
        await h.write_file(b"v2", data(1 * K, 2))
        await h.write_file(b"v3", data(100 * K, 3))
        fh, w = await h.create(b"w")
        await h.write(fh, 0, data(798 * K, 4))
        result = {}

        async def writer():
            try:
                await h.ops.write(fh, 798 * K, data(CHUNK, 5))
                result["ok"] = True
            except pyfuse3.FUSEError as exc:
                result["errno"] = os.strerror(exc.errno)

        async with trio.open_nursery() as n:
            n.start_soon(writer)
            with trio.fail_after(10):
                while v1 not in h.engine.active:
                    await trio.sleep(0)
            await h.ops.unlink(ROOT_INO, b"v2", h.ctx)  # frees 1 KiB: not enough yet
        assert result == {"ok": True}
        await h.check()
        assert await h.read(fh, 798 * K, CHUNK) == data(CHUNK, 5)
        await h.close(fh)
        assert h.engine.counters.migrations_failed == 0

    run_engine(tmp_path, body, fast_capacity=M)


def test_unlink_during_migration_switch(tmp_path):
    """A file deleted while its promotion is committing must not stay in the policy or
    the fast-tier accounting."""

    async def body(h):
        x = await h.write_file(b"x", data(200 * K, 1))
        await h.setxattr(x, b"user.hycache.tier", b"slow")
        await h.ops.setxattr(x, b"user.hycache.tier", b"fast", h.ctx)
        with trio.fail_after(10):
            while h.ns.inodes[x].tier != T.FAST:  # the switch is committing the metadata
                await trio.sleep(0)
        assert x in h.engine.active
        await h.ops.unlink(ROOT_INO, b"x", h.ctx)
        await h.check()
        assert x not in h.engine.policy and h.engine.fast_used == 0

    run_engine(tmp_path, body, fast_capacity=M)


def test_unlink_during_migration_copy(tmp_path):
    async def body(h):
        x = await h.write_file(b"x", data(900 * K, 1))
        await h.ops.setxattr(x, b"user.hycache.tier", b"slow", h.ctx)
        with trio.fail_after(10):
            while x not in h.engine.active:
                await trio.sleep(0)
        await h.ops.unlink(ROOT_INO, b"x", h.ctx)
        await h.check()
        assert x not in h.ns.inodes and h.engine.fast_used == 0

    run_engine(tmp_path, body, fast_capacity=M)


def test_spill_while_demotion_in_flight(tmp_path):
    """A write that must spill a file whose demotion is already copying: it must neither
    fail with ENOSPC (the slow tier has room) nor deadlock (the demotion's switch waits for
    the lock the writer holds)."""

    async def body(h):
        fh, y = await h.create(b"y")
        await h.write(fh, 0, data(1_000_000, 1))
        await h.ops.setxattr(y, b"user.hycache.tier", b"slow", h.ctx)
        with trio.fail_after(10):
            while y not in h.engine.active:
                await trio.sleep(0)
        # 1_000_000 + 128 KiB > 1 MiB: this write must spill (or wait for the demotion)
        await h.ops.write(fh, 1_000_000, data(CHUNK, 2))
        await h.check()
        assert await h.read(fh, 1_000_000, CHUNK) == data(CHUNK, 2)
        await h.close(fh)

    run_engine(tmp_path, body, fast_capacity=M)


def test_handle_survives_round_trip_migration(tmp_path):
    """A handle opened on the slow tier, file promoted then demoted again (slow→fast→slow)
    before the handle is used: its writes must reach the file's current blob, not the
    deleted one it opened first (data loss seen through the mount as O_TRUNC rewrites
    that read back as zeros)."""

    async def body(h):
        payload = data(200 * K, 1)
        ino = await h.write_file(b"f", payload)
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        fh = await h.open(ino, os.O_RDWR)  # promotion on open, in the background
        assert h.tier(ino) == T.FAST
        await h.setxattr(ino, b"user.hycache.tier", b"slow")  # and back again
        assert h.tier(ino) == T.SLOW
        await h.write(fh, 0, b"NEW")
        assert await h.read(fh, 0, 8) == b"NEW" + payload[3:8]
        await h.close(fh)
        assert await h.read_file(ino) == b"NEW" + payload[3:]
        # the same through O_TRUNC + a write that spills (the mount's usual pattern)
        fh = await h.open(ino, os.O_WRONLY | os.O_TRUNC)  # size 0 now: promoted at once
        assert h.tier(ino) == T.FAST
        await h.write(fh, 50 * K, data(2 * M, 2))  # spills back to the slow tier
        await h.close(fh)
        assert h.tier(ino) == T.SLOW
        assert await h.read_file(ino) == bytes(50 * K) + data(2 * M, 2)

    run_engine(tmp_path, body, fast_capacity=M)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concurrent_random_operations(tmp_path, seed):
    """Five tasks do random writes, truncates, reads, unlinks, renames (all flags), links,
    pin and tier requests on eight shared names through a 512 KiB fast tier.  Like the
    kernel, namespace changes of one directory are serialized (its i_rwsem) and an inode
    is held by a lookup while it is used.  No operation may fail unexpectedly, and the
    invariants must hold once everything settles."""
    import random

    async def body(h):
        ops, ctx = h.ops, h.ctx
        dirlock = trio.Lock()
        names = [b"f%d" % i for i in range(8)]

        async def worker(w: int) -> None:
            r = random.Random(seed * 100 + w)
            for step in range(60):
                name = r.choice(names)
                op = r.choice(["write", "write", "trunc", "read", "unlink", "rename", "tier", "pin", "link"])
                held: list[int] = []
                allowed = {E.ENOENT, E.EEXIST} | ({E.ENOSPC} if op == "tier" else set())
                try:
                    if op in ("unlink", "rename", "link"):
                        async with dirlock:
                            if op == "unlink":
                                await ops.unlink(ROOT_INO, name, ctx)
                            elif op == "rename":
                                await ops.rename(ROOT_INO, name, ROOT_INO, r.choice(names),
                                                 r.choice([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]), ctx)
                            else:
                                a = await kernel_lookup(ops, ROOT_INO, name, ctx)
                                held.append(a.st_ino)
                                a2 = await ops.link(a.st_ino, ROOT_INO, r.choice(names), ctx)
                                held.append(a2.st_ino)
                    elif op == "write":
                        async with dirlock:  # open(O_CREAT): lookup-or-create under the dir lock
                            try:
                                a = await kernel_lookup(ops, ROOT_INO, name, ctx)
                                held.append(a.st_ino)
                                fh = (await ops.open(a.st_ino, os.O_RDWR, ctx)).fh
                            except pyfuse3.FUSEError:
                                fi, a = await ops.create(ROOT_INO, name, stat.S_IFREG | 0o644, os.O_RDWR, ctx)
                                held.append(a.st_ino)
                                fh = fi.fh
                        try:
                            n = await ops.write(fh, r.randint(0, 300 * K), data(r.randint(1, CHUNK), step))
                            assert n > 0
                        finally:
                            await ops.flush(fh)
                            await ops.release(fh)
                    else:
                        a = await kernel_lookup(ops, ROOT_INO, name, ctx)
                        held.append(a.st_ino)
                        if op == "trunc":
                            attr = pyfuse3.EntryAttributes()
                            attr.st_size = r.randint(0, 400 * K)
                            await ops.setattr(a.st_ino, attr, Fields(update_size=True), None, ctx)
                        elif op == "read":
                            fh = (await ops.open(a.st_ino, os.O_RDONLY, ctx)).fh
                            try:
                                got = await ops.read(fh, 0, 500 * K)
                                assert len(got) <= 500 * K
                            finally:
                                await ops.release(fh)
                        elif op == "tier":
                            await ops.setxattr(a.st_ino, b"user.hycache.tier", r.choice([b"fast", b"slow"]), ctx)
                        else:
                            await ops.setxattr(a.st_ino, b"user.hycache.pinned", r.choice([b"0", b"1"]), ctx)
                except pyfuse3.FUSEError as exc:
                    assert exc.errno in allowed, f"worker {w} step {step}: {op} {name!r}: {os.strerror(exc.errno)}"
                finally:
                    for ino in held:
                        await ops.forget([(ino, 1)])
                await trio.sleep(0)

        async with trio.open_nursery() as n:
            for w in range(5):
                n.start_soon(worker, w)
        await h.check()
        assert not h.engine.handles
        return h.engine.counters

    counters = run_engine(tmp_path, body, fast_capacity=512 * K)
    assert counters.migrations_done > 5 and counters.migrations_failed == 0


def test_failing_slow_tier_does_not_kill_the_engine(tmp_path):
    """The slow tier's directories vanish (an unmounted disk, a lost NFS server): evictions
    fail, but the engine keeps serving and evicts again once the tier is back."""

    async def body(h):
        # While the slow tier is gone the evictor keeps retrying in the background, so the
        # "idle" invariants cannot hold: this part drives the operations directly and the
        # invariants are checked once the tier is back.
        ops, ctx = h.ops, h.ctx

        async def write_file(name: bytes, payload: bytes) -> int:
            fi, attrs = await ops.create(ROOT_INO, name, 0o644, os.O_RDWR, ctx)
            await ops.write(fi.fh, 0, payload)
            await ops.flush(fi.fh)
            await ops.release(fi.fh)
            return attrs.st_ino

        async def read_file(ino: int) -> bytes:
            fh = (await ops.open(ino, os.O_RDONLY, ctx)).fh
            try:
                return await ops.read(fh, 0, h.ns.get(ino).size + 1)
            finally:
                await ops.release(fh)

        slow = h.engine.tiers[T.SLOW]
        shutil.rmtree(slow.data_dir)
        inos = [await write_file(b"f%d" % i, data(150 * K, i)) for i in range(6)]  # 900 KiB
        fi, _attrs = await ops.create(ROOT_INO, b"trigger", 0o644, os.O_RDWR, ctx)
        await ops.write(fi.fh, 0, data(100 * K, 9))  # above the high watermark: the evictor runs
        await trio.sleep(0.3)  # it fails (no slow tier) and retries
        assert await ops.read(fi.fh, 0, 10) == data(100 * K, 9)[:10]
        await ops.release(fi.fh)
        for n, i in enumerate(inos):
            assert await read_file(i) == data(150 * K, n)
        slow.prepare()  # the slow tier is back
        h.engine.placement.check_watermark()
        with trio.fail_after(30):
            while h.engine.fast_used > 0.7 * h.engine.capacity or h.engine.active:
                await trio.sleep(0.05)  # (the last eviction's tail: removing the old copy)
        await h.check()
        assert any(h.tier(i) == T.SLOW for i in inos)

    run_engine(tmp_path, body, fast_capacity=M)

"""A read (or fsync) whose worker thread opens the blob only after a migration removed it.

``TieringEngine._io`` chooses the blob (tier, generation, path) on the event loop and opens
it in a worker thread when the handle has no descriptor for it yet (the first read after
an open). Reads take no inode lock, so a promotion started by that open can copy, switch
and remove the old blob in between: the open then fails with ENOENT, and the application's
read(2) with it. Seen through the mount with fsx in O_DIRECT mode (passthrough off, 1 MiB
fast tier, seed 42, 20,000 operations): TRUNCATE DOWN to 0x4d18c, CLOSE/OPEN, READ ->
"pread (O_DIRECT) ... failed: No such file or directory". Buffered reads hide it behind
the page cache. Here the worker thread is held at the open until the promotion is done.
"""

from __future__ import annotations

import os
import threading

import trio
from hycache_agent.fs import engine as engine_mod
from hycache_agent.fs import tiers as T

from .harness import run_engine
from .invariants import check_invariants, settle
from .test_engine import K, M, data


def test_first_read_after_open_survives_the_promotion_it_started(tmp_path, monkeypatch):
    armed, go, held = threading.Event(), threading.Event(), threading.Event()
    orig = engine_mod.Handle.fd_for

    def fd_for(self, path, tier, gen):
        if armed.is_set() and self.fd < 0 and not go.is_set():  # the first open: wait for the migration
            held.set()
            go.wait(30)
        return orig(self, path, tier, gen)

    monkeypatch.setattr(engine_mod.Handle, "fd_for", fd_for)

    async def body(h):
        payload = data(400 * K, 3)
        ino = await h.write_file(b"f", payload)
        await h.setxattr(ino, b"user.hycache.tier", b"slow")
        assert h.tier(ino) == T.SLOW
        armed.set()
        fi = await h.ops.open(ino, os.O_RDONLY, h.ctx)  # starts the promotion (background)
        got: list[bytes | BaseException] = []

        async def reader():
            try:
                got.append(await h.ops.read(fi.fh, 0, 64 * K))
            except BaseException as exc:
                got.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.to_thread.run_sync(held.wait, 30)  # the read chose the slow blob
            await settle(h.engine)  # the promotion copied, switched, removed the slow blob
            assert h.tier(ino) == T.FAST and h.engine.counters.promotions == 1
            assert not os.path.exists(h.engine.tiers[T.SLOW].blob(ino))
            go.set()
        assert got and not isinstance(got[0], BaseException), f"read failed: {got[0]!r}"
        assert got[0] == payload[: 64 * K]
        check_invariants(h.engine)
        await h.ops.fsync(fi.fh, False)
        await h.close(fi.fh)

    run_engine(tmp_path, body, fast_capacity=M)

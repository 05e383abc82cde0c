"""Fixtures for the peer data service: a real PeerServer on 127.0.0.1 (free port) inside
the test's trio loop, serving a :class:`DirFiles` directory, and a real PeerClient."""

from __future__ import annotations

import hashlib
import os

import pytest
import trio
from hycache_agent.transport.client import PeerClient
from hycache_agent.transport.server import PeerServer
from hycache_harness.dirfiles import DirFiles

SECRET = b"peer-tests-secret-0123456789abcdef"


class ServerHandle:
    """A PeerServer that a test can stop (connections dropped mid-transfer) and restart on
    the same port."""

    def __init__(self, nursery: trio.Nursery, files: DirFiles, **kw) -> None:
        self.nursery = nursery
        self.files = files
        self.kw = kw
        self.server: PeerServer | None = None
        self.address: tuple[str, int] | None = None
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    @property
    def addr(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    async def start(self) -> ServerHandle:
        self.server = PeerServer(self.files, node_id=self.kw.pop("node_id", "server-1"),
                                 secret=self.kw.pop("secret", SECRET), **self.kw)
        port = self.address[1] if self.address else 0
        self._scope, self._done = trio.CancelScope(), trio.Event()
        scope, done, server = self._scope, self._done, self.server

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await server.serve("127.0.0.1", port, task_status=task_status)
            finally:
                done.set()

        self.address = await self.nursery.start(run)
        return self

    async def stop(self) -> None:
        self._scope.cancel()
        await self._done.wait()


@pytest.fixture
def files(tmp_path) -> DirFiles:
    return DirFiles(str(tmp_path / "root"), str(tmp_path / "staging"))


@pytest.fixture
async def server(nursery, files) -> ServerHandle:
    handle = ServerHandle(nursery, files)
    await handle.start()
    yield handle
    await handle.stop()


@pytest.fixture
async def client():
    async with PeerClient("client-1", SECRET, retries=3, backoff=0.05, read_timeout=10) as c:
        yield c


def write_file(files: DirFiles, path: bytes, data: bytes) -> bytes:
    local = files.local(path)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    with open(local, "wb") as f:
        f.write(data)
    return local


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def make_sparse(path, size: int, seed: int = 7) -> None:
    """A sparse-ish file: holes with scattered random data (1 MiB runs and 4 KiB blocks),
    data at both ends."""
    import random

    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for off in (0, size // 3, size // 2 + 12345, size - (1 << 20)):
            f.seek(off)
            f.write(rnd.randbytes(1 << 20))
        for _ in range(200):
            f.seek(rnd.randrange(0, size - 4096))
            f.write(rnd.randbytes(4096))
        f.seek(size - 7)
        f.write(b"THE END")

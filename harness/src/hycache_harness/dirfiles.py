"""A real :class:`hycache_agent.transport.wire.PeerFiles` over a plain directory (tests, benchmark).

Paths are namespace paths (bytes, ``/a/b``) below ``root``; ``..``, ``.`` and empty
components are refused as unknown files, so nothing outside ``root`` is reachable.  The
ETag is derived from (inode, mtime, size), so rewriting a file changes it.  Replicas land
by ``rename`` from ``staging`` (same file system) with the mode and mtime their headers
carry; the version header is kept in ``versions``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import trio


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


@dataclass(eq=False)
class DirFile:
    blob: str
    size: int
    etag: str
    owner: DirFiles
    closed: bool = False

    async def close(self) -> None:
        assert not self.closed, "PeerFile closed twice"
        self.closed = True
        self.owner.open_count -= 1


@dataclass(eq=False)
class DirFiles:
    root: str
    staging_dir: str
    open_count: int = 0  # PeerFiles opened and not yet closed
    opened: int = 0
    versions: dict[bytes, str] = field(default_factory=dict)
    replica_headers: dict[bytes, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.staging_dir, exist_ok=True)

    def local(self, path: bytes) -> bytes:
        parts = path.split(b"/")
        if not path.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts[1:]):
            raise FileNotFoundError(f"not a valid namespace path: {path!r}")
        return os.fsencode(self.root) + path

    async def open_for_peer(self, path: bytes) -> DirFile:
        local = self.local(path)

        def _stat() -> os.stat_result:
            st = os.stat(local)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(path)
            return st

        st = await trio.to_thread.run_sync(_stat)
        self.open_count += 1
        self.opened += 1
        return DirFile(blob=os.fsdecode(local), size=st.st_size, etag=_etag(st), owner=self)

    async def receive_replica(self, path: bytes, temp_blob: str, headers: dict[str, str]) -> None:
        local = self.local(path)
        mode = int(headers.get("x-hycache-mode", "644"), 8)  # ValueError → 400
        if mode & ~0o7777:
            raise ValueError(f"bad mode {mode:o}")
        mtime_ns = headers.get("x-hycache-mtime-ns")

        def _adopt() -> None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            os.chmod(temp_blob, mode)
            if mtime_ns is not None:
                os.utime(temp_blob, ns=(int(mtime_ns), int(mtime_ns)))
            os.rename(temp_blob, local)
            dfd = os.open(os.path.dirname(local), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

        await trio.to_thread.run_sync(_adopt)
        if "x-hycache-version" in headers:
            self.versions[path] = headers["x-hycache-version"]
        self.replica_headers[path] = dict(headers)

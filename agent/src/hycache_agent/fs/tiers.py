"""Tiers: where a file's bytes live, and the blocking file operations on them.

Each regular file's bytes are one *blob* named after its inode number, under
``<tier>/data/<2 hex digits>/<inode in hex>``.  Names, directories, permissions and
symlinks live only in the metadata store, so a blob can never be mistaken for a user's
file or symlink (the papers' symlink stubs are replaced by the inode's ``tier`` field).

Every function here blocks; callers run them with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

FAST = "fast"
SLOW = "slow"
TIER_NAMES = (FAST, SLOW)
TEMP_SUFFIX = ".migrating"
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Tier:
    name: str
    path: Path

    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    @functools.cached_property
    def _data_prefix(self) -> str:
        return str(self.data_dir)

    def blob(self, ino: int) -> str:
        return f"{self._data_prefix}/{ino & 0xFF:02x}/{ino:x}"

    def temp_blob(self, ino: int) -> str:
        return self.blob(ino) + TEMP_SUFFIX

    def prepare(self) -> None:
        for i in range(256):
            (self.data_dir / f"{i:02x}").mkdir(parents=True, exist_ok=True)

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.path)

    def scan(self) -> Iterator[tuple[str, int | None, bool]]:
        """Every file in the data directory: (path, inode or None if foreign, is_temp)."""
        for shard in os.scandir(self.data_dir):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(shard.path):
                name = entry.name
                temp = name.endswith(TEMP_SUFFIX)
                stem = name[: -len(TEMP_SUFFIX)] if temp else name
                try:
                    ino = int(stem, 16)
                except ValueError:
                    ino = None
                yield entry.path, ino, temp


def create_blob(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_blob(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_blobs(paths: list[str]) -> None:
    for path in paths:
        remove_blob(path)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of the data regions of a possibly sparse file."""
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole remains
                return
            if exc.errno == errno.EINVAL:  # file system without SEEK_DATA: one extent
                yield off, size - off
                return
            raise
        try:
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # truncated under the copy: the generation check abandons it
                return
            raise
        end = min(end, size)
        if end > start:
            yield start, end - start
        off = end


def copy_blob(src: str, dst: str, progress: Callable[[int], None] | None = None,
              cancelled: Callable[[], bool] | None = None, *, durable: bool = True) -> int:
    """Stage ``dst`` (O_EXCL) as a durable copy of ``src``: copy, fsync the file and its
    directory (``durable`` False: neither; a group commit makes a batch of copies durable
    with one :func:`commit_blobs`).  Holes stay holes.  Returns the bytes copied.  Raises
    InterruptedError if ``cancelled()`` turns true (the partial ``dst`` is removed)."""
    copied = 0
    sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(sfd).st_size
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
            use_cfr = hasattr(os, "copy_file_range")
            for start, length in _data_extents(sfd, size):
                pos, end = start, start + length
                while pos < end:
                    if cancelled is not None and cancelled():
                        raise InterruptedError("migration cancelled")
                    n = min(COPY_CHUNK, end - pos)
                    done = 0
                    if use_cfr:
                        try:
                            done = os.copy_file_range(sfd, dfd, n, pos, pos)
                        except OSError as exc:
                            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                                raise
                            use_cfr = False
                    if not use_cfr:
                        buf = os.pread(sfd, n, pos)
                        done = os.pwrite(dfd, buf, pos) if buf else 0
                    if done == 0:  # source shrank under us; the caller's generation check catches it
                        end = pos
                        break
                    pos += done
                    copied += done
                    if progress is not None:
                        progress(copied)
            os.ftruncate(dfd, size)
            if durable:
                os.fsync(dfd)
        except BaseException:
            os.close(dfd)
            remove_blob(dst)
            raise
        os.close(dfd)
        if durable:
            fsync_dir(dst)
    finally:
        os.close(sfd)
    return copied


def commit_blob(temp: str, final: str) -> None:
    """The atomic switch's first half: the staged copy takes its final name, durably."""
    os.rename(temp, final)
    fsync_dir(final)


def sync_fs(path: Path) -> None:
    """syncfs(2) of the file system holding ``path``: every dirty byte and name on it
    durable, in one journal commit."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def commit_blobs(renames: list[tuple[str, str]], tier: Path) -> None:
    """A group commit's switch on ``tier``: each staged copy (written without fsync) takes
    its final name, then one :func:`sync_fs` makes the copies and the names durable
    together.  Until that returns none may be trusted (a crash may leave a final name on a
    partial copy): the caller commits the metadata that names them only afterwards, and
    the recovery pass keeps the copy the metadata names.  On an error the caller removes
    the staged and the final names of every copy of the batch."""
    for temp, final in renames:
        os.rename(temp, final)
    sync_fs(tier)

"""The mover of mergerfs's tiered-cache recipe, our own equivalent of the percent-full mover
its documentation gives: every ``period`` seconds, while the fast branch holds more than
the high watermark of its capacity, move the file with the oldest access time to the slow
branch (copy with its mode and times, then remove the source: rsync --remove-source-files)
until it holds less than the low watermark.  The watermarks are HyCache's defaults (0.9,
0.7), so both evict on the same rule; a file modified within the last period is left alone
(it may still be being written, which the documented script does not check)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

HIGH, LOW = 0.9, 0.7


class Mover:
    def __init__(self, fast: Path, slow: Path, capacity: int, period: float) -> None:
        self.fast, self.slow, self.capacity, self.period = fast, slow, capacity, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mergerfs-mover", daemon=True)
        self._lock = threading.Lock()
        self.moved_bytes = 0

    def describe(self) -> str:
        return (f"mover: every {self.period:g} s, above {HIGH:.0%} of {self.capacity >> 20} MiB on {self.fast}, "
                f"oldest atime first to {self.slow} until below {LOW:.0%}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=600)

    def _files(self) -> list[tuple[float, float, int, Path]]:
        out = []
        for root, _dirs, files in os.walk(self.fast):
            for name in files:
                p = Path(root) / name
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                out.append((st.st_atime, st.st_mtime, st.st_blocks * 512, p))
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.run_once()

    def run_once(self) -> int:
        """One pass; returns the bytes moved."""
        files = self._files()
        used = sum(f[2] for f in files)
        if used <= HIGH * self.capacity:
            return 0
        moved, now = 0, time.time()
        for _atime, mtime, size, path in sorted(files):
            if used - moved <= LOW * self.capacity or self._stop.is_set():
                break
            if now - mtime < self.period:
                continue
            if self.move(path):
                moved += size
        return moved

    def _mirror_dirs(self, rel: Path) -> None:
        """The slow branch's copy of the fast branch's directories down to ``rel``, with their
        owners and modes (a directory the mover creates must let their users in)."""
        for part in reversed([rel, *rel.parents]):
            src, dst = self.fast / part, self.slow / part
            if not dst.exists():
                st = src.stat()
                dst.mkdir(exist_ok=True)
                os.chown(dst, st.st_uid, st.st_gid)
                dst.chmod(st.st_mode & 0o7777)

    def move(self, path: Path) -> bool:
        """Move one file of the fast branch to the same path on the slow branch."""
        with self._lock:
            dest = self.slow / path.relative_to(self.fast)
            tmp = dest.with_name(f".{dest.name}.mover")
            try:
                self._mirror_dirs(path.parent.relative_to(self.fast))
                shutil.copy2(path, tmp)
                st = path.stat()
                os.chown(tmp, st.st_uid, st.st_gid)  # rsync -a keeps the owner: its user must still open it
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
                self.moved_bytes += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                tmp.unlink(missing_ok=True)
                return False
            return True

"""PostMark (Katcher 1997), re-implemented: the small-file workload of mail and news servers
the HyCache paper's Fig. 11-12 ran.  Standalone, so the bench can run it as a process of
its own inside a memory-limited cgroup (the page cache it may fill is then bounded).

Phases, as in PostMark: create ``files`` files of uniform random size in [lo, hi] over
``dirs`` subdirectories; ``transactions`` transactions, each a read of a whole file or an
append to one (equal odds), then a create or a delete (equal odds); delete every file left;
``syncfs`` (the write-back is inside the time).  I/O in ``block``-byte calls.  With
``drop_caches`` (root) each phase ends with ``syncfs`` (timed: the phase's write-back) and
starts after ``echo 3 > /proc/sys/vm/drop_caches`` (not timed): a transaction's read of a
file the create phase wrote reaches the file system's tiers, not the page cache.

    python bench/paperbench/postmark.py DIR --files 5000 --lo 512 --hi 16384 --transactions 20000

prints one JSON object: seconds per phase, total, transactions per second, bytes read and
written."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import sys
import time
from pathlib import Path


def syncfs(path: Path) -> None:
    """syncfs(2) of the file system holding ``path``: its dirty data written back, no other file system's."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs {path}")
    finally:
        os.close(fd)


class PostMark:
    def __init__(self, root: Path, lo: int, hi: int, block: int, dirs: int, seed: int,
                 drop_caches: bool = False) -> None:
        self.root, self.lo, self.hi, self.block, self.dirs = root, lo, hi, block, dirs
        self.drop_caches = drop_caches
        self.untimed = 0.0
        self.rnd = random.Random(seed)
        self.payload = os.urandom(max(block, 1 << 16))
        self.live: list[Path] = []
        self.serial = 0
        self.read_bytes = self.written_bytes = 0

    def _write(self, fd: int, n: int) -> None:
        while n > 0:
            k = min(n, self.block)
            os.write(fd, self.payload[:k])
            n -= k
            self.written_bytes += k

    def create(self) -> None:
        self.serial += 1
        p = self.root / f"s{self.serial % self.dirs}" / f"pm{self.serial}"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._write(fd, self.rnd.randint(self.lo, self.hi))
        finally:
            os.close(fd)
        self.live.append(p)

    def delete(self) -> None:
        i = self.rnd.randrange(len(self.live))
        self.live[i], self.live[-1] = self.live[-1], self.live[i]
        os.unlink(self.live.pop())

    def read(self) -> None:
        fd = os.open(self.rnd.choice(self.live), os.O_RDONLY)
        try:
            while b := os.read(fd, self.block):
                self.read_bytes += len(b)
        finally:
            os.close(fd)

    def append(self) -> None:
        fd = os.open(self.rnd.choice(self.live), os.O_WRONLY | os.O_APPEND)
        try:
            self._write(fd, self.rnd.randint(self.lo, min(self.hi, 1 << 16)))
        finally:
            os.close(fd)

    def transaction(self) -> None:
        self.read() if self.rnd.random() < 0.5 else self.append()
        self.create() if self.rnd.random() < 0.5 or len(self.live) < 2 else self.delete()

    def phase_end(self) -> float:
        """End a phase (its write-back, timed), drop the caches if asked; returns the time
        the phase ended, past the untimed drop."""
        if self.drop_caches:
            syncfs(self.root)
            t = time.perf_counter()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            self.untimed += time.perf_counter() - t
        return time.perf_counter()

    def run(self, files: int, transactions: int) -> dict[str, float]:
        for d in range(self.dirs):
            (self.root / f"s{d}").mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        for _ in range(files):
            self.create()
        t1 = self.phase_end()
        for _ in range(transactions):
            self.transaction()
        t2 = self.phase_end()
        while self.live:
            os.unlink(self.live.pop())
        syncfs(self.root)
        t3 = time.perf_counter()
        return {"create_s": t1 - t0, "transactions_s": t2 - t1, "delete_sync_s": t3 - t2,
                "total_s": t3 - t0 - self.untimed,
                "tps": transactions / (t2 - t1) if t2 > t1 else 0.0,
                "read_mb": self.read_bytes / 1e6, "written_mb": self.written_bytes / 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--transactions", type=int, default=500)
    ap.add_argument("--lo", type=int, default=500, help="smallest file, bytes (PostMark: 500)")
    ap.add_argument("--hi", type=int, default=10000, help="largest file, bytes (PostMark: 10,000)")
    ap.add_argument("--block", type=int, default=4096, help="bytes per read/write call")
    ap.add_argument("--dirs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache between phases (root)")
    a = ap.parse_args(argv)
    pm = PostMark(a.dir, a.lo, a.hi, a.block, a.dirs, a.seed, a.drop_caches)
    print(json.dumps(pm.run(a.files, a.transactions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

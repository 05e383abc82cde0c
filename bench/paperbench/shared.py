"""The ``shared`` row: many nodes, one shared slow store (HyCache+ §IV: a parallel file
system all nodes read).  One HDD model is the shared store; each node's slow tier is a
share of it (``SlowTier.share``), its fast tier a directory of its own on the local disk.

A read-mostly workload per node: its own ``files`` files of ``file_mib`` (the working set
fits its fast tier), written through the node and pushed to the slow store untimed, then
read whole ``passes`` times by one reader per node, all nodes at once.  The first pass
reads from the shared store (HyCache promotes each file it opens, in the background;
JuiceFS caches the blocks it fetches), the next ones re-read.  ``drop_caches`` before
every pass: each pass reads the tiers, not the page cache.  Before each re-read the nodes
settle: HyCache's agents finish the promotions the pass started (a re-read begun while a
promotion still copies waits for it, and under load that made a "warm" pass a second cold
one); the seconds waited are reported (``settle_s``), so what the promotions cost past the
readers is shown, not hidden.

Configurations: the shared device alone (1 and N readers straight on it: the store's
ceiling), the local disk alone (each node's set in a directory on it: the ceiling of the
fast tiers, which here all share one virtual disk and two CPUs), HyCache with 1 and N agents (``hycache-agent mount``, standalone: separate node
names, no DHT), and, with ``juicefs`` among the targets, JuiceFS with 1 and N mounts of one
volume (one metadata redis, one ``--storage file`` bucket on the shared device, a cache
directory each).  Each reports the aggregate MB/s of every pass (bytes read by all nodes /
the pass's wall time) and the shared device's bytes read."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hycache_harness import Agent, FuseDaemon, drop_caches, executable, free_port, wait_for
from slowtier import SlowTier

from .rows import Tick

CACHES = ("drop_caches before every pass; each reader reads each of its files once per pass (cat, buffered); "
          "before each re-read, the agents' promotions finished (settle_s)")
SETTLE_TIMEOUT = 600.0


@dataclass
class Nodes:
    """One configuration's nodes: each one's directory, and what to wait for before a
    re-read (nothing for plain directories)."""

    dirs: list[Path]
    settle: Callable[[], None] = field(default=lambda: None)


def write_set(d: Path, files: int, file_mib: int) -> None:
    """``files`` files of ``file_mib`` MiB of non-repeating bytes in ``d``, fsynced."""
    d.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(d / f"f{i}", "wb") as f:
            for j in range(file_mib):
                f.write(block[j % 251:] + block[:j % 251])
            f.flush()
            os.fsync(f.fileno())


def read_pass(dirs: list[Path]) -> float:
    """One reader per directory (``cat`` of its files), all at once; the wall seconds."""
    drop_caches()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["sh", "-c", 'cat "$@" > /dev/null', "sh", *map(str, sorted(d.iterdir()))])
             for d in dirs]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"a reader failed ({p.returncode}) in {dirs}")
    return time.perf_counter() - t0


def run_passes(hdd: SlowTier, nodes: Nodes, passes: int, set_bytes: int) -> dict:
    """``passes`` read passes over ``nodes``, settled before each re-read (the wait is
    ``settle_s``, outside every pass's time)."""
    s0, secs, settle, shared = hdd.read_bytes(), [], [], []
    for i in range(passes):
        if i:
            t0 = time.perf_counter()
            nodes.settle()
            settle.append(time.perf_counter() - t0)
        before = hdd.read_bytes()
        secs.append(read_pass(nodes.dirs))
        shared.append((hdd.read_bytes() - before) / 1e6)
    n = len(nodes.dirs)
    mbps = [n * set_bytes / s / 1e6 for s in secs]
    warm = mbps[1:] or mbps
    return {"pass_mbps": mbps, "cold_mbps": mbps[0], "warm_mbps": sum(warm) / len(warm),
            "overall_mbps": n * set_bytes * passes / sum(secs) / 1e6,
            "shared_read_mb": (hdd.read_bytes() - s0) / 1e6, "pass_shared_read_mb": shared, "settle_s": settle}


def migrations_settled(agents: list[Agent], timeout: float = SETTLE_TIMEOUT) -> None:
    """Until no agent of ``agents`` has a migration under way."""
    wait_for(lambda: not any(a.status()["migrations"]["active"] for a in agents), timeout=timeout,
             what="the agents' promotions", interval=0.05)


@contextmanager
def plain_sets(dirs: list[Path], files: int, file_mib: int) -> Iterator[Nodes]:
    """Each node's set written straight into its directory (the shared device alone, or the
    local disk: the fast tiers' own ceiling), removed afterwards."""
    for d in dirs:
        write_set(d, files, file_mib)
    try:
        yield Nodes(dirs)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


@contextmanager
def hycache_nodes(hdd: SlowTier, work: Path, n: int, files: int, file_mib: int, fast_bytes: int,
                  commands: list[str], agent_args: list[str] | None = None) -> Iterator[Nodes]:
    agents: list[Agent] = []
    try:
        for i in range(n):
            root = work / f"sh{n}-{i}"
            (root / "fast").mkdir(parents=True, exist_ok=True)
            a = Agent(root, f"papers-shared-{n}-{i}", *(agent_args or []), fast=root / "fast", slow=hdd.share(f"hycache{n}-{i}"),
                      fast_capacity=fast_bytes, log=work / f"shared-hycache{n}-{i}.log")
            agents.append(a.start(timeout=60))
            commands.append(" ".join(a.argv))
        for a in agents:
            write_set(a.mnt / "set", files, file_mib)
            a.cli("demote", "--timeout", "600", *map(str, sorted((a.mnt / "set").iterdir())))
        yield Nodes([a.mnt / "set" for a in agents], lambda: migrations_settled(agents))
    finally:
        for a in reversed(agents):
            a.stop(timeout=60)
            shutil.rmtree(a.root, ignore_errors=True)


@contextmanager
def juicefs_nodes(hdd: SlowTier, work: Path, n: int, files: int, file_mib: int, fast_bytes: int,
                  commands: list[str]) -> Iterator[Nodes]:
    port, rdir = free_port(), work / f"sh-jfs-redis{n}"
    rdir.mkdir(parents=True, exist_ok=True)
    redis_argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                  "--dir", str(rdir)]
    redis = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    mounts: list[FuseDaemon] = []
    try:
        meta = f"redis://127.0.0.1:{port}/1"
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                        text=True).stdout.strip() == "PONG", timeout=20, what="redis-server")
        jfs = executable("juicefs")
        fmt = [jfs, "format", "--storage", "file", "--bucket", f"{hdd.share(f'juicefs{n}')}/", meta, "shared"]
        subprocess.run(fmt, check=True, capture_output=True)
        commands += [" ".join(redis_argv), " ".join(fmt)]
        for i in range(n):
            mnt = work / f"sh-jfs{n}-{i}"
            argv = [jfs, "mount", meta, str(mnt), "--cache-dir", str(work / f"sh-jfs-cache{n}-{i}"),
                    "--cache-size", str(fast_bytes >> 20), "--writeback", "--no-usage-report"]
            mounts.append(FuseDaemon(f"juicefs-{i}", argv, mnt, work / f"shared-juicefs{n}-{i}.log").start(timeout=60))
            commands.append(" ".join(argv))
        dirs = [m.mountpoint / f"node{i}" for i, m in enumerate(mounts)]
        for d in dirs:
            write_set(d, files, file_mib)
        # uploaded to the shared bucket, then evicted from every node's cache: the first pass reads the store
        wait_for(lambda: not any("rawstaging" in r and fs for r, _d, fs in os.walk(work) if "sh-jfs-cache" in r),
                 timeout=600, what="juicefs uploads", interval=0.2)
        for d in dirs:
            subprocess.run([jfs, "warmup", "--evict", str(d)], check=True, capture_output=True)
        yield Nodes(dirs)
    finally:
        for m in reversed(mounts):
            m.stop(timeout=60)
        redis.terminate()
        redis.wait(timeout=30)
        for p in work.glob(f"sh-jfs*{n}*"):
            shutil.rmtree(p, ignore_errors=True)


def shared_row(work: Path, hdd_args: dict, names: list[str], nodes: int, files: int, file_mib: int, fast_mib: int,
               passes: int, tick: Tick, agent_args: list[str] | None = None) -> dict:
    """The shared-store row: every configuration with 1 and ``nodes`` nodes, on one HDD model
    (``agent_args``: more ``hycache-agent mount`` arguments for its HyCache nodes)."""
    work.mkdir(parents=True, exist_ok=True)
    set_bytes, fast = files * file_mib << 20, fast_mib << 20
    out: dict = {"nodes": nodes, "files": files, "file_mib": file_mib, "fast_mib": fast_mib, "passes": passes,
                 "set_mb_per_node": set_bytes / 1e6, "configs": {}, "commands": {}}
    with SlowTier(base=work, **hdd_args) as hdd:
        out["device"] = hdd.describe()
        kinds = ["alone", "fast", *[k for k in ("hycache", "juicefs") if k in names]]
        for kind in kinds:
            for n in (1, nodes):
                cmds: list[str] = []
                if kind == "alone":
                    ctx = plain_sets([hdd.share(f"alone{n}-{i}") for i in range(n)], files, file_mib)
                elif kind == "fast":
                    ctx = plain_sets([work / f"fast{n}-{i}" for i in range(n)], files, file_mib)
                elif kind == "hycache":
                    ctx = hycache_nodes(hdd, work, n, files, file_mib, fast, cmds, agent_args)
                else:
                    ctx = juicefs_nodes(hdd, work, n, files, file_mib, fast, cmds)
                with ctx as node_sets:
                    out["configs"][f"{kind}{n}"] = run_passes(hdd, node_sets, passes, set_bytes)
                out["commands"][f"{kind}{n}"] = cmds
                tick(f"shared {kind} x{n}")
    for kind in ("alone", "fast", "hycache", "juicefs"):
        one, many = out["configs"].get(f"{kind}1"), out["configs"].get(f"{kind}{nodes}")
        if one and many:
            out[f"{kind}_scaling"] = {k: many[k] / one[k] for k in ("cold_mbps", "warm_mbps", "overall_mbps")}
    return out

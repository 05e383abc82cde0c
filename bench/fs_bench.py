#!/usr/bin/env python3
"""File-system benchmark of issue 11, in one run: the raw directory, HyCache with and
without kernel FUSE passthrough, HyCache joined to a Redis Cluster, mergerfs, and pyfuse3's
own passthrough example (the framework's floor).

Targets (all on the file system of --workdir, so they share one disk; all mounted for the
whole run; every workload runs on every target in turn, so a change in background load hits
all targets alike, and the order rotates by one at every row, so no target is always the
first after a row change, which runs slower on a virtual disk whose host cache warms up):

  raw                  a plain directory: the limit
  slow                 a second plain directory (same disk on a one-disk machine; opt-in)
  hycache              hycache-agent mount --passthrough on (reads, writes, mmap: kernel -> blob)
  hycache-nopt         the same with --passthrough off (every read and write through the
                       agent, kernel writeback cache on)
  mergerfs             mergerfs fast:slow (an existing FUSE file system)
  pyfuse3-passthrough  pyfuse3's examples/passthroughfs.py from the patched pyfuse3 source
                       tree the venv was built from, run by the venv's Python: the same
                       pyfuse3 and libfuse 3.17 build as the agent. A pyfuse3 file system that
                       only forwards; it does NOT use kernel passthrough (writeback cache off,
                       its defaults) and implements no fsync (its write rows are marked)
  hycache-dht          the agent with --passthrough on, joined to a local Redis Cluster
                       started for the run: metadata rows only unless --dht-fio

fio rows (cache-neutral, see "Method" in the report): sequential read and write at 1 MiB
and 4 KiB, random 4 KiB read and write, 1 and 4 concurrent jobs (job i on its own file
bench.i of --size, named explicitly).
Size-based jobs, no time_based: each job reads or writes each of its bytes once (1 MiB rows:
the whole file; 4 KiB rows: --io-4k of it, random jobs on distinct blocks thanks to fio's
random map); `sync; echo 3 > drop_caches` before every job; invalidate=1; writes end with
end_fsync=1 (the write-back to disk is inside the measured time); buffered direct=0,
ioengine=psync, fallocate=none. Every read job also counts the bytes read from the disk:
a pass that read less than half of its bytes from the disk is flagged (a cache served it).

Metadata rows: create (open O_CREAT|O_EXCL + write 4 KiB + close), stat, remove with 1 and
4 writers (4 processes, each in its own directory, started together at a barrier; rate =
total operations / wall time of the slowest), caches dropped and the machine quiet (CPUs
>= 90 % idle) before each phase. For
hycache-dht also the publication tail: seconds from the last create (or remove) until the
agent's outbox is empty (`hycache-agent status ROOT --json` -> cluster.backlog).

Small-file serving rows (issue 17, bench/smallfiles.py): a tree of files with a web-like
size mix read whole (open + read + close) by 1 and 4 reader processes following one Zipf
request trace, after a cache drop: mean and p99 of one request (ms), MB/s. mdtest rows
(when scripts/build-mdtest.sh built it): `mpirun -np 4 mdtest -n 1000 -u -F -w 4096
-e 4096 -d DIR -i 1`, its create/stat/read/remove rates. --baseline DIR mounts DIR's agent
beside this one (base-hycache, base-hycache-dht): before/after under the same load; issue
17's floor (>= 3x before, mdtest read >= 10x, serving mean <= 1 ms) and goal (>= mergerfs)
are checked on hycache-dht.

Targets of issue 11, checked per row (PASS/MISS): every fio row of hycache >= 0.9 x raw;
hycache creates >= pyfuse3-passthrough creates; hycache-dht creates >= 0.8 x hycache
creates (1 and 4 writers).

Results: the median of --repeat passes and the spread (min-max) per cell; a table on
stdout, a Markdown report (--out, default docs/benchmarks.md; its hand-written "## Notes"
section is kept), a plot beside it (img/bench_fs.png: x raw per row for every target, the
0.9 line, a second panel for the metadata rows) and the raw numbers as JSON (--json).

Needs root (drop_caches, FUSE mounts), fio, mergerfs, fusermount3, redis-server (for
hycache-dht): scripts/bootstrap.sh installs them. Mounts, daemons and the Redis Cluster are
always stopped on exit, Ctrl-C and SIGTERM included; a run killed with SIGKILL leaves them
for the next run to clean up first. A script with printed results, never a test with timed
assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# bench/smallfiles.py: the small-file serving workload (issue 17)
import smallfiles

# bench/fs_report.py: the rows, the issue-11 checks, the table, the page and the plot
from fs_report import (
    META_OPS,
    TAIL_OPS,
    WORKLOADS,
    fio_key,
    mdtest_key,
    meta_key,
    plot,
    print_table,
    serve_keys,
    tail_key,
    unit_for,
    write_report,
)
from hycache_harness import (
    Agent,
    FuseDaemon,
    cluster_secret,
    executable,
    force_unmount,
    free_page_reporting,
    redis_seeds,
)

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = Path(sys.executable)  # the environment the bench runs in (scripts/bootstrap.sh: .venv)
AGENT_BIN = Path(executable("hycache-agent"))

MERGERFS_OPTS = ("allow_other,default_permissions,category.create=ff,cache.files=partial,"
                 "dropcacheonclose=false,moveonenospc=true,fsname=mergerfs-bench")
HYCACHE_FAST_CAPACITY = "64G"
# before every timed phase, after the cache drop: the CPUs this idle over two 0.1 s windows in
# a row (quiesce), waited for at most this long
QUIET_IDLE = 0.90
QUIET_MAX_SECONDS = 15.0


ALL_TARGETS = ["raw", "slow", "hycache", "hycache-nopt", "mergerfs", "pyfuse3-passthrough", "hycache-dht",
               "base-hycache", "base-hycache-dht"]
BASE_TARGETS = {"base-hycache", "base-hycache-dht"}  # the agent of --baseline DIR (before/after in one run)
DEFAULT_TARGETS = [t for t in ALL_TARGETS if t != "slow" and t not in BASE_TARGETS]
AGENT_TARGETS = {"hycache", "hycache-nopt", "hycache-dht"} | BASE_TARGETS
DHT_TARGETS = {"hycache-dht", "base-hycache-dht"}
FUSE_TARGETS = AGENT_TARGETS | {"mergerfs", "pyfuse3-passthrough"}
PARTS = ("fio", "meta", "serve", "mdtest")
MDTEST_OPS = {"create": "File creation", "stat": "File stat", "read": "File read", "remove": "File removal"}



# ============================================================================ helpers
def log(msg: str) -> None:
    print(f"[fs_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, text=True, capture_output=True, **kw)


def parse_size(s: str) -> int:
    """'256M' -> bytes (K/M/G/T, optional i/B suffix); a bad value raises ValueError."""
    t = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        n = int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except (ValueError, IndexError):
        raise ValueError(f"not a size: {s!r} (e.g. 256M)") from None
    if n <= 0:
        raise ValueError(f"not a positive size: {s!r}")
    return n


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def cpu_times() -> tuple[int, int]:
    """(all, idle + iowait) clock ticks of every CPU since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def quiesce(max_wait: float = QUIET_MAX_SECONDS, window: float = 0.1) -> float:
    """Wait until the machine is quiet: the CPUs at least QUIET_IDLE idle over two windows
    in a row, so that a phase does not run beside the background work that the previous
    one left to some target (an agent still removing the blobs of 8,000 unlinked files or
    publishing them, mergerfs or the kernel writing back). Returns the seconds waited; gives
    up (and says so) after ``max_wait``."""
    t0 = time.monotonic()
    quiet = 0
    prev = cpu_times()
    while time.monotonic() - t0 < max_wait:
        time.sleep(window)
        cur = cpu_times()
        total, idle = cur[0] - prev[0], cur[1] - prev[1]
        prev = cur
        quiet = quiet + 1 if total > 0 and idle / total >= QUIET_IDLE else 0
        if quiet >= 2:
            return time.monotonic() - t0
    log(f"the machine did not quiet down within {max_wait:.0f} s (CPUs < {QUIET_IDLE:.0%} idle): going on")
    return time.monotonic() - t0


class Caches:
    """sync + drop the page, dentry and inode caches (root only; otherwise runs are warm),
    then wait for the machine to be quiet (:func:`quiesce`): before every timed phase."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and os.access("/proc/sys/vm/drop_caches", os.W_OK)
        if enabled and not self.enabled:
            log("cannot write /proc/sys/vm/drop_caches (not root?): runs start with warm caches")
        self.waited: list[float] = []  # quiesce() before each phase, seconds

    def drop(self) -> None:
        os.sync()
        if self.enabled:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        self.waited.append(quiesce())


class DiskCounter:
    """Bytes read from the block device under the work dir (/sys/class/block/X/stat,
    machine-wide: other processes count too). A cache-neutrality witness: a cold read job
    reads about all of its bytes from the disk; one that reads much less was served from a
    cache. None when the device cannot be found."""

    def __init__(self, workdir: Path):
        src = run(["findmnt", "-n", "-o", "SOURCE", "-T", str(workdir)]).stdout.strip()
        stat = Path(f"/sys/class/block/{Path(src).name}/stat") if src.startswith("/dev/") else None
        self.stat = stat if stat is not None and stat.exists() else None

    def read_bytes(self) -> int | None:
        if self.stat is None:
            return None
        return int(self.stat.read_text().split()[2]) * 512  # field 3: sectors read


def mounts_under(root: Path) -> list[Path]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = Path(line.split()[1].replace("\\040", " "))
            if mp == root or root in mp.parents:
                out.append(mp)
    return out


def pyfuse3_example() -> Path:
    """examples/passthroughfs.py of the pyfuse3 source tree the venv's pyfuse3 was built
    from (its direct_url.json: uv installs it from that path), else .work/pyfuse3."""
    probe = run([str(VENV_PYTHON), "-c",
                 "import importlib.metadata as m; print(m.distribution('pyfuse3').read_text('direct_url.json') or '')"])
    candidates = []
    if probe.returncode == 0 and probe.stdout.strip():
        try:
            url = json.loads(probe.stdout)["url"]
            if url.startswith("file://"):
                candidates.append(Path(url.removeprefix("file://")) / "examples" / "passthroughfs.py")
        except (ValueError, KeyError):
            pass
    candidates.append(REPO / ".work" / "pyfuse3" / "examples" / "passthroughfs.py")
    for c in candidates:
        if c.is_file():
            return c
    raise RuntimeError("pyfuse3's examples/passthroughfs.py not found (looked at "
                       f"{', '.join(map(str, candidates))}): run scripts/bootstrap.sh")


def libfuse_version() -> str:
    out = run([str(VENV_PYTHON), "-c", "import pyfuse3; print(pyfuse3.__version__)"])
    prefix = REPO / ".work" / "pyfuse3" / "hycache-libfuse-prefix"
    lib = prefix.read_text().strip() if prefix.exists() else "?"
    return f"pyfuse3 {out.stdout.strip() or '?'}, libfuse prefix {lib}"


# ============================================================================ the DHT
class Cluster:
    """A local Redis Cluster for hycache-dht (as bench/cluster_bench.py starts one)."""

    def __init__(self, workdir: Path):
        self.dir = workdir / "redis"
        self.secret = workdir / "cluster-secret"
        self.namespace = f"fsbench-{os.getpid()}"
        self.cluster = None

    def start(self) -> None:
        from hycache_dht.localcluster import LocalRedisCluster, find_free_base

        self.stop_stale()
        cluster_secret(self.secret)
        self.cluster = LocalRedisCluster(self.dir, find_free_base(6, start=44000, stop=48000))
        self.cluster.start()

    @property
    def redis(self) -> str:
        return redis_seeds(self.cluster.nodes)

    def stop_stale(self) -> None:
        """A run killed with SIGKILL leaves its redis-servers running: stop them."""
        from hycache_dht.localcluster import LocalRedisCluster

        meta = self.dir / "cluster.json"
        if meta.exists():
            try:
                m = json.loads(meta.read_text())
                log(f"stopping the stale Redis Cluster in {self.dir}")
                LocalRedisCluster(self.dir, m["base_port"], masters=m["masters"], replicas=m["replicas"]).stop()
            except (ValueError, KeyError, OSError) as e:
                log(f"could not stop the stale cluster in {self.dir}: {e}")
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        shutil.rmtree(self.dir, ignore_errors=True)


# ============================================================================ targets
@dataclass
class Target:
    name: str
    base: Path                    # scratch dir for this target
    path: Path | None = None      # where the benchmark files go
    daemon: FuseDaemon | None = None
    description: str = ""
    fio: bool = True              # runs the fio rows
    agent_bin: Path = AGENT_BIN   # base-*: the --baseline checkout's agent
    agent_args: tuple[str, ...] = ()  # more `hycache-agent mount` flags (agent targets)

    def start(self, cluster: Cluster | None) -> None:
        if self.base.exists():
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)
        if self.name in ("raw", "slow"):
            self.path = self.base / "dir"
            self.path.mkdir()
            self.description = f"plain directory {self.path}"
            return
        logfile = self.base.parent / f"{self.name}.log"
        mnt = self.base / "mnt"
        if self.name == "mergerfs":
            fast, slow = self.base / "fast", self.base / "slow"
            fast.mkdir()
            slow.mkdir()
            self.daemon = FuseDaemon(self.name, ["mergerfs", "-f", "-o", MERGERFS_OPTS, f"{fast}:{slow}", str(mnt)],
                                     mnt, logfile)
        elif self.name == "pyfuse3-passthrough":
            src = self.base / "src"
            src.mkdir()
            # Its defaults: no --debug/--debug-fuse, no writeback cache; trio, one thread.
            # It exits cleanly on unmount, not on SIGTERM.
            self.daemon = FuseDaemon(self.name, [str(VENV_PYTHON), str(pyfuse3_example()), str(src), str(mnt)],
                                     mnt, logfile, unmount_to_stop=True)
        elif self.name in AGENT_TARGETS:
            if not Path(self.agent_bin).exists():
                raise RuntimeError(f"{self.agent_bin} missing: run scripts/bootstrap.sh")
            opts = ["--fast-capacity", HYCACHE_FAST_CAPACITY,
                    "--passthrough", "off" if self.name == "hycache-nopt" else "on", *self.agent_args]
            if self.name in DHT_TARGETS:
                assert cluster is not None
                # one node: nothing to rebalance with, so no background rebalance checks; each
                # agent in its own namespace (two would form one global namespace)
                self.daemon = Agent(self.base, self.name, *opts, "--rebalance-interval", "0",
                                    redis=cluster.redis, secret=cluster.secret,
                                    namespace=f"{cluster.namespace}-{self.name}",
                                    log_level="warning", agent_bin=self.agent_bin)
            else:
                self.daemon = Agent(self.base, self.name, *opts, log_level="warning", agent_bin=self.agent_bin)
        else:
            raise ValueError(self.name)
        self.description = shlex.join(self.daemon.argv)
        self.daemon.start()
        self.path = mnt / "bench"
        self.path.mkdir()

    def stop(self) -> None:
        if self.daemon is not None:
            rc = self.daemon.stop()
            if rc not in (0, None):
                log(f"{self.name} exited {rc} (log: {self.daemon.logfile})")
        shutil.rmtree(self.base, ignore_errors=True)

    def alive(self) -> bool:
        return self.daemon is None or self.daemon.alive()

    def log_tail(self) -> str:
        return self.daemon.log_tail(2000) if self.daemon is not None else ""


# ============================================================================ fio
def fio_argv(path: Path, name: str, rw: str, bs: str, numjobs: int, size: str, io_size: str | None) -> list[str]:
    """One size-based, cache-neutral fio run of ``numjobs`` concurrent jobs (see the module
    docstring), job i on its own file PATH/bench.i.

    The files are named explicitly, one job section each: fio's ``--numjobs`` with
    ``--filename_format=bench.$jobnum`` named a one-job read "bench" (a new file that fio
    laid out and then read back from the page cache) and let the four jobs of a read run
    share that one file."""
    argv = ["fio", f"--rw={rw}", f"--bs={bs}", f"--size={size}",
            "--ioengine=psync", "--direct=0", "--invalidate=1", "--fallocate=none",
            "--group_reporting", "--output-format=json"]
    if io_size:
        argv.append(f"--io_size={io_size}")
    if "write" in rw:
        argv.append("--end_fsync=1")
    for i in range(numjobs):  # global options above, then one section per job; all run at once
        argv += [f"--name={name}{i}", f"--filename={path / f'bench.{i}'}"]
    return argv


def fio(argv: list[str], rw: str, timeout: float = 1800) -> dict:
    # fio forks one process per job: run it in its own process group and kill the whole
    # group on any interruption, so no job keeps a file open on a mount we unmount.
    p = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        raise
    if p.returncode != 0:
        raise RuntimeError(f"fio failed ({p.returncode}): {shlex.join(argv)}\n{stderr[-2000:]}")
    job = json.loads(stdout[stdout.index("{"):])["jobs"][0]  # fio may print notes before the JSON
    side = job["read"] if rw.endswith("read") else job["write"]
    return {"bw_bytes": side["bw_bytes"], "iops": side["iops"], "runtime_ms": side["runtime"],
            "io_bytes": side["io_bytes"]}


# ============================================================================ metadata
def _meta_worker(directory: str, n: int, barrier, conn) -> None:
    """One writer (a process): waits for an op name, meets the others at the barrier,
    does the op on its n files, sends back its elapsed seconds (or an error)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up
    payload = b"x" * 4096
    names = [os.path.join(directory, f"f{i:06d}") for i in range(n)]
    while True:
        op = conn.recv()
        if op is None:
            return
        try:
            barrier.wait(timeout=120)
            t0 = time.perf_counter()
            if op == "create":
                for p in names:
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    os.write(fd, payload)
                    os.close(fd)
            elif op == "stat":
                for p in names:
                    os.stat(p)
            elif op == "remove":
                for p in names:
                    os.unlink(p)
            else:
                raise ValueError(op)
            conn.send(("ok", time.perf_counter() - t0))
        except Exception as e:  # reported by the parent
            conn.send(("error", f"{type(e).__name__}: {e}"))


FORK = multiprocessing.get_context("fork")


@contextlib.contextmanager
def _workers(target, args_list: list[tuple]):
    """One forked process per entry of ``args_list`` running ``target(*args, conn)``;
    yields the parent ends of their pipes; joins them at the end, kills what is left."""
    procs, conns = [], []
    try:
        for args in args_list:
            parent, child = FORK.Pipe()
            p = FORK.Process(target=target, args=(*args, child), daemon=True)
            p.start()
            procs.append(p)
            conns.append(parent)
        yield conns
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def _answer(conn, what: str):
    """A worker's ("ok", value) answer, or RuntimeError naming ``what``."""
    if not conn.poll(1800):
        raise RuntimeError(f"{what} did not finish in 30 min")
    status, v = conn.recv()
    if status != "ok":
        raise RuntimeError(f"{what} failed: {v}")
    return v


def metadata_run(t: Target, writers: int, n: int, caches: Caches) -> dict[str, float]:
    """create/stat/remove of n files per writer; returns {key: ops/s or tail seconds}."""
    barrier = FORK.Barrier(writers)
    dirs = [t.path / f"meta-w{writers}-{i}" for i in range(writers)]
    for d in dirs:
        d.mkdir()
    out: dict[str, float] = {}
    with _workers(_meta_worker, [(str(d), n, barrier) for d in dirs]) as conns:
        for op in META_OPS:
            caches.drop()
            for c in conns:
                c.send(op)
            times = [_answer(c, f"{t.name}: {op} with {writers} writers") for c in conns]
            out[meta_key(op, writers)] = writers * n / max(times)
            if t.name in DHT_TARGETS and op in TAIL_OPS:
                out[tail_key(op, writers)] = t.daemon.wait_published(timeout=600)
        for c in conns:
            c.send(None)
    for d in dirs:
        d.rmdir()
    return out


# ============================================================================ small files
def _serve_worker(directory: str, requests: list[int], n_files: int, barrier, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up
    try:
        barrier.wait(timeout=120)
        conn.send(("ok", smallfiles.serve(directory, requests, n_files)))
    except Exception as e:  # reported by the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))


def serve_run(t: Target, readers: int, args, caches: Caches) -> dict[str, float]:
    """The small-file trace (laid out once per target) read by ``readers`` processes;
    returns {key: value} for the mean and p99 of one request (ms) and the MB/s."""
    directory = t.path / "serve"
    if not directory.exists():
        smallfiles.make_tree(str(directory), args.serve_files)
    trace = smallfiles.trace(args.serve_files, args.serve_requests)
    barrier = FORK.Barrier(readers)
    caches.drop()
    lat, nbytes, wall = [], 0, 0.0
    with _workers(_serve_worker, [(str(directory), trace[i::readers], args.serve_files, barrier)
                                  for i in range(readers)]) as conns:
        for c in conns:
            v = _answer(c, f"{t.name}: serving with {readers} readers")
            lat += v[0]
            nbytes += v[1]
            wall = max(wall, v[2])
    s = smallfiles.summary(lat, nbytes, wall)
    mean, p99, mbs = serve_keys(readers)
    return {mean: s["mean_ms"], p99: s["p99_ms"], mbs: s["mb_s"]}


# ============================================================================ mdtest
def mdtest_bin() -> str | None:
    """mdtest (github hpc/ior, built by scripts/build-mdtest.sh into .work/bin) or on PATH."""
    local = REPO / ".work" / "bin" / "mdtest"
    return str(local) if local.exists() else shutil.which("mdtest")


def mdtest_argv(directory: Path, ranks: int, files: int) -> list[str]:
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), mdtest_bin() or "mdtest",
            "-n", str(files), "-u", "-F", "-w", "4096", "-e", "4096", "-d", str(directory), "-i", "1"]


def parse_mdtest(out: str) -> dict[str, float]:
    """The SUMMARY rate table of mdtest: {op: ops/s (its Mean column)}."""
    rates: dict[str, float] = {}
    in_rate = False
    for line in out.splitlines():
        if line.startswith("SUMMARY"):
            in_rate = line.startswith("SUMMARY rate")
            continue
        for op, name in MDTEST_OPS.items():
            cols = line.split()
            if in_rate and line.strip().startswith(name + " ") and len(cols) >= 5:
                rates[op] = float(cols[-2])  # Max Min Mean "Std Dev"
    return rates


def mdtest_run(t: Target, args) -> dict[str, float]:
    directory = t.path / "mdtest"
    directory.mkdir()
    try:
        out = subprocess.run(mdtest_argv(directory, args.mdtest_ranks, args.mdtest_files), capture_output=True,
                             text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"{t.name}: mdtest failed ({out.returncode}): {out.stderr.strip()[-800:]}")
        rates = parse_mdtest(out.stdout)
        if set(rates) != set(MDTEST_OPS):
            raise RuntimeError(f"{t.name}: mdtest printed no rate for {set(MDTEST_OPS) - set(rates)}:\n"
                               f"{out.stdout[-1500:]}")
        return {mdtest_key(op): v for op, v in rates.items()}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ============================================================================ the run
def rotated(xs: list, k: int) -> list:
    """xs rotated left by k: the first job after a row change runs measurably slower on this
    virtual disk (its host's cache warms up), so no target may always be first."""
    if not xs:
        return xs
    k %= len(xs)
    return xs[k:] + xs[:k]


def bench_all(targets: list[Target], args, caches: Caches) -> dict:
    """Interleaved: for each row, every target in turn (the order rotating by one at every
    row); --repeat passes over everything."""
    samples: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets}
    iops: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets}
    disk_share: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets}
    disk = DiskCounter(args.workdir)
    fio_targets = [t for t in targets if t.fio] if "fio" in args.parts else []
    maxjobs = max(args.numjobs)
    for t in fio_targets:
        log(f"{t.name}: laying out {maxjobs} x {args.size} in {t.path}")
        fio(fio_argv(t.path, "layout", "write", "1m", maxjobs, args.size, None), "write")
    step = 0  # rows run so far: the target order rotates by one at every row
    for rep in range(args.repeat):
        tag = f"[{rep + 1}/{args.repeat}]"
        for label, rw, bs in WORKLOADS:
            for nj in args.numjobs:
                key = fio_key(label, nj)
                io_size = args.io_4k if bs == "4k" else None
                step += 1
                for t in rotated(fio_targets, step):
                    caches.drop()
                    before = disk.read_bytes()
                    r = fio(fio_argv(t.path, "bench", rw, bs, nj, args.size, io_size), rw)
                    from_disk = disk.read_bytes() - before
                    mib = r["bw_bytes"] / 2**20
                    samples[t.name].setdefault(key, []).append(mib)
                    iops[t.name].setdefault(key, []).append(r["iops"])
                    share = from_disk / r["io_bytes"] if r["io_bytes"] and from_disk is not None else None
                    if rw.endswith("read") and share is not None:
                        disk_share[t.name].setdefault(key, []).append(share)
                    log(f"{tag} {t.name:19} {key:16} {mib:9.1f} MiB/s {r['iops']:9.0f} IOPS "
                        f"{r['runtime_ms'] / 1000:6.1f} s"
                        + (f"  disk read {share:4.0%} of it" if rw.endswith("read") and share is not None else ""))
                    if not t.alive():
                        raise RuntimeError(f"{t.name} died during {key}:\n{t.log_tail()}")
        for w in args.writers if "meta" in args.parts else []:
            step += 1
            for t in rotated(targets, step):
                for key, v in metadata_run(t, w, args.files, caches).items():
                    samples[t.name].setdefault(key, []).append(v)
                    log(f"{tag} {t.name:19} {key:16} " + (f"{v:9.2f} s" if "tail" in key else f"{v:9.0f} ops/s"))
                if not t.alive():
                    raise RuntimeError(f"{t.name} died during the metadata rows:\n{t.log_tail()}")
        for r in args.readers if "serve" in args.parts else []:
            step += 1
            for t in rotated(targets, step):
                for key, v in serve_run(t, r, args, caches).items():
                    samples[t.name].setdefault(key, []).append(v)
                    log(f"{tag} {t.name:19} {key:16} {v:9.2f}")
                if not t.alive():
                    raise RuntimeError(f"{t.name} died during the small-file rows:\n{t.log_tail()}")
        if "mdtest" in args.parts:
            step += 1
            for t in rotated(targets, step):
                caches.drop()
                for key, v in mdtest_run(t, args).items():
                    samples[t.name].setdefault(key, []).append(v)
                    log(f"{tag} {t.name:19} {key:16} {v:9.0f} ops/s")
                if not t.alive():
                    raise RuntimeError(f"{t.name} died during mdtest:\n{t.log_tail()}")
    results: dict[str, dict] = {}
    for t in fio_targets:
        for f in t.path.glob("bench.*"):
            f.unlink()
    for t in targets:
        results[t.name] = {}
        for key, xs in samples[t.name].items():
            cell = {"value": median(xs), "min": min(xs), "max": max(xs), "samples": xs, "unit": unit_for(key)}
            if key in iops[t.name]:
                cell["iops"] = median(iops[t.name][key])
            if key in disk_share[t.name]:
                cell["disk_read_share"] = disk_share[t.name][key]
            results[t.name][key] = cell
    return results


def machine_info(workdir: Path) -> dict[str, str]:
    info = {}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "?"
    info["CPU"] = f"{cpu}, {os.cpu_count()} cores"
    try:
        mem_kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        info["RAM"] = f"{mem_kb / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    try:
        osname = next(line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                      if line.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        osname = platform.system()
    info["OS / kernel"] = f"{osname}, Linux {platform.release()}"
    fm = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(workdir)]).stdout.strip()
    info["work dir file system"] = f"{workdir}: {fm}"
    src = fm.split()[0] if fm else ""
    if src.startswith("/dev/"):
        ra = Path(f"/sys/class/block/{Path(src).name}/queue/read_ahead_kb")
        if ra.exists():
            info["its disk's read_ahead_kb"] = ra.read_text().strip()
    info["fio"] = run(["fio", "--version"]).stdout.strip()
    if shutil.which("mergerfs"):
        mv = run(["mergerfs", "--version"])
        info["mergerfs"] = ((mv.stdout or mv.stderr).strip().splitlines() or ["?"])[0]
    info["free page reporting (memory back to the VM's host)"] = free_page_reporting() or "off"
    info["pyfuse3 / libfuse"] = libfuse_version()
    info["python"] = platform.python_version()
    info["HyCache commit"] = run(["git", "-C", str(REPO), "describe", "--always", "--dirty"]).stdout.strip()
    return info


# ============================================================================ main
EPILOG = """\
defaults: full run = --size 256M --io-4k 64M --files 1000 --repeat 3 (about 15 min on the
2-core development machine), writes docs/benchmarks.md, docs/img/bench_fs.png and
WORKDIR/results-*.json; --quick = --size 32M --io-4k 16M --files 200 --repeat 1, writes
under .work/bench/quick/.

examples:
  sudo .venv/bin/python bench/fs_bench.py                       # the issue-11 run
  .venv/bin/python bench/fs_bench.py --quick
  .venv/bin/python bench/fs_bench.py --targets raw,hycache --repeat 1 --out /tmp/b/benchmarks.md
"""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="fs_bench.py", description=__doc__, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help=f"comma-separated, from {','.join(ALL_TARGETS)} (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="small files, one pass, 200 metadata files per writer (a few minutes); "
                         "writes to .work/bench/quick/ unless --out is given")
    ap.add_argument("--out", type=Path, default=None,
                    help="Markdown report (default docs/benchmarks.md; the plot goes to "
                         "img/bench_fs.png beside it)")
    ap.add_argument("--json", type=Path, default=None,
                    help="raw results as JSON (default WORKDIR/results-YYYYmmdd-HHMMSS.json)")
    ap.add_argument("--workdir", type=Path, default=REPO / ".work" / "bench",
                    help="scratch directory; every target lives under it (default: %(default)s)")
    ap.add_argument("--size", default=None,
                    help="file size per fio job; the 1 MiB rows read/write it whole (default 256M, quick 32M)")
    ap.add_argument("--io-4k", default=None,
                    help="bytes each 4 KiB job reads/writes of its file (fio io_size; default 64M, quick 16M)")
    ap.add_argument("--numjobs", default="1,4", help="fio numjobs values (default: %(default)s)")
    ap.add_argument("--writers", default="1,4", help="metadata writer counts (default: %(default)s)")
    ap.add_argument("--files", type=int, default=None,
                    help="metadata files per writer (default 1000, quick 200)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="passes over every row; the median and min–max are reported (default 3, quick 1)")
    ap.add_argument("--parts", default="fio,meta,serve,mdtest",
                    help="what to run, from fio (throughput rows), meta (create/stat/remove), serve "
                         "(small-file serving), mdtest (when built: scripts/build-mdtest.sh) "
                         "(default: %(default)s)")
    ap.add_argument("--readers", default="1,4", help="small-file serving reader counts (default: %(default)s)")
    ap.add_argument("--serve-files", type=int, default=None,
                    help="files of the small-file tree (default 1250, quick 300)")
    ap.add_argument("--serve-requests", type=int, default=None,
                    help="requests of the small-file trace (default 10000, quick 2000)")
    ap.add_argument("--mdtest-ranks", type=int, default=4, help="mdtest MPI ranks (default: %(default)s)")
    ap.add_argument("--mdtest-files", type=int, default=None,
                    help="mdtest files per rank (-n; default 1000, quick 200)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout with its own .venv (e.g. /work/main): adds the targets base-hycache "
                         "and base-hycache-dht, its agent, for before/after in one run")
    ap.add_argument("--agent-args", default="",
                    help="more `hycache-agent mount` flags for this checkout's agent targets (not base-*), "
                         "e.g. \"--loop-spin-us 0\"")
    ap.add_argument("--dht-fio", action="store_true",
                    help="run the fio rows on hycache-dht too (default: metadata rows only)")
    ap.add_argument("--warm", dest="drop_caches", action="store_false",
                    help="do not drop the caches before each job (not cache-neutral; for experiments)")
    a = ap.parse_args(argv)
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    bad = [t for t in a.targets if t not in ALL_TARGETS]
    if bad:
        ap.error(f"--targets: unknown target(s) {bad}; choose from {ALL_TARGETS}")
    a.targets = [t for t in ALL_TARGETS if t in a.targets]  # raw first
    try:
        a.numjobs = [int(x) for x in a.numjobs.split(",")]
        a.writers = [int(x) for x in a.writers.split(",")]
        a.readers = [int(x) for x in a.readers.split(",")]
    except ValueError:
        ap.error("--numjobs/--writers/--readers: comma-separated integers, e.g. 1,4")
    if min(a.numjobs + a.writers + a.readers) < 1:
        ap.error("--numjobs/--writers/--readers: values must be ≥ 1")
    a.parts = {x.strip() for x in a.parts.split(",") if x.strip()}
    if not a.parts or a.parts - set(PARTS):
        ap.error(f"--parts: a comma-separated subset of {','.join(PARTS)}, not {','.join(sorted(a.parts)) or 'nothing'}")
    if "mdtest" in a.parts and (mdtest_bin() is None or shutil.which("mpirun") is None):
        a.parts.discard("mdtest")  # not built here: scripts/build-mdtest.sh
    if a.baseline is not None:
        if not (a.baseline / ".venv" / "bin" / "hycache-agent").exists():
            ap.error(f"--baseline: {a.baseline}/.venv/bin/hycache-agent missing")
        a.targets = [t for t in ALL_TARGETS if t in a.targets or t in BASE_TARGETS and t[5:] in a.targets]
    if not a.parts & {"meta", "serve", "mdtest"} and not a.dht_fio:
        a.targets = [t for t in a.targets if t not in DHT_TARGETS]  # it would have no row to run
    a.size = a.size or ("32M" if a.quick else "256M")
    a.io_4k = a.io_4k or ("16M" if a.quick else "64M")
    for opt in ("size", "io_4k"):
        try:
            parse_size(getattr(a, opt))
        except ValueError as e:
            ap.error(f"--{opt.replace('_', '-')}: {e}")
    if parse_size(a.io_4k) > parse_size(a.size):
        ap.error(f"--io-4k ({a.io_4k}) must not exceed --size ({a.size})")
    a.files = a.files or (200 if a.quick else 1000)
    a.serve_files = a.serve_files or (300 if a.quick else 1250)
    a.serve_requests = a.serve_requests or (2000 if a.quick else 10000)
    a.mdtest_files = a.mdtest_files or (200 if a.quick else 1000)
    a.repeat = a.repeat or (1 if a.quick else 3)
    if a.files < 1 or a.repeat < 1:
        ap.error("--files and --repeat must be ≥ 1")
    if a.out is None:
        a.out = (REPO / ".work" / "bench" / "quick" / "benchmarks.md") if a.quick else (REPO / "docs" / "benchmarks.md")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    cmdline = "python bench/fs_bench.py " + " ".join(shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))
    tools = ["fio"] + (["mergerfs"] if "mergerfs" in args.targets else []) \
        + (["fusermount3"] if set(args.targets) & FUSE_TARGETS else []) \
        + (["redis-server"] if set(args.targets) & DHT_TARGETS else [])
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"fs_bench: {tool} not found: run scripts/bootstrap.sh", file=sys.stderr)
            return 2
    if set(args.targets) & FUSE_TARGETS and not VENV_PYTHON.exists():
        print(f"fs_bench: {VENV_PYTHON} missing: run scripts/bootstrap.sh", file=sys.stderr)
        return 2
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for mp in mounts_under(workdir):  # leftovers of a killed run
        log(f"unmounting stale {mp}")
        force_unmount(mp)
    n_fio = sum(1 for t in args.targets if t not in DHT_TARGETS or args.dht_fio) if "fio" in args.parts else 0
    free = shutil.disk_usage(workdir).free
    need = n_fio * max(args.numjobs) * parse_size(args.size) + (256 << 20)
    if free < need:
        print(f"fs_bench: {workdir} has {free >> 20} MiB free, needs {need >> 20} MiB", file=sys.stderr)
        return 2

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    caches = Caches(args.drop_caches)
    descriptions: dict[str, str] = {}
    t_start = time.monotonic()
    load_before = os.getloadavg()
    started: list[Target] = []
    cluster = Cluster(workdir) if set(args.targets) & DHT_TARGETS else None
    try:
        if cluster is not None:
            log("starting a local Redis Cluster for hycache-dht")
            cluster.start()
            descriptions["redis"] = cluster.redis
        for name in args.targets:
            t = Target(name, workdir / name, fio=name not in DHT_TARGETS | BASE_TARGETS or args.dht_fio,
                       agent_args=() if name in BASE_TARGETS else tuple(shlex.split(args.agent_args)))
            if name in BASE_TARGETS:
                t.agent_bin = args.baseline / ".venv" / "bin" / "hycache-agent"
            started.append(t)
            log(f"starting {name}")
            t.start(cluster)
            descriptions[name] = t.description
        res = bench_all(started, args, caches)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    except Exception as e:
        log(f"error: {e}")
        for t in started:
            if not t.alive():
                log(f"{t.name} is dead; its log's tail:\n{t.log_tail()}")
        return 1
    finally:
        for t in reversed(started):
            t.stop()
        for mp in mounts_under(workdir):
            force_unmount(mp)
        if cluster is not None:
            cluster.stop()
    elapsed = time.monotonic() - t_start
    load_after = os.getloadavg()

    print_table(res, args.targets, args)
    info = machine_info(workdir)
    info["load average (1 min) before / after"] = (f"{load_before[0]:.1f} / {load_after[0]:.1f} "
                                                   f"on {os.cpu_count()} cores")
    if caches.waited:
        w = sorted(caches.waited)
        info["wait for a quiet machine before a phase"] = (
            f"median {median(w):.2f} s, max {w[-1]:.2f} s over {len(w)} phases; "
            f"{sum(1 for x in w if x >= QUIET_MAX_SECONDS - 0.2)} not quiet within {QUIET_MAX_SECONDS:.0f} s")
    md = args.out.resolve()
    png = md.parent / "img" / "bench_fs.png"
    raw_json = (args.json or workdir / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json").resolve()
    raw_json.parent.mkdir(parents=True, exist_ok=True)
    raw_json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "machine": info,
                                    "elapsed_s": elapsed, "descriptions": descriptions, "results": res},
                                   indent=1))
    plot(res, args.targets, args, png)
    write_report(res, args.targets, args, caches.enabled, info, descriptions, md, png, cmdline, elapsed,
                 MERGERFS_OPTS)
    log(f"done in {elapsed / 60:.1f} min: {md}, {png}, {raw_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``db`` row: an application on the mount (the journal's Fig. 17 ran TPC-H on MySQL),
here PostgreSQL's pgbench on a database about twice the fast tier.

Per target: ``initdb`` a cluster whose data directory is on the target (owned by the
``postgres`` user; the FUSE mounts are ``allow_other``), ``pgbench -i`` (timed: the load)
with ``pgbench_accounts`` split into partitions (one file each, so a file-granular cache
can hold a part of the table), a ``CHECKPOINT`` and a stop; then two timed phases, each on
a freshly started server after ``drop_caches``: ``pgbench -S`` (read-only, uniform random
point selects over the whole table) and ``pgbench`` (TPC-B-like, a commit per
transaction), each for a fixed time.

The page cache: 24 GB of RAM would hold the whole database after one pass, so the server
and, for the FUSE targets, the file system's daemon run in memory cgroups (v1): the server
in one of ``PG_MEM`` (``shared_buffers`` is inside it), the daemon in one of its resident
size at the start of the phase plus ``DAEMON_SLACK``.  Pages a process reads are charged to
its cgroup, so neither the server nor a daemon (JuiceFS's cache blocks, HyCache's
promotions) can keep the database in memory."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hycache_harness import drop_caches, free_port, stop_pid, wait_for

from .rows import Tick, rotated
from .targets import Target

MEMCG = Path("/sys/fs/cgroup/memory")
PG_MEM = 160 << 20
DAEMON_SLACK = 128 << 20
SHARED_BUFFERS = "32MB"
LOAD_TIMEOUT = 300  # s: a target that cannot load the database in this time fails the row
MB_PER_SCALE = 15.6  # pgbench -i: the database's size per unit of scale (tables and indexes)
CACHES = (f"drop_caches and a server restart (shared_buffers={SHARED_BUFFERS}) before each phase; the server in a "
          f"memory cgroup v1 of {PG_MEM >> 20} MiB, each FUSE daemon in one of its RSS + {DAEMON_SLACK >> 20} MiB")


def pg_bin(tool: str) -> str:
    """The newest installed PostgreSQL's ``tool`` (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        raise RuntimeError(f"no PostgreSQL {tool} under /usr/lib/postgresql/*/bin (scripts/bootstrap.sh)")
    return found[-1]


def _as_pg(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv]


class MemCgroup:
    """A cgroup v1 memory cgroup: ``limit`` bytes, page cache included; removed on close
    (its processes first moved back to the root cgroup)."""

    def __init__(self, name: str, limit: int) -> None:
        self.dir = MEMCG / name
        self.dir.mkdir(exist_ok=True)
        (self.dir / "memory.limit_in_bytes").write_text(str(limit))

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def prefix(self) -> list[str]:
        """A command prefix that runs the command (and all it forks) in this cgroup."""
        return ["sh", "-c", f'echo $$ > {self.dir / "cgroup.procs"} && exec "$@"', "sh"]

    def close(self) -> None:
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                (MEMCG / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone meanwhile
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def daemon_pid(t: Target) -> int | None:
    """The target's FUSE daemon (None for a plain directory)."""
    d = getattr(t, "agent", None) or getattr(t, "daemon", None)
    return d.pid if d is not None else None


class PgCluster:
    """A PostgreSQL cluster in ``data`` run by the postgres user, reached on a Unix socket."""

    def __init__(self, data: Path) -> None:
        self.data, self.port = data, free_port()
        self.sock = Path(tempfile.mkdtemp(prefix="pgsock-"))
        shutil.chown(self.sock, "postgres", "postgres")
        self.log = self.sock / "server.log"
        self.pid: int | None = None
        data.mkdir(parents=True, exist_ok=True)
        for d in data.parents:  # the postgres user must reach it (mkdtemp makes 0700 directories)
            if d.stat().st_mode & 0o001 == 0:
                d.chmod(d.stat().st_mode | 0o011)
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)

    def initdb(self) -> list[str]:
        argv = _as_pg([pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        _run(argv, "initdb")
        return argv

    def start(self, prefix: list[str] | None = None) -> list[str]:
        opts = (f"-p {self.port} -k {self.sock} -c listen_addresses='' -c shared_buffers={SHARED_BUFFERS} "
                "-c max_wal_size=2GB -c fsync=on -c synchronous_commit=on -c autovacuum=off")
        argv = [*(prefix or []), *_as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                                          "300", "-o", opts, "start"])]
        _run(argv, "pg_ctl start", self.log)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return argv

    def stop(self) -> None:
        """A fast shutdown; if pg_ctl cannot (its data directory broken under it), an immediate
        SIGTERM then SIGKILL, so no server outlives the row."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            _run(_as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "300", "-m", "fast", "stop"]),
                 "pg_ctl stop", self.log)
        except RuntimeError:  # the row's own error, if any, is the one to report
            stop_pid(pid, timeout=30)

    def client(self, tool: str, *args: str) -> list[str]:
        return _as_pg([pg_bin(tool), "-h", str(self.sock), "-p", str(self.port), *args])

    def sql(self, query: str) -> str:
        return _run(self.client("psql", "-XAtq", "-d", "postgres", "-c", query), "psql").strip()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.sock, ignore_errors=True)
            shutil.rmtree(self.data, ignore_errors=True)


def _run(argv: list[str], what: str, log: Path | None = None, timeout: float = 1800) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        tail = log.read_text()[-1500:] if log and log.exists() else ""
        raise RuntimeError(f"{what} failed ({out.returncode}): {' '.join(argv)}\n{out.stderr[-1500:]}\n{tail}")
    return out.stdout


def parse_pgbench(text: str) -> dict:
    """TPS (without the initial connection time), average latency (ms) and transactions."""
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
    lat = re.search(r"latency average = ([\d.]+) ms", text)
    done = re.search(r"number of transactions actually processed: (\d+)", text)
    if not tps or not lat or not done:
        raise RuntimeError(f"pgbench output not understood:\n{text[-1500:]}")
    return {"tps": float(tps.group(1)), "latency_ms": float(lat.group(1)), "transactions": int(done.group(1))}


def timed_phase(t: Target, pg: PgCluster, args: list[str], seconds: int, clients: int) -> dict:
    """A pgbench run of ``seconds`` on a server started after drop_caches, the server and the
    target's daemon in memory cgroups."""
    drop_caches()
    groups = [MemCgroup(f"papers-db-{t.name}-pg", PG_MEM)]
    pid = daemon_pid(t)
    try:
        if pid is not None:
            groups.append(MemCgroup(f"papers-db-{t.name}-fs", _rss(pid) + DAEMON_SLACK))
            groups[1].add(pid)
        pg.start(groups[0].prefix())  # the postmaster and every process it forks
        argv = pg.client("pgbench", "-n", *args, "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)),
                         "postgres")
        r = parse_pgbench(_run(argv, f"pgbench on {t.name}", pg.log, timeout=seconds + 600))
        r["argv"] = " ".join(argv)
        r["mem_failcnt"] = [int((g.dir / "memory.failcnt").read_text()) for g in groups]
        return r
    finally:
        try:
            pg.stop()
        finally:
            for g in groups:
                g.close()


def one_target(t: Target, scale: int, partitions: int, seconds: int, clients: int) -> dict:
    pg = PgCluster(t.dir / "pg")
    try:
        commands = [" ".join(pg.initdb()), " ".join(pg.start())]
        init = pg.client("pgbench", "-i", "-q", "-s", str(scale), f"--partitions={partitions}", "postgres")
        t0 = time.perf_counter()
        _run(init, f"pgbench -i on {t.name}", pg.log, timeout=LOAD_TIMEOUT)
        pg.sql("CHECKPOINT")
        _run(["sync", "-f", str(t.dir)], "syncfs")  # this file system's write-back, not the machine's
        load_s = time.perf_counter() - t0
        size = int(pg.sql("SELECT pg_database_size('postgres')"))
        pg.stop()
        staged = getattr(t, "staged", None)  # JuiceFS's write-back: uploaded before the timed phases
        if staged is not None:
            wait_for(lambda: staged() == 0, timeout=600, what=f"{t.name} uploads", interval=0.5)
        upload_s = time.perf_counter() - t0 - load_s
        s0 = t.slow_bytes()[0]
        ro = timed_phase(t, pg, ["-S"], seconds, clients)
        ro["slow_read_mb"] = (t.slow_bytes()[0] - s0) / 1e6
        s0 = t.slow_bytes()[0]
        rw = timed_phase(t, pg, [], seconds, clients)
        rw["slow_read_mb"] = (t.slow_bytes()[0] - s0) / 1e6
        return {"load_s": load_s, "upload_s": upload_s, "db_mb": size / 1e6, "select": ro, "tpcb": rw,
                "commands": [*commands, " ".join(init), ro.pop("argv"), rw.pop("argv")]}
    finally:
        pg.close()


def db_row(targets: list[Target], fast_bytes: int, factor: float, partitions: int, seconds: int, clients: int,
           tick: Tick) -> dict:
    """pgbench on a database ``factor`` x the fast tier, on every target in turn."""
    scale = max(1, round(factor * fast_bytes / 1e6 / MB_PER_SCALE))
    out: dict = {"scale": scale, "partitions": partitions, "seconds": seconds, "clients": clients,
                 "fast_mib": fast_bytes >> 20, "targets": {}}
    for t in rotated(targets, 4):
        try:
            out["targets"][t.name] = one_target(t, scale, partitions, seconds, clients)
        except Exception as e:  # one target's failure (a daemon killed in its cgroup) leaves the others' numbers
            out["targets"][t.name] = {"error": str(e)[-2000:]}
        tick(f"db {t.name}")
    return out

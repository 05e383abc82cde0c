"""A real PostgreSQL server for tests and benchmarks: Debian's binaries (``initdb``, ``pg_ctl``) run as the
``postgres`` user on a free port, data and unix socket in a temp dir, torn down after."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hycache_harness import free_port


def pg_bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(d, "initdb")):
            return Path(d)
    return None


def _as_postgres(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, text=True, **kw)


@dataclass
class PostgresServer:
    base: Path
    port: int
    bindir: Path

    @property
    def data(self) -> Path:
        return self.base / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        _as_postgres(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                     "-E", "UTF8", "--no-sync")
        _as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "server.log"), "-w",
                     "-t", "60", "-o", f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
                     "-c fsync=off -c max_connections=200", "start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(["runuser", "-u", "postgres", "--", str(self.bindir / "pg_ctl"), "-D", str(self.data),
                            "-m", "immediate", "-w", "stop"], capture_output=True)

    def create_database(self, prefix: str = "t") -> str:
        import psycopg
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self) -> str:
        try:
            return (self.base / "server.log").read_text()[-3000:]
        except OSError:
            return ""


def start_postgres() -> PostgresServer:
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries not found (apt package postgresql; run scripts/bootstrap.sh)")
    base = Path(tempfile.mkdtemp(prefix="hycache-pg-"))
    shutil.chown(base, "postgres", "postgres")
    base.chmod(0o700)
    srv = PostgresServer(base, free_port(), bindir)
    deadline = time.monotonic() + 3
    while True:
        try:
            srv.start()
            return srv
        except subprocess.CalledProcessError as e:
            srv.stop()
            if time.monotonic() > deadline:
                shutil.rmtree(base, ignore_errors=True)
                raise RuntimeError(f"postgres did not start: {e.stderr}\n{srv.log_tail()}") from e
            shutil.rmtree(srv.data, ignore_errors=True)
            srv.port = free_port()


HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def start_haproxy(tmp: Path, port: int, backends: list[int], *, maxconn: int = 2000,
                  timeout: float = 30.0, check: str = "inter 200ms fall 2 rise 2") -> subprocess.Popen:
    """Debian's HAProxy on ``127.0.0.1:port`` in front of control-plane processes on
    ``backends`` (round robin, health-checked on /healthz, a request retried on another
    process when its connection fails), the way several hosts' processes stand behind
    one; returns when it forwards /healthz.  ``check``: the health checks' timing (a
    process is taken out after ``fall`` failed checks, a check failing after 2 s).  The tests' kill -9 test and the heartbeat
    benchmark's ``--processes N`` use it."""
    import httpx
    cfg = tmp / "haproxy.cfg"
    servers = "\n".join(f"    server cp{i} 127.0.0.1:{p} check" for i, p in enumerate(backends))
    cfg.write_text(f"""global
    maxconn {maxconn}
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    timeout check 2s
    retries 3
    option redispatch
frontend control_plane
    bind 127.0.0.1:{port}
    default_backend control_plane
backend control_plane
    balance roundrobin
    option httpchk GET /healthz
    http-response set-header X-Served-By %[srv_name]
    default-server {check}
{servers}
""")
    proc = subprocess.Popen([HAPROXY, "-f", str(cfg), "-db"], stdout=open(tmp / "haproxy.log", "wb"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"haproxy did not forward /healthz: {(tmp / 'haproxy.log').read_text()[-2000:]}")
        time.sleep(0.2)

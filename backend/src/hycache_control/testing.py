"""A real PostgreSQL server for tests and benchmarks: Debian's binaries (``initdb``, ``pg_ctl``) run as the
``postgres`` user on a free port, data and unix socket in a temp dir, torn down after."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


def pg_bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(d, "initdb")):
            return Path(d)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

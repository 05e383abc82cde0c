"""A server start-up failure exits non-zero (issue 34), so a supervisor (systemd's
``Restart=on-failure``) sees it and starts the server again: ``hycache-control serve`` as
a real process, one worker or several, each on a configuration that cannot start."""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from hycache_control.testing import PostgresServer, free_port

from .conftest import CONTROL_BIN

#: how long a start that fails may take at most
TIMEOUT = 90


def serve(tmp: Path, db_url: str, *extra: str, port: int | None = None) -> subprocess.CompletedProcess:
    argv = [str(CONTROL_BIN), "serve", "--db", db_url, "--listen", f"127.0.0.1:{port or free_port()}",
            "--state-dir", str(tmp), "--ui-dir", str(tmp / "no-ui"), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def one_connection_database(postgres: PostgresServer) -> str:
    """A database whose owner may hold one connection at a time: the parent of ``serve
    --workers 2`` migrates it, and its workers (two processes, each with its pool, its
    bus and its leader lock) fail at start-up."""
    name = f"lim_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname=postgres",
                         autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT 1')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    return f"postgresql+psycopg://{name}@127.0.0.1:{postgres.port}/{name}"


def test_serve_workers_2_exits_non_zero_when_its_workers_fail_to_start(postgres, tmp_path):
    r = serve(tmp_path, one_connection_database(postgres), "--workers", "2")
    assert r.returncode != 0, r.stderr[-3000:]
    assert "failed to start" in r.stderr, r.stderr[-3000:]


def test_serve_workers_2_exits_non_zero_on_an_unreachable_database(tmp_path):
    r = serve(tmp_path, f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none", "--workers", "2")
    assert r.returncode != 0, r.stderr[-3000:]
    assert "database" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_exits_non_zero_when_its_port_is_taken(postgres, tmp_path, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = serve(tmp_path, postgres.create_database(), "--workers", workers, port=taken.getsockname()[1])
    assert r.returncode != 0, r.stderr[-3000:]

"""Fixtures for the control plane: a real PostgreSQL (session), the database URL of each
engine (``db_url`` is parametrised: sqlite and postgresql), the app in-process on the real
database and the real Redis Cluster (``api``), and the real server as a process
(``control_server``)."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hycache_control.app import create_app
from hycache_control.control import Control
from hycache_control.settings import load_settings
from hycache_control.testing import PostgresServer, start_postgres
from hycache_harness import ControlPlane, HarnessError, executable, free_port
from hycache_harness import redis_seeds as seeds_of

REPO = Path(__file__).resolve().parents[2]
CONTROL_BIN = Path(executable("hycache-control"))


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    srv = start_postgres()
    yield srv
    srv.stop()
    import shutil
    shutil.rmtree(srv.base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    return request.getfixturevalue("postgres").create_database()


def redis_seeds(redis_cluster) -> str:
    """The ``--redis`` seeds of the session's Redis Cluster."""
    return seeds_of(redis_cluster.nodes)


@dataclass
class Api:
    client: TestClient
    control: Control
    admin: str
    read: str
    tmp: Path
    namespace: str
    node_tokens: dict[str, str] = field(default_factory=dict)

    def h(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin}"}

    def get(self, url: str, token: str | None = None, **kw) -> httpx.Response:
        return self.client.get(url, headers=self.h(token), **kw)

    def post(self, url: str, json=None, token: str | None = None, **kw) -> httpx.Response:
        return self.client.post(url, json=json, headers=self.h(token), **kw)

    def put(self, url: str, json=None, token: str | None = None, **kw) -> httpx.Response:
        return self.client.put(url, json=json, headers=self.h(token), **kw)

    def node_token(self, node_id: str) -> str:
        if node_id not in self.node_tokens:
            self.node_tokens[node_id] = self.control.tokens.create(f"node-{node_id}", "node", node_id)[1]
        return self.node_tokens[node_id]

    def beat(self, node_id: str, *, boot_id: str = "boot-1", seq: int = 1, sent_at: float | None = None,
             counters: dict | None = None, status: dict | None = None, policy_version: int = 0,
             action_results: list | None = None, address: str | None = None) -> httpx.Response:
        body = {"node_id": node_id, "version": "0.1.0", "boot_id": boot_id, "seq": seq,
                "sent_at": time.time() if sent_at is None else sent_at, "address": address,
                "status": status, "counters": counters or {}, "policy_version": policy_version,
                "action_results": action_results or []}
        return self.post(f"/api/v1/nodes/{node_id}/heartbeats", body, token=self.node_token(node_id))


@pytest.fixture
def api(db_url, redis_cluster, dht_namespace, tmp_path) -> Api:
    settings = load_settings(None, db=db_url, redis=redis_seeds(redis_cluster), dht_namespace=dht_namespace,
                             state_dir=str(tmp_path), heartbeat_interval=0.5, down_grace=0.5, flush_interval=0.1,
                             max_body_bytes=64 * 1024, max_manifest_bytes=8 << 20, ui_dir=str(tmp_path / "no-ui"))
    control = Control(settings)
    admin = control.tokens.create("test-admin", "admin")[1]
    read = control.tokens.create("test-reader", "read")[1]
    app = create_app(settings, control)
    with TestClient(app) as client:
        yield Api(client, control, admin, read, tmp_path, dht_namespace)


# --------------------------------------------------------------------------- a real server
@dataclass
class ControlServer:
    """A ``hycache-control serve`` the test started (the harness's launcher) and its admin token."""
    plane: ControlPlane
    db_url: str
    admin: str

    @property
    def proc(self) -> subprocess.Popen:
        assert self.plane.proc is not None
        return self.plane.proc

    @property
    def url(self) -> str:
        return self.plane.url

    @property
    def argv(self) -> list[str]:
        return self.plane.argv

    @property
    def log(self) -> Path:
        return self.plane.log

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        return self.plane.stop(30)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "<no log>"


def make_token(db_url: str, scope: str, name: str, node_id: str | None = None) -> str:
    """A token made by the token service on the database (the CLI's code, without its
    process start, which costs seconds on a busy machine)."""
    from hycache_control.db import Database
    from hycache_control.services.tokens import TokenService
    db = Database(db_url)
    try:
        db.upgrade()
        return TokenService(db).create(name, scope, node_id)[1]
    finally:
        db.close()


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(CONTROL_BIN), *args], capture_output=True, text=True, check=check, timeout=120)


def start_server(db_url: str, tmp: Path, *extra: str, admin: str | None = None, port: int | None = None,
                 timeout: float = 90.0) -> ControlServer:
    if admin is None:
        admin = make_token(db_url, "admin", "test-admin")
    port = port or free_port()
    plane = ControlPlane("--ui-dir", str(tmp / "no-ui"), *extra, db=db_url, port=port, state_dir=tmp,
                         binary=str(CONTROL_BIN), ready_path="/healthz", log=tmp / f"control-{port}.log")
    try:
        plane.start(timeout)
    except HarnessError as e:
        raise AssertionError(f"hycache-control did not answer /healthz: {e}") from None
    return ControlServer(plane, db_url, admin)


@pytest.fixture
def control_server(tmp_path):
    """Factory: ``control_server(db_url, *flags) -> ControlServer``; stopped at teardown."""
    started: list[ControlServer] = []

    def factory(db_url: str, *extra: str, **kw) -> ControlServer:
        srv = start_server(db_url, tmp_path, *extra, **kw)
        started.append(srv)
        return srv
    yield factory
    for srv in started:
        srv.stop()

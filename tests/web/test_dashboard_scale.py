"""The dashboard at 1,000 simulated nodes in a real browser (issue 20): a real
``hycache-control serve`` (SQLite, the built dashboard), 1,000 nodes with their own node
tokens posting two heartbeats each (50 of them report a degraded DHT link), then
``npx playwright test e2e/scale.spec.ts`` (Debian's Chromium): the counts, the node table,
a node one click away, axe; it prints the overview's time to render and the bytes per
second the browser receives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hycache_control.db import Database
from hycache_control.models import Token
from hycache_control.services.tokens import hash_secret, new_secret
from hycache_harness import ControlPlane

from .test_dashboard import CHROMIUM, FRONTEND, _require_frontend, _tail

NODES = 1000
DEGRADED = 50  # every 20th node reports a degraded DHT link
BIN = Path(sys.executable).parent / "hycache-control"


def _tokens(db_url: str) -> tuple[dict[str, str], str]:
    db = Database(db_url)
    db.upgrade()
    nodes = {f"n{i:04d}": new_secret() for i in range(NODES)}
    admin = new_secret()
    with db.session() as s:
        s.add_all([Token(name=n, scope="node", node_id=n, hash=hash_secret(t), created_at=time.time())
                   for n, t in nodes.items()])
        s.add(Token(name="scale-admin", scope="admin", hash=hash_secret(admin), created_at=time.time()))
    db.close()
    return nodes, admin


@pytest.mark.slow
def test_dashboard_at_1000_nodes(tmp_path):
    _require_frontend()
    db_url = f"sqlite:///{tmp_path / 'control.db'}"
    nodes, admin = _tokens(db_url)
    log = tmp_path / "control.log"
    # a long interval: every node stays up for the whole test after two heartbeats
    control = ControlPlane("--ui-dir", str(FRONTEND / "dist"), "--heartbeat-interval", "60", db=db_url,
                           state_dir=tmp_path, binary=str(BIN), log=log, append_log=False, ready_path="/healthz")
    url = control.url
    try:
        control.start(90)
        with httpx.Client(base_url=url, timeout=30) as c:
            for seq in (1, 2):
                for i, (node, tok) in enumerate(nodes.items()):
                    status = {"cluster": {"state": "degraded" if i % 20 == 0 else "ok", "backlog": 0},
                              "tiers": {"fast": {"capacity": 1 << 30, "used": i << 20, "files": i},
                                        "slow": {"capacity": 1 << 40, "used": i << 24, "files": 10}}}
                    r = c.post(f"/api/v1/nodes/{node}/heartbeats", headers={"Authorization": f"Bearer {tok}"},
                               json={"node_id": node, "boot_id": "b", "seq": seq, "sent_at": time.time() + seq,
                                     "status": status, "counters": {"fast": {"read_bytes": seq * i * 1000,
                                                                             "hits": seq * i}, "misses": seq}})
                    assert r.status_code == 200, r.text
            s = c.get("/api/v1/summary", headers={"Authorization": f"Bearer {admin}"}).json()
            assert (s["nodes"], s["up"], s["degraded"], s["down"]) == (NODES, NODES - DEGRADED, DEGRADED, 0), s
        state = tmp_path / "scale.json"
        state.write_text(json.dumps({"base_url": url, "admin_token": admin, "read_token": "", "agents": {},
                                     "nodes": NODES, "up": NODES - DEGRADED, "degraded": DEGRADED, "down": 0}))
        env = {**os.environ, "HYCACHE_SCALE_STATE": str(state), "HYCACHE_STACK_STATE": str(state),
               "HYCACHE_E2E_ARTIFACTS": str(tmp_path / "results"), "CHROMIUM": CHROMIUM,
               "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "CI": "1"}
        out = subprocess.run(["npx", "--no-install", "playwright", "test", "e2e/scale.spec.ts"], cwd=FRONTEND, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        print(out.stdout)
        assert out.returncode == 0, f"Playwright failed:\n{out.stdout[-6000:]}\n--- control plane ---\n{_tail(log)}"
        assert "scale: overview rendered" in out.stdout and "bytes/s over 10 s" in out.stdout
    finally:
        control.stop(60)

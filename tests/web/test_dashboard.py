"""The dashboard in a real browser against the real stack.

Starts ``hycache_control.stack`` (two agents with 8 MiB fast tiers and FUSE mounts, the
control plane, on the session's real Redis Cluster from ``hycache_dht.testing``) and runs
``npx playwright test`` (frontend/e2e, Debian's Chromium) with the state file in
HYCACHE_STACK_STATE. Fails when Playwright fails and prints its output. Screenshots of every
view land in .work/artifacts/web/ (HYCACHE_WEB_ARTIFACTS to change).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hycache_control.stack import Stack

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _require_frontend() -> None:
    missing = []
    if shutil.which("npx") is None:
        missing.append("npx (Node.js)")
    if not (FRONTEND / "node_modules" / ".bin" / "playwright").exists():
        missing.append("frontend/node_modules (npm ci)")
    if not (FRONTEND / "dist" / "index.html").exists():
        missing.append("frontend/dist (vite build)")
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt chromium)")
    if missing:
        pytest.fail("the dashboard's browser tests need: " + ", ".join(missing)
                    + " — scripts/bootstrap.sh installs and builds them", pytrace=False)


@pytest.mark.mount
@pytest.mark.slow
def test_dashboard_in_chromium(redis_cluster, dht_namespace, tmp_path_factory):
    _require_frontend()
    artifacts = Path(os.environ.get("HYCACHE_WEB_ARTIFACTS", REPO / ".work" / "artifacts" / "web"))
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    workdir = tmp_path_factory.mktemp("stack")
    with Stack(workdir, agents=2, fast_capacity="8M", redis_seeds=redis_cluster.nodes,
               namespace=dht_namespace) as stack:
        env = {**os.environ,
               "HYCACHE_STACK_STATE": str(stack.state_file),
               "HYCACHE_PYTHON": sys.executable,
               "HYCACHE_E2E_ARTIFACTS": str(artifacts / "results"),
               "HYCACHE_SCREENSHOTS_DIR": str(artifacts / "screenshots"),
               "CHROMIUM": CHROMIUM,
               "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
               "CI": "1"}
        start = time.monotonic()
        proc = subprocess.run(["npx", "--no-install", "playwright", "test"], cwd=FRONTEND, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        print(proc.stdout)
        print(f"playwright: exit {proc.returncode} after {time.monotonic() - start:.0f} s")
        logs = "\n".join(f"--- {a['node_id']} agent log tail ---\n" + _tail(Path(a["log"]))
                         for a in stack.reload()["agents"].values())
        assert proc.returncode == 0, (f"Playwright failed (exit {proc.returncode}):\n{proc.stdout[-8000:]}\n"
                                      f"--- control plane log tail ---\n{_tail(Path(stack.state['control']['log']))}\n{logs}")
    shots = sorted(p.name for p in (artifacts / "screenshots").glob("*.png"))
    assert {"overview-light.png", "files-light.png", "throughput-dark.png"} <= set(shots), shots


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"

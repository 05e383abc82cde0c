"""The workflow graph readable at its default zoom whatever the shape (a Seismology-shaped
fan of 100 jobs, a deep chain) and the jobs' Slurm id, node and staging, in a real browser:
two agents, the control plane, ``npx playwright test e2e/shapes.spec.ts`` (Debian's
Chromium)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hycache_control.stack import Stack

from .test_dashboard import CHROMIUM, FRONTEND, REPO, _require_frontend, _tail


@pytest.mark.mount
@pytest.mark.slow
def test_graph_shapes_and_slurm_on_the_page(redis_cluster, dht_namespace, tmp_path_factory):
    _require_frontend()
    artifacts = Path(os.environ.get("HYCACHE_WEB_ARTIFACTS", REPO / ".work" / "artifacts" / "web-shapes"))
    workdir = tmp_path_factory.mktemp("stack")
    with Stack(workdir, agents=2, fast_capacity="8M", redis_seeds=redis_cluster.nodes,
               namespace=dht_namespace) as stack:
        env = {**os.environ, "HYCACHE_STACK_STATE": str(stack.state_file), "HYCACHE_PYTHON": sys.executable,
               "HYCACHE_SHAPES_E2E": "1", "HYCACHE_E2E_ARTIFACTS": str(artifacts / "results"),
               "HYCACHE_SCREENSHOTS_DIR": str(artifacts), "CHROMIUM": CHROMIUM,
               "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "CI": "1"}
        proc = subprocess.run(["npx", "--no-install", "playwright", "test", "e2e/shapes.spec.ts"], cwd=FRONTEND,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        print(proc.stdout)
        control_log = _tail(Path(stack.state["control"]["log"]))
        assert proc.returncode == 0, (f"Playwright failed (exit {proc.returncode}):\n{proc.stdout[-8000:]}\n"
                                      f"--- control plane log tail ---\n{control_log}")
        assert "1 passed" in proc.stdout

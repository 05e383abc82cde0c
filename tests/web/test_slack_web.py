"""The fast tier's write slack and the move counters on a node's page, in a real browser: one
agent with an 8 MiB fast tier and ``--write-slack 1``, the control plane, ``npx playwright
test e2e/slack.spec.ts`` (Debian's Chromium).  Passthrough off, so the agent serves the
writes and counts every byte into ``used`` as it lands."""

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
def test_write_slack_and_move_counters_on_the_page(redis_cluster, dht_namespace, tmp_path_factory):
    _require_frontend()
    artifacts = Path(os.environ.get("HYCACHE_WEB_ARTIFACTS", REPO / ".work" / "artifacts" / "web-slack"))
    workdir = tmp_path_factory.mktemp("stack")
    with Stack(workdir, agents=1, fast_capacity="8M", redis_seeds=redis_cluster.nodes, namespace=dht_namespace,
               agent_args=["--write-slack", "1"]) as stack:
        env = {**os.environ, "HYCACHE_STACK_STATE": str(stack.state_file), "HYCACHE_PYTHON": sys.executable,
               "HYCACHE_SLACK_E2E": "1", "HYCACHE_E2E_ARTIFACTS": str(artifacts / "results"),
               "HYCACHE_SCREENSHOTS_DIR": str(artifacts), "CHROMIUM": CHROMIUM,
               "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "CI": "1"}
        proc = subprocess.run(["npx", "--no-install", "playwright", "test", "e2e/slack.spec.ts"], cwd=FRONTEND,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        print(proc.stdout)
        agent_log = "\n".join(_tail(Path(a["log"])) for a in stack.reload()["agents"].values())
        assert proc.returncode == 0, (f"Playwright failed (exit {proc.returncode}):\n{proc.stdout[-8000:]}\n"
                                      f"--- agent log tail ---\n{agent_log}")
        assert "1 passed" in proc.stdout
    assert (artifacts / "node-slack-light.png").exists()

"""The README's first command, second part: ``hycache-control demo`` brings the whole
product up (Redis Cluster, control plane, two agents with mounts), its workload reaches
the control plane's metrics, and it stops cleanly, leaving no mount behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTROL = REPO / ".venv" / "bin" / "hycache-control"


@pytest.mark.mount
@pytest.mark.slow
def test_demo_runs_the_whole_product_and_stops_cleanly(tmp_path):
    work = tmp_path / "demo"
    out = subprocess.run([str(CONTROL), "demo", "--duration", "5", "--dir", str(work)],
                         capture_output=True, text=True, timeout=300)
    sys.stdout.write(out.stdout[-4000:])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(r"dashboard\s+│\s+http://127\.0\.0\.1:\d+/", out.stdout)
    assert "metrics show node a writing" in out.stdout
    assert re.search(r"│ a\s+│ up\s+│", out.stdout) and re.search(r"│ b\s+│ up\s+│", out.stdout)
    mounts = Path("/proc/self/mounts").read_text()
    assert str(work) not in mounts, "a demo mount was left behind"

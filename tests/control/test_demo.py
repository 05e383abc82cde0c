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


def test_demo_workload_reads_only_files_it_wrote(tmp_path):
    """The workload's rounds over long runs (the 5 s demo above reaches few of them): every
    cold file it reads back was written in an earlier round.  One plain directory stands
    in for both nodes' mounts of the global namespace: this is about the workload's own
    choice of paths."""
    from hycache_control.demo import COLD_FILES, Workload

    mounts = {"a": tmp_path, "b": tmp_path}
    w = Workload(mounts, 4096)
    w.prepare()
    for _ in range(3 * COLD_FILES):
        w.round()
    assert w.errors == []
    assert w.rounds == 3 * COLD_FILES
    assert w.bytes_read > 0 and w.bytes_written > 0
    assert sorted(p.name for p in tmp_path.glob("cold-a-*")) == sorted(f"cold-a-{i}.dat" for i in range(COLD_FILES))

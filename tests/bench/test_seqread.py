"""bench/seqread.py: HyCache mounts with different flags side by side with the papers'
peers, several passes. Its range table from passes, and a short run end to end (root,
FUSE, fio, the HDD model): every variant mounts with its own flags and reads in every pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hycache_harness import fuse_unusable_reason
from seqread import cells, table

REPO = Path(__file__).resolve().parents[2]


def test_table_gives_each_cell_its_range_over_the_passes() -> None:
    seq = [{"a": {"read": {"4k": 100.0}, "write": {"4k": 50.0}}, "b": {"read": {"4k": 300.0}, "write": {"4k": 60.0}}},
           {"a": {"read": {"4k": 250.0}, "write": {"4k": 40.0}}, "b": {"read": {"4k": 200.0}, "write": {"4k": 70.0}}}]
    res = {"targets": ["a", "b"], "passes": [{"seq": s, "aggregate": {"a": {"4k": {"12": 900.0 + i}}}}
                                             for i, s in enumerate(seq)]}
    assert cells(res)["seq read 4k"] == {"a": [100.0, 250.0], "b": [300.0, 200.0]}
    lines = table(res)
    assert "| seq read 4k | 100-250 | 200-300 |" in lines
    assert "| seq write 4k | 40-50 | 60-70 |" in lines
    assert "| aggregate 4k x12 | 900-901 | - |" in lines


def _root_tools_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices, blkio, drop_caches, FUSE)"
    return "fio not installed (scripts/bootstrap.sh)" if shutil.which("fio") is None else fuse_unusable_reason()


@pytest.mark.mount
@pytest.mark.slow
@pytest.mark.skipif(_root_tools_missing() is not None, reason=str(_root_tools_missing()))
def test_variants_read_side_by_side_in_every_pass(tmp_path: Path) -> None:
    out = tmp_path / "seqread.json"
    work = Path(tempfile.mkdtemp(prefix="sr-", dir="/var/tmp"))  # short: the agents' control sockets are in it
    argv = [sys.executable, str(REPO / "bench" / "seqread.py"), "--peers", "fast", "--sizes", "4k,1m",
            "--file", "8M", "--counts", "2", "--agg-file", "4M", "--passes", "2", "--workdir", str(work),
            "--variant", "pt=--passthrough on", "--variant", "nopt=--passthrough off --read-ahead-kb 1024",
            "--json", str(out)]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        leftovers = list(work.iterdir())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert leftovers == []  # mounts, HDD models and the run's directory are gone
    res = json.loads(out.read_text())
    assert res["targets"] == ["fast", "pt", "nopt"]
    assert "--read-ahead-kb 1024" in res["commands"]["nopt"][0] and "--passthrough on" in res["commands"]["pt"][0]
    assert [p["order"] for p in res["passes"]] == [["fast", "pt", "nopt"], ["nopt", "pt", "fast"]]
    for row, per in cells(res).items():
        assert set(per) == {"fast", "pt", "nopt"}, row
        assert all(len(v) == 2 and min(v) > 0 for v in per.values()), (row, per)
    assert "| seq read 4k |" in run.stdout

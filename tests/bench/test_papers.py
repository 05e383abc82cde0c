"""bench/papers.py, the papers' matrix (issue 31): its pieces on plain directories (the
mergerfs recipe's mover, PostMark, the tables), and its quick mode end to end on a subset
(root, FUSE, fio, mergerfs): every target produces numbers, the HDD model's rows are
throttle-bound, and a cold read's bytes really come from the slow device."""

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
from paperbench import report
from paperbench.mover import Mover
from paperbench.postmark import PostMark

REPO = Path(__file__).resolve().parents[2]


def test_mover_moves_the_oldest_accessed_files_until_below_the_low_watermark(tmp_path: Path) -> None:
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    (fast / "d").mkdir(parents=True)
    slow.mkdir()
    for i in range(10):  # 10 x 100 KiB on a 1000 KiB budget: above the 90 % high watermark
        p = fast / "d" / f"f{i}"
        p.write_bytes(bytes([i]) * (100 << 10))
        os.utime(p, (1000 + i, 1000))  # f0 is the least recently accessed, and not being written
    mover = Mover(fast, slow, capacity=1000 << 10, period=1.0)
    moved = mover.run_once()
    left = sorted(p.name for p in (fast / "d").iterdir())
    gone = sorted(p.name for p in (slow / "d").iterdir())
    assert left == [f"f{i}" for i in range(3, 10)] and gone == ["f0", "f1", "f2"]  # 700 KiB = 70 % left
    assert moved == 3 * (100 << 10) and mover.moved_bytes == moved
    assert (slow / "d" / "f1").read_bytes() == bytes([1]) * (100 << 10)
    assert mover.run_once() == 0  # below the high watermark: nothing to do


def test_postmark_runs_its_phases_and_leaves_nothing(tmp_path: Path) -> None:
    r = PostMark(tmp_path, lo=512, hi=4096, block=1024, dirs=3, seed=1).run(files=200, transactions=400)
    assert r["total_s"] > 0
    assert r["read_mb"] > 0 and r["written_mb"] >= 200 * 512 / 1e6
    assert r["total_s"] >= r["create_s"] + r["transactions_s"] and r["tps"] > 0
    assert [list(d.iterdir()) for d in tmp_path.iterdir()] == [[], [], []]


def test_tables_give_speedups_over_hdd_and_juicefs() -> None:
    res = {"targets": ["hdd", "hycache", "juicefs"], "params": {"seq_sizes": ["1m"], "factors": [1.0]},
           "rows": {"seq": {"hdd": {"write": {"1m": 100.0}, "read": {"1m": 150.0}},
                            "hycache": {"write": {"1m": 300.0}, "read": {"1m": 600.0}},
                            "juicefs": {"write": {"1m": 150.0}, "read": {"1m": 1200.0}}},
                    "postmark": {n: {"1": {"total_s": s, "set_mb": 512.0}}
                                 for n, s in (("hdd", 10.0), ("hycache", 4.0), ("juicefs", 8.0))}}}
    lines = report.tables(res)
    assert "| seq read 1m, MB/s | 150 | 600 | 1,200 | 4.00x | 0.50x |" in lines
    # times: the speedup is the other's time over HyCache's
    assert "| PostMark 1x fast tier (512 MB), s | 10.0 | 4.0 | 8.0 | 2.50x | 2.00x |" in lines


def _root_tools_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices, blkio, drop_caches, FUSE)"
    missing = [t for t in ("fio", "mergerfs") if shutil.which(t) is None]
    return f"{', '.join(missing)} not installed (scripts/bootstrap.sh)" if missing else fuse_unusable_reason()


@pytest.mark.mount
@pytest.mark.slow
@pytest.mark.skipif(_root_tools_missing() is not None, reason=str(_root_tools_missing()))
def test_quick_matrix_on_a_subset(tmp_path: Path) -> None:
    out = tmp_path / "papers.json"
    work = Path(tempfile.mkdtemp(prefix="pp-", dir="/var/tmp"))  # short: the agent's control socket is in it
    argv = [sys.executable, str(REPO / "bench" / "papers.py"), "--quick", "--rows", "seq,cold",
            "--targets", "hdd,fast,hycache,mergerfs", "--json", str(out), "--img", str(tmp_path),
            "--workdir", str(work), "--hdd-size", "2G"]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        leftovers = list(work.iterdir())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert leftovers == []  # the run's directory (mounts, HDD models) is gone
    res = json.loads(out.read_text())
    assert res["errors"] == {}
    seq, cold = res["rows"]["seq"], res["rows"]["cold"]
    for name in ("hdd", "fast", "hycache", "mergerfs"):
        for op in ("read", "write"):
            assert all(seq[name][op][bs] > 0 for bs in res["params"]["seq_sizes"]), (name, op, seq[name])
        assert cold[name]["mbps"] > 0
    limit = res["hdd_model"]["mbps"]
    for bs in ("1m", "16m"):  # buffered reads of the HDD model: bandwidth-bound (±15 %)
        assert abs(seq["hdd"]["read"][bs] - limit) <= 0.15 * limit, seq["hdd"]["read"]
    size_mb = 64 * 2**20 / 1e6  # --quick's cold file
    for name in ("hdd", "hycache", "mergerfs"):  # read back from the slow device, not a cache
        assert cold[name]["slow_read_mb"] >= 0.9 * size_mb, cold
    assert cold["fast"]["slow_read_mb"] == 0
    assert (tmp_path / "papers_fig7_8_bandwidth.png").stat().st_size > 10_000

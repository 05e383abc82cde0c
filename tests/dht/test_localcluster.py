"""The ``hycache-redis-cluster`` command: start / status / stop a real 6-node cluster, and a
restart from its data directory keeps the data (append-only files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hycache_dht.localcluster import LocalRedisCluster, find_free_base
from hycache_dht.meta import dir_meta
from hycache_dht.redis_store import RedisClusterStore

CLI = str(Path(sys.executable).parent / "hycache-redis-cluster")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_help():
    out = run("--help")
    assert out.returncode == 0
    for word in ("start", "stop", "status"):
        assert word in out.stdout
    for sub in ("start", "stop", "status"):
        out = run(sub, "--help")
        assert out.returncode == 0 and "--base-port" in out.stdout and "--dir" in out.stdout
    assert "--node-timeout" in run("start", "--help").stdout
    assert run("status", "--dir", "/nonexistent/nothing").returncode == 1


def test_start_status_stop_restart(tmp_path):
    base = find_free_base(6)
    d = tmp_path / "cluster"
    out = run("start", "--dir", str(d), "--base-port", str(base))
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"127.0.0.1:{base}" in out.stdout
        st = run("status", "--dir", str(d), "--base-port", str(base))
        assert st.returncode == 0, st.stdout
        rows = [r.split() for r in st.stdout.splitlines()[1:]]
        assert len(rows) == 6 and all(r[2] == "True" and r[4] == "ok" for r in rows)
        assert sorted(r[3] for r in rows) == ["master"] * 3 + ["slave"] * 3
        for p in range(base, base + 6):
            conf = (d / str(p) / "redis.conf").read_text()
            assert "cluster-enabled yes" in conf and "appendonly yes" in conf
        with RedisClusterStore(LocalRedisCluster.from_dir(d).nodes, namespace="cli") as s:
            assert s.ping() and s.create(b"/kept", dir_meta())
        assert run("stop", "--dir", str(d)).returncode == 0
        st = run("status", "--dir", str(d))
        assert st.returncode == 3 and "False" in st.stdout
        # a second start reuses the data directory: same cluster, same data
        assert run("start", "--dir", str(d), "--base-port", str(base)).returncode == 0
        with RedisClusterStore(LocalRedisCluster.from_dir(d).nodes, namespace="cli") as s:
            assert s.get(b"/kept").kind == "dir"
    finally:
        run("stop", "--dir", str(d))
    assert not LocalRedisCluster.from_dir(d).healthy()

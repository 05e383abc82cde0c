"""The HDD model (bench/slowtier.py) holds its limits: fio with O_DIRECT against its file
system measures the bandwidth limit and the 4 KiB random IOPS limit within ±15 %, a
shared-store user's subdirectory is on the same throttled device, and close() removes the
rules and the device.  Root needed (losetup, mount, the cgroup v1 blkio controller)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# bench/ is on pytest's pythonpath (pyproject.toml)
from slowtier import BLKIO, SlowTier

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(os.geteuid() != 0, reason="the HDD model needs root (losetup, mount, blkio)"),
    pytest.mark.skipif(not (BLKIO / "blkio.throttle.read_iops_device").exists(),
                       reason=f"no cgroup v1 blkio throttle at {BLKIO}"),
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (scripts/bootstrap.sh)"),
]

MBPS = 40.0  # small limits keep each check to about two seconds
IOPS = 200
TOLERANCE = 0.15


def fio(path: Path, rw: str, bs: str, size: str, runtime: int | None = None) -> tuple[float, float]:
    """(MB/s, IOPS) of one O_DIRECT fio job on ``path``."""
    argv = ["fio", "--name=slowtier", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", f"--size={size}",
            "--direct=1", "--ioengine=psync", "--fallocate=none", "--output-format=json"]
    if runtime:
        argv += ["--time_based", f"--runtime={runtime}"]
    job = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)["jobs"][0]
    side = job["read" if "read" in rw else "write"]
    return side["bw_bytes"] / 1e6, side["iops"]


def within(measured: float, limit: float) -> bool:
    return abs(measured - limit) <= TOLERANCE * limit


def test_the_throttle_holds_and_close_removes_it(tmp_path: Path) -> None:
    st = SlowTier(MBPS, size="512M", base=tmp_path, iops=IOPS)
    majmin, loop = st.majmin, st.loop
    try:
        assert st.rules() == {"read_bps": int(MBPS * 1e6), "write_bps": int(MBPS * 1e6),
                              "read_iops": IOPS, "write_iops": IOPS}
        f = st.share("agent-1") / "f"
        assert f.parent.parent == st.mnt  # the shared store: a subdirectory of the one device
        # 4 MiB requests: bandwidth-bound (a 4 MiB request is a few large ones on the device)
        w_mbps, _ = fio(f, "write", "4M", "80M")
        r_mbps, _ = fio(f, "read", "4M", "80M")
        assert within(w_mbps, MBPS), f"O_DIRECT write {w_mbps:.1f} MB/s, limit {MBPS}"
        assert within(r_mbps, MBPS), f"O_DIRECT read {r_mbps:.1f} MB/s, limit {MBPS}"
        _, rr_iops = fio(f, "randread", "4k", "80M", runtime=2)
        _, rw_iops = fio(f, "randwrite", "4k", "80M", runtime=2)
        assert within(rr_iops, IOPS), f"4 KiB random reads {rr_iops:.0f} IOPS, limit {IOPS}"
        assert within(rw_iops, IOPS), f"4 KiB random writes {rw_iops:.0f} IOPS, limit {IOPS}"
        assert st.read_bytes() >= 80e6 and st.write_bytes() >= 80e6  # the device served them
    finally:
        st.close()
    assert st.rules(majmin) == {}
    assert not st.dir.exists()
    assert f"{loop}:" not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout

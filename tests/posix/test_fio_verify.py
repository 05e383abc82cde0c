"""fio's own data verification through a HyCache mount (fio: Debian package, installed by
scripts/bootstrap.sh). fio writes blocks with a checksum and a header naming the block
(`verify=crc32c`, `verify_fatal`), then reads everything back and checks it. With a 1 MiB
fast tier and 4 x 2 MiB files the files keep moving between tiers while fio works."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

FIO_JOBS = [
    # name, rw, bs, O_DIRECT
    ("seq-1m", "write", "1m", False),
    ("rand-4k", "randwrite", "4k", False),
    ("rand-mixed-bs", "randwrite", "4k-256k", False),
    ("direct-rand-4k", "randwrite", "4k", True),   # O_DIRECT, 4 writers (fsx: test_fsx.py direct modes)
]


@pytest.fixture(scope="module")
def fio_bin() -> str:
    path = shutil.which("fio")
    if path is None:
        pytest.fail("fio not installed: run scripts/bootstrap.sh")
    return path


@pytest.mark.mount
@pytest.mark.parametrize("fast_capacity", ["1M", "1G"], ids=["tiny-fast-tier", "large-fast-tier"])
@pytest.mark.parametrize("name,rw,bs,direct", FIO_JOBS, ids=[j[0] for j in FIO_JOBS])
def test_fio_verify(hycache_mount, fio_bin, fast_capacity, name, rw, bs, direct):
    m = hycache_mount(fast_capacity=fast_capacity)
    work = m.mountpoint / "fio"
    work.mkdir()
    argv = [fio_bin, f"--name={name}", f"--directory={work}", f"--rw={rw}", f"--bs={bs}",
            "--size=2M", "--numjobs=4", "--ioengine=psync", "--fallocate=none", f"--direct={int(direct)}",
            "--verify=crc32c", "--verify_fatal=1", "--verify_dump=0", "--do_verify=1",
            "--verify_state_save=0",
            "--end_fsync=1", "--group_reporting", "--output-format=json"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=m.base)
    assert p.returncode == 0, f"fio verify failed on {fast_capacity} fast tier:\n{p.stderr[-3000:]}\n{p.stdout[-2000:]}"
    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    assert job["error"] == 0, job
    written, verified = job["write"]["io_bytes"], job["read"]["io_bytes"]
    assert written >= 4 * 2**20, f"fio wrote only {written} bytes"  # mixed sizes stop short of 8 MiB
    assert verified >= written, f"the verify pass read {verified} of {written} bytes written"
    assert m.proc.poll() is None, f"agent died:\n{m.stderr[-4000:]}"

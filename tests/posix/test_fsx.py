"""fsx (the File System eXerciser, Rust rewrite `fsx` from crates.io, built by
scripts/bootstrap.sh) through a HyCache mount: a reproducible pseudo-random sequence of
pread/pwrite, mmap reads and writes (msync, MS_INVALIDATE), ftruncate, fsync/fdatasync and
close/reopen on one file, every read checked against fsx's own model of the bytes.

With a 1 MiB fast tier and a file of up to 4 MiB the file keeps being evicted and promoted
between its opens (close_open), so the checks also cover migrations. fsx has no O_DIRECT
mode: tests/posix/test_fio_verify.py's `direct` jobs cover O_DIRECT.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FSX_BIN = REPO / ".work" / "bin" / "fsx"
NUMOPS = 4000

CONFIG = """
flen = 4194304
[opsize]
max = 131072
[weights]
close_open = 2
read = 10
write = 10
mapread = {mmap}
mapwrite = {mmap}
invalidate = {invalidate}
truncate = 2
fsync = 1
fdatasync = 1
"""


@pytest.mark.mount
@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
@pytest.mark.parametrize("fast_capacity", ["1M", "1G"], ids=["tiny-fast-tier", "large-fast-tier"])
def test_fsx(hycache_mount, fast_capacity, mmap, tmp_path):
    if not FSX_BIN.exists():
        pytest.fail(f"{FSX_BIN} missing: run scripts/bootstrap.sh")
    m = hycache_mount(fast_capacity=fast_capacity)
    conf = tmp_path / "fsx.toml"
    conf.write_text(CONFIG.format(mmap=10 if mmap else 0, invalidate=1 if mmap else 0))
    target = m.mountpoint / "fsx.file"
    p = subprocess.run([str(FSX_BIN), "-N", str(NUMOPS), "-S", "7", "-f", str(conf), "-P", str(tmp_path),
                        str(target)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "RUST_LOG": "warn"})
    assert p.returncode == 0, (f"fsx failed ({fast_capacity} fast tier, mmap={mmap}):\n"
                               f"{p.stderr[-4000:]}\n{p.stdout[-2000:]}")
    assert target.stat().st_size <= 4 << 20
    assert m.proc.poll() is None, f"agent died:\n{m.stderr[-4000:]}"

"""fsx (the File System eXerciser, Rust rewrite `fsx` 0.3.2 from crates.io, built by
scripts/bootstrap.sh with tests/posix/patches/fsx-odirect.patch) through a HyCache mount: a
reproducible pseudo-random sequence of pread/pwrite, mmap reads and writes (msync,
MS_INVALIDATE), ftruncate, fsync/fdatasync and close/reopen on one file, every read checked
against fsx's own model of the bytes.

Four modes: buffered I/O with and without mmap, and O_DIRECT (the patch's `direct = true`:
every open with O_DIRECT, pread/pwrite of aligned buffers at 4 KiB-aligned offsets and
sizes, reads at an unaligned end of file checked for the exact short count) with and
without mmap. With a 1 MiB fast tier and a file of up to 4 MiB the file keeps being
evicted and promoted between its opens (close_open), so the checks also cover migrations.

Each case also checks what it claims: the agent's passthrough state (`hycache-agent status
--json`: on unless pytest runs with `--passthrough off`) and, from /proc/PID/fdinfo while
fsx runs, that fsx's descriptor of the file has O_DIRECT exactly in the direct modes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from hycache_harness import executable

REPO = Path(__file__).resolve().parents[2]
FSX_BIN = Path(os.environ.get("HYCACHE_FSX") or REPO / ".work" / "bin" / "fsx")  # HYCACHE_FSX: another build
AGENT_BIN = Path(executable("hycache-agent"))
# HYCACHE_FSX_OPS / HYCACHE_FSX_SEED: longer or other runs than CI's (e.g. 20000 ops, seeds 1..5)
NUMOPS = int(os.environ.get("HYCACHE_FSX_OPS", "4000"))
SEED = os.environ.get("HYCACHE_FSX_SEED", "7")

CONFIG = """
flen = 4194304
direct = {direct}
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

# mode id: (mmap ops, O_DIRECT)
MODES = {
    "mmap": (True, False),
    "no-mmap": (False, False),
    "direct": (False, True),
    "direct-mmap": (True, True),
}


def agent_passthrough(m) -> dict:
    p = subprocess.run([str(AGENT_BIN), "status", str(m.root), "--json"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"hycache-agent status failed:\n{p.stderr}"
    return json.loads(p.stdout)["passthrough"]


def fd_flags(pid: int, path: str) -> list[int]:
    """open(2) flags of process ``pid``'s descriptors of ``path`` (none if it is gone or
    between a close and an open)."""
    flags = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return flags
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != path:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("flags:"):
                        flags.append(int(line.split()[1], 8))
        except OSError:
            continue  # closed meanwhile (close_open)
    return flags


def run_fsx(argv: list[str], target: Path, timeout: float = 600) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run fsx; meanwhile sample the open flags of its descriptors of ``target``."""
    path = os.path.realpath(target)
    seen: list[int] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "RUST_LOG": "warn"}) as proc:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            seen += fd_flags(proc.pid, path)
            time.sleep(0.002)
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), seen


@pytest.mark.mount
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fast_capacity", ["1M", "1G"], ids=["tiny-fast-tier", "large-fast-tier"])
def test_fsx(hycache_mount, fast_capacity, mode, tmp_path, request):
    if not FSX_BIN.exists():
        pytest.fail(f"{FSX_BIN} missing: run scripts/bootstrap.sh")
    mmap, direct = MODES[mode]
    m = hycache_mount(fast_capacity=fast_capacity)
    conf = tmp_path / "fsx.toml"
    conf.write_text(CONFIG.format(mmap=10 if mmap else 0, invalidate=1 if mmap else 0,
                                  direct="true" if direct else "false"))
    target = m.mountpoint / "fsx.file"
    p, flags = run_fsx([str(FSX_BIN), "-N", str(NUMOPS), "-S", SEED, "-f", str(conf), "-P", str(tmp_path),
                        str(target)], target)
    assert p.returncode == 0, (f"fsx failed ({fast_capacity} fast tier, {mode}; config {conf}, agent log "
                               f"{m.log}):\n{p.stderr[-4000:]}\n{p.stdout[-2000:]}")
    assert "All operations completed A-OK!" in p.stdout
    assert target.stat().st_size <= 4 << 20
    assert m.proc.poll() is None, f"agent died:\n{m.stderr[-4000:]}"

    assert flags, "never saw fsx's descriptor of the file in /proc while it ran"
    with_direct = sum(1 for f in flags if f & os.O_DIRECT)
    if direct:
        assert with_direct == len(flags), f"{len(flags) - with_direct} of {len(flags)} samples without O_DIRECT"
    else:
        assert with_direct == 0, f"{with_direct} of {len(flags)} samples with O_DIRECT"

    wanted = request.config.getoption("--passthrough") or "auto"
    pt = agent_passthrough(m)
    if wanted == "off":
        assert pt["enabled"] is False, pt
    else:  # on, or auto on a host that allows it (this test claims passthrough on)
        assert pt["enabled"] is True, f"--passthrough {wanted}, but the agent runs without: {pt['reason']}"

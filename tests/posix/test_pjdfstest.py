"""pjdfstest (crate `pjdfstest` on crates.io, pinned in scripts/versions.env) against:

* ``raw``           a plain directory on the same file system as the tiers (the baseline),
* ``hycache-large`` a HyCache mount whose fast tier holds everything,
* ``hycache-tiny``  a HyCache mount with a 1 MiB fast tier (constant migration),
* ``mergerfs``      mergerfs (Debian) over a fast and a slow dir: a reference point for
                    what an existing FUSE file system achieves; reported, not asserted.

Every case that passes on ``raw`` must pass on each HyCache mount, except the cases in
``known_failures.toml`` (each with a reason). pjdfstest needs root (it switches to the dummy
users nobody/nogroup and daemon/daemon), so the mounts use allow_other.

Logs: .work/pjdfstest/<target>.log; summary: .work/pjdfstest/summary.txt.
See docs/posix.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hycache_harness import executable, force_unmount, shared_tmpdir

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOG_DIR = REPO / ".work" / "pjdfstest"
IN_CI = os.environ.get("CI") == "true"

NAPTIME = float(os.environ.get("HYCACHE_PJDFSTEST_NAPTIME", "0.01"))
RUN_TIMEOUT = float(os.environ.get("HYCACHE_PJDFSTEST_TIMEOUT", "900"))
DUMMY_USERS = [("nobody", "nogroup"), ("daemon", "daemon")]
# Opt-in features that a Linux ext4/xfs/tmpfs directory supports. A feature the mount
# lacks shows up as a difference against the raw baseline, which is the point.
FEATURES = ["posix_fallocate", "rename_ctime", "utime_now", "utimensat"]

HYCACHE_TARGETS = {
    "hycache-large": "64G",  # everything fits on the fast tier
    "hycache-tiny": "1M",    # + the churn below: constant migration to/from the slow tier
}
# On the tiny target a background thread keeps CHURN_FILES x CHURN_SIZE (2x the fast tier)
# moving while pjdfstest runs: it rewrites one file and reads back (and verifies) another,
# so evictions and promotions interleave with the suite's operations.
CHURN_TARGETS = {"hycache-tiny"}
CHURN_FILES, CHURN_SIZE = 8, 256 * 1024
MERGERFS_OPTS = "allow_other,default_permissions,category.create=ff,cache.files=partial,fsname=mergerfs-pjd"


def _versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "scripts" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


PJDFSTEST_VERSION = _versions()["PJDFSTEST_VERSION"]


# --------------------------------------------------------------------------- helpers
class Churn(threading.Thread):
    """Rewrite and read back files under ``directory`` until stopped; verifies content."""

    def __init__(self, directory: Path):
        super().__init__(daemon=True, name="pjdfstest-churn")
        self.dir, self.stop_event = directory, threading.Event()
        self.rounds, self.errors = 0, []
        self.expected: dict[int, bytes] = {}

    @staticmethod
    def content(i: int, gen: int) -> bytes:
        return (f"{i}:{gen}:".encode() * (CHURN_SIZE // 8 + 1))[:CHURN_SIZE]

    def run(self) -> None:
        self.dir.mkdir(mode=0o755)
        try:
            while not self.stop_event.is_set():
                i = self.rounds % CHURN_FILES
                data = self.content(i, self.rounds)
                (self.dir / f"c{i}").write_bytes(data)
                self.expected[i] = data
                j = (i + CHURN_FILES // 2) % CHURN_FILES
                if j in self.expected and (self.dir / f"c{j}").read_bytes() != self.expected[j]:
                    self.errors.append(f"c{j}: content differs after round {self.rounds}")
                self.rounds += 1
                self.stop_event.wait(0.005)
        except OSError as e:
            self.errors.append(f"round {self.rounds}: {e!r}")

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=60)


def agent_status(root: Path) -> dict:
    p = subprocess.run([executable("hycache-agent"), "status", "--json", str(root)],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return {}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {}


def migrations_done(status: dict) -> int | None:
    return status.get("migrations", {}).get("migrations_done")


# --------------------------------------------------------------------------- running
LINE_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9_:]+)\s+(?P<status>ok|FAILED|skipped|PASSED UNEXPECTEDLY|failed as expected)\s*$")
SUMMARY_RE = re.compile(
    r"^Summary: (?P<failed>\d+) failed, (?P<skipped>\d+) skipped, (?P<passed>\d+) passed, "
    r"(?P<xfail>\d+) expected failures, (?P<total>\d+) total")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class PjdResult:
    target: str
    status: dict[str, str] = field(default_factory=dict)   # case -> ok|FAILED|skipped
    message: dict[str, str] = field(default_factory=dict)  # case -> first failure line
    summary: dict[str, int] | None = None
    returncode: int | None = None
    seconds: float = 0.0
    log: Path | None = None

    def count(self, status: str) -> int:
        return sum(1 for s in self.status.values() if s == status)

    @property
    def passed(self) -> set[str]:
        return {n for n, s in self.status.items() if s == "ok"}

    def line(self) -> str:
        return (f"{self.target:14} passed {self.count('ok'):4}  failed {self.count('FAILED'):4}  "
                f"skipped {self.count('skipped'):3}  total {len(self.status):4}  ({self.seconds:.1f} s)")


def parse_output(target: str, text: str) -> PjdResult:
    res = PjdResult(target)
    current = None
    for raw in ANSI_RE.sub("", text).splitlines():
        m = LINE_RE.match(raw)
        if m:
            current = m["name"]
            res.status[current] = m["status"]
            continue
        m = SUMMARY_RE.match(raw)
        if m:
            res.summary = {k: int(v) for k, v in m.groupdict().items()}
            current = None
            continue
        if current and res.status.get(current) == "FAILED" and raw.startswith("\t") \
                and current not in res.message:
            res.message[current] = raw.strip()
    return res


def find_pjdfstest() -> Path | None:
    candidates = [os.environ.get("HYCACHE_PJDFSTEST"), REPO / ".work" / "bin" / "pjdfstest",
                  Path.home() / ".cache" / "hycache" / f"pjdfstest-{PJDFSTEST_VERSION}" / "bin" / "pjdfstest",
                  shutil.which("pjdfstest")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    return None


def write_config(path: Path) -> Path:
    users = ",\n".join(f'  ["{u}", "{g}"]' for u, g in DUMMY_USERS)
    feats = "\n".join(f"{f} = {{}}" for f in FEATURES)
    path.write_text(
        "# generated by tests/posix/test_pjdfstest.py\n"
        f"[features]\n{feats}\n\n"
        f"[settings]\nnaptime = {NAPTIME}\nallow_remount = false\n\n"
        f"[dummy_auth]\nentries = [\n{users},\n]\n")
    return path


def run_pjdfstest(binary: Path, config: Path, target: str, directory: Path,
                  secondary: Path | None) -> PjdResult:
    """Run the whole suite in a fresh 0755 subdirectory of ``directory``."""
    work = directory / "pjdfstest"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    argv = [str(binary), "-c", str(config), "-p", str(work)]
    if secondary is not None:
        argv += ["-s", str(secondary)]
    env = {**os.environ, "NO_COLOR": "1", "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{target}.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=work, start_new_session=True)
        try:
            proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"pjdfstest on {target} did not finish in {RUN_TIMEOUT:.0f} s; log: {log}\n"
                        + "\n".join(log.read_text(errors='replace').splitlines()[-30:]), pytrace=False)
    res = parse_output(target, log.read_text(errors="replace"))
    res.returncode, res.seconds, res.log = proc.returncode, time.monotonic() - t0, log
    if res.summary is None:
        pytest.fail(f"pjdfstest on {target} exited {proc.returncode} without a summary; log: {log}\n"
                    + "\n".join(log.read_text(errors='replace').splitlines()[-30:]), pytrace=False)
    counted = {"failed": res.count("FAILED") + res.count("PASSED UNEXPECTEDLY"),
               "skipped": res.count("skipped"), "passed": res.count("ok")}
    for k, v in counted.items():
        assert res.summary[k] == v, f"parsed {k}={v} but pjdfstest says {res.summary[k]} ({log})"
    return res


def load_known_failures(target: str) -> dict[str, str]:
    data = tomllib.loads((HERE / "known_failures.toml").read_text()).get("known_failures", {})
    known = {}
    for case, entry in data.items():
        if not isinstance(entry, dict) or not entry.get("reason"):
            raise AssertionError(f"known_failures.toml: {case!r} needs a reason")
        if target in entry.get("targets", list(HYCACHE_TARGETS)):
            known[case] = entry["reason"]
    return known


def compare(baseline: PjdResult, res: PjdResult, known: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(regressions, accepted known failures, known failures that pass now)."""
    regressions, accepted = [], []
    for case in sorted(baseline.passed):
        if res.status.get(case) == "ok":
            continue
        (accepted if case in known else regressions).append(case)
    fixed = sorted(c for c in known if res.status.get(c) == "ok")
    return regressions, accepted, fixed


def describe(baseline: PjdResult, res: PjdResult, regressions, accepted, fixed) -> str:
    lines = [res.line()]
    for case in regressions:
        lines.append(f"    DIFF  {case}: {res.status.get(case, 'missing')}"
                     f"{' — ' + res.message[case] if case in res.message else ''}")
    for case in accepted:
        lines.append(f"    known {case}: {res.status.get(case, 'missing')}")
    for case in fixed:
        lines.append(f"    note  {case} is in known_failures.toml but passes now: remove it")
    better = sorted(c for c in res.passed if baseline.status.get(c) != "ok")
    if better:
        lines.append(f"    ({len(better)} cases pass here but not on raw: {', '.join(better[:5])}...)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pjdfstest_bin() -> Path:
    if os.geteuid() != 0:
        pytest.skip("pjdfstest needs root (it switches to dummy users and creates device nodes)")
    b = find_pjdfstest()
    if b is None:
        msg = (f"pjdfstest {PJDFSTEST_VERSION} not found: run scripts/bootstrap.sh "
               "(cargo install into ~/.cache/hycache) or set HYCACHE_PJDFSTEST")
        pytest.fail(msg) if IN_CI else pytest.skip(msg)
    version = subprocess.run([str(b), "--version"], capture_output=True, text=True).stdout.strip()
    assert version == f"pjdfstest {PJDFSTEST_VERSION}", f"{b}: {version!r}, want {PJDFSTEST_VERSION}"
    return b


@pytest.fixture(scope="module")
def pjd_env(pjdfstest_bin):
    """Config file and a secondary file system (tmpfs) for the EXDEV cases."""
    base = shared_tmpdir("hycache-pjd-")
    config = write_config(base / "pjdfstest.toml")
    secondary = None
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(base).st_dev:
        secondary = shared_tmpdir("hycache-pjd-", "/dev/shm")
    yield {"bin": pjdfstest_bin, "config": config, "base": base, "secondary": secondary}
    shutil.rmtree(base, ignore_errors=True)
    if secondary:
        shutil.rmtree(secondary, ignore_errors=True)


@pytest.fixture(scope="module")
def baseline(pjd_env, posix_summaries) -> PjdResult:
    raw = pjd_env["base"] / "raw"
    raw.mkdir(mode=0o755)
    res = run_pjdfstest(pjd_env["bin"], pjd_env["config"], "raw", raw, pjd_env["secondary"])
    posix_summaries.append(f"pjdfstest {PJDFSTEST_VERSION}, naptime {NAPTIME}, features {', '.join(FEATURES)}"
                           f", dummy users {DUMMY_USERS}")
    posix_summaries.append(res.line())
    return res


# --------------------------------------------------------------------------- tests
def test_pjdfstest_raw_baseline(baseline):
    """The baseline itself must be meaningful: the suite ran and most cases passed."""
    assert len(baseline.status) >= 300, f"only {len(baseline.status)} cases ran; see {baseline.log}"
    assert baseline.count("ok") >= 0.9 * len(baseline.status) - baseline.count("skipped"), \
        f"raw directory fails {baseline.count('FAILED')} cases; see {baseline.log}"


@pytest.mark.mount
@pytest.mark.timeout(RUN_TIMEOUT + 120)
@pytest.mark.parametrize("target", list(HYCACHE_TARGETS))
def test_pjdfstest_hycache(target, baseline, pjd_env, hycache_mount, posix_summaries):
    m = hycache_mount(fast_capacity=HYCACHE_TARGETS[target])
    churn = Churn(m.mountpoint / "churn") if target in CHURN_TARGETS else None
    before = migrations_done(agent_status(m.root)) or 0
    if churn:
        churn.start()
    try:
        res = run_pjdfstest(pjd_env["bin"], pjd_env["config"], target, m.mountpoint, pjd_env["secondary"])
    finally:
        if churn:
            churn.stop()
    moved = migrations_done(agent_status(m.root))
    regressions, accepted, fixed = compare(baseline, res, load_known_failures(target))
    report = describe(baseline, res, regressions, accepted, fixed)
    report += (f"\n    migrations during the run: {moved - before if moved is not None else 'unknown'}"
               + (f" (churn: {churn.rounds} rewrites of {CHURN_FILES} x {CHURN_SIZE // 1024} KiB)" if churn else ""))
    posix_summaries.append(report)
    print(report)
    assert m.proc.poll() is None, f"hycache-agent died during pjdfstest:\n{m.stderr[-4000:]}"
    if churn:
        assert not churn.errors, f"churn I/O on {target} failed: {churn.errors[:5]}"
        assert churn.rounds > CHURN_FILES, f"churn made only {churn.rounds} rounds"
        if moved is not None:
            assert moved - before > 0, f"no migrations on {target} although the churn overfilled the fast tier"
    assert not regressions, (
        f"{len(regressions)} pjdfstest cases pass on a raw directory but not on {target} "
        f"(log: {res.log}; agent log: {m.log}):\n{report}")


@pytest.mark.mount
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_pjdfstest_mergerfs_reference(baseline, pjd_env, posix_summaries):
    """Reference point, not a gate: what an existing FUSE union fs (mergerfs, Debian)
    scores with the same config. Checks only that the harness works through a FUSE mount
    with allow_other (the suite completes and dummy-user cases run)."""
    mergerfs = shutil.which("mergerfs")
    if mergerfs is None:
        msg = "mergerfs not installed: run scripts/bootstrap.sh"
        pytest.fail(msg) if IN_CI else pytest.skip(msg)
    base = shared_tmpdir("hycache-mergerfs-")
    fast, slow, mnt = base / "fast", base / "slow", base / "mnt"
    for d in (fast, slow, mnt):
        d.mkdir(mode=0o755)
    log = base / "mergerfs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([mergerfs, "-f", "-o", MERGERFS_OPTS, f"{fast}:{slow}", str(mnt)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            assert proc.poll() is None, f"mergerfs exited {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"mergerfs did not mount: {log.read_text()}"
            time.sleep(0.05)
        res = run_pjdfstest(pjd_env["bin"], pjd_env["config"], "mergerfs", mnt, pjd_env["secondary"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        force_unmount(mnt)
    regressions, _, _ = compare(baseline, res, {})
    report = res.line() + f"\n    (reference only: {len(regressions)} cases that pass on raw fail here)"
    posix_summaries.append(report)
    shutil.rmtree(base, ignore_errors=True)
    assert len(res.status) == len(baseline.status)
    assert res.count("ok") > 0.5 * baseline.count("ok")

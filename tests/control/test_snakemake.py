"""Snakemake (a real workflow engine) runs a real workflow whose jobs the control plane
places as they become ready (issue 21): Snakemake's generic cluster executor calls
``hycache-control submit``, which asks ``POST /api/v1/placements`` where each job's
inputs are and runs it through that node's FUSE mount.  The control plane server
(SQLite, the real Redis Cluster) and two real agents with FUSE mounts
(``linked_cluster``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
from hycache_harness import wait_for, write_secret

from .conftest import CONTROL_BIN
from .test_e2e_manifests import linked_cluster  # noqa: F401  (the fixture)

SNAKEMAKE = Path(sys.executable).parent / "snakemake"
MB = 1 << 20

SNAKEFILE = textwrap.dedent("""
    rule all:
        input: "out/report.txt"

    rule summarise:
        input: "in/{x}.dat"
        output: "out/{x}.sum"
        shell: "cksum < {input} > {output}"

    rule report:
        input: "out/a.sum", "out/b.sum"
        output: "out/report.txt"
        shell: "cat {input} > {output}"
""")


def info(srv, path: str) -> dict:
    r = httpx.get(f"{srv.url}/api/v1/files/info", params={"path": path},
                  headers={"Authorization": f"Bearer {srv.admin}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def published(srv, path: str) -> bool:
    """Whether the global namespace has ``path`` yet: a close does not wait for the
    publication (docs/agent.md, "The metadata path"), which trails it by a commit and the
    publisher's batch."""
    r = httpx.get(f"{srv.url}/api/v1/files/info", params={"path": path},
                  headers={"Authorization": f"Bearer {srv.admin}"}, timeout=10)
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def remote_fetch_bytes(srv) -> int:
    r = httpx.get(f"{srv.url}/api/v1/nodes", headers={"Authorization": f"Bearer {srv.admin}"}, timeout=10).json()
    return sum(((n.get("counters") or {}).get("remote") or {}).get("fetch_bytes", 0) for n in r["items"])


def setup_workdir(srv, ma: Path, mb: Path, name: str, data: dict[str, bytes]) -> Path:
    wd = ma / name
    (wd / "in").mkdir(parents=True)
    (wd / "Snakefile").write_text(SNAKEFILE)
    (ma / name / "in" / "a.dat").write_bytes(data["a"])  # written through a: its primary is a
    wait_for(lambda: (mb / name / "in").is_dir(), 30, "the directory made through a to show through b")
    (mb / name / "in" / "b.dat").write_bytes(data["b"])  # through b: on b
    for x in "ab":  # what Snakemake submits next is placed from the published entries
        wait_for(lambda: published(srv, f"/{name}/in/{x}.dat"), 30, f"/{name}/in/{x}.dat to be published")
    return wd


def settled_fetch_bytes(srv) -> int:
    """The agents' remote fetch bytes once two heartbeats (0.5 s) agree."""
    last = -1
    for _ in range(40):
        now = remote_fetch_bytes(srv)
        if now == last:
            return now
        last = now
        time.sleep(1.2)
    return last


def test_snakemake_runs_each_job_where_its_inputs_are(linked_cluster, tmp_path):  # noqa: F811
    srv, mounts = linked_cluster
    ma, mb = Path(mounts["a"].mountpoint), Path(mounts["b"].mountpoint)
    data = {"a": os.urandom(4 * MB), "b": os.urandom(4 * MB)}
    wd = setup_workdir(srv, ma, mb, "wf", data)
    assert info(srv, "/wf/in/a.dat")["primary"] == "a" and info(srv, "/wf/in/b.dat")["primary"] == "b"
    token = write_secret(tmp_path / "admin.token", srv.admin)
    submit = (f"{CONTROL_BIN} submit --api {srv.url} --token-file {token} --mount a={ma} --mount b={mb} "
              f"--log-dir {tmp_path / 'jobs'}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    before = settled_fetch_bytes(srv)
    t = time.monotonic()
    p = subprocess.run([str(SNAKEMAKE), "--executor", "cluster-generic", "--cluster-generic-submit-cmd", submit,
                        "--jobs", "2", "--latency-wait", "60", "--nocolor"],
                       cwd=wd, capture_output=True, text=True, timeout=900, env=env)
    elapsed = time.monotonic() - t
    logs = "\n".join(f"== {f.name}\n{f.read_text()[-2000:]}" for f in sorted((tmp_path / "jobs").glob("*.log")))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + logs
    placed = settled_fetch_bytes(srv) - before
    # each summarise job ran on the node that holds its input; the report wherever
    ran = {}
    for f in (tmp_path / "jobs").glob("hycache-job-*.sh"):
        props = json.loads(f.read_text().split("# properties = ", 1)[1].split("\n", 1)[0])
        ran[(props["rule"], props["wildcards"].get("x"))] = f.name.split("-")[2]
    assert ran[("summarise", "a")] == "a" and ran[("summarise", "b")] == "b", ran
    assert set(ran) == {("summarise", "a"), ("summarise", "b"), ("report", None)}
    # and the results are right, read through either mount
    report = (mb / "wf" / "out" / "report.txt").read_text().split("\n")
    expect = [subprocess.run(["cksum"], input=data[x], capture_output=True).stdout.decode().strip() for x in "ab"]
    assert [line.strip() for line in report if line.strip()] == expect

    # Snakemake's own local run of the same workflow, on a: b.dat crosses to a
    wd2 = setup_workdir(srv, ma, mb, "wf-local", data)
    before = settled_fetch_bytes(srv)
    p = subprocess.run([str(SNAKEMAKE), "--cores", "1", "--nocolor"], cwd=wd2, capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    local = settled_fetch_bytes(srv) - before
    assert (wd2 / "out" / "report.txt").read_text() == (wd / "out" / "report.txt").read_text()
    assert local >= 4 * MB > placed, (local, placed)
    print(f"snakemake through hycache-control submit: 3 jobs in {elapsed:.1f} s, {placed:,} bytes moved between "
          f"nodes; Snakemake's local run on one node: {local:,} bytes")

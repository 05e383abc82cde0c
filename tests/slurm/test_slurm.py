"""Slurm runs the jobs, HyCache places and stages their data (issue 35, docs/slurm.md).

Real daemons: munged, slurmctld and three slurmd (n1, n2, n3) on this host with
deploy/slurm's job_submit.lua and burst_buffer.lua; a real control plane (SQLite) on the
real Redis Cluster; three real agents (FUSE mounts) named n1..n3 linked to it.  Jobs are
submitted with ``sbatch`` as ``nobody`` (Slurm refuses burst buffers to root) and declare
their data with ``#BB_LUA hycache inputs=… outputs=…``."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from hycache_harness import ControlPlane, cluster_secret, create_token, free_port, redis_seeds, wait_for, write_secret

from .slurmcluster import SlurmCluster, missing

NODES = ["n1", "n2", "n3"]
STAGE_WAIT = 30

pytestmark = [pytest.mark.slow, pytest.mark.mount]


def job_script(name: str, mounts: dict[str, str], inputs: str, outputs: str, out_dir) -> str:
    cases = " ".join(f"{n}) M={m} ;;" for n, m in mounts.items())
    return f"""#!/bin/bash
#SBATCH -o {out_dir}/{name}-%j.out
#BB_LUA hycache inputs={inputs} outputs={outputs}
case "$SLURMD_NODENAME" in {cases} esac
wc -c < "$M{inputs.split(',')[0]}" > "$M{outputs}" 2>/dev/null || true
echo "ran on $SLURMD_NODENAME"
"""


@pytest.fixture
def stack(hycache_mount, redis_cluster, dht_namespace, tmp_path):
    why = missing()
    if why:
        pytest.skip(why)
    redis = redis_seeds(redis_cluster.nodes)
    db = f"sqlite:///{tmp_path}/control.db"
    cp = ControlPlane("--redis", redis, "--dht-namespace", dht_namespace, "--heartbeat-interval", "0.5",
                      db=db, log=tmp_path / "control.log", state_dir=tmp_path).start()
    admin = create_token(db, "admin", "slurm")
    secret = cluster_secret(tmp_path / "cluster.secret")
    mounts = {}
    for n in NODES:
        tok = write_secret(tmp_path / f"{n}.token", create_token(db, "node", f"node-{n}", n))
        mounts[n] = hycache_mount(fast_capacity="64M", redis=redis, dht_namespace=dht_namespace, node_id=n,
                                  listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret,
                                  control_plane=cp.url, control_token_file=tok)
    token_file = write_secret(tmp_path / "slurm.token", admin)
    conf = (f"url = {cp.url}\ntoken_file = {token_file}\nsubmit_timeout = 2\nhttp_timeout = 3\n"
            f"stage_wait = {STAGE_WAIT}\npoll_interval = 0.5\n")
    slurm = SlurmCluster(NODES, hycache_conf=conf)
    client = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    try:
        for n in NODES:
            wait_for(lambda n=n: client.get(f"/api/v1/nodes/{n}").json().get("state") == "up", 60, f"{n} up")
        slurm.start()
        yield cp, client, mounts, slurm
    finally:
        client.close()
        slurm.stop()
        cp.stop()


def test_jobs_run_where_hycache_chose_staged_and_never_held_by_it(stack):
    cp, c, mounts, slurm = stack
    # the input lives on n2, on its slow tier: 2LS sends the job to n2 and stages it there
    m2 = mounts["n2"].mountpoint
    (m2 / "in").mkdir()
    (m2 / "out").mkdir()
    os.chmod(m2 / "out", 0o1777)
    (m2 / "in" / "data.bin").write_bytes(os.urandom(4 << 20))
    wait_for(lambda: (e := c.get("/api/v1/files/info", params={"path": "/in/data.bin"})).status_code == 200
             and e.json()["primary"] == "n2" and e.json()["size"] == 4 << 20, 60, "data.bin published")
    r = c.post("/api/v1/files/actions", json={"action": "demote", "paths": ["/in/data.bin"]})
    assert r.status_code == 202, r.text
    act = wait_for(lambda: (a := c.get(f"/api/v1/actions/{r.json()['id']}").json())["state"] in ("done", "failed")
                   and a, 60, "the demote's result")
    assert act["state"] == "done", act["items"]
    assert c.get("/api/v1/files/info", params={"path": "/in/data.bin"}).json()["tier"] == "slow"
    paths = {n: str(m.mountpoint) for n, m in mounts.items()}

    t0 = time.monotonic()
    job = slurm.sbatch(job_script("placed", paths, "/in/data.bin", "/out/result.txt", slurm.out), "placed")
    done = slurm.wait_done(job, 120)
    print(f"\nplaced and staged: sbatch to completed {time.monotonic() - t0:.1f} s")
    assert done["JobState"] == "COMPLETED", done["_raw"]
    # Layer 1: the job ran on the node the control plane chose, and the control plane knows it
    assert done["NodeList"] == "n2", done["_raw"]
    assert (slurm.out / f"placed-{job}.out").read_text().strip() == "ran on n2"
    log = (slurm.logs / "slurmctld.log").read_text()
    assert "steered to n2 (placement)" in log and 'chosen among ["n1","n2","n3"]' in log, slurm.log_tail()
    # Layer 2: the hooks came in order; the input was staged onto n2's fast tier; the output published
    view = wait_for(lambda: (v := c.get(f"/api/v1/slurm/jobs/{job}").json())["state"] == "done" and v, 60,
                    "teardown reported")
    assert [h["hook"] for h in view["hooks"]] == ["stage-in", "pre-run", "post-run", "teardown"], view["hooks"]
    assert (view["staged_on"], view["ran_on"], view["staging"]) == ("n2", "n2", "staged"), view
    at = [h["at"] for h in view["hooks"]]
    print(f"hooks after stage-in: pre-run {at[1] - at[0]:.2f} s, post-run {at[2] - at[0]:.2f} s, "
          f"teardown {at[3] - at[0]:.2f} s")
    assert c.get("/api/v1/files/info", params={"path": "/in/data.bin"}).json()["tier"] == "fast"
    assert view["published"] == {"/out/result.txt": {"node": "n2", "size": len(f"{4 << 20}\n")}}, view
    # scontrol show bbstat asks the burst buffer, which asks the control plane
    bbstat = slurm.run("scontrol", "show", "bbstat").stdout
    assert f"JobId={job} State=done Staging=staged StagedOn=n2 RanOn=n2" in bbstat, bbstat

    # a manifest's job goes to its node in the manifest's placement (n3 here), its input is
    # fetched onto n3 before it starts, and the manifest shows where Slurm ran it
    doc = {"version": 1, "name": "one", "jobs": [{"name": "j1", "accesses": [{"path": "in/data.bin", "size": "4M"}]}]}
    m = c.post("/api/v1/manifests", params={"nodes": "n3"}, json=doc)
    assert m.status_code == 201, m.text
    mid = m.json()["id"]
    cases = " ".join(f"{n}) M={p} ;;" for n, p in paths.items())
    script = (f"#!/bin/bash\n#SBATCH -o {slurm.out}/manifest-%j.out\n#BB_LUA hycache manifest={mid} job=j1\n"
              f'case "$SLURMD_NODENAME" in {cases} esac\nwc -c < "$M/in/data.bin"\n')
    mjob = slurm.sbatch(script, "manifest")
    done = slurm.wait_done(mjob, 120)
    assert done["JobState"] == "COMPLETED" and done["NodeList"] == "n3", done["_raw"]
    assert (slurm.out / f"manifest-{mjob}.out").read_text().strip() == str(4 << 20)
    view = wait_for(lambda: (v := c.get(f"/api/v1/slurm/jobs/{mjob}").json())["state"] == "done" and v, 60,
                    "teardown reported")
    assert (view["staged_on"], view["ran_on"], view["staging"]) == ("n3", "n3", "staged"), view
    # a copy of n2's file in n3's remote cache on its fast tier (fetched by this step, or
    # by the manifest's own plan step for j1 just before it)
    (step,) = view["step_items"]
    assert step["node"] == "n3" and step["state"] == "done", step
    assert step["detail"].startswith(("fast (fetched", "already fast (remote copy)")), step
    mj = c.get(f"/api/v1/manifests/{mid}/jobs/j1").json()
    assert mj["state"] == "done" and mj["slurm"] == {"job_id": mjob, "node": "n3", "state": "done"}, mj

    # a malformed directive is refused at submission, with the reason
    r = slurm.run("sbatch", "--chdir=/tmp", user="nobody", check=False,
                  input="#!/bin/bash\n#BB_LUA hycache inputs=/in/data.bin colour=blue\ntrue\n")
    assert r.returncode != 0 and "unknown key colour" in r.stderr, r.stderr

    # a staging that fails (an input no node holds) holds the job, and says why on it
    bad = slurm.sbatch(job_script("missing", paths, "/in/nowhere.bin", "/out/never.txt", slurm.out), "missing")
    held = wait_for(lambda: "HyCache staging failed" in (j := slurm.job(bad))["_raw"] and j, 60,
                    f"job {bad} held with the staging failure\n{slurm.log_tail()}")
    assert held["JobState"] == "PENDING", held["_raw"]
    assert "/in/nowhere.bin: no such file" in held["_raw"]
    slurm.run("scancel", str(bad))

    # the control plane down: the next job still runs, on Slurm's own choice, within the bound
    cp.stop()
    t0 = time.monotonic()
    down = slurm.sbatch(job_script("down", paths, "/in/data.bin", "/out/down.txt", slurm.out), "down")
    done = slurm.wait_done(down, 60)
    took = time.monotonic() - t0
    assert done["JobState"] == "COMPLETED" and done["NodeList"] in NODES, done["_raw"]
    print(f"with the control plane down: sbatch to completed {took:.1f} s")
    assert took < 30, f"the job took {took:.1f} s with the control plane down"
    log = (slurm.logs / "slurmctld.log").read_text()
    assert "control plane unreachable at stage-in" in log and "Slurm's own choice" in log
    assert "HyCache burst buffer: control plane unreachable" in slurm.run("scontrol", "show", "bbstat").stdout

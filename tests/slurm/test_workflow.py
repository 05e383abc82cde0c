"""Issue 35's measurement: a WfCommons instance (Montage's shape, 16 tasks, 2 MiB images)
turned into dependent ``sbatch`` jobs by ``hycache-control slurm submit-workflow`` and run
through real slurmctld/slurmd three ways in one run (Slurm alone, HyCache's node choice,
node choice and burst-buffer staging), the agents' slow tiers on the HDD model
(bench/slowtier.py); then once more with staging while the control plane is killed
(SIGKILL) a third of the way through.  bench/slurm_workflow.py is the same run, standalone.

Real daemons only: munged, slurmctld and three slurmd (n1–n3) with deploy/slurm's plugins,
the control plane on the real Redis Cluster, three agents (FUSE mounts) on a throttled
loop device."""

from __future__ import annotations

import json
import shutil

import pytest
from hycache_harness import fuse_unusable_reason, redis_seeds, shared_tmpdir
from slowtier import BLKIO
from slurm_stack import STAGE_WAIT, stack
from slurm_workflow import MODES, WorkflowBench, montage

from .slurmcluster import SlurmCluster, missing

pytestmark = [pytest.mark.slow, pytest.mark.mount]

#: the slow tiers' device: a disk-like 20 MB/s, 200 IOPS, shared by the three nodes
MBPS = 20.0
#: the manifest's load bound slack (submit-workflow --slack)
SLACK = 1.0


@pytest.fixture
def wf_stack(redis_cluster, dht_namespace):
    why = missing() or fuse_unusable_reason()
    if why is None and not (BLKIO / "blkio.throttle.read_bps_device").exists():
        why = f"no cgroup v1 blkio throttle at {BLKIO}"
    if why:
        pytest.skip(why)
    base = shared_tmpdir("hycache-slurmwf-")
    try:
        with stack(base, SlurmCluster, mbps=MBPS, seeds=redis_seeds(redis_cluster.nodes),
                   namespace=dht_namespace) as st:
            yield st, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_workflow_through_slurm_three_ways(wf_stack):
    st, base = wf_stack
    inst = base / "montage.json"
    inst.write_text(json.dumps(montage(images=4, mib=2)))
    inst.chmod(0o644)
    # slack 1: 2LS keeps a job by its data until its node carries twice the mean load (the
    # default 0.1 spreads this 16-task DAG over the node that holds no input, moving the
    # projected images to it)
    bench = WorkflowBench(st.slurm, st.api, st.mounts, inst, token_file=st.token_file, slow=st.slow, slack=SLACK)
    res = {m: bench.run(m, f"/{m}") for m in MODES}
    for m, r in res.items():
        print(f"\n{m}: makespan {r['makespan']:.1f} s, moved {r['moved_bytes'] / 2**20:.1f} MiB, "
              f"first-read hit ratio {r['hit_ratio']}, staging wait {r['staging_wait']:.1f} s, "
              f"on HyCache's node {r['on_chosen']}, ran on {r['ran_on']}")
    for m, r in res.items():
        assert r["outputs_wrong"] == [], (m, r["outputs_wrong"])
    slurm, place, stage = res["slurm"], res["place"], res["stage"]
    # Layer 1: Slurm ran the jobs where HyCache chose (every node stays up here)
    assert place["on_chosen"] >= 0.95 and stage["on_chosen"] >= 0.95, (place["chosen"], stage["chosen"])
    assert slurm["moved_bytes"] > 0, slurm
    # Layer 2: the staged inputs are on the fast tier when the jobs first read them
    assert stage["hit_ratio"] >= 0.90, stage
    # staging costs no makespan: no worse than node choice alone, within 15 % + 3 s of noise
    # (the machine is shared; Slurm's backfill pass runs every second and stamps whole seconds)
    assert stage["makespan"] <= place["makespan"] * 1.15 + 3.0, (stage["makespan"], place["makespan"])

    # the control plane killed a third of the way through: no job waits past the bound, no output lost
    killed = bench.run("stage", "/killed", kill=st.kill_control_plane)
    print(f"control plane killed at {killed['killed_at']} s: makespan {killed['makespan']:.1f} s, "
          f"start delays {killed['start_delays']}")
    assert killed["killed_at"] is not None and not st.cp.alive()
    assert killed["outputs_wrong"] == [], killed["outputs_wrong"]
    late = {t: d for t, d in killed["start_delays"].items() if d > STAGE_WAIT + 5}
    assert not late, f"jobs started more than stage_wait + 5 s after their parents were done: {late}"

    # the floor on bytes moved (docs/slurm.md "Measured"): the placement needs 4.3 MiB
    # (0.19-0.30x Slurm alone's 14.5-22.5); a refetch of a copy the kernel forgot cost +4 MiB
    # (0.57x) before copies outlived their inodes (cluster/kept.py)
    over = {r["mode"]: r["moved_bytes"] for r in (place, stage) if r["moved_bytes"] > 0.5 * slurm["moved_bytes"]}
    assert not over, f"bytes moved over 0.5x Slurm alone's {slurm['moved_bytes']}: {over}"

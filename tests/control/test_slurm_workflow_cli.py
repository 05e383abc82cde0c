"""``hycache-control slurm submit-workflow``'s batch scripts (docs/slurm.md): the directive
each mode writes, the script's reads and writes, and the workflow registered as a manifest
with its files under the prefix.  The jobs through real Slurm: tests/slurm/test_workflow.py."""

from __future__ import annotations

import subprocess

from hycache_control.cli import parser
from hycache_control.slurm_workflow import Layout, as_instance, directive, script
from hycache_core.workflow import parse_workflow
from hycache_harness import executable
from slurm_workflow import expected, montage

WF = parse_workflow(montage(images=3, mib=1))
LAYOUT = Layout(prefix="/runs/a", mounts={"n1": "/m/n1", "n2": "/m/n2"}, scale=0.5, compute_scale=0.1)


def test_the_directive_of_each_mode():
    job = WF.job("mDiffFit_0")
    assert directive(job, LAYOUT, "slurm") == ""
    ins, outs = "inputs=/runs/a/proj_0.fits,/runs/a/proj_1.fits", "outputs=/runs/a/diff_0.fits"
    assert directive(job, LAYOUT, "stage") == f"#BB_LUA hycache {ins} {outs}\n"
    assert directive(job, LAYOUT, "place", 7) == f"#BB_LUA hycache manifest=7 job=mDiffFit_0 {ins} {outs} stage=no\n"


def test_the_script_reads_every_input_and_writes_checkable_outputs(tmp_path):
    s = script(WF.job("mProject_1"), LAYOUT, "stage", "/logs", 3)
    assert s.startswith("#!/bin/bash\n#SBATCH -o /logs/mProject_1-%j.out\n#BB_LUA hycache manifest=3 job=mProject_1 ")
    assert 'case "$SLURMD_NODENAME" in n1) M=/m/n1 ;; n2) M=/m/n2 ;;' in s
    assert 'need "$M"/runs/a/raw_1.fits; cat "$M"/runs/a/raw_1.fits > /dev/null' in s
    assert "sleep 0.400" in s  # runtime 4 s x 0.1
    # run it: the output is the path repeated, cut at the scaled size
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "raw_1.fits").write_bytes(b"x" * 10)
    local = Layout(prefix="/runs/a", mounts={"": str(tmp_path)}, scale=0.5, compute_scale=0.0)
    r = subprocess.run(["bash", "-c", script(WF.job("mProject_1"), local, "slurm", None)], capture_output=True,
                       text=True, env={"SLURMD_NODENAME": "n9", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "runs" / "a" / "proj_1.fits").read_bytes()
    assert out == expected("/runs/a/proj_1.fits", (1 << 20) // 2)


def test_the_manifest_has_the_files_under_the_prefix():
    doc = as_instance(WF, LAYOUT)
    wf = parse_workflow(doc)
    assert [j.id for j in wf.jobs] == [j.id for j in WF.jobs]
    assert dict(wf.job("mProject_0").inputs) == {"runs/a/raw_0.fits": (1 << 20) // 2}
    assert wf.job("mAdd").parents == WF.job("mAdd").parents


def test_help_and_usage_errors():
    args = parser().parse_args(["slurm", "submit-workflow", "w.json", "--mountpoint", "/h", "--mode", "place"])
    assert (args.mode, args.prefix, args.sbatch) == ("place", "/", "sbatch")
    r = subprocess.run([executable("hycache-control"), "slurm", "submit-workflow", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "--dependency=afterok" in r.stdout and "--mode" in r.stdout
    r = subprocess.run([executable("hycache-control"), "slurm", "submit-workflow", "/nonexistent.json",
                        "--mountpoint", "/h"], capture_output=True, text=True)
    assert r.returncode == 2 and "error" in r.stderr

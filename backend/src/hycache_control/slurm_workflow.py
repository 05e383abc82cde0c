"""``hycache-control slurm submit-workflow INSTANCE``: a workflow (a WfCommons WfFormat
1.4/1.5 instance, or a HyCache manifest) as dependent ``sbatch`` jobs (docs/slurm.md).

Each task becomes one batch script, submitted in topological order with
``--dependency=afterok:`` its parents' Slurm job ids.  The script reads each input through
its node's HyCache mount (every byte), computes (sleeps) ``--compute-scale`` × the task's
runtime, and writes each output with its size (× ``--scale``): the file's namespace path
and a newline, repeated and cut at the size, so anyone can check an output's content.
A file's namespace path is ``--prefix`` / its id.

``--mode`` says how much of HyCache the jobs use:

- ``slurm``: plain ``sbatch`` jobs (no ``#BB_LUA`` lines): Slurm's own node choice, no staging;
- ``place``: ``#BB_LUA hycache inputs=… outputs=… stage=no``: job_submit.lua steers each job to
  the node 2-Layer Scheduling chooses; the burst buffer records where it ran, stages nothing;
- ``stage``: ``#BB_LUA hycache inputs=… outputs=…``: that node choice, and the burst buffer
  stages the job's inputs onto its node's fast tier before it starts.

With ``--api`` (place and stage modes) the workflow is first registered with the control
plane as a manifest (``POST /api/v1/manifests``, its files under ``--prefix``, no layer-2
plans: the burst buffer stages) and each job also declares ``manifest=ID job=TASK``: it
goes to its node in the placement of the whole workflow, made while the jobs are
submitted, before most of the files they read exist.  Without it each job is placed
alone, by where its inputs are at submission: a job whose inputs another job has not
written yet is placed blind.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from hycache_core.workflow import Workflow, WorkflowError, WorkflowJob, load_workflow

MODES = ("slurm", "place", "stage")


def add_parser(sub) -> None:
    """``slurm`` and its subcommand ``submit-workflow``."""
    s = sub.add_parser("slurm", help="Slurm: submit a workflow as dependent sbatch jobs (docs/slurm.md)")
    ssub = s.add_subparsers(dest="slurm_cmd", required=True)
    w = ssub.add_parser(
        "submit-workflow", help="turn a WfCommons instance into dependent sbatch jobs",
        description="Submit every task of INSTANCE as one sbatch job (in topological order, each with "
                    "--dependency=afterok: its parents), declaring its inputs and outputs with "
                    "'#BB_LUA hycache' lines as --mode says.  Prints each task's Slurm job id.")
    w.add_argument("instance", metavar="INSTANCE", help="a WfFormat 1.4/1.5 instance or a HyCache manifest (JSON)")
    w.add_argument("--mode", choices=MODES, default="stage",
                   help="slurm: plain sbatch (Slurm's node choice, no staging); place: HyCache's node choice, "
                        "no staging (stage=no); stage: node choice and burst-buffer staging (default)")
    w.add_argument("--prefix", default="/", metavar="DIR",
                   help="namespace directory of the workflow's files: a file's path is DIR/ID (default /)")
    where = w.add_mutually_exclusive_group(required=True)
    where.add_argument("--mountpoint", metavar="DIR", help="the HyCache mount, at the same path on every node")
    where.add_argument("--mount", action="append", metavar="NODE=DIR",
                       help="a node and its mount (repeat; several Slurm nodes on one host)")
    w.add_argument("--scale", type=float, default=1.0, help="multiply every file size by this (default 1)")
    w.add_argument("--compute-scale", type=float, default=0.0, metavar="X",
                   help="each job also sleeps X × its runtime from the instance (default 0)")
    w.add_argument("--log-dir", metavar="DIR", help="each job's output: DIR/TASK-JOBID.out (default: sbatch's)")
    w.add_argument("--sbatch", default="sbatch", metavar="CMD",
                   help="the sbatch command, split like a shell does, e.g. 'runuser -u alice -- sbatch "
                        "--chdir=/tmp' (default: sbatch)")
    w.add_argument("--api", metavar="URL", help="the control plane: register the workflow as a manifest and "
                                                "place every job by its placement (place and stage modes)")
    w.add_argument("--token-file", metavar="FILE", help="an admin token for --api")
    w.add_argument("--nodes", metavar="N,...", help="the nodes the manifest is placed on (default: the --mount "
                                                   "nodes, else the live ones)")
    w.add_argument("--solver", default="local", choices=["greedy", "local", "hypergraph", "exact", "round-robin"],
                   help="the manifest's placement solver (default local)")
    w.add_argument("--slack", type=float, default=0.1,
                   help="the manifest's load bound slack: how far a node's load may exceed the mean to keep "
                        "a job by its data (default 0.1)")
    w.add_argument("--json", action="store_true", help="print {manifest_id, jobs: {task: job id}} as JSON")


@dataclass(frozen=True)
class Layout:
    """Where a job finds the files: namespace paths under ``prefix``, read through a mount."""

    prefix: str
    mounts: dict[str, str]  # node -> mount point; {"": DIR} when every node has it at DIR
    scale: float
    compute_scale: float

    def path(self, file_id: str) -> str:
        return self.prefix.rstrip("/") + "/" + file_id.lstrip("/")

    def size(self, n: int) -> int:
        return max(0, int(n * self.scale))


def as_instance(wf: Workflow, layout: Layout) -> dict[str, Any]:
    """``wf`` as a WfFormat 1.5 instance whose file ids are their namespace paths (without
    the leading /, which the control plane adds) and sizes scaled."""
    files: dict[str, int] = {}
    tasks = []
    for j in wf.jobs:
        for f, n in (*j.inputs.items(), *j.outputs.items()):
            files[layout.path(f).lstrip("/")] = layout.size(n)
        tasks.append({"name": j.name or j.id, "id": j.id, "parents": list(j.parents), "children": [],
                      "inputFiles": [layout.path(f).lstrip("/") for f in j.inputs],
                      "outputFiles": [layout.path(f).lstrip("/") for f in j.outputs]})
    return {"name": wf.name or "workflow", "schemaVersion": "1.5", "workflow": {
        "specification": {"tasks": tasks, "files": [{"id": f, "sizeInBytes": n} for f, n in files.items()]},
        "execution": {"makespanInSeconds": 0, "executedAt": "1970-01-01T00:00:00Z",
                      "tasks": [{"id": j.id, "runtimeInSeconds": j.runtime or 0.0,
                                 "command": {"program": j.task or j.id}} for j in wf.jobs]}}}


def register(wf: Workflow, layout: Layout, api: str, token: str, nodes: list[str] | None, *,
             solver: str = "local", slack: float = 0.1) -> int:
    """The workflow as a manifest of the control plane, placed, without layer-2 plans: its id."""
    params = {"plans": "false", "solver": solver, "slack": str(slack), **({"nodes": ",".join(nodes)} if nodes else {})}
    r = httpx.post(api.rstrip("/") + "/api/v1/manifests", params=params, json=as_instance(wf, layout),
                   headers={"Authorization": f"Bearer {token}"}, timeout=120.0)
    if r.status_code != 201:
        raise RuntimeError(f"POST /api/v1/manifests: {r.status_code} {r.text[:500]}")
    return int(r.json()["id"])


def directive(job: WorkflowJob, layout: Layout, mode: str, manifest_id: int | None = None) -> str:
    """The job's ``#BB_LUA hycache`` line for ``mode`` (none for ``slurm``)."""
    if mode == "slurm":
        return ""
    parts = ["#BB_LUA hycache"]
    if manifest_id is not None:
        parts += [f"manifest={manifest_id}", f"job={job.id}"]
    if job.inputs:
        parts.append("inputs=" + ",".join(layout.path(f) for f in job.inputs))
    if job.outputs:
        parts.append("outputs=" + ",".join(layout.path(f) for f in job.outputs))
    if mode == "place":
        parts.append("stage=no")
    return " ".join(parts) + "\n"


def script(job: WorkflowJob, layout: Layout, mode: str, log_dir: str | None, manifest_id: int | None = None) -> str:
    """The batch script of one task."""
    head = "#!/bin/bash\n"
    if log_dir:
        head += f"#SBATCH -o {shlex.quote(str(Path(log_dir) / (job.id + '-%j.out')))}\n"
    head += directive(job, layout, mode, manifest_id)
    if "" in layout.mounts:
        body = f"M={shlex.quote(layout.mounts[''])}\n"
    else:
        cases = " ".join(f"{shlex.quote(n)}) M={shlex.quote(m)} ;;" for n, m in layout.mounts.items())
        body = (f'case "$SLURMD_NODENAME" in {cases} *) echo "no HyCache mount for node $SLURMD_NODENAME" >&2; '
                "exit 2 ;; esac\n")
    # a parent's output reaches this node's view of the namespace a moment after the parent
    # ended (its agent publishes it asynchronously): wait for each input, at most 30 s
    body += ('set -e\nneed() { for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done; '
             'echo "no $1 after 30 s" >&2; return 1; }\n')
    for f in job.inputs:
        body += f'need "$M"{shlex.quote(layout.path(f))}; cat "$M"{shlex.quote(layout.path(f))} > /dev/null\n'
    if layout.compute_scale > 0 and job.runtime:
        body += f"sleep {job.runtime * layout.compute_scale:.3f}\n"
    for f, n in job.outputs.items():
        p = shlex.quote(layout.path(f))
        body += f'yes {p} | head -c {layout.size(n)} > "$M"{p}\n'
    return head + body + 'echo "ran on $SLURMD_NODENAME"\n'


def submit_workflow(wf: Workflow, layout: Layout, mode: str, sbatch: list[str],
                    log_dir: str | None, manifest_id: int | None = None) -> dict[str, int]:
    """Submit every job of ``wf`` (topological order): task id -> Slurm job id."""
    ids: dict[str, int] = {}
    for job in wf.jobs:
        argv = [*sbatch, "--parsable", "-J", job.id]
        if job.parents:
            argv.append("--dependency=afterok:" + ":".join(str(ids[p]) for p in job.parents))
        r = subprocess.run(argv, input=script(job, layout, mode, log_dir, manifest_id), capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch of task {job.id} exited {r.returncode}: {r.stderr.strip()[:500]}")
        ids[job.id] = int(r.stdout.strip().split(";")[0])
    return ids


def main(args: argparse.Namespace) -> int:
    try:
        wf = load_workflow(args.instance)
    except (OSError, WorkflowError) as e:
        print(f"hycache-control: error: {e}", file=sys.stderr)
        return 2
    if args.mount:
        mounts = {}
        for m in args.mount:
            node, sep, mp = m.partition("=")
            if not sep or not node or not mp:
                print(f"hycache-control: error: --mount {m!r}: expected NODE=DIR", file=sys.stderr)
                return 2
            mounts[node] = mp
    else:
        mounts = {"": args.mountpoint}
    layout = Layout(prefix=args.prefix, mounts=mounts, scale=args.scale, compute_scale=args.compute_scale)
    if args.api and not args.token_file:
        print("hycache-control: error: --api needs --token-file", file=sys.stderr)
        return 2
    nodes = args.nodes.split(",") if args.nodes else ([n for n in mounts if n] or None)
    try:
        mid = None
        if args.api and args.mode != "slurm":
            mid = register(wf, layout, args.api, Path(args.token_file).read_text().strip(), nodes,
                           solver=args.solver, slack=args.slack)
        ids = submit_workflow(wf, layout, args.mode, shlex.split(args.sbatch), args.log_dir, mid)
    except (OSError, RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as e:
        print(f"hycache-control: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"manifest_id": mid, "jobs": ids}))
    else:
        for task, jid in ids.items():
            print(f"{task} {jid}")
    return 0

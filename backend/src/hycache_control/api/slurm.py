"""/api/v1/slurm: what Slurm's job_submit.lua and burst_buffer.lua ask (docs/slurm.md).
Plain ``def`` routes (the thread pool); the services do the work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from .. import schemas as S
from .deps import Admin, ControlDep, Reader
from .routes import ERRORS_404, ERRORS_409, Responses

router = APIRouter(prefix="/api/v1/slurm", tags=["slurm"])

UNAVAILABLE: Responses = {503: {"model": S.ErrorOut, "description": "the DHT (Redis Cluster) is unreachable"}}
SlurmJobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="Slurm's job id")]


@router.post("/placements", response_model=S.SlurmPlacementOut, responses={**ERRORS_404, **UNAVAILABLE},
             operation_id="slurmChooseNode")
def choose_node(control: ControlDep, _: Reader, body: S.SlurmPlacementRequest) -> dict:
    """The node a job should run on (job_submit.lua sets it as the job's node list): a
    manifest's job on its node in the manifest's placement; a job that names its inputs
    where they are (the online placement of `POST /placements`)."""
    return control.slurm.choose(manifest_id=body.manifest_id, job=body.job, inputs=body.inputs, nodes=body.nodes)


@router.post("/jobs/{slurm_job_id}/stage-in", response_model=S.SlurmJobOut, responses={**ERRORS_409, **UNAVAILABLE},
             operation_id="slurmStageIn")
def stage_in(control: ControlDep, c: Admin, slurm_job_id: SlurmJobId, body: S.SlurmStageIn) -> dict:
    """Record the job and send the prefetches of its inputs to its node; `staging` says
    how far they are (the hook polls `GET /slurm/jobs/{id}` until `staged` or `failed`)."""
    return control.slurm.stage_in(slurm_job_id, node=body.node, manifest_id=body.manifest_id, job=body.job,
                                  inputs=body.inputs, outputs=body.outputs, stage=body.stage,
                                  actor=c.name)


@router.post("/jobs/{slurm_job_id}/pre-run", response_model=S.SlurmJobOut, responses={**ERRORS_404, **UNAVAILABLE},
             operation_id="slurmPreRun")
def pre_run(control: ControlDep, c: Admin, slurm_job_id: SlurmJobId, body: S.SlurmPreRun) -> dict:
    """The job starts on `node`: recorded as where it ran, staged again there if it was
    staged elsewhere, its inputs pinned while it runs."""
    return control.slurm.pre_run(slurm_job_id, body.node, c.name)


@router.post("/jobs/{slurm_job_id}/post-run", response_model=S.SlurmJobOut, responses={**ERRORS_404, **UNAVAILABLE},
             operation_id="slurmPostRun")
def post_run(control: ControlDep, c: Admin, slurm_job_id: SlurmJobId, body: S.SlurmPostRun) -> dict:
    """The job ended: its inputs unpinned, its outputs published."""
    return control.slurm.post_run(slurm_job_id, body.exit_code, c.name)


@router.post("/jobs/{slurm_job_id}/teardown", response_model=S.SlurmJobOut, responses=ERRORS_404,
             operation_id="slurmTeardown")
def teardown(control: ControlDep, c: Admin, slurm_job_id: SlurmJobId, body: S.SlurmTeardown) -> dict:
    return control.slurm.teardown(slurm_job_id, body.hurry, c.name)


@router.get("/jobs/{slurm_job_id}", response_model=S.SlurmJobOut, responses=ERRORS_404,
            operation_id="slurmGetJob")
def get_job(control: ControlDep, _: Reader, slurm_job_id: SlurmJobId) -> dict:
    return control.slurm.get(slurm_job_id)


@router.get("/status", response_model=S.SlurmStatus, responses=ERRORS_404, operation_id="slurmStatus")
def status(control: ControlDep, _: Reader,
           job: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="one Slurm job")] = None) -> dict:
    """`scontrol show bbstat [JOBID]`: the latest 50 jobs (or one), as text and JSON."""
    return control.slurm.status(job)



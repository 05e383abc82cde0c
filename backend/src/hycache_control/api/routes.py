"""The /api/v1 routes.  Plain ``def`` routes: FastAPI runs them in its thread pool, so their
database and Redis calls never block the event loop."""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Body, Header, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from .. import schemas as S
from ..jsonfast import dumps
from ..services.paths import check_path
from .deps import Admin, CallerDep, ControlDep, PagingDep, PathDep, Reader, auth_error

router = APIRouter(prefix="/api/v1")

NodeId = Annotated[str, Path(pattern=S.NODE_ID_PATTERN, description="node id")]
# FastAPI's `responses`: status code -> OpenAPI response fields
Responses = dict[int | str, dict[str, Any]]
ERRORS: Responses = {400: {"model": S.ErrorOut, "description": "the body is not JSON"},
                     401: {"model": S.ErrorOut, "description": "no, unknown or revoked token"},
                     403: {"model": S.ErrorOut, "description": "the token's scope does not allow this"},
                     413: {"model": S.ErrorOut, "description": "the request body is larger than the bound"},
                     422: {"model": S.ErrorOut, "description": "invalid input (detail names the field)"}}
ERRORS_404: Responses = {**ERRORS, 404: {"model": S.ErrorOut, "description": "not found"}}
NOT_MODIFIED: Responses = {304: {"description": "not modified (If-None-Match matched the ETag)"}}


def _etag_response(body: dict, if_none_match: str | None) -> Response:
    """``body`` as JSON with an ETag of its bytes (views are built in a fixed key order, so
    equal content gives equal bytes)."""
    raw = dumps(body)
    etag = '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'
    if if_none_match and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(raw, media_type="application/json", headers={"ETag": etag})


def _not_found(loc: list, msg: str) -> HTTPException:
    return HTTPException(404, [{"loc": loc, "msg": msg, "type": "not_found"}])


# -- whoami / tokens ------------------------------------------------------------------------

@router.get("/whoami", response_model=S.WhoAmI, responses=ERRORS, operation_id="whoami", tags=["tokens"])
def whoami(c: CallerDep) -> S.WhoAmI:
    # the token table holds only the scopes create() admits; pydantic checks it again
    return S.WhoAmI(name=c.name, scope=cast(S.Scope, c.scope), node_id=c.node_id)


@router.get("/tokens", response_model=S.Page[S.TokenOut], responses=ERRORS, operation_id="listTokens", tags=["tokens"])
def list_tokens(control: ControlDep, _: Admin, page: PagingDep):
    rows, total = control.tokens.list(page.limit, page.offset)
    return {"items": [S.TokenOut.model_validate(r, from_attributes=True) for r in rows], "total": total,
            "limit": page.limit, "offset": page.offset}


@router.post("/tokens", response_model=S.TokenCreated, status_code=201, responses=ERRORS,
             operation_id="createToken", tags=["tokens"])
def create_token(control: ControlDep, _: Admin, body: S.TokenCreate):
    row, secret = control.tokens.create(body.name, body.scope, body.node_id)
    return {**S.TokenOut.model_validate(row, from_attributes=True).model_dump(), "token": secret}


@router.delete("/tokens/{token_id}", response_model=S.TokenOut,
               responses={**ERRORS_404, 409: {"model": S.ErrorOut, "description": "the last active admin token"}},
               operation_id="revokeToken", tags=["tokens"])
def revoke_token(control: ControlDep, _: Admin, token_id: Annotated[int, Path(ge=1, le=2**31 - 1)]):
    return S.TokenOut.model_validate(control.tokens.revoke(token_id), from_attributes=True)


# -- nodes ----------------------------------------------------------------------------------

@router.get("/nodes", response_model=S.NodePage, responses={**ERRORS, **NOT_MODIFIED}, operation_id="listNodes",
            tags=["nodes"])
def list_nodes(control: ControlDep, _: Reader, page: PagingDep,
               state: Annotated[S.NodeState | None, Query(description="only nodes in this state")] = None,
               q: Annotated[str | None, Query(max_length=200, description="only nodes whose id contains this "
                                                                            "(case-insensitive)")] = None,
               sort: Annotated[S.NodeSort, Query(description="sort key (then by id)")] = "id",
               desc: Annotated[bool, Query(description="descending")] = False,
               if_none_match: Annotated[str | None, Header()] = None):
    items, total = control.node_page(state, page.offset, page.limit, sort=sort, desc=desc, q=q)
    body = {"items": items, "total": total, "limit": page.limit, "offset": page.offset}
    return _etag_response(body, if_none_match)  # the views conform to NodeOut as built (views.py)


@router.get("/summary", response_model=S.NodeSummary, responses=ERRORS, operation_id="getNodeSummary",
            tags=["nodes"])
def node_summary(control: ControlDep, _: Reader):
    return control.summary()


@router.get("/summary/history", response_model=S.SummaryHistory, responses=ERRORS, operation_id="getSummaryHistory",
            tags=["nodes"])
def summary_history(control: ControlDep, _: Reader,
                    seconds: Annotated[float, Query(gt=0, le=3600, description="the last this many seconds")] = 600):
    """The cluster's capacity, use and throughput over time: a point every 2 s, each
    summed by the server over every node (the overview's charts), the last hour kept."""
    return control.summary_history(seconds)


@router.get("/nodes/{node_id}", response_model=S.NodeOut, responses={**ERRORS_404, **NOT_MODIFIED},
            operation_id="getNode", tags=["nodes"])
def get_node(control: ControlDep, _: Reader, node_id: NodeId,
             if_none_match: Annotated[str | None, Header()] = None):
    v = control.node_view(node_id)
    if v is None:
        raise _not_found(["path", "node_id"], f"no node {node_id}")
    return _etag_response(v, if_none_match)


def _time(value: str | None, loc: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        pass
    from datetime import datetime
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise RequestValidationError([{"loc": ("query", loc), "msg": "unix seconds or ISO 8601 expected",
                                       "type": "value_error", "input": value[:100]}]) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@router.get("/nodes/{node_id}/metrics", response_model=S.MetricsOut, responses=ERRORS_404,
            operation_id="getNodeMetrics", tags=["nodes"])
def node_metrics(control: ControlDep, _: Reader, node_id: NodeId,
                 since: Annotated[str | None, Query(max_length=64, description="unix seconds or ISO 8601 (default: 5 min ago)")] = None,
                 until: Annotated[str | None, Query(max_length=64, description="unix seconds or ISO 8601 (default: now)")] = None,
                 step: Annotated[float, Query(ge=1, le=86400, description="seconds per sample")] = 1.0):
    if not control.nodes.known(node_id):
        raise _not_found(["path", "node_id"], f"no node {node_id}")
    now = time.time()
    u = _time(until, "until", now)
    s = _time(since, "since", u - 300)
    resolution, samples = control.metrics.query(node_id, s, u, step, now=now)
    return {"node_id": node_id, "step": step, "since": s, "until": u, "resolution": resolution, "samples": samples}


@router.get("/nodes/{node_id}/policy", response_model=S.PolicyOut, responses=ERRORS_404, operation_id="getPolicy",
            tags=["policies"])
def get_policy(control: ControlDep, _: Reader, node_id: NodeId):
    n = control.nodes.get(node_id)
    if n is None:
        raise _not_found(["path", "node_id"], f"no node {node_id}")
    return control.policies.get(node_id, n.status)


@router.put("/nodes/{node_id}/policy", response_model=S.PolicyOut, responses=ERRORS_404, operation_id="putPolicy",
            tags=["policies"])
def put_policy(control: ControlDep, c: Admin, node_id: NodeId, body: S.PolicyIn):
    if not control.nodes.known(node_id):
        raise _not_found(["path", "node_id"], f"no node {node_id}")
    out = control.policies.put(node_id, body.policy, body.high_watermark, body.low_watermark, c.name)
    control.nodes.mark_changed(node_id)  # the stream's next delta carries the node's new policy
    return out


async def heartbeat(control: ControlDep, c: CallerDep, node_id: NodeId, body: S.Heartbeat):
    """(async: a heartbeat that needs no database — the common case — is handled on the
    event loop from memory; one that does goes to a worker thread)"""
    if c.scope != "node" or c.node_id != node_id:
        raise auth_error(403, f"this token may not report for node {node_id} "
                              "(needs the node token of that node)", "forbidden")
    if body.node_id != node_id:
        raise RequestValidationError([{"loc": ("body", "node_id"), "msg": "must equal the node id of the URL",
                                       "type": "value_error", "input": body.node_id}])
    if control.heartbeat_in_memory(body):
        return control.heartbeat(body, db=False)
    return await run_in_threadpool(control.heartbeat, body)


class HeartbeatRoute(APIRoute):
    """The heartbeat route, lean: the common heartbeat (a JSON body, a node token the
    in-memory table knows, for its own node) skips FastAPI's dependency solving and its
    response validation — a third of the event loop's time per heartbeat at 1,000/s
    (docs/scaling.md) — and anything else (no or unknown token, another node's token, a
    body that does not validate, gzip already undone by BodyLimit included) falls back to
    FastAPI's handler of the same route, so the errors (401/403/422 bodies) and the
    published OpenAPI (the route is declared as before) stay exactly the same."""

    def get_route_handler(self):
        full = super().get_route_handler()

        async def handler(request: Request) -> Response:
            answer = await _heartbeat_lean(request)
            return answer if answer is not None else await full(request)

        return handler


_NODE_ID = re.compile(S.NODE_ID_PATTERN)
_ANSWER = S.HeartbeatAnswer.__pydantic_validator__
_ANSWER_JSON = S.HeartbeatAnswer.__pydantic_serializer__


async def _heartbeat_lean(request: Request) -> Response | None:
    """The answer to a heartbeat on the common path, or None: FastAPI's handler decides."""
    headers = request.headers
    ct = headers.get("content-type", "")
    if not (ct == "application/json" or ct.startswith("application/json;")):
        return None
    scheme, _, secret = headers.get("authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        return None
    control = request.app.state.control
    c = control.tokens.cached(secret)
    node_id = request.path_params.get("node_id", "")
    if not c or c.scope != "node" or c.node_id != node_id or not _NODE_ID.match(node_id):
        return None
    try:  # one validation of the body's bytes (FastAPI: json.loads, then validation of the dict)
        hb = S.Heartbeat.model_validate_json(await request.body())
    except ValidationError:
        return None
    if hb.node_id != node_id:
        return None
    request.state.actor = c.name
    if control.heartbeat_in_memory(hb):
        answer = control.heartbeat(hb, db=False)
    else:
        answer = await run_in_threadpool(control.heartbeat, hb)
    # validated and dumped by the response model, as FastAPI's handler would (pydantic-core:
    # a few microseconds for an answer without actions)
    return Response(_ANSWER_JSON.to_json(_ANSWER.validate_python(answer)), media_type="application/json")


router.add_api_route("/nodes/{node_id}/heartbeats", heartbeat, methods=["POST"], response_model=S.HeartbeatAnswer,
                     responses=ERRORS, operation_id="postHeartbeat", tags=["agents"],
                     route_class_override=HeartbeatRoute)


# -- files ----------------------------------------------------------------------------------

@router.get("/files", response_model=S.FileListing, responses={**ERRORS_404, 503: {"model": S.ErrorOut}},
            operation_id="listFiles", tags=["files"])
def list_files(control: ControlDep, _: Reader, path: PathDep,
               cursor: Annotated[str | None, Query(max_length=8192, description="next_cursor of the previous page")] = None,
               limit: Annotated[int, Query(ge=1, le=5000)] = 500,
               prefix: Annotated[str | None, Query(max_length=255, description="only names that start with this")] = None):
    """One page of a directory, never read whole (a page may be short and still have a
    next_cursor: keep following it until it is null)."""
    items, nxt = control.namespace.list(path, cursor, limit, prefix)
    return {"path": path, "items": items, "next_cursor": nxt}


@router.get("/files/info", response_model=S.FileEntry, responses={**ERRORS_404, 503: {"model": S.ErrorOut}},
            operation_id="getFileInfo", tags=["files"])
def file_info(control: ControlDep, _: Reader, path: PathDep):
    return control.namespace.info(path)


@router.post("/files/actions", response_model=S.ActionOut, status_code=202,
             responses={**ERRORS, 503: {"model": S.ErrorOut}}, operation_id="createAction", tags=["actions"])
def create_action(control: ControlDep, c: Admin, body: Annotated[S.ActionRequest, Body()]):
    errors, paths = [], []
    for i, p in enumerate(body.paths):
        try:
            paths.append(check_path(p))
        except ValueError as e:
            errors.append({"loc": ("body", "paths", i), "msg": str(e), "type": "value_error", "input": p[:200]})
    if errors:
        raise RequestValidationError(errors)
    return control.actions.create(body.action, paths, c.name)


@router.get("/actions", response_model=S.ActionPage, responses=ERRORS, operation_id="listActions", tags=["actions"])
def list_actions(control: ControlDep, _: Reader, page: PagingDep):
    items, total = control.actions.list(page.limit, page.offset)
    return {"items": items, "total": total, "limit": page.limit, "offset": page.offset}


@router.get("/actions/{action_id}", response_model=S.ActionOut, responses=ERRORS_404, operation_id="getAction",
            tags=["actions"])
def get_action(control: ControlDep, _: Reader, action_id: Annotated[int, Path(ge=1, le=2**31 - 1)]):
    return control.actions.get(action_id)


# -- events ---------------------------------------------------------------------------------

@router.get("/events", response_model=S.EventPage, responses=ERRORS, operation_id="listEvents", tags=["events"])
def list_events(control: ControlDep, _: Reader, page: PagingDep,
                kind: Annotated[S.EventKind | None, Query()] = None,
                node: Annotated[str | None, Query(max_length=200)] = None,
                since_id: Annotated[int | None, Query(ge=0, le=2**62, description="only events after this id, oldest first")] = None):
    rows, total = control.events.list(kind, node, since_id, page.limit, page.offset)
    return {"items": [S.EventOut.model_validate(r, from_attributes=True) for r in rows], "total": total,
            "limit": page.limit, "offset": page.offset}


# -- manifests (2-Layer Scheduling) -----------------------------------------------------------

ManifestId = Annotated[int, Path(ge=1, le=2**31 - 1)]
JobId = Annotated[str, Path(min_length=1, max_length=200)]
ERRORS_409 = {**ERRORS_404, 409: {"model": S.ErrorOut, "description": "not in a state that allows this"}}


@router.post("/manifests", status_code=201, responses=ERRORS,
             operation_id="createManifest", tags=["manifests"])
def create_manifest(control: ControlDep, c: Admin,
                    body: Annotated[Any, Body(description="a HyCache manifest or a WfFormat 1.4/1.5 instance")],
                    nodes: Annotated[str | None, Query(max_length=10_000, description="comma-separated node ids (default: the live nodes)")] = None,
                    solver: Annotated[Literal["greedy", "local", "hypergraph", "exact", "round-robin"], Query()] = "local",
                    slack: Annotated[float, Query(ge=0, le=100)] = 0.1,
                    plans: Annotated[bool, Query(description="make and carry out layer-2 plans (false: placement only)")] = True,
                    prefetch_first: Annotated[bool, Query(description="plan prefetches for each node's first job too "
                                                          "(default false: it reads the files of its own node's slow "
                                                          "tier where they are, since its steps would be released "
                                                          "the moment it starts)")] = False,
                    release: Annotated[Literal["reads", "start"], Query(description=(
                        "when a job's prefetch/evict steps are released to its node: once the job before it "
                        "on the node has read its inputs (`reads`: its `…/reads-done` event, or its finish), "
                        "or once that job has started (`start`: for a runner that never reports reads done)"))]
                    = "reads") -> dict:
    names = None
    if nodes is not None:
        names = [n.strip() for n in nodes.split(",") if n.strip()]
        if not names or len(set(names)) != len(names):
            raise RequestValidationError([{"loc": ("query", "nodes"), "msg": "a comma-separated list of distinct node ids",
                                           "type": "value_error", "input": nodes[:200]}])
    return control.manifests.create(body, nodes=names, solver=solver, slack=slack, plans=plans, actor=c.name,
                                    prefetch_first=prefetch_first, release=release)


@router.post("/placements", responses=ERRORS, operation_id="placeJob", tags=["manifests"],
             response_model=S.PlacementOut)
def place_job(control: ControlDep, _: Reader, body: S.PlacementRequest) -> dict:
    """Online placement: this job reads these files, where should it run now?  The node
    whose copies of the inputs (their primaries in the DHT) save the most bytes, among
    the nodes whose fast tier can hold the job."""
    return control.manifests.place_job(body.inputs, footprint=body.footprint, nodes=body.nodes)


@router.get("/manifests", responses=ERRORS, operation_id="listManifests", tags=["manifests"])
def list_manifests(control: ControlDep, _: Reader, page: PagingDep) -> dict:
    items, total = control.manifests.list(page.limit, page.offset)
    return {"items": items, "total": total, "limit": page.limit, "offset": page.offset}


@router.get("/manifests/{manifest_id}", responses=ERRORS_404, operation_id="getManifest", tags=["manifests"])
def get_manifest(control: ControlDep, _: Reader, manifest_id: ManifestId) -> dict:
    return control.manifests.get(manifest_id)


@router.delete("/manifests/{manifest_id}", responses=ERRORS_404, operation_id="cancelManifest", tags=["manifests"])
def cancel_manifest(control: ControlDep, c: Admin, manifest_id: ManifestId) -> dict:
    return control.manifests.cancel(manifest_id, c.name)


def _job_event(control, c, manifest_id: int, job: str, what: str) -> dict:
    if c.scope == "node":
        if c.node_id != control.jobs.job_node(manifest_id, job):
            raise auth_error(403, f"a node token may only report jobs placed on its node ({c.node_id})", "forbidden")
    elif c.scope != "admin":
        raise auth_error(403, f"a {c.scope} token may not report jobs (needs admin or the job's node token)",
                         "forbidden")
    return control.jobs.job_event(manifest_id, job, what, c.name)


@router.get("/manifests/{manifest_id}/jobs/{job}", responses=ERRORS_404, operation_id="getManifestJob",
            tags=["manifests"])
def get_manifest_job(control: ControlDep, _: Reader, manifest_id: ManifestId, job: JobId) -> dict:
    """One job of a manifest and its prefetch/evict steps' states (`steps`, as in the
    start's answer): what a runner polls while a prefetch is under way."""
    return control.jobs.job(manifest_id, job)


@router.post("/manifests/{manifest_id}/jobs/{job}/start", responses=ERRORS_409, operation_id="startJob",
             tags=["manifests"])
def start_job(control: ControlDep, c: CallerDep, manifest_id: ManifestId, job: JobId) -> dict:
    return _job_event(control, c, manifest_id, job, "start")


@router.post("/manifests/{manifest_id}/jobs/{job}/reads-done", responses=ERRORS_409, operation_id="jobReadsDone",
             tags=["manifests"])
def job_reads_done(control: ControlDep, c: CallerDep, manifest_id: ManifestId, job: JobId) -> dict:
    """The job has read its inputs (it computes and writes from now on): the next job's
    prefetch/evict steps on its node are released now, so they overlap this job's compute
    instead of its reads.  Idempotent; 409 before the job's start."""
    return _job_event(control, c, manifest_id, job, "reads-done")


@router.post("/manifests/{manifest_id}/jobs/{job}/finish", responses=ERRORS_409, operation_id="finishJob",
             tags=["manifests"])
def finish_job(control: ControlDep, c: CallerDep, manifest_id: ManifestId, job: JobId) -> dict:
    return _job_event(control, c, manifest_id, job, "finish")

"""GET /api/v1/nodes/{node_id}/plan: the push channel of plan steps and actions to an agent.

A long-poll beside the heartbeat (docs/control-plane.md, "The push channel"): the agent
asks with the ``version`` of its previous answer; the request waits (up to ``wait``
seconds) until something may have become deliverable to the node — a manifest submitted,
a job started or finished, an action created, here or in another control-plane process
(the bus's ``w`` notification) — and answers the node's deliverable items, the same ones
(and the same shapes) the heartbeat answer carries.  Items are re-sent until the node
reports their result, so the agent applies each id once."""

from __future__ import annotations

import asyncio
from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Query
from starlette.concurrency import run_in_threadpool

from .. import schemas as S
from .deps import CallerDep, ControlDep, auth_error
from .routes import ERRORS

router = APIRouter(prefix="/api/v1")

MAX_WAIT = 60.0


@router.get("/nodes/{node_id}/plan", response_model=S.PlanPush, responses=ERRORS, operation_id="pollPlan",
            tags=["agents"])
async def poll_plan(control: ControlDep, c: CallerDep,
                    node_id: Annotated[str, Path(pattern=S.NODE_ID_PATTERN, description="node id")],
                    wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description="seconds to wait for new work")] = 30.0,
                    after: Annotated[str | None, Query(max_length=64,
                                                       description="the version of the previous answer")] = None):
    """(async: the wait holds no thread; the delivery query runs in a worker thread)"""
    if c.scope != "node" or c.node_id != node_id:
        raise auth_error(403, f"this token may not take the plan of node {node_id} "
                              "(needs the node token of that node)", "forbidden")
    actions = control.actions
    if after is not None and wait > 0:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        if actions.watch(node_id, after, wake):
            try:
                with anyio.move_on_after(wait):
                    await woken.wait()
            finally:
                actions.unwatch(node_id, wake)
    version = actions.push_version(node_id)  # before delivering: a wake during it answers the next poll at once
    items = await run_in_threadpool(actions.deliver, node_id) if actions.has_work(node_id) else []
    return {"version": version, "actions": items}

"""GET /api/v1/stream: Server-Sent Events (sse-starlette).  ``summary`` (GET /summary) every
second; ``nodes`` (every node's view) when the client connects, then ``nodes-delta`` every
second with what changed (nodefeed.py: per changed node its id and changed fields, the ids
removed), a ``nodes`` snapshot again when the client fell behind the deltas kept;
``event`` as they happen (``id:`` = event id; ``Last-Event-ID`` replays what was missed),
``action`` when an action item changes."""

from __future__ import annotations

import json
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from .. import schemas as S
from .deps import ControlDep, Reader
from .routes import ERRORS

router = APIRouter(prefix="/api/v1")

NODES_PERIOD = 1.0
POLL = 0.2


def _event_json(e) -> str:
    return S.EventOut.model_validate(e, from_attributes=True).model_dump_json()


@router.get("/stream", responses={**ERRORS, 200: {"content": {"text/event-stream": {}},
                                                   "description": "Server-Sent Events: summary, nodes, nodes-delta, event, action"}},
            response_class=EventSourceResponse, operation_id="stream", tags=["stream"])
async def stream(request: Request, control: ControlDep, _: Reader,
                 last_event_id: Annotated[str | None, Header(max_length=32)] = None,
                 access_token: Annotated[str | None, Query(max_length=200, description="the token, for EventSource")] = None):
    try:
        last = int(last_event_id) if last_event_id else control.events.last_id
    except ValueError:
        last = control.events.last_id
    last_update = control.actions.last_update

    async def gen():
        nonlocal last, last_update
        next_nodes = 0.0
        seq = None  # the node feed's sequence number this client has
        while True:
            if control.events.last_id > last:
                for e in await run_in_threadpool(control.events.after, last):
                    last = e.id
                    yield {"event": "event", "id": str(e.id), "data": _event_json(e)}
            if control.actions.last_update > last_update:
                for seq, item in control.actions.updates_after(last_update):
                    last_update = seq
                    yield {"event": "action", "data": json.dumps(item)}
            now = time.monotonic()
            if now >= next_nodes:
                next_nodes = now + NODES_PERIOD
                yield await run_in_threadpool(control.summary_sse, NODES_PERIOD * 0.9)
                deltas = None if seq is None else await run_in_threadpool(control.feed.after, seq, NODES_PERIOD * 0.9)
                if deltas is None:  # connected, or fell behind: every node (encoded once for all)
                    seq, snapshot = await run_in_threadpool(control.feed.snapshot, NODES_PERIOD * 0.9)
                    yield snapshot
                else:
                    seq, msgs = deltas
                    for m in msgs:
                        yield m
            await anyio.sleep(POLL)

    return EventSourceResponse(gen(), ping=15, send_timeout=30)

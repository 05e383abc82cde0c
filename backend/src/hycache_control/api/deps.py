"""Dependencies: the Control object, the caller's token and its scope, paging, paths."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ..control import Control
from ..services.paths import MAX_PATH, check_path
from ..services.tokens import Caller

AUTH_LOC = ["header", "Authorization"]


async def get_control(request: Request) -> Control:  # no I/O: no thread-pool hop
    return request.app.state.control


ControlDep = Annotated[Control, Depends(get_control)]


def auth_error(status: int, msg: str, type_: str) -> HTTPException:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return HTTPException(status, [{"loc": AUTH_LOC, "msg": msg, "type": type_}], headers=headers)


def _secret(request: Request) -> str | None:
    h = request.headers.get("authorization")
    if h:
        scheme, _, value = h.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return request.query_params.get("access_token") if request.url.path.endswith("/stream") else None


#: declares the bearer scheme in the OpenAPI document (the check itself is ``caller``)
bearer = HTTPBearer(auto_error=False, description="an API token (hycache-control token create)")


async def caller(request: Request, control: ControlDep,
                 _doc: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> Caller:
    """(async: the token table answers without I/O; only a secret it does not know costs a
    query, in a worker thread)"""
    secret = _secret(request)
    if secret is None:
        raise auth_error(401, "missing bearer token (Authorization: Bearer <token>)", "missing_token")
    known = control.tokens.cached(secret)
    c = await run_in_threadpool(control.tokens.authenticate, secret) if known is False else known
    if c is None:
        raise auth_error(401, "unknown or revoked token", "invalid_token")
    request.state.actor = c.name
    return c


CallerDep = Annotated[Caller, Depends(caller)]


async def reader(c: CallerDep) -> Caller:  # async: no I/O, no thread-pool hop
    if c.scope not in ("read", "admin"):
        raise auth_error(403, f"a {c.scope} token may not read this (needs read or admin)", "forbidden")
    return c


async def admin(c: CallerDep) -> Caller:
    if c.scope != "admin":
        raise auth_error(403, f"a {c.scope} token may not change anything (needs admin)", "forbidden")
    return c


Reader = Annotated[Caller, Depends(reader)]
Admin = Annotated[Caller, Depends(admin)]


class Paging:
    def __init__(self, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> None:
        self.limit = limit
        self.offset = offset


PagingDep = Annotated[Paging, Depends()]


def query_path(path: Annotated[str, Query(max_length=MAX_PATH, description="absolute path in the namespace")] = "/") -> str:
    try:
        return check_path(path)
    except ValueError as e:
        raise RequestValidationError([{"loc": ("query", "path"), "msg": str(e), "type": "value_error",
                                       "input": path[:200]}]) from None


PathDep = Annotated[str, Depends(query_path)]

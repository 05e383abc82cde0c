"""The API's error answers: a service's error and a request that fails validation, each
as ``{"detail": [...]}`` (docs/control-plane.md), whatever input the error echoes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..services.errors import ServiceError


class ErrorResponse(JSONResponse):
    """A JSON answer that holds any string: one no UTF-8 encodes (a lone UTF-16 surrogate
    echoed from the input) is written as its JSON escape, ``\\ud800``."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def install(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return ErrorResponse({"detail": exc.detail()}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return ErrorResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)

"""Errors the services raise; the API turns them into ``{"detail": [{loc, msg, type}]}``."""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    type = "invalid"

    def __init__(self, loc: tuple[str | int, ...], msg: str, type_: str | None = None) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg
        if type_:
            self.type = type_

    def detail(self) -> list[dict]:
        return [{"loc": list(self.loc), "msg": self.msg, "type": self.type}]


class NotFound(ServiceError):
    status = 404
    type = "not_found"


class Invalid(ServiceError):
    status = 422
    type = "value_error"


class Conflict(ServiceError):
    status = 409
    type = "conflict"


class Unavailable(ServiceError):
    status = 503
    type = "unavailable"

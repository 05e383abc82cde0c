"""The project's manifest format: what each job of a workflow reads and writes, in order.

A manifest is what workflow users submit to the control plane (2LS plans with it) and
what the simulator replays.  JSON example::

    {
      "version": 1,
      "name": "montage-small",
      "jobs": [
        {"name": "project-1", "accesses": [
            {"path": "raw/1.fits", "size": "64M"},
            {"path": "proj/1.fits", "size": 67108864, "op": "W"}]},
        {"name": "add", "accesses": [{"path": "proj/1.fits", "size": "64M"}]}
      ],
      "pinned": []
    }

Jobs run in the order given and each job's accesses are in program order, so the
manifest's reference string is the concatenation of the jobs' accesses.  ``size`` is
the file's size in bytes at that access (for a write: the size written) and accepts
human sizes (``"64M"``, binary units).  ``op`` is ``R`` (default) or ``W``.

Validation errors name the field: :func:`load_manifest` and :func:`parse_manifest`
raise :class:`ManifestError` whose lines read ``jobs[0].accesses[3].size: ...``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from .sizes import parse_size


def _size(value: Any) -> Any:
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _op(value: Any) -> Any:
    if isinstance(value, str):
        v = value.strip().upper()
        return {"READ": "R", "WRITE": "W"}.get(v, v)
    return value


Size = Annotated[int, BeforeValidator(_size), Field(ge=0, description="bytes (or a human size such as \"64M\")")]


class FileAccess(BaseModel):
    """One whole-file read or write."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="file path, relative to the mount")
    size: Size
    op: Annotated[Literal["R", "W"], BeforeValidator(_op)] = "R"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    accesses: list[FileAccess] = Field(description="in program order")
    node: str | None = Field(default=None, description="placement, if already decided")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    name: str | None = None
    jobs: list[Job]
    pinned: list[str] = Field(default_factory=list, description="paths never evicted from the fast tier")

    @field_validator("jobs")
    @classmethod
    def _unique_job_names(cls, jobs: list[Job]) -> list[Job]:
        seen: set[str] = set()
        for job in jobs:
            if job.name in seen:
                raise ValueError(f"duplicate job name {job.name!r}")
            seen.add(job.name)
        return jobs

    def references(self) -> Iterator[tuple[str, FileAccess]]:
        """``(job name, access)`` in execution order: the manifest's reference string."""
        for job in self.jobs:
            for access in job.accesses:
                yield job.name, access


class ManifestError(ValueError):
    """A manifest failed validation; ``errors`` lists ``(field path, message)``."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = "\n".join(f"  {loc}: {msg}" for loc, msg in errors)
        super().__init__(f"{source}: invalid manifest\n{lines}")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def parse_manifest(data: Any, source: str = "manifest") -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            msg = err["msg"]
            if err["type"] == "value_error":  # drop pydantic's "Value error, " prefix
                msg = msg.removeprefix("Value error, ")
            errors.append((_loc(err["loc"]), msg))
        raise ManifestError(source, errors) from None


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a JSON manifest file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ManifestError(str(p), [(f"line {exc.lineno} column {exc.colno}", exc.msg)]) from None
    return parse_manifest(data, str(p))

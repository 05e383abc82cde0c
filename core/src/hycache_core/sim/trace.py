"""Reference strings for the simulator: from a CSV trace, a manifest or a generator.

A :class:`Trace` is columnar (one list per field) with file names interned to small
integers, so a million references cost a few tens of MB and replay fast.

CSV traces: a header row; columns ``file`` and ``size`` (bytes) are required,
``time``, ``op`` (``R`` or ``W``, default ``R``) and ``job`` are optional, any other
column is ignored; rows are in access order.  Malformed input raises
:class:`TraceError` naming the line and the field.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..manifest import Manifest
from ..sizes import parse_size

REQUIRED = ("file", "size")
OPTIONAL = ("time", "op", "job")


class TraceError(ValueError):
    """Malformed trace input; ``line`` is 1-based (the header is line 1)."""

    def __init__(self, source: str, line: int | None, field_name: str | None, message: str) -> None:
        self.source, self.line, self.field = source, line, field_name
        where = source
        if line is not None:
            where += f", line {line}"
        if field_name is not None:
            where += f", field {field_name!r}"
        super().__init__(f"{where}: {message}")


@dataclass
class Trace:
    """References in order.  ``keys[i]`` indexes ``names``; ``writes[i]`` is 1 for W."""

    names: list[str] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    writes: bytearray = field(default_factory=bytearray)
    jobs: list[str] | None = None
    pinned: frozenset[int] = frozenset()
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    def key_of(self, name: str) -> int:
        k = self._index.get(name)
        if k is None:
            k = self._index[name] = len(self.names)
            self.names.append(name)
        return k

    def append(self, name: str, size: int, write: bool = False) -> None:
        self.keys.append(self.key_of(name))
        self.sizes.append(size)
        self.writes.append(1 if write else 0)

    def pin(self, names: Iterable[str]) -> None:
        """Pin files by name (names never referenced are ignored)."""
        self.pinned = self.pinned | {self._index[n] for n in names if n in self._index}

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    @property
    def distinct_files(self) -> int:
        return len(set(self.keys))

    @classmethod
    def from_refs(cls, refs: Iterable[tuple[str, int] | tuple[str, int, bool]]) -> Trace:
        t = cls()
        for ref in refs:
            t.append(ref[0], ref[1], bool(ref[2]) if len(ref) > 2 else False)
        return t

    def write_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["file", "size", "op"] + (["job"] if self.jobs else []))
            names = self.names
            for i, k in enumerate(self.keys):
                row = [names[k], self.sizes[i], "W" if self.writes[i] else "R"]
                if self.jobs:
                    row.append(self.jobs[i])
                w.writerow(row)


def _parse_int_size(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = parse_size(text)  # "64M" etc.; raises ValueError
    if v < 0:
        raise ValueError("negative")
    return v


def read_csv_trace(path: str | Path, *, source: str | None = None) -> Trace:
    """Read a CSV trace (see module docstring)."""
    src = source or str(path)
    try:
        f = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(src, None, None, exc.strerror or str(exc)) from None
    with f:
        return parse_csv_trace(f, source=src)


def _header(reader: Iterator[list[str]], source: str) -> tuple[list[str], dict[str, int]]:
    """The header row and each column's index by its lower-cased name; every column of
    ``REQUIRED`` is there."""
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(source, 1, None, "empty file: expected a header row with 'file' and 'size'") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(source, 1, None, str(exc)) from None
    cols = {name.strip().lower(): i for i, name in enumerate(header)}
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise TraceError(
            source, 1, missing[0],
            f"missing required column(s) {', '.join(repr(m) for m in missing)}; header is {header!r}",
        )
    return header, cols


def _size_text(text: str, source: str, line: int) -> int:
    """A size that is not a plain byte count (``64M``: :func:`parse_size`)."""
    try:
        return _parse_int_size(text.strip())
    except ValueError:
        raise TraceError(source, line, "size", f"{text!r} is not a size in bytes") from None


def _write_flag(op: str, source: str, line: int) -> int:
    """1 for a write (``W``), 0 for a read (``R`` or empty)."""
    norm = op.strip().upper()
    if norm in ("W", "WRITE"):
        return 1
    if norm not in ("", "R", "READ"):
        raise TraceError(source, line, "op", f"{op!r} is not R or W")
    return 0


def _time(t_text: str, last_time: float | None, source: str, line: int) -> float | None:
    """The row's time (``last_time`` when empty); rows must be in access order."""
    if not t_text:
        return last_time
    try:
        t = float(t_text)
    except ValueError:
        raise TraceError(source, line, "time", f"{t_text!r} is not a number") from None
    if t != t:
        raise TraceError(source, line, "time", "NaN")
    if last_time is not None and t < last_time:
        raise TraceError(
            source, line, "time",
            f"{t_text} is earlier than the previous row's {last_time}: rows must be in access order",
        )
    return t


def parse_csv_trace(stream: io.TextIOBase | Iterable[str], *, source: str = "trace") -> Trace:
    reader = csv.reader(stream)
    header, cols = _header(reader, source)
    ci_file, ci_size = cols["file"], cols["size"]
    ci_op, ci_time, ci_job = cols.get("op"), cols.get("time"), cols.get("job")
    width = max(i for i in (ci_file, ci_size, ci_op, ci_time, ci_job) if i is not None) + 1

    trace = Trace()
    if ci_job is not None:
        trace.jobs = []
    keys, sizes, writes = trace.keys, trace.sizes, trace.writes
    index, names = trace._index, trace.names
    last_time = None
    line = 1
    try:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            if len(row) < width:
                if len(row) <= ci_file or len(row) <= ci_size:
                    name = "file" if len(row) <= ci_file else "size"
                    raise TraceError(source, line, name, f"missing (row has {len(row)} fields, header has {len(header)})")
                row = row + [""] * (width - len(row))
            name = row[ci_file]
            if not name:
                raise TraceError(source, line, "file", "empty file name")
            text = row[ci_size]
            try:
                size = int(text)
                if size < 0:
                    raise ValueError
            except ValueError:
                size = _size_text(text, source, line)
            w = 0 if ci_op is None else _write_flag(row[ci_op], source, line)
            if ci_time is not None:
                last_time = _time(row[ci_time].strip(), last_time, source, line)
            if ci_job is not None:
                trace.jobs.append(row[ci_job])  # type: ignore[union-attr]
            k = index.get(name)
            if k is None:
                k = index[name] = len(names)
                names.append(name)
            keys.append(k)
            sizes.append(size)
            writes.append(w)
    except csv.Error as exc:
        raise TraceError(source, reader.line_num, None, f"CSV syntax: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(source, line + 1, None, f"not UTF-8 text: {exc.reason}") from None
    if not keys:
        raise TraceError(source, None, None, "no references after the header")
    return trace


def trace_from_manifest(manifest: Manifest) -> Trace:
    trace = Trace(jobs=[])
    for job, access in manifest.references():
        trace.append(access.path, access.size, access.op == "W")
        trace.jobs.append(job)  # type: ignore[union-attr]
    trace.pin(manifest.pinned)
    return trace

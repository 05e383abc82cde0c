"""Workflows for 2-Layer Scheduling: one normalized model, two input formats.

:func:`parse_workflow` detects the format of a JSON document and returns a
:class:`Workflow`:

* the project's own manifest (:mod:`hycache_core.manifest`, ``{"version": 1, "jobs": …}``):
  job ids are the jobs' ``name``; a job's parents are the earlier jobs that last wrote
  the files it reads (the manifest's job order is its execution order); runtimes are
  unknown (``None``); ``node`` is the recorded machine;
* WfCommons **WfFormat** instances as they are, schema 1.4 (``workflow.tasks[]`` with
  ``files[]`` whose ``link`` is ``input``/``output``, ``runtimeInSeconds``, ``machine``;
  tasks refer to their parents by name, or by ``id``) and 1.5 (and 1.6, the same layout:
  ``workflow.specification.tasks[]`` with ``inputFiles``/``outputFiles`` id lists,
  ``workflow.specification.files[]`` with ``sizeInBytes``, ``workflow.execution.tasks[]``
  with ``runtimeInSeconds`` and ``machines``).  Job ids are the task ``id`` (1.4 tasks
  without one: their ``name``).

Errors are collected, not raised one at a time: :class:`WorkflowError` carries
``errors``, a list of ``{"loc": [json path…], "msg": …}`` (the REST API's 422 shape) and
``format``, the format the document looked like.  Cyclic dependencies, unknown parents,
negative sizes, duplicate ids and missing fields are reported with the JSON path of the
offending field.

The model: ``Workflow.jobs`` in a topological order (stable: a job comes as early as its
parents allow, ties in document order), each :class:`WorkflowJob` with ``inputs`` and
``outputs`` mapping file id → size in bytes.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HYCACHE = "hycache-manifest"
WFFORMAT_14 = "wfformat-1.4"
WFFORMAT_15 = "wfformat-1.5"

Loc = list[str | int]


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    id: str
    runtime: float | None
    parents: tuple[str, ...]
    inputs: Mapping[str, int]
    outputs: Mapping[str, int]
    machine: str | None = None
    name: str | None = None
    #: the task type as the instance states it (WfFormat ``category``, else 1.5's
    #: ``execution.tasks[].command.program``); None when it does not
    task: str | None = None

    def footprint(self) -> int:
        """Distinct bytes the job reads and writes (what it needs on the fast tier)."""
        total = sum(self.inputs.values())
        return total + sum(s for f, s in self.outputs.items() if f not in self.inputs)


@dataclass(slots=True)
class Workflow:
    format: str
    jobs: list[WorkflowJob]  # topological order
    name: str | None = None
    pinned: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sizes:
            for job in self.jobs:
                self.sizes.update(job.inputs)
                self.sizes.update(job.outputs)

    def job(self, job_id: str) -> WorkflowJob:
        return self._index()[job_id]

    def _index(self) -> dict[str, WorkflowJob]:
        return {j.id: j for j in self.jobs}

    def recorded_placement(self) -> dict[str, str] | None:
        """Job id → recorded machine, when every job has one; else None."""
        if self.jobs and all(j.machine for j in self.jobs):
            return {j.id: j.machine for j in self.jobs}  # type: ignore[misc]
        return None

    def runtimes_known(self) -> bool:
        return bool(self.jobs) and all(j.runtime is not None for j in self.jobs) and any(j.runtime for j in self.jobs)


class WorkflowError(ValueError):
    """The document is not a valid workflow: ``errors`` is ``[{"loc": [...], "msg": ...}]``."""

    def __init__(self, format: str, errors: list[dict[str, Any]], source: str = "manifest") -> None:
        self.format = format
        self.errors = errors
        self.source = source
        lines = "\n".join(f"  {_path(e['loc'])}: {e['msg']}" for e in errors)
        super().__init__(f"{source}: invalid {format} document\n{lines}")


def _path(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(root)"


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, loc: Loc, msg: str) -> None:
        self.items.append({"loc": list(loc), "msg": msg})

    def __bool__(self) -> bool:
        return bool(self.items)


# -- detection ----------------------------------------------------------------------

def detect_format(data: Any) -> str:
    """The format ``data`` looks like (a best guess, for error messages too)."""
    if isinstance(data, dict):
        if "schemaVersion" in data or "workflow" in data:
            version = str(data.get("schemaVersion", ""))
            wf = data.get("workflow")
            if version == "1.4" or (version == "" and isinstance(wf, dict) and "tasks" in wf):
                return WFFORMAT_14
            return WFFORMAT_15
        if "jobs" in data:
            return HYCACHE
    return HYCACHE if not isinstance(data, dict) or "schemaVersion" not in data else WFFORMAT_15


def parse_workflow(data: Any, source: str = "manifest") -> Workflow:
    """Parse a decoded JSON document of either format; :class:`WorkflowError` if invalid."""
    fmt = detect_format(data)
    if fmt == HYCACHE:
        return _parse_hycache(data, source)
    errors = _Errors()
    if not isinstance(data, dict):
        errors.add([], "expected a JSON object")
        raise WorkflowError(fmt, errors.items, source)
    version = data.get("schemaVersion")
    if version is None:
        errors.add(["schemaVersion"], "field required (WfFormat 1.4, 1.5 or 1.6)")
    elif str(version) not in ("1.4", "1.5", "1.6"):
        errors.add(["schemaVersion"], f"unsupported WfFormat version {version!r} (1.4, 1.5 and 1.6 are read)")
    wf = data.get("workflow")
    if not isinstance(wf, dict):
        errors.add(["workflow"], "field required (an object)" if wf is None else "expected an object")
        wf = {}  # not read: the errors are raised below
    if errors:
        raise WorkflowError(fmt, errors.items, source)
    name = data.get("name") if isinstance(data.get("name"), str) else None
    if fmt == WFFORMAT_14:
        raw = _read_14(wf, errors)
    else:
        raw = _read_15(wf, errors)
    return _finish(fmt, name, raw, errors, source)


def load_workflow(path: str | Path) -> Workflow:
    """Read a JSON file of either format."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WorkflowError("json", [{"loc": [], "msg": f"not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"}],
                            str(p)) from None
    return parse_workflow(data, str(p))


# -- the readers: each returns raw jobs (id, loc, runtime, parents with locs, files) -------

@dataclass(slots=True)
class _Raw:
    id: str
    loc: Loc
    runtime: float | None
    parents: list[tuple[str, Loc]]
    children: list[tuple[str, Loc]]
    inputs: dict[str, int]
    outputs: dict[str, int]
    machine: str | None
    name: str | None
    task: str | None = None


def _task_type(*tasks: Any) -> str | None:
    """The first of ``category`` (WfFormat 1.4, and 1.5 instances that keep it) or
    ``command.program`` (1.5's execution record) that is a non-empty string."""
    for t in tasks:
        category = t.get("category") if isinstance(t, dict) else None
        if isinstance(category, str) and category.strip():
            return category.strip()
    for t in tasks:
        cmd = t.get("command") if isinstance(t, dict) else None
        program = cmd.get("program") if isinstance(cmd, dict) else None
        if isinstance(program, str) and program.strip():
            return program.strip()
    return None


def _is_list(value: Any, loc: Loc, errors: _Errors, required: bool = True) -> list[Any] | None:
    if value is None:
        if required:
            errors.add(loc, "field required (a list)")
        return None
    if not isinstance(value, list):
        errors.add(loc, "expected a list")
        return None
    return value


def _str(obj: dict[str, Any], key: str, loc: Loc, errors: _Errors, required: bool = True) -> str | None:
    v = obj.get(key)
    if v is None:
        if required:
            errors.add(loc + [key], "field required")
        return None
    if not isinstance(v, str) or not v:
        errors.add(loc + [key], "expected a non-empty string")
        return None
    return v


def _size(obj: dict[str, Any], key: str, loc: Loc, errors: _Errors) -> int | None:
    v = obj.get(key)
    if v is None:
        errors.add(loc + [key], "field required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        errors.add(loc + [key], "expected a number of bytes")
        return None
    if v < 0:
        errors.add(loc + [key], f"size must not be negative: {v}")
        return None
    return int(v)


def _runtime(obj: dict[str, Any], loc: Loc, errors: _Errors, required: bool) -> float | None:
    v = obj.get("runtimeInSeconds")
    if v is None:
        if required:
            errors.add(loc + ["runtimeInSeconds"], "field required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        errors.add(loc + ["runtimeInSeconds"], "expected a non-negative number of seconds")
        return None
    return float(v)


def _refs(obj: dict[str, Any], key: str, loc: Loc, errors: _Errors, required: bool) -> list[tuple[str, Loc]]:
    items = _is_list(obj.get(key), loc + [key], errors, required)
    out = []
    for i, v in enumerate(items or ()):
        if not isinstance(v, str) or not v:
            errors.add(loc + [key, i], "expected a non-empty string")
        else:
            out.append((v, loc + [key, i]))
    return out


def _read_14(wf: dict[str, Any], errors: _Errors) -> list[_Raw]:
    tasks = _is_list(wf.get("tasks"), ["workflow", "tasks"], errors)
    machines = _machine_names(wf.get("machines"), ["workflow", "machines"], errors)
    raws: list[_Raw] = []
    by_name: dict[str, str] = {}
    for i, t in enumerate(tasks or ()):
        loc: Loc = ["workflow", "tasks", i]
        if not isinstance(t, dict):
            errors.add(loc, "expected an object")
            continue
        name = _str(t, "name", loc, errors)
        tid = _str(t, "id", loc, errors, required=False) or name
        if tid is None:
            continue
        inputs: dict[str, int] = {}
        outputs: dict[str, int] = {}
        for k, f in enumerate(_is_list(t.get("files"), loc + ["files"], errors, required=False) or ()):
            floc = loc + ["files", k]
            if not isinstance(f, dict):
                errors.add(floc, "expected an object")
                continue
            fname = _str(f, "name", floc, errors)
            size = _size(f, "sizeInBytes", floc, errors)
            link = f.get("link")
            if link is None:
                errors.add(floc + ["link"], "field required ('input' or 'output')")
            elif str(link).lower() not in ("input", "output"):
                errors.add(floc + ["link"], f"expected 'input' or 'output', got {link!r}")
            if fname is None or size is None or link is None or str(link).lower() not in ("input", "output"):
                continue
            fid = (f["path"] + fname) if isinstance(f.get("path"), str) else fname
            (inputs if str(link).lower() == "input" else outputs)[fid] = size
        machine = t.get("machine")
        if machine is not None and not isinstance(machine, str):
            errors.add(loc + ["machine"], "expected a machine's nodeName")
            machine = None
        if machine is not None and machines is not None and machine not in machines:
            errors.add(loc + ["machine"], f"unknown machine {machine!r} (not in workflow.machines)")
        raws.append(_Raw(tid, loc, _runtime(t, loc, errors, required=False),
                         _refs(t, "parents", loc, errors, False), _refs(t, "children", loc, errors, False),
                         inputs, outputs, machine, name, _task_type(t)))
        if name is not None:
            by_name.setdefault(name, tid)
    # 1.4 tasks name their parents and children by name (or by id): resolve to ids
    ids = {r.id for r in raws}
    for r in raws:
        r.parents = [(by_name.get(p, p) if p not in ids else p, ploc) for p, ploc in r.parents]
        r.children = [(by_name.get(c, c) if c not in ids else c, cloc) for c, cloc in r.children]
    return raws


def _machine_names(value: Any, loc: Loc, errors: _Errors) -> set[str] | None:
    items = _is_list(value, loc, errors, required=False)
    if items is None:
        return None
    names = set()
    for i, m in enumerate(items):
        if not isinstance(m, dict):
            errors.add(loc + [i], "expected an object")
            continue
        n = _str(m, "nodeName", loc + [i], errors)
        if n is not None:
            if n in names:
                errors.add(loc + [i, "nodeName"], f"duplicate machine {n!r}")
            names.add(n)
    return names


def _read_15(wf: dict[str, Any], errors: _Errors) -> list[_Raw]:
    spec = wf.get("specification")
    if not isinstance(spec, dict):
        errors.add(["workflow", "specification"], "field required (an object)" if spec is None else "expected an object")
        return []
    sizes: dict[str, int] = {}
    bad: set[str] = set()  # files whose own entry is invalid (already reported)
    for k, f in enumerate(_is_list(spec.get("files"), ["workflow", "specification", "files"], errors, False) or ()):
        floc: Loc = ["workflow", "specification", "files", k]
        if not isinstance(f, dict):
            errors.add(floc, "expected an object")
            continue
        fid = _str(f, "id", floc, errors)
        size = _size(f, "sizeInBytes", floc, errors)
        if fid is not None and size is None:
            bad.add(fid)
        if fid is not None and fid in sizes:
            errors.add(floc + ["id"], f"duplicate file id {fid!r}")
        elif fid is not None and size is not None:
            sizes[fid] = size
    raws: list[_Raw] = []
    for i, t in enumerate(_is_list(spec.get("tasks"), ["workflow", "specification", "tasks"], errors) or ()):
        loc: Loc = ["workflow", "specification", "tasks", i]
        if not isinstance(t, dict):
            errors.add(loc, "expected an object")
            continue
        tid = _str(t, "id", loc, errors)
        name = _str(t, "name", loc, errors)
        files = []
        for key in ("inputFiles", "outputFiles"):
            got: dict[str, int] = {}
            for fid, floc in _refs(t, key, loc, errors, False):
                if fid in bad:
                    continue
                if fid not in sizes:
                    errors.add(floc, f"unknown file {fid!r} (not in workflow.specification.files)")
                else:
                    got[fid] = sizes[fid]
            files.append(got)
        if tid is None:
            continue
        raws.append(_Raw(tid, loc, None, _refs(t, "parents", loc, errors, True), _refs(t, "children", loc, errors, True),
                         files[0], files[1], None, name, _task_type(t)))
    execution = wf.get("execution")
    if execution is not None:
        if not isinstance(execution, dict):
            errors.add(["workflow", "execution"], "expected an object")
            return raws
        machines = _machine_names(execution.get("machines"), ["workflow", "execution", "machines"], errors)
        by_id = {r.id: r for r in raws}
        for i, t in enumerate(_is_list(execution.get("tasks"), ["workflow", "execution", "tasks"], errors) or ()):
            loc = ["workflow", "execution", "tasks", i]
            if not isinstance(t, dict):
                errors.add(loc, "expected an object")
                continue
            tid = _str(t, "id", loc, errors)
            runtime = _runtime(t, loc, errors, required=True)
            if tid is None:
                continue
            r = by_id.get(tid)
            if r is None:
                errors.add(loc + ["id"], f"unknown task {tid!r} (not in workflow.specification.tasks)")
                continue
            r.runtime = runtime
            if r.task is None:
                r.task = _task_type(t)
            ms = _refs(t, "machines", loc, errors, False)
            if ms:
                m, mloc = ms[0]
                if machines is not None and m not in machines:
                    errors.add(mloc, f"unknown machine {m!r} (not in workflow.execution.machines)")
                r.machine = m
    return raws


# -- the hycache manifest -----------------------------------------------------------

def _parse_hycache(data: Any, source: str) -> Workflow:
    from pydantic import ValidationError

    from .manifest import Manifest

    try:
        m = Manifest.model_validate(data)
    except ValidationError as exc:
        items = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            items.append({"loc": list(err["loc"]), "msg": msg})
        raise WorkflowError(HYCACHE, items, source) from None
    last_writer: dict[str, str] = {}
    jobs = []
    for job in m.jobs:
        inputs: dict[str, int] = {}
        outputs: dict[str, int] = {}
        parents: dict[str, None] = {}
        for a in job.accesses:
            if a.op == "W":
                outputs[a.path] = a.size
            elif a.path not in outputs:
                inputs[a.path] = a.size
                w = last_writer.get(a.path)
                if w is not None and w != job.name:
                    parents[w] = None
        for path in outputs:
            last_writer[path] = job.name
        jobs.append(WorkflowJob(job.name, None, tuple(parents), inputs, outputs, job.node, job.name))
    return Workflow(HYCACHE, jobs, m.name, tuple(m.pinned))


# -- checks shared by the WfFormat readers ----------------------------------------------

def _finish(fmt: str, name: str | None, raws: list[_Raw], errors: _Errors, source: str) -> Workflow:
    seen: dict[str, Loc] = {}
    unique: list[_Raw] = []
    for r in raws:
        if r.id in seen:
            errors.add(r.loc + ["id"], f"duplicate task id {r.id!r} (first at {_path(seen[r.id])})")
        else:
            seen[r.id] = r.loc
            unique.append(r)
    parents: dict[str, dict[str, None]] = {r.id: {} for r in unique}
    for r in unique:
        for p, ploc in r.parents:
            if p not in parents:
                errors.add(ploc, f"unknown parent {p!r}")
            elif p == r.id:
                errors.add(ploc, f"task {p!r} depends on itself")
            else:
                parents[r.id][p] = None
        for c, cloc in r.children:
            if c not in parents:
                errors.add(cloc, f"unknown child {c!r}")
            elif c == r.id:
                errors.add(cloc, f"task {c!r} depends on itself")
            else:
                parents[c][r.id] = None
    order = {r.id: i for i, r in enumerate(unique)}
    topo = _toposort([r.id for r in unique], {k: list(v) for k, v in parents.items()}, order)
    if isinstance(topo, set):  # the jobs left on a cycle
        by_id = {r.id: r for r in unique}
        first = min(topo, key=order.__getitem__)
        r = by_id[first]
        cyc = _cycle_from(first, parents, topo)
        key = "parents" if r.parents else "children"
        errors.add(r.loc + [key], "cyclic dependency: " + " -> ".join(cyc))
    if errors:
        raise WorkflowError(fmt, errors.items, source)
    assert not isinstance(topo, set)
    by_id = {r.id: r for r in unique}
    jobs = [WorkflowJob(j, by_id[j].runtime, tuple(parents[j]), by_id[j].inputs, by_id[j].outputs,
                        by_id[j].machine, by_id[j].name, by_id[j].task) for j in topo]
    return Workflow(fmt, jobs, name)


def _toposort(ids: list[str], parents: dict[str, list[str]], order: dict[str, int]) -> list[str] | set[str]:
    """Kahn's algorithm, ties by document order; the set of unsorted jobs on a cycle."""
    indeg = {j: len(parents[j]) for j in ids}
    children: dict[str, list[str]] = {j: [] for j in ids}
    for j in ids:
        for p in parents[j]:
            children[p].append(j)
    ready = [order[j] for j in ids if indeg[j] == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        j = ids[heapq.heappop(ready)]
        out.append(j)
        for c in children[j]:
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, order[c])
    if len(out) < len(ids):
        return {j for j in ids if indeg[j] > 0}
    return out


def _cycle_from(start: str, parents: dict[str, dict[str, None]], left: set[str]) -> list[str]:
    path: list[str] = [start]
    index = {start: 0}
    cur = start
    while True:
        nxt = next(p for p in parents[cur] if p in left)
        if nxt in index:
            cyc = path[index[nxt]:] + [nxt]
            return list(reversed(cyc))
        index[nxt] = len(path)
        path.append(nxt)
        cur = nxt


def topological_order(jobs: list[WorkflowJob]) -> list[WorkflowJob]:
    """``jobs`` sorted so that every job follows its parents (stable)."""
    ids = [j.id for j in jobs]
    order = {j: i for i, j in enumerate(ids)}
    res = _toposort(ids, {j.id: [p for p in j.parents if p in order] for j in jobs}, order)
    if isinstance(res, set):
        raise ValueError(f"cyclic dependencies among {sorted(res)}")
    by_id = {j.id: j for j in jobs}
    return [by_id[j] for j in res]


def synthetic_workflow(jobs: int, files: int, *, stages: int = 10, fan_in: int = 3, shared: int = 50,
                       runtimes: bool = True, seed: int = 0) -> Workflow:
    """A layered workflow for benchmarks and tests: ``stages`` stages of jobs; stage-0
    jobs read input files (on the slow tier); every later job reads ``fan_in`` outputs of
    jobs of the previous stage near its own position (so that data locality pays), and
    one of ``shared`` reference files read by many jobs.  Files not needed as outputs
    become inputs; sizes are log-uniform between 64 KiB and 256 MiB."""
    import random

    rng = random.Random(seed)
    if jobs < 1 or files < jobs:
        raise ValueError("need at least one job and at least as many files as jobs")
    stages = max(1, min(stages, jobs))
    per_stage = [jobs // stages + (1 if s < jobs % stages else 0) for s in range(stages)]
    n_out = min(files - shared - per_stage[0], 3 * jobs) if files - shared - per_stage[0] > jobs else jobs
    n_out = max(n_out, jobs)
    outs_per_job = [n_out // jobs + (1 if i < n_out % jobs else 0) for i in range(jobs)]
    n_inputs = max(files - n_out - shared, per_stage[0])

    def size() -> int:
        return int(2 ** rng.uniform(16, 28))

    sizes: dict[str, int] = {}
    inputs_pool = [f"in/{i}" for i in range(n_inputs)]
    shared_pool = [f"ref/{i}" for i in range(shared)]
    for f in inputs_pool + shared_pool:
        sizes[f] = size()
    out: list[WorkflowJob] = []
    prev: list[tuple[str, list[str]]] = []  # previous stage: (job id, outputs)
    k = 0
    in_cursor = 0
    for s, count in enumerate(per_stage):
        cur: list[tuple[str, list[str]]] = []
        for i in range(count):
            jid = f"s{s}-j{i}"
            outputs = [f"out/{jid}/{o}" for o in range(outs_per_job[k])]
            for f in outputs:
                sizes[f] = size()
            ins: list[str] = []
            parents: list[str] = []
            if s == 0 or not prev:
                take = max(1, n_inputs // per_stage[0])
                ins.extend(inputs_pool[(in_cursor + t) % n_inputs] for t in range(take))
                in_cursor += take
            else:
                centre = i * len(prev) // count
                for _ in range(fan_in):
                    p = min(len(prev) - 1, max(0, centre + int(rng.gauss(0, 2))))
                    pid, pouts = prev[p]
                    ins.append(rng.choice(pouts))
                    parents.append(pid)
            if shared and rng.random() < 0.5:
                ins.append(shared_pool[int(rng.paretovariate(1.2)) % shared])
            runtime = round(rng.uniform(1, 60), 1) if runtimes else None
            ins_d = {f: sizes[f] for f in dict.fromkeys(ins)}
            out.append(WorkflowJob(jid, runtime, tuple(dict.fromkeys(parents)), ins_d, {f: sizes[f] for f in outputs}))
            cur.append((jid, outputs))
            k += 1
        prev = cur
    return Workflow("synthetic", out, f"synthetic-{jobs}x{files}", sizes=sizes)

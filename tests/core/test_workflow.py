"""Workflows: the project's manifest and WfFormat 1.4 / 1.5 parse into one model; every
error names the format and the JSON path of the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hycache_core.workflow import HYCACHE, WFFORMAT_14, WFFORMAT_15, WorkflowError, load_workflow, parse_workflow

DATA = Path(__file__).parent / "data"
MB = 1 << 20


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _errors(data) -> tuple[str, list[dict]]:
    with pytest.raises(WorkflowError) as exc:
        parse_workflow(data)
    return exc.value.format, exc.value.errors


def _model(wf):
    return [(j.id, j.runtime, set(j.parents), dict(j.inputs), dict(j.outputs), j.machine) for j in wf.jobs]


def test_both_wfformat_versions_parse_to_the_same_model():
    w14 = load_workflow(DATA / "wfformat-1.4-tiny.json")
    w15 = load_workflow(DATA / "wfformat-1.5-tiny.json")
    assert w14.format == WFFORMAT_14 and w15.format == WFFORMAT_15
    assert _model(w14) == _model(w15)
    jobs = {j.id: j for j in w15.jobs}
    assert [j.id for j in w15.jobs] == ["ID01", "ID02", "ID03", "ID04", "ID05", "ID06"]
    assert set(jobs["ID05"].parents) == {"ID02", "ID03", "ID04"}
    assert jobs["ID02"].inputs == {"chunk1": 32 * MB, "ref.db": 64 * MB}
    assert jobs["ID02"].outputs == {"out1": 16 * MB}
    assert jobs["ID03"].runtime == 20.0 and jobs["ID03"].machine == "n2"
    assert w15.recorded_placement() == {"ID01": "n1", "ID02": "n1", "ID03": "n2", "ID04": "n2", "ID05": "n1", "ID06": "n2"}
    assert w15.sizes["ref.db"] == 64 * MB


def test_jobs_come_in_a_topological_order_whatever_the_document_order():
    data = _load("wfformat-1.5-tiny.json")
    data["workflow"]["specification"]["tasks"].reverse()
    wf = parse_workflow(data)
    pos = {j.id: i for i, j in enumerate(wf.jobs)}
    for j in wf.jobs:
        for p in j.parents:
            assert pos[p] < pos[j.id]


def test_children_alone_declare_the_edges():
    data = _load("wfformat-1.5-tiny.json")
    for t in data["workflow"]["specification"]["tasks"]:
        t["parents"] = []
    wf = parse_workflow(data)
    assert set(wf.job("ID05").parents) == {"ID02", "ID03", "ID04"}


def test_the_project_manifest_parses_with_parents_from_the_data():
    wf = parse_workflow({
        "version": 1, "name": "m",
        "jobs": [
            {"name": "a", "accesses": [{"path": "in", "size": "1M"}, {"path": "mid", "size": 10, "op": "W"}]},
            {"name": "b", "node": "n2", "accesses": [{"path": "mid", "size": 10}, {"path": "out", "size": 5, "op": "W"}]},
        ],
    })
    assert wf.format == HYCACHE
    a, b = wf.jobs
    assert a.inputs == {"in": MB} and a.outputs == {"mid": 10} and a.parents == ()
    assert b.parents == ("a",) and b.machine == "n2" and b.runtime is None
    assert wf.recorded_placement() is None  # job a has no node
    assert not wf.runtimes_known()


def test_project_manifest_errors_name_the_field():
    fmt, errs = _errors({"version": 1, "jobs": [{"name": "a", "accesses": [{"path": "x", "size": -1}]}]})
    assert fmt == HYCACHE
    assert [e["loc"] for e in errs] == [["jobs", 0, "accesses", 0, "size"]]
    fmt, errs = _errors({"version": 1, "jobs": [{"name": "a", "accesses": []}, {"name": "a", "accesses": []}]})
    assert errs[0]["loc"] == ["jobs"] and "duplicate job name 'a'" in errs[0]["msg"]
    fmt, errs = _errors({"version": 1, "jobs": [{"accesses": []}]})
    assert errs[0]["loc"] == ["jobs", 0, "name"]


def _spec(data):
    return data["workflow"]["specification"]


CASES_15 = {
    "negative size": (lambda d: _spec(d)["files"][2].__setitem__("sizeInBytes", -5),
                      ["workflow", "specification", "files", 2, "sizeInBytes"], "negative"),
    "duplicate task id": (lambda d: _spec(d)["tasks"][3].__setitem__("id", "ID02"),
                          ["workflow", "specification", "tasks", 3, "id"], "duplicate task id"),
    "duplicate file id": (lambda d: _spec(d)["files"][1].__setitem__("id", _spec(d)["files"][0]["id"]),
                          ["workflow", "specification", "files", 1, "id"], "duplicate file id"),
    "unknown parent": (lambda d: _spec(d)["tasks"][1]["parents"].append("ID99"),
                       ["workflow", "specification", "tasks", 1, "parents", 1], "unknown parent"),
    "unknown child": (lambda d: _spec(d)["tasks"][0]["children"].append("nope"),
                      ["workflow", "specification", "tasks", 0, "children", 3], "unknown child"),
    "unknown file": (lambda d: _spec(d)["tasks"][2]["inputFiles"].append("ghost"),
                     ["workflow", "specification", "tasks", 2, "inputFiles", 2], "unknown file"),
    "missing id": (lambda d: _spec(d)["tasks"][4].pop("id"),
                   ["workflow", "specification", "tasks", 4, "id"], "required"),
    "missing parents": (lambda d: _spec(d)["tasks"][4].pop("parents"),
                        ["workflow", "specification", "tasks", 4, "parents"], "required"),
    "missing size": (lambda d: _spec(d)["files"][0].pop("sizeInBytes"),
                     ["workflow", "specification", "files", 0, "sizeInBytes"], "required"),
    "missing runtime": (lambda d: d["workflow"]["execution"]["tasks"][1].pop("runtimeInSeconds"),
                        ["workflow", "execution", "tasks", 1, "runtimeInSeconds"], "required"),
    "unknown execution task": (lambda d: d["workflow"]["execution"]["tasks"][1].__setitem__("id", "X"),
                               ["workflow", "execution", "tasks", 1, "id"], "unknown task"),
    "unknown machine": (lambda d: d["workflow"]["execution"]["tasks"][0].__setitem__("machines", ["n9"]),
                        ["workflow", "execution", "tasks", 0, "machines", 0], "unknown machine"),
    "missing specification": (lambda d: d["workflow"].pop("specification"),
                              ["workflow", "specification"], "required"),
    "bad version": (lambda d: d.__setitem__("schemaVersion", "0.9"), ["schemaVersion"], "unsupported"),
    "self dependency": (lambda d: _spec(d)["tasks"][1]["parents"].append("ID02"),
                        ["workflow", "specification", "tasks", 1, "parents", 1], "itself"),
}


@pytest.mark.parametrize("case", sorted(CASES_15))
def test_wfformat_15_errors_name_the_json_path(case):
    mutate, loc, words = CASES_15[case]
    data = _load("wfformat-1.5-tiny.json")
    mutate(data)
    fmt, errs = _errors(data)
    assert fmt == WFFORMAT_15
    matching = [e for e in errs if e["loc"] == loc]
    assert matching, errs
    assert words in matching[0]["msg"]


def test_cycles_are_named_with_their_members():
    data = _load("wfformat-1.5-tiny.json")
    _spec(data)["tasks"][1]["parents"].append("ID05")  # ID02 <- ID05 <- ID02
    fmt, errs = _errors(data)
    assert len(errs) == 1
    assert errs[0]["loc"][:4] == ["workflow", "specification", "tasks", 1]
    assert "cyclic" in errs[0]["msg"] and "ID02" in errs[0]["msg"] and "ID05" in errs[0]["msg"]


def _tasks14(data):
    return data["workflow"]["tasks"]


CASES_14 = {
    "negative size": (lambda d: _tasks14(d)[1]["files"][0].__setitem__("sizeInBytes", -1),
                      ["workflow", "tasks", 1, "files", 0, "sizeInBytes"], "negative"),
    "bad link": (lambda d: _tasks14(d)[1]["files"][0].__setitem__("link", "both"),
                 ["workflow", "tasks", 1, "files", 0, "link"], "input"),
    "unknown parent": (lambda d: _tasks14(d)[2]["parents"].append("nobody"),
                       ["workflow", "tasks", 2, "parents", 1], "unknown parent"),
    "duplicate id": (lambda d: _tasks14(d)[2].__setitem__("id", "ID01"),
                     ["workflow", "tasks", 2, "id"], "duplicate"),
    "missing name": (lambda d: _tasks14(d)[0].pop("name"), ["workflow", "tasks", 0, "name"], "required"),
    "unknown machine": (lambda d: _tasks14(d)[0].__setitem__("machine", "zz"), ["workflow", "tasks", 0, "machine"], "unknown"),
    "missing tasks": (lambda d: d["workflow"].pop("tasks"), ["workflow", "tasks"], "required"),
}


@pytest.mark.parametrize("case", sorted(CASES_14))
def test_wfformat_14_errors_name_the_json_path(case):
    mutate, loc, words = CASES_14[case]
    data = _load("wfformat-1.4-tiny.json")
    mutate(data)
    fmt, errs = _errors(data)
    assert fmt == WFFORMAT_14
    matching = [e for e in errs if e["loc"] == loc]
    assert matching, errs
    assert words in matching[0]["msg"]


def test_14_cycle_through_names():
    data = _load("wfformat-1.4-tiny.json")
    _tasks14(data)[0]["parents"] = [_tasks14(data)[5]["name"]]
    fmt, errs = _errors(data)
    assert fmt == WFFORMAT_14
    assert any("cyclic" in e["msg"] and e["loc"][:3] == ["workflow", "tasks", 0] for e in errs)


def test_several_errors_are_reported_together():
    data = _load("wfformat-1.5-tiny.json")
    _spec(data)["files"][0]["sizeInBytes"] = -1
    _spec(data)["tasks"][2]["parents"] = ["ghost"]
    _, errs = _errors(copy.deepcopy(data))
    assert len(errs) >= 2


def test_not_json_and_not_an_object(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{nope")
    with pytest.raises(WorkflowError) as exc:
        load_workflow(p)
    assert "not JSON" in exc.value.errors[0]["msg"]
    fmt, errs = _errors([1, 2])
    assert fmt == HYCACHE and errs


def test_task_types_come_from_the_instance():
    """A job's ``task`` is the instance's own task type: ``category``, else the command's
    ``program`` (1.4 tasks, 1.5's execution record); None when the instance has neither."""
    w14 = load_workflow(DATA / "wfformat-1.4-tiny.json")
    assert {j.id: j.task for j in w14.jobs} == {"ID01": "split", "ID02": "process", "ID03": "process",
                                                "ID04": "process", "ID05": "merge", "ID06": "report"}
    assert all(j.task is None for j in load_workflow(DATA / "wfformat-1.5-tiny.json").jobs)
    data = _load("wfformat-1.5-tiny.json")
    for t in data["workflow"]["execution"]["tasks"]:
        t["command"] = {"program": "prog-" + t["id"], "arguments": []}
    data["workflow"]["specification"]["tasks"][1]["category"] = "stage2"
    data["workflow"]["execution"]["tasks"][2]["category"] = "stage3"
    jobs = {j.id: j.task for j in parse_workflow(data).jobs}
    assert jobs["ID01"] == "prog-ID01" and jobs["ID06"] == "prog-ID06"
    assert jobs[data["workflow"]["specification"]["tasks"][1]["id"]] == "stage2"  # category wins over program
    assert jobs[data["workflow"]["execution"]["tasks"][2]["id"]] == "stage3"
    # the project's manifest has no task types
    assert all(j.task is None for j in parse_workflow({"version": 1, "jobs": [
        {"name": "a", "accesses": [{"path": "x", "size": 1, "op": "W"}]}]}).jobs)

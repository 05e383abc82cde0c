"""Simulator inputs: CSV traces, manifests, generators — and their error messages."""

from __future__ import annotations

import io
import json

import pytest
from hycache_core.manifest import ManifestError, load_manifest, parse_manifest
from hycache_core.sim import TraceError, generate, parse_csv_trace, trace_from_manifest
from hycache_core.sim.generators import generator_params


def parse(text: str):
    return parse_csv_trace(io.StringIO(text), source="t.csv")


def test_csv_columns_optional_and_ignored():
    t = parse("time,file,extra,size,op,job\n1.0,a,x,10,R,j1\n2,b,y,64K,w,j1\n2,a,z,10,,j2\n")
    assert t.names == ["a", "b"]
    assert t.keys == [0, 1, 0]
    assert t.sizes == [10, 65536, 10]
    assert list(t.writes) == [0, 1, 0]
    assert t.jobs == ["j1", "j1", "j2"]


def test_csv_minimal_and_blank_lines():
    t = parse("file,size\n\na,1\n\nb,2\n")
    assert (t.keys, t.sizes, list(t.writes)) == ([0, 1], [1, 2], [0, 0])


@pytest.mark.parametrize(
    "text, line, field, message",
    [
        ("", 1, None, "empty file"),
        ("file,bytes\na,1\n", 1, "size", "missing required column"),
        ("file,size\na,1\nb,lots\n", 3, "size", "'lots' is not a size"),
        ("file,size\na,-5\n", 2, "size", "is not a size"),
        ("file,size,op\na,1,X\n", 2, "op", "'X' is not R or W"),
        ("file,size,time\na,1,5\nb,1,4\n", 3, "time", "earlier than the previous row"),
        ("file,size,time\na,1,soon\n", 2, "time", "not a number"),
        ("file,size\n,1\n", 2, "file", "empty file name"),
        ("file,size\na\n", 2, "size", "missing"),
        ("file,size\n", None, None, "no references"),
    ],
)
def test_csv_errors_name_line_and_field(text, line, field, message):
    with pytest.raises(TraceError) as exc:
        parse(text)
    assert exc.value.line == line
    assert exc.value.field == field
    assert message in str(exc.value)
    if line is not None:
        assert f"line {line}" in str(exc.value)


MANIFEST = {
    "name": "demo",
    "jobs": [
        {"name": "j1", "accesses": [{"path": "in/a", "size": "1M"}, {"path": "out/b", "size": 5, "op": "W"}]},
        {"name": "j2", "accesses": [{"path": "out/b", "size": 5}, {"path": "in/a", "size": 1048576, "op": "read"}]},
    ],
    "pinned": ["in/a"],
}


def test_manifest_to_trace(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(MANIFEST))
    trace = trace_from_manifest(load_manifest(p))
    assert [trace.names[k] for k in trace.keys] == ["in/a", "out/b", "out/b", "in/a"]
    assert trace.sizes == [1 << 20, 5, 5, 1 << 20]
    assert list(trace.writes) == [0, 1, 0, 0]
    assert trace.jobs == ["j1", "j1", "j2", "j2"]
    assert trace.pinned == {0}


@pytest.mark.parametrize(
    "mutate, location, message",
    [
        (lambda m: m["jobs"][1]["accesses"][0].update(size=-1), "jobs[1].accesses[0].size", "greater than or equal to 0"),
        (lambda m: m["jobs"][0]["accesses"][1].update(op="X"), "jobs[0].accesses[1].op", "'R' or 'W'"),
        (lambda m: m["jobs"][0]["accesses"][0].pop("path"), "jobs[0].accesses[0].path", "Field required"),
        (lambda m: m["jobs"][0]["accesses"][0].update(size="huge"), "jobs[0].accesses[0].size", "not a size"),
        (lambda m: m["jobs"][1].update(name="j1"), "jobs", "duplicate job name 'j1'"),
        (lambda m: m.update(colour="red"), "colour", "Extra inputs are not permitted"),
    ],
)
def test_manifest_errors_name_the_field(mutate, location, message):
    m = json.loads(json.dumps(MANIFEST))
    mutate(m)
    with pytest.raises(ManifestError) as exc:
        parse_manifest(m, "m.json")
    locs = dict(exc.value.errors)
    assert location in locs, exc.value.errors
    assert message in locs[location]
    assert f"{location}: " in str(exc.value)


def test_manifest_bad_json(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"jobs": [}')
    with pytest.raises(ManifestError, match="line 1 column"):
        load_manifest(p)


def test_round_robin_generator():
    t = generate("round-robin", {"files": "3", "volume": "2G"}, seed=5)
    assert t.distinct_files == 3
    sizes = {t.names[k]: s for k, s in zip(t.keys, t.sizes)}
    assert all(6 << 20 <= s <= 250 << 20 for s in sizes.values())
    assert 2 << 30 <= t.total_bytes < (2 << 30) + max(sizes.values())
    assert t.keys[:6] == [0, 1, 2, 0, 1, 2]
    assert generate("round-robin", {"files": "3", "volume": "2G"}, seed=5).sizes == t.sizes
    assert generate("round-robin", {"files": "3", "volume": "2G"}, seed=6).sizes != t.sizes


def test_zipf_and_workflow_generators():
    z = generate("zipf", {"files": "50", "refs": "2000", "write_ratio": "0.5"}, seed=1)
    assert len(z) == 2000 and 0 < sum(z.writes) < 2000
    counts = [z.keys.count(k) for k in range(3)]
    assert counts[0] > counts[2]  # rank 1 more popular than rank 3
    w = generate("workflow", {"stages": "3", "width": "2"}, seed=1)
    assert w.jobs is not None and len(w.jobs) == len(w)
    assert any(w.writes) and not all(w.writes)


def test_generator_parameter_errors():
    with pytest.raises(ValueError, match="no parameter 'color'"):
        generate("zipf", {"color": "1"})
    with pytest.raises(ValueError, match="unknown generator"):
        generate("nope")
    with pytest.raises(ValueError, match="exactly one of volume"):
        generate("round-robin", {"files": "2"})
    assert "alpha" in generator_params("zipf")

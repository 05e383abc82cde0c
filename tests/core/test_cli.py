"""``hycache simulate`` / ``generate`` / ``policies`` through main()."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hycache_core.cli import main

REQUIRED = ("hits", "misses", "hit_ratio", "byte_hit_ratio", "slow_bytes_read", "slow_bytes_written", "modelled_seconds")


@pytest.fixture
def trace_csv(tmp_path):
    p = tmp_path / "t.csv"
    rows = ["file,size,op,time,comment"]
    for r in range(6):
        for f, s in (("a", 40), ("b", 30), ("c", 50)):
            rows.append(f"{f},{s},R,{r},x")
    rows.append("a,40,W,9,")
    p.write_text("\n".join(rows) + "\n")
    return p


def test_simulate_json(trace_csv, capsys):
    rc = main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru,lfu,heuristic,optimal", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["lru", "lfu", "heuristic", "optimal"]
    for name, d in out.items():
        for key in REQUIRED:
            assert key in d, (name, key)
        assert d["hits"] + d["misses"] == 19
    # round-robin over 120 bytes in a 100-byte cache: with the agent's admission LRU keeps
    # what it holds instead of thrashing (a and b stay: 2 hits a round after the first)
    assert out["lru"]["admission"] == "agent" and out["lru"]["declined"] > 0
    assert out["lru"]["hits"] == 11
    assert out["heuristic"]["hits"] > 0
    assert out["optimal"]["slow_bytes_read"] <= out["heuristic"]["slow_bytes_read"]


def test_simulate_admission_all_is_the_papers_algorithm_1(trace_csv, capsys):
    argv = ["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json"]
    assert main([*argv, "--admission", "all"]) == 0
    out = json.loads(capsys.readouterr().out)
    # every miss admitted: round-robin over 120 bytes in a 100-byte cache, LRU always misses
    assert out["lru"]["admission"] == "all" and out["lru"]["declined"] == 0
    assert out["lru"]["hits"] == 0


def test_simulate_table_and_plot(trace_csv, tmp_path, capsys):
    png, svg = tmp_path / "f.png", tmp_path / "f.svg"
    assert main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    for name in ("lru", "lfu", "gdsf", "arc", "heuristic", "optimal"):
        assert name in text
    assert "no policy can read less than" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--plot", str(svg), "--json"]) == 0
    assert b"<svg" in svg.read_bytes()[:400]


def test_simulate_model_options_change_time(trace_csv, capsys):
    main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json"])
    slow = json.loads(capsys.readouterr().out)["lru"]["modelled_seconds"]
    main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json",
          "--slow-read-bw", "1440", "--slow-latency-ms", "0"])
    fast = json.loads(capsys.readouterr().out)["lru"]["modelled_seconds"]
    assert fast < slow


def test_simulate_generator_and_manifest(tmp_path, capsys):
    assert main(["simulate", "--generator", "round-robin", "--gen-opt", "files=3", "--gen-opt", "rounds=5",
                 "--capacity", "256M", "--policies", "lru,heuristic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lru"]["hits"] + out["lru"]["misses"] == 15
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"jobs": [{"name": "j", "accesses": [{"path": "x", "size": "1K"}] * 3}]}))
    assert main(["simulate", "--manifest", str(m), "--capacity", "1M", "--policies", "lru", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lru"]["hits"] == 2


def test_pin_option(trace_csv, capsys):
    assert main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json", "--pin", "c"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lru"]["hits"] >= 5  # c stays once admitted


@pytest.mark.parametrize(
    "content, args, message",
    [
        ("file,size\na,1\nb,x\n", [], "line 3, field 'size'"),
        ("name,size\na,1\n", [], "line 1, field 'file'"),
        ("file,size\na,1\n", ["--policies", "lru,mru"], "unknown policy 'mru'"),
        ("file,size\na,1\n", ["--gen-opt", "files=2"], "--gen-opt only applies"),
    ],
)
def test_errors_exit_2_with_a_clear_message(tmp_path, capsys, content, args, message):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    rc = main(["simulate", "--trace", str(p), "--capacity", "1M", *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_bad_capacity_and_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", "x.csv", "--capacity", "lots"])
    assert exc.value.code == 2
    assert "not a size" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv"), "--capacity", "1M"]) == 2
    assert "No such file" in capsys.readouterr().err


def test_generate_and_policies(tmp_path, capsys):
    out = tmp_path / "z.csv"
    assert main(["generate", "zipf", "--gen-opt", "refs=500", "--gen-opt", "files=20", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "file,size,op" and len(lines) == 501
    assert main(["policies"]) == 0
    listing = capsys.readouterr().out
    assert "heuristic\tplanned" in listing and "lru\tonline" in listing


@pytest.mark.skipif(shutil.which("hycache") is None and not (sys.prefix and shutil.which("hycache", path=f"{sys.prefix}/bin")),
                    reason="console script not installed")
def test_console_script(trace_csv):
    exe = shutil.which("hycache") or shutil.which("hycache", path=f"{sys.prefix}/bin")
    res = subprocess.run([exe, "simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json",
                          "--admission", "all"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["lru"]["misses"] == 19


def test_progress_bar_reports_each_policy():
    import io

    from hycache_core.cli import _progress_factory
    from hycache_core.sim import generate, simulate
    from hycache_core.sim.runner import SimOptions
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    progress, factory = _progress_factory(console, True)
    trace = generate("zipf", {"files": "100", "refs": "70000"}, seed=3)
    with progress:
        simulate(trace, 1 << 30, ["lru", "heuristic"], options=SimOptions(), progress=factory)
    tasks = {t.description: t for t in progress.tasks}
    assert set(tasks) == {"lru", "heuristic"}
    assert all(t.completed == t.total == len(trace) for t in tasks.values())
    assert _progress_factory(console, False) == (None, None)


def test_unknown_pin_warns(trace_csv, capsys):
    assert main(["simulate", "--trace", str(trace_csv), "--capacity", "100", "--policies", "lru", "--json",
                 "--pin", "nope"]) == 0
    assert "--pin nope: not in the workload" in capsys.readouterr().err

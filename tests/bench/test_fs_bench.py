"""Smoke tests of bench/fs_bench.py's pure helpers (argument checks, the issue-11 target
checks, the table cells) and of its metadata loop on a plain directory. No timings are
asserted: the benchmark itself is a script that prints numbers."""

from __future__ import annotations

from pathlib import Path

# bench/ is on pytest's pythonpath (pyproject.toml): fs_bench.py and fs_report.py (rows, checks, tables)
import fs_bench as fb
import fs_report as fr
import pytest

REPO = Path(__file__).resolve().parents[2]


def cell(value: float, unit: str = "MiB/s", samples: list[float] | None = None) -> dict:
    samples = samples or [value]
    return {"value": value, "min": min(samples), "max": max(samples), "samples": samples, "unit": unit}


def test_parse_size() -> None:
    assert fb.parse_size("256M") == 256 << 20
    assert fb.parse_size("1g") == 1 << 30
    assert fb.parse_size("64KiB") == 64 << 10
    assert fb.parse_size("4096") == 4096
    for bad in ("", "M", "12X", "-1M", "0"):
        with pytest.raises(ValueError):
            fb.parse_size(bad)


def test_median() -> None:
    assert fb.median([3.0, 1.0, 2.0]) == 2.0
    assert fb.median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_args_defaults_full_and_quick() -> None:
    full = fb.parse_args([])
    assert (full.size, full.io_4k, full.files, full.repeat) == ("256M", "64M", 1000, 3)
    assert full.targets == fb.DEFAULT_TARGETS and full.targets[0] == "raw"
    assert full.out == REPO / "docs" / "benchmarks.md"
    quick = fb.parse_args(["--quick"])
    assert (quick.size, quick.io_4k, quick.files, quick.repeat) == ("32M", "16M", 200, 1)
    assert "docs" not in quick.out.parts
    # hycache-dht has no fio row unless --dht-fio: a fio-only run leaves it out
    assert "hycache-dht" not in fb.parse_args(["--parts", "fio"]).targets
    assert "hycache-dht" in fb.parse_args(["--parts", "fio", "--dht-fio"]).targets


@pytest.mark.parametrize("argv, field", [
    (["--targets", "raw,zfs"], "--targets"),
    (["--size", "lots"], "--size"),
    (["--size", "16M", "--io-4k", "32M"], "--io-4k"),
    (["--numjobs", "1,x"], "--numjobs"),
    (["--parts", "fio,disk"], "--parts"),
])
def test_bad_arguments_name_the_field(argv: list[str], field: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        fb.parse_args(argv)
    assert exc.value.code == 2
    assert field in capsys.readouterr().err


def test_fio_argv_is_size_based_and_cache_neutral() -> None:
    argv = fb.fio_argv(Path("/x"), "bench", "randwrite", "4k", 4, "256M", "64M")
    assert "--time_based" not in argv and not any(a.startswith("--runtime") for a in argv)
    for opt in ("--invalidate=1", "--direct=0", "--fallocate=none", "--end_fsync=1", "--io_size=64M",
                "--size=256M"):
        assert opt in argv
    # four jobs, each on its own, explicitly named file (not fio's numjobs/filename_format)
    assert [a for a in argv if a.startswith("--filename=")] == [f"--filename=/x/bench.{i}" for i in range(4)]
    assert len([a for a in argv if a.startswith("--name=")]) == 4
    assert not any(a.startswith(("--numjobs", "--filename_format")) for a in argv)
    reads = fb.fio_argv(Path("/x"), "bench", "read", "1m", 1, "256M", None)
    assert "--end_fsync=1" not in reads and not any(a.startswith("--io_size") for a in reads)


def test_checks_of_issue_11() -> None:
    res = {
        "raw": {"seq read 1M j1": cell(1000), "rand read 4K j1": cell(100), "create w1": cell(20000, "ops/s")},
        "hycache": {"seq read 1M j1": cell(900), "rand read 4K j1": cell(89.9), "create w1": cell(1000, "ops/s")},
        "pyfuse3-passthrough": {"create w1": cell(1200, "ops/s")},
        "hycache-dht": {"create w1": cell(800, "ops/s")},
    }
    assert [ok for _t, ok in fr.checks(res, "seq read 1M j1")] == [True]      # exactly 0.9x
    assert [ok for _t, ok in fr.checks(res, "rand read 4K j1")] == [False]
    create = fr.checks(res, "create w1")
    assert [ok for _t, ok in create] == [False, True]                         # < pyfuse3; dht = 0.8x
    assert "pyfuse3" in create[0][0] and "dht" in create[1][0]
    assert fr.checks(res, "stat w1") == []
    met, total, missed = fr.summary(res, fb.parse_args(["--writers", "1"]))
    assert (met, total) == (2, 4) and len(missed) == 2


def test_table_cells_show_ratio_spread_and_the_fsync_mark() -> None:
    args = fb.parse_args(["--numjobs", "1", "--writers", "1", "--repeat", "3"])
    res = {
        "raw": {"seq write 1M j1": cell(1000, samples=[900, 1000, 1100])},
        "pyfuse3-passthrough": {"seq write 1M j1": cell(1500, samples=[1400, 1500, 1600])},
    }
    rows = fr.table_rows(res, ["raw", "pyfuse3-passthrough"], args, "|")
    assert rows == [["seq write 1M j1", "MiB/s", "1,000|900–1,100", "1,500 (1.50×) †|1,400–1,600", ""]]


def test_metadata_run_on_a_plain_directory(tmp_path: Path) -> None:
    t = fb.Target("raw", tmp_path / "raw")
    t.start(None)
    try:
        out = fb.metadata_run(t, 2, 20, fb.Caches(False))
        assert set(out) == {"create w2", "stat w2", "remove w2"}
        assert all(v > 0 for v in out.values())
        assert list(t.path.iterdir()) == []  # every file and writer directory removed
    finally:
        t.stop()
    assert not (tmp_path / "raw").exists()


def test_target_order_rotates_so_no_target_is_always_first() -> None:
    ts = ["raw", "hycache", "mergerfs"]
    assert fb.rotated(ts, 0) == ts
    assert fb.rotated(ts, 4) == ["hycache", "mergerfs", "raw"]
    assert {fb.rotated(ts, k)[0] for k in range(3)} == set(ts)
    assert fb.rotated([], 2) == []


def test_cache_suspects_name_the_pass() -> None:
    res = {"hycache": {"seq read 1M j1": {**cell(9000, samples=[9000, 1000]), "disk_read_share": [0.02, 1.2]}},
           "raw": {"seq read 1M j1": {**cell(1000), "disk_read_share": [1.1]}}}
    assert fr.cache_suspects(res) == ["hycache seq read 1M j1 (pass 1: 2%)"]


def test_disk_counter_reads_the_work_dirs_device(tmp_path: Path) -> None:
    d = fb.DiskCounter(tmp_path)
    if d.stat is None:
        pytest.skip("the work dir is not on a block device here")
    assert d.read_bytes() >= 0


MDTEST_OUT = """\
SUMMARY rate (in ops/sec): (of 1 iterations)
   Operation                     Max            Min           Mean        Std Dev
   ---------                     ---            ---           ----        -------
   File creation               28167.887      28000.000      28100.000          0.000
   File stat                  184628.766     184628.766     184628.766          0.000
   File read                   65887.313      65887.313      65887.313          0.000
   File removal                40052.081      40052.081      40052.081          0.000
   Tree creation                4922.892       4922.892       4922.892          0.000
SUMMARY time (in ms): (of 1 iterations)
   File creation                   1.000          1.000          1.000          0.000
"""


def test_parse_mdtest_takes_the_mean_of_the_rate_table() -> None:
    assert fb.parse_mdtest(MDTEST_OUT) == {"create": 28100.0, "stat": 184628.766, "read": 65887.313,
                                           "remove": 40052.081}
    argv = fb.mdtest_argv(Path("/d"), 4, 1000)
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"]
    assert argv[6:] == ["-n", "1000", "-u", "-F", "-w", "4096", "-e", "4096", "-d", "/d", "-i", "1"]


def test_small_file_tree_and_trace(tmp_path: Path) -> None:
    import smallfiles

    total = smallfiles.make_tree(str(tmp_path), 200)
    sizes = smallfiles.sizes(200)
    assert total == sum(sizes) and all(128 <= s <= 2 << 20 for s in sizes)
    assert sorted(sizes)[100] < 64 << 10  # the median is small
    trace = smallfiles.trace(200, 1000)
    assert len(trace) == 1000 and set(trace) <= set(range(200))
    assert max(trace.count(i) for i in set(trace)) > 50  # a few hot files (Zipf)
    lat, nbytes, wall = smallfiles.serve(str(tmp_path), trace[:100], 200)
    assert len(lat) == 100 and nbytes == sum(sizes[i] for i in trace[:100]) and wall > 0
    s = smallfiles.summary(lat, nbytes, wall)
    assert 0 < s["mean_ms"] <= s["p99_ms"] * 100 and s["mb_s"] > 0


def test_issue_17_checks_against_the_baseline_and_mergerfs() -> None:
    res = {
        "hycache-dht": {"stat w4": cell(9000, "ops/s"), "mdtest read": cell(4000, "ops/s"),
                        "serve mean r4": cell(0.8, "ms")},
        "base-hycache-dht": {"stat w4": cell(3000, "ops/s"), "mdtest read": cell(500, "ops/s"),
                             "serve mean r4": cell(3.0, "ms")},
        "mergerfs": {"stat w4": cell(50000, "ops/s"), "serve mean r4": cell(0.5, "ms")},
    }
    assert [ok for _t, ok in fr.checks(res, "stat w4")] == [True, False]       # 3.0x before; < mergerfs
    assert [ok for _t, ok in fr.checks(res, "mdtest read")] == [False]         # 8x < 10x
    assert [ok for _t, ok in fr.checks(res, "serve mean r4")] == [True, False]  # <= 1 ms; > mergerfs
    assert fr.unit_for("serve mean r4") == "ms" and fr.unit_for("serve MB/s r1") == "MB/s"
    assert fr.unit_for("mdtest stat") == "ops/s"


def test_quiesce_waits_while_the_cpus_are_busy() -> None:
    """A phase waits for a quiet machine: with every CPU kept busy, quiesce() waits its
    whole bound (and says so) instead of starting the phase beside the load."""
    import multiprocessing
    import os
    import time

    def burn(stop_at: float) -> None:
        while time.monotonic() < stop_at:
            pass

    stop_at = time.monotonic() + 5.0
    ctx = multiprocessing.get_context("fork")
    burners = [ctx.Process(target=burn, args=(stop_at,)) for _ in range(os.cpu_count() or 1)]
    for p in burners:
        p.start()
    try:
        waited = fb.quiesce(max_wait=1.0)
    finally:
        for p in burners:
            p.kill()
            p.join()
    assert waited >= 1.0


def test_report_keeps_the_papers_section_and_the_notes(tmp_path: Path) -> None:
    md = tmp_path / "benchmarks.md"
    md.write_text("# File-system benchmarks\n\nold run\n\n## The papers, reproduced\n\nkeep me\n\n"
                  "## Results\n\nold results\n\n## Notes\n\nmy notes\n")
    args = fb.parse_args(["--quick", "--targets", "raw"])
    fr.write_report({"raw": {}}, ["raw"], args, True, {"k": "v"}, {"raw": "a directory"}, md,
                    tmp_path / "plot.png", "python bench/fs_bench.py", 1.0, "opts")
    text = md.read_text()
    assert text.index("## The papers, reproduced\n\nkeep me") < text.index("## Results") < text.index("## Notes")
    assert "old results" not in text and "old run" not in text and text.rstrip().endswith("my notes")

"""The rows, the issue-11 checks and the reports of bench/fs_bench.py: the table on stdout,
the Markdown page (its hand-written "## Notes" section kept) and the plot. Pure functions
of the results dict ({target: {row key: {"value", "min", "max", "samples", "unit", ...}}})
and the parsed arguments; nothing here mounts or measures."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

NOTES_MARKER = "## Notes"  # hand-written section of the report, kept when it is regenerated
# bench/papers.py's section at the top of the page (issue 31), kept above "## Results"
PAPERS_MARKER = "## The papers, reproduced"
RESULTS_MARKER = "## Results"

# row label, fio rw, block size
WORKLOADS = [
    ("seq read 1M", "read", "1m"),
    ("seq write 1M", "write", "1m"),
    ("seq read 4K", "read", "4k"),
    ("seq write 4K", "write", "4k"),
    ("rand read 4K", "randread", "4k"),
    ("rand write 4K", "randwrite", "4k"),
]
META_OPS = ["create", "stat", "remove"]
TAIL_OPS = ["create", "remove"]  # publication tails measured for hycache-dht

# pyfuse3's example has no fsync handler (pyfuse3 answers ENOSYS, which the kernel takes as
# "fsync not needed"): fio's end_fsync does not reach its disk, so its write rows leave the
# write-back out. Marked with a dagger in the tables.
NO_FSYNC_TARGETS = {"pyfuse3-passthrough"}
NO_FSYNC_NOTE = ("† `pyfuse3-passthrough` implements no fsync (pyfuse3 answers ENOSYS, and the kernel "
                 "then treats every fsync as done): its write rows do not include the write-back to "
                 "disk that the other targets' `end_fsync=1` does — an upper bound, not comparable.")

FIO_TARGET_RATIO = 0.9   # every fio row of hycache >= 0.9 x raw
DHT_CREATE_RATIO = 0.8   # hycache-dht creates >= 0.8 x hycache creates
# issue 17's floor, on hycache-dht against base-hycache-dht (the --baseline agent) in one run:
# every create, stat, read and remove rate >= 3x (mdtest's read >= 10x), the small-file
# serving mean <= 1 ms; its goal: >= mergerfs on every row
RATE_FLOOR, MDTEST_READ_FLOOR, SERVE_MEAN_FLOOR_MS = 3.0, 10.0, 1.0
MDTEST_ROWS = ["create", "stat", "read", "remove"]


# ============================================================================ row keys
def fio_key(label: str, numjobs: int) -> str:
    return f"{label} j{numjobs}"


def meta_key(op: str, writers: int) -> str:
    return f"{op} w{writers}"


def tail_key(op: str, writers: int) -> str:
    return f"publish tail after {op}s w{writers}"


def serve_keys(readers: int) -> tuple[str, str, str]:
    """The small-file serving rows: mean and p99 of one request (ms), MB/s."""
    return f"serve mean r{readers}", f"serve p99 r{readers}", f"serve MB/s r{readers}"


def mdtest_key(op: str) -> str:
    return f"mdtest {op}"


def unit_for(key: str) -> str:
    if key.startswith("publish tail"):
        return "s"
    if key.startswith(("serve mean", "serve p99")):
        return "ms"
    if key.startswith("serve MB/s"):
        return "MB/s"
    if key.startswith("mdtest "):
        return "ops/s"
    return "ops/s" if key.split(" w")[0] in META_OPS else "MiB/s"


def cache_suspects(res: dict, limit: float = 0.5) -> list[str]:
    """Read cells of which a pass read less than ``limit`` of its bytes from the disk."""
    out = []
    for t, cells in res.items():
        for key, c in cells.items():
            low = [(i, x) for i, x in enumerate(c.get("disk_read_share", [])) if x < limit]
            if low:
                out.append(f"{t} {key} (pass {', '.join(f'{i + 1}: {x:.0%}' for i, x in low)})")
    return out


# ============================================================================ checks
def row_keys(args) -> list[str]:
    keys = [fio_key(label, nj) for label, _rw, _bs in WORKLOADS for nj in args.numjobs]
    keys += [meta_key(op, w) for op in META_OPS for w in args.writers]
    keys += [tail_key(op, w) for op in TAIL_OPS for w in args.writers]
    keys += [k for r in getattr(args, "readers", []) for k in serve_keys(r)]
    keys += [mdtest_key(op) for op in MDTEST_ROWS]
    return keys


def checks(res: dict, key: str) -> list[tuple[str, bool]]:
    """The targets of issue 11 that apply to a row: [(text, met)], from the medians."""
    def v(target: str) -> float | None:
        return res.get(target, {}).get(key, {}).get("value")

    out = []
    hv = v("hycache")
    if hv is None:
        return checks_17(res, key)
    if key.split(" j")[0] in {label for label, _rw, _bs in WORKLOADS}:
        raw = v("raw")
        if raw:
            out.append((f"hycache {hv / raw:.2f}× raw ≥ {FIO_TARGET_RATIO}", hv >= FIO_TARGET_RATIO * raw))
    elif key.startswith("create w"):
        floor = v("pyfuse3-passthrough")
        if floor:
            out.append((f"hycache {hv / floor:.2f}× pyfuse3 ≥ 1", hv >= floor))
        dht = v("hycache-dht")
        if dht is not None and hv:
            out.append((f"dht {dht / hv:.2f}× hycache ≥ {DHT_CREATE_RATIO}", dht >= DHT_CREATE_RATIO * hv))
    return out + checks_17(res, key)


def checks_17(res: dict, key: str) -> list[tuple[str, bool]]:
    """Issue 17, on hycache-dht: the floor against the --baseline agent in the same run and
    the goal against mergerfs."""
    def v(target: str) -> float | None:
        return res.get(target, {}).get(key, {}).get("value")

    dht, before, mergerfs = v("hycache-dht"), v("base-hycache-dht"), v("mergerfs")
    if dht is None:
        return []
    out = []
    if key.startswith("serve mean"):
        out.append((f"dht {dht:.2f} ms ≤ {SERVE_MEAN_FLOOR_MS:g} ms", dht <= SERVE_MEAN_FLOOR_MS))
        if mergerfs:
            out.append((f"goal: dht {dht / mergerfs:.2f}× mergerfs's mean ≤ 1", dht <= mergerfs))
    elif unit_for(key) == "ops/s" and key.split(" w")[0] in META_OPS or key.startswith("mdtest "):
        floor = MDTEST_READ_FLOOR if key == mdtest_key("read") else RATE_FLOOR
        if before:
            out.append((f"dht {dht / before:.2f}× before ≥ {floor:g}", dht >= floor * before))
        if mergerfs:
            out.append((f"goal: dht {dht / mergerfs:.2f}× mergerfs ≥ 1", dht >= mergerfs))
    return out


def verdict_text(cs: list[tuple[str, bool]]) -> str:
    return "; ".join(f"{'PASS' if ok else 'MISS'} {txt}" for txt, ok in cs)


# ============================================================================ reporting
def fmt(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v:.2f}"
    return f"{v:,.0f}" if unit == "ops/s" or v >= 100 else f"{v:,.1f}"


def cell_parts(res: dict, target: str, key: str) -> tuple[str, str] | None:
    """('median (x raw)', 'min–max') for one cell, or None when the target has no such row."""
    c = res.get(target, {}).get(key)
    if c is None:
        return None
    main = fmt(c["value"], c["unit"])
    raw = res.get("raw", {}).get(key)
    if target != "raw" and raw and raw["value"] and c["unit"] != "s":
        main += f" ({c['value'] / raw['value']:.2f}×)"
    if target in NO_FSYNC_TARGETS and " write " in f" {key} ":
        main += " †"
    spread = f"{fmt(c['min'], c['unit'])}–{fmt(c['max'], c['unit'])}" if len(c["samples"]) > 1 else ""
    return main, spread


def unit_of(res: dict, key: str) -> str:
    return next((res[t][key]["unit"] for t in res if key in res[t]), "")


def table_rows(res: dict, targets: list[str], args, sep: str) -> list[list[str]]:
    """Rows of strings: key, unit, one cell per target (median (×raw) + sep + spread), checks."""
    rows = []
    for key in row_keys(args):
        if not any(key in res.get(t, {}) for t in targets):
            continue
        row = [key, unit_of(res, key)]
        for t in targets:
            parts = cell_parts(res, t, key)
            row.append("—" if parts is None else parts[0] + (sep + parts[1] if parts[1] else ""))
        row.append(verdict_text(checks(res, key)))
        rows.append(row)
    return rows


def summary(res: dict, args) -> tuple[int, int, list[str]]:
    met, total, missed = 0, 0, []
    for key in row_keys(args):
        for txt, ok in checks(res, key):
            total += 1
            met += ok
            if not ok:
                missed.append(f"{key} ({txt})")
    return met, total, missed


def print_table(res: dict, targets: list[str], args) -> None:
    from rich.console import Console
    from rich.table import Table

    tbl = Table(title="fs_bench: median (× raw) and min–max of the passes",
                caption="MiB/s for fio rows, ops/s for metadata rows, seconds for publication tails")
    for col in ["row", "unit", *targets, "targets (issues 11, 17)"]:
        tbl.add_column(col, justify="left" if col in ("row", "unit", "targets (issues 11, 17)") else "right")
    for row in table_rows(res, targets, args, "\n"):
        v = row[-1]
        style = "red" if "MISS" in v else "green" if "PASS" in v else None
        tbl.add_row(*row[:-1], f"[{style}]{v}[/{style}]" if style else v)
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(tbl)
    if any(t in NO_FSYNC_TARGETS for t in targets) and "fio" in args.parts:
        console.print(NO_FSYNC_NOTE.replace("`", ""))
    suspects = cache_suspects(res)
    if suspects:
        console.print("[red]read jobs that read < 50 % of their bytes from the disk (a cache served them; "
                      f"suspect cells):[/red] {', '.join(suspects)}")
    met, total, missed = summary(res, args)
    if total:
        console.print(f"targets met: {met} of {total}" + (f"; missed: {', '.join(missed)}" if missed else ""))


COLORS = {"hycache": "#1f77b4", "hycache-nopt": "#9ecae1", "hycache-dht": "#08306b", "mergerfs": "#8c8c8c",
          "pyfuse3-passthrough": "#ff7f0e", "slow": "#2ca02c"}


FIO_PLOT_XMAX = 2.0  # the fio panel is cut here; longer bars and whiskers are labelled


def plot(res: dict, targets: list[str], args, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if "raw" not in res:
        return
    others = [t for t in targets if t != "raw"]
    fio_keys = [k for k in row_keys(args) if k in res["raw"] and unit_of(res, k) == "MiB/s"]
    meta_keys = [k for k in row_keys(args) if k in res["raw"] and unit_of(res, k) in ("ops/s", "MB/s")]
    panels = [(fio_keys, f"fio rows: throughput × raw (cut at {FIO_PLOT_XMAX:g}×; hatched: no fsync, †)", False),
              (meta_keys, "metadata and small-file rows: operations/s or MB/s × raw (log scale)", True)]
    panels = [p for p in panels if p[0]]
    heights = [max(2.0, 0.5 * len(k) + 1) for k, _t, _l in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11.5, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (keys, title, logx) in zip(axes[:, 0], panels):
        ts = [t for t in others if any(k in res.get(t, {}) for k in keys)]
        y = np.arange(len(keys))
        h = 0.84 / max(1, len(ts))
        for i, t in enumerate(ts):
            ys = y + (i - (len(ts) - 1) / 2) * h
            vals, lo, hi = [], [], []
            for k in keys:
                c, r = res.get(t, {}).get(k), res["raw"][k]["value"]
                if c is None or not r:
                    vals.append(np.nan)
                    lo.append(0)
                    hi.append(0)
                    continue
                vals.append(c["value"] / r)
                lo.append((c["value"] - c["min"]) / r)
                hi.append((c["max"] - c["value"]) / r)
            err = [lo, hi] if args.repeat > 1 else None
            bars = ax.barh(ys, vals, h, xerr=err, label=t, color=COLORS.get(t),
                           error_kw={"lw": 0.7, "capsize": 1.5})
            if t in NO_FSYNC_TARGETS and not logx:
                for bar, k in zip(bars, keys):
                    if " write " in f" {k} ":
                        bar.set_hatch("///")
                        bar.set_edgecolor("white")
            if not logx:
                for yy, v, up in zip(ys, vals, hi):
                    if not np.isnan(v) and v + up > FIO_PLOT_XMAX:
                        ax.text(FIO_PLOT_XMAX * 0.985, yy, f"{v:.2f}× (max {v + up:.1f}×) →", ha="right",
                                va="center", fontsize=7,
                                bbox={"facecolor": "white", "alpha": 0.85, "lw": 0, "pad": 0.6})
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        if not logx:
            ax.axvline(FIO_TARGET_RATIO, color="red", lw=1.2, label=f"target: hycache ≥ {FIO_TARGET_RATIO}× raw")
            ax.set_xlim(0, FIO_PLOT_XMAX)
        else:
            ax.set_xscale("log")
        ax.set_yticks(y, keys)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("× raw directory (median; whiskers: min–max of the passes)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle("fs_bench: every target relative to the raw directory", fontsize=11)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def method_lines(args, caches_dropped: bool) -> list[str]:
    return [
        f"- fio ({'median of ' + str(args.repeat) + ' passes, whiskers and ranges: min–max' if args.repeat > 1 else 'one pass'}): "
        f"`--ioengine=psync --direct=0 --invalidate=1 --fallocate=none`, `--end_fsync=1` for writes, "
        f"`--size={args.size}` per job, {' or '.join(map(str, args.numjobs))} concurrent jobs (`jN`), "
        f"`--group_reporting --output-format=json`. Job i has its own file `bench.i`, named "
        f"explicitly (`--name=benchI --filename=DIR/bench.I` per job, not `--numjobs` with "
        f"`--filename_format`, with which fio named a one-job read `bench`, a new file it laid out "
        f"and read back from the page cache, and let the four jobs of a read share that file). "
        f"The files are laid out once per target (sequential 1 MiB writes through the target); "
        f"write jobs overwrite them in place.",
        "- **Cache-neutral.** Size-based jobs, no `time_based`: a job reads or writes each of its "
        f"bytes once (1 MiB rows: the whole file; 4 KiB rows: `--io_size={args.io_4k}` of it, the "
        "random ones on distinct blocks, because fio's random map — on by default — never picks a "
        "block twice), so no read is served from a page cache the job itself filled, as a "
        "time-based job looping over its file was (and fio's invalidation between loops does not "
        "reach a passthrough backing file, so there `hycache` re-read from memory). "
        + ("`sync; echo 3 > /proc/sys/vm/drop_caches` before every job" if caches_dropped
           else "**caches NOT dropped in this run (--warm or not root)**")
        + " and `invalidate=1` (fio drops the file's pages at job start; through passthrough that "
        "stops at the FUSE file, the cache drop covers the backing file): every job starts cold, "
        "on every target, in the FUSE page cache and in the backing ext4's. `end_fsync=1`: a "
        "write job ends with fsync and fio counts it in the job's runtime, so the write-back to "
        "disk is inside the measured time (without it a 256 MiB buffered write measures memcpy "
        "into the page cache). Buffered `direct=0`: what applications use, and O_DIRECT would "
        "bypass exactly the caches that differ between targets. `fallocate=none`: FUSE file "
        "systems answer fallocate differently (mergerfs, pyfuse3's example), the layout must not "
        "depend on it.",
        "- **Quiet before every phase.** After the cache drop, each timed phase (a fio job, a "
        "metadata phase, a serving run, mdtest) waits until the CPUs are at least 90 % idle over "
        "two 0.1 s windows in a row (`quiesce`, at most 15 s): all targets stay mounted, and "
        "without it a phase ran beside the background work the previous phase left to some "
        "target (an agent still removing the blobs of thousands of unlinked files or publishing "
        "them, the kernel writing back), which spread a single writer's creates over 1.3–3.2k/s "
        "between the passes of one run.",
        "- Cache check: for every read job the script counts the bytes read from the work "
        "dir's block device (`/sys/class/block/*/stat`, machine-wide, so other processes and "
        "read-ahead count too) and flags a cell when a pass read less than half of the job's "
        "bytes from the disk: such a job was served from a cache, and the cell is suspect.",
        "- Read-ahead is each target's own: the raw directory gets ext4's on the disk "
        "(`read_ahead_kb` below), the FUSE targets without passthrough get the FUSE mount's "
        "(the kernel's per-mount default, capped by the daemon's max_readahead), `hycache` with "
        "passthrough the backing file's (ext4's again). No knob is changed: size-based random 4 KiB "
        "reads cost one disk read per block on raw and on hycache alike (see Notes).",
        f"- Metadata: {args.files} files of 4 KiB per writer; create = open(O_CREAT|O_EXCL) + "
        "write 4 KiB + close, then stat, then unlink, each phase after a cache drop; "
        f"{' and '.join(map(str, args.writers))} writer(s) = processes, each in its own "
        "directory, released together at a barrier; rate = total operations / wall time of the "
        "slowest writer. `hycache-dht`: publication tail = seconds from the end of the phase "
        "until `hycache-agent status ROOT --json` shows `cluster.backlog` 0 (polled; resolution "
        "about one `status` call, ~0.3 s).",
        "- Every target lives on the same file system (below), so they share one disk; all are "
        "mounted for the whole run; each row runs on every target in turn, so a change in "
        "background load hits every target alike, and the order rotates by one target at every "
        "row and pass: on this virtual disk the first job after a row change reads measurably "
        "slower (the host's cache of the disk warms up; raw read the same 256 MiB at 0.9 and "
        "then 1.3–2.2 GiB/s), and a fixed order made whoever came first look slow. `hycache-dht`'s Redis Cluster (6 local "
        "redis-servers, 3 masters + 3 replicas, append-only files on the same disk) runs for the "
        "whole run" + (" and takes part in the fio rows (--dht-fio)." if args.dht_fio
                      else "; `hycache-dht` takes part in the metadata rows only (fio rows: `--dht-fio`)."),
        "- `pyfuse3-passthrough` is pyfuse3's `examples/passthroughfs.py` from the patched pyfuse3 "
        "source tree the venv was built from, run by the venv's Python — the same pyfuse3 and "
        "libfuse 3.17 build as the agent — with its defaults (no debug, no writeback cache, trio, "
        "one thread). It is an ordinary pyfuse3 file system: it does NOT use kernel passthrough; "
        "every read and write goes through it. It is the framework's floor for metadata. It has "
        "no fsync handler (see † under the table).",
        f"- Small-file serving (issue 17, `bench/smallfiles.py`): {getattr(args, 'serve_files', 0)} files in 16 "
        "directories, sizes log-normal around 8 KiB (sigma 1.5, 128 B – 2 MiB: most under 64 KiB, a few "
        f"% above 256 KiB), written once per target; a trace of {getattr(args, 'serve_requests', 0)} requests, "
        "file popularity Zipf (s = 1), dealt round-robin to "
        f"{' or '.join(map(str, getattr(args, 'readers', [])))} reader processes released at a barrier "
        "after a cache drop; one request = open(O_RDONLY) + read(256 KiB) to EOF + close, timed "
        "alone: `serve mean`/`serve p99` (ms), `serve MB/s` = bytes / wall time of the slowest reader.",
        "- mdtest (the IOR project's, github hpc/ior, built by `scripts/build-mdtest.sh` with Debian's "
        "OpenMPI; the row is left out where it is not built): `mpirun --allow-run-as-root --oversubscribe "
        f"-np {getattr(args, 'mdtest_ranks', 4)} mdtest -n {getattr(args, 'mdtest_files', 1000)} -u -F -w 4096 "
        "-e 4096 -d DIR -i 1` after a cache drop (its phases run back to back, caches warm): create, stat, "
        "read (open + 4 KiB + close), remove; the mean column of its SUMMARY rate table.",
        "- `base-hycache`, `base-hycache-dht` (with `--baseline DIR`): the agent of another checkout "
        "(DIR/.venv, its own pyfuse3 build), mounted beside the others in the same run: before/after "
        "under the same load. Issue 17's floor is checked on `hycache-dht` against `base-hycache-dht`: "
        f"every create, stat, read and remove rate ≥ {RATE_FLOOR:g}× (mdtest read ≥ {MDTEST_READ_FLOOR:g}×), "
        f"the serving mean ≤ {SERVE_MEAN_FLOOR_MS:g} ms; its goal, ≥ mergerfs, beside it.",
        "- Targets of issue 11 checked on the medians: every fio row of `hycache` ≥ "
        f"{FIO_TARGET_RATIO}× raw; `hycache` creates ≥ `pyfuse3-passthrough` creates; "
        f"`hycache-dht` creates ≥ {DHT_CREATE_RATIO}× `hycache` creates (1 and 4 writers).",
    ]


def write_report(res: dict, targets: list[str], args, caches_dropped: bool, info: dict, descriptions: dict,
                 md: Path, png: Path, cmdline: str, elapsed: float, mergerfs_opts: str) -> None:
    rows = table_rows(res, targets, args, "<br>")
    header = ["row", "unit", *targets, "targets (issues 11, 17)"]
    met, total, missed = summary(res, args)
    lines = [
        "# File-system benchmarks",
        "",
        "Generated by `bench/fs_bench.py` — a script with printed results, not a test. "
        "Re-run it to refresh this page:",
        "",
        "```",
        cmdline,
        "```",
        "",
        f"Run: {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}, {elapsed / 60:.1f} min"
        + (" (**--quick**: small files, one pass — indicative only)" if args.quick else ""),
        "",
        "## Results",
        "",
        "Median of the passes, in brackets × the raw directory, below it the spread (min–max) "
        "of the passes. MiB/s for the fio rows (`jN` = numjobs: N files, N processes), "
        "operations/s for the metadata rows (`wN` = N writers), seconds for `hycache-dht`'s "
        "publication tails.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * len(targets) + ["---"]) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [""]
    if any(t in NO_FSYNC_TARGETS for t in targets) and "fio" in args.parts:
        lines += [NO_FSYNC_NOTE, ""]
    if "fio" in args.parts:
        suspects = cache_suspects(res)
        lines += [("Cache check: read jobs that read less than half of their bytes from the disk "
                   f"(served from a cache, so these cells are suspect): {', '.join(suspects)}." if suspects else
                   "Cache check: every read job read at least half of its bytes from the disk "
                   "(`/sys/class/block/*/stat`), i.e. none was served from a cache."), ""]
    if total:
        lines += [f"Targets met: **{met} of {total}**"
                  + (f"; missed: {', '.join(missed)}." if missed else "."), ""]
    lines += [f"![every target relative to the raw directory]({os.path.relpath(png, md.parent)})", "",
              "## Method", ""]
    lines += method_lines(args, caches_dropped)
    lines += ["", "| target | how |", "|---|---|"]
    lines += [f"| {t} | `{descriptions.get(t, '')}` |" for t in targets]
    lines += [
        "",
        f"mergerfs options (chosen to be fair: page cache on as for HyCache, create on the first "
        f"branch = the fast dir, spill to the next branch when full): `{mergerfs_opts}`.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines.append("")
    # A hand-written "## Notes" section (analysis) and the papers' section survive regeneration.
    if md.exists():
        old = md.read_text()
        if NOTES_MARKER in old:
            lines += ["", old[old.index(NOTES_MARKER):].rstrip(), ""]
        if PAPERS_MARKER in old and RESULTS_MARKER in old[old.index(PAPERS_MARKER):]:
            start = old.index(PAPERS_MARKER)
            papers = old[start:old.index(RESULTS_MARKER, start)].rstrip()
            at = lines.index(RESULTS_MARKER)
            lines[at:at] = [papers, ""]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))

#!/usr/bin/env python3
"""File-system benchmark: the raw fast directory vs mergerfs vs a HyCache mount, in one run.

For every target it runs fio (Debian package, --output-format=json):

  * sequential read and write at 4 KiB and 1 MiB, random 4 KiB read and write,
  * each with numjobs 1 and 4 (one file of --size per job, ioengine psync, buffered I/O),
  * time-based (--runtime seconds), starting cold: files are laid out first, then
    `sync; echo 3 > /proc/sys/vm/drop_caches` before every job; writes end with fsync
    (end_fsync=1) so dirty page-cache data is counted;

and a metadata loop (Python): create N small files (4 KiB each), stat them (after dropping
caches), remove them, reported as operations per second.

Targets (all on the file system of --workdir, so they share the same disk):
  raw       a plain directory (the limit: what the fast tier does on its own)
  slow      a plain "slow" directory (same disk on a one-disk machine; opt-in)
  mergerfs  mergerfs -o MERGERFS_OPTS fast:slow mnt (an existing FUSE fs as the peer)
  hycache   hycache-agent mount ROOT MNT --fast-capacity 64G --passthrough on (everything on
            the fast tier; reads and writes go kernel -> blob)
  hycache-nopt  the same with --passthrough off (every read and write through the agent,
            kernel writeback cache on)

Results: a table on stdout (value, % of raw, goal check), a Markdown report (--out,
default docs/benchmarks.md), a plot next to it (img/bench_fs.png) and the raw numbers as
JSON in the work directory. Goals for hycache: >= 80 % of raw at 1 MiB sequential, >= 50 %
at 4 KiB, and at least mergerfs everywhere.

Mounts are always unmounted on exit, Ctrl-C and SIGTERM included.
This is a script with printed results, never a test with timed assertions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fusemount import force_unmount, is_mounted, stop_daemon  # bench/fusemount.py, shared with tests/conftest.py

REPO = Path(__file__).resolve().parent.parent
AGENT_BIN = REPO / ".venv" / "bin" / "hycache-agent"

MERGERFS_OPTS = ("allow_other,default_permissions,category.create=ff,cache.files=partial,"
                 "dropcacheonclose=false,moveonenospc=true,fsname=mergerfs-bench")
HYCACHE_FAST_CAPACITY = "64G"

NOTES_MARKER = "## Notes"  # hand-written section of the report, kept when it is regenerated

ALL_TARGETS = ["raw", "slow", "mergerfs", "hycache", "hycache-nopt"]
DEFAULT_TARGETS = ["raw", "mergerfs", "hycache", "hycache-nopt"]

# name, fio rw, block size, goal (fraction of raw) for hycache or None
WORKLOADS = [
    ("seq read 1M", "read", "1m", 0.80),
    ("seq write 1M", "write", "1m", 0.80),
    ("seq read 4K", "read", "4k", 0.50),
    ("seq write 4K", "write", "4k", 0.50),
    ("rand read 4K", "randread", "4k", 0.50),
    ("rand write 4K", "randwrite", "4k", 0.50),
]
META_OPS = ["create", "stat", "remove"]


# ============================================================================ helpers
def log(msg: str) -> None:
    print(f"[fs_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, text=True, capture_output=True, **kw)


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


class Caches:
    """sync + drop the page, dentry and inode caches (root only; otherwise runs are warm)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and os.access("/proc/sys/vm/drop_caches", os.W_OK)
        if enabled and not self.enabled:
            log("cannot write /proc/sys/vm/drop_caches (not root?): runs start with warm caches")

    def drop(self) -> None:
        os.sync()
        if self.enabled:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")


def mounts_under(root: Path) -> list[Path]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = Path(line.split()[1].replace("\\040", " "))
            if mp == root or root in mp.parents:
                out.append(mp)
    return out


# ============================================================================ targets
@dataclass
class Target:
    name: str
    base: Path                 # scratch dir for this target
    path: Path | None = None   # where the benchmark files go
    proc: subprocess.Popen | None = None
    mountpoint: Path | None = None
    logfile: Path | None = None
    description: str = ""
    argv: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ set up
    def start(self) -> None:
        if self.base.exists():
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)
        if self.name in ("raw", "slow"):
            self.path = self.base / "dir"
            self.path.mkdir()
            self.description = f"plain directory {self.path}"
            return
        fast, slow, mnt = self.base / "fast", self.base / "slow", self.base / "mnt"
        for d in (fast, slow, mnt):
            d.mkdir()
        if self.name == "mergerfs":
            self.argv = ["mergerfs", "-f", "-o", MERGERFS_OPTS, f"{fast}:{slow}", str(mnt)]
        elif self.name in ("hycache", "hycache-nopt"):
            if not AGENT_BIN.exists():
                raise RuntimeError(f"{AGENT_BIN} missing: run scripts/bootstrap.sh")
            # ROOT/fast and ROOT/slow: the same layout as mergerfs' branches.
            self.argv = [str(AGENT_BIN), "mount", str(self.base), str(mnt),
                         "--fast-capacity", HYCACHE_FAST_CAPACITY, "--log-level", "warning",
                         "--passthrough", "on" if self.name == "hycache" else "off"]
        else:
            raise ValueError(self.name)
        self.description = shlex.join(self.argv)
        self.logfile = self.base.parent / f"{self.name}.log"
        with open(self.logfile, "wb") as out:
            # Own session: a terminal Ctrl-C reaches us, and we unmount in order.
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.mountpoint = mnt
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before mounting:\n"
                                   + self.logfile.read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not mount within 30 s:\n"
                                   + self.logfile.read_text(errors="replace")[-3000:])
            time.sleep(0.05)
        self.path = mnt / "bench"
        self.path.mkdir()

    # ------------------------------------------------------------------ tear down
    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if stop_daemon(self.proc, self.mountpoint, timeout=30) != 0:
                log(f"{self.name} exited {self.proc.returncode} (log: {self.logfile})")
        if self.mountpoint is not None:
            force_unmount(self.mountpoint)
        shutil.rmtree(self.base, ignore_errors=True)

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None


# ============================================================================ measuring
def fio(path: Path, name: str, rw: str, bs: str, numjobs: int, size: str, runtime: float | None,
        extra: list[str] = ()) -> dict:
    argv = ["fio", f"--name={name}", f"--directory={path}", "--filename_format=bench.$jobnum",
            f"--rw={rw}", f"--bs={bs}", f"--size={size}", f"--numjobs={numjobs}",
            "--ioengine=psync", "--direct=0", "--fallocate=none", "--end_fsync=1",
            "--group_reporting", "--output-format=json", *extra]
    if runtime:
        argv += ["--time_based", f"--runtime={runtime}"]
    timeout = (runtime or 0) + 600
    # fio forks one process per job: run it in its own process group and kill the whole
    # group on any interruption, so no job keeps a file open on a mount we unmount.
    p = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        raise
    if p.returncode != 0:
        raise RuntimeError(f"fio failed ({p.returncode}): {shlex.join(argv)}\n{stderr[-2000:]}")
    out = stdout[stdout.index("{"):]  # fio may print notes before the JSON
    job = json.loads(out)["jobs"][0]
    side = job["read"] if rw.endswith("read") else job["write"]
    return {"bw_bytes": side["bw_bytes"], "iops": side["iops"], "runtime_ms": side["runtime"],
            "io_bytes": side["io_bytes"], "argv": shlex.join(argv)}


def metadata_loop(path: Path, n: int, caches: Caches) -> dict[str, float]:
    d = path / "meta"
    d.mkdir()
    payload = b"x" * 4096
    names = [str(d / f"f{i:06d}") for i in range(n)]
    caches.drop()
    t0 = time.perf_counter()
    for p in names:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, payload)
        os.close(fd)
    t1 = time.perf_counter()
    caches.drop()
    t2 = time.perf_counter()
    for p in names:
        os.stat(p)
    t3 = time.perf_counter()
    caches.drop()
    t4 = time.perf_counter()
    for p in names:
        os.unlink(p)
    t5 = time.perf_counter()
    os.rmdir(d)
    return {"create": n / (t1 - t0), "stat": n / (t3 - t2), "remove": n / (t5 - t4)}


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def bench_all(targets: list[Target], args, caches: Caches) -> dict:
    """Interleaved: for each workload, every target in turn (so a change in background load
    hits all targets alike); --repeat passes over everything, the median is reported."""
    samples: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets}
    extra: dict[str, dict[str, dict]] = {t.name: {} for t in targets}
    maxjobs = max(args.numjobs)
    for t in targets:
        log(f"{t.name}: laying out {maxjobs} x {args.size} in {t.path}")
        fio(t.path, "layout", "write", "1m", maxjobs, args.size, None)
    for rep in range(args.repeat):
        for label, rw, bs, _goal in WORKLOADS:
            for nj in args.numjobs:
                key = f"{label} j{nj}"
                for t in targets:
                    caches.drop()
                    r = fio(t.path, "bench", rw, bs, nj, args.size, args.runtime)
                    samples[t.name].setdefault(key, []).append(r["bw_bytes"] / 2**20)
                    extra[t.name][key] = {"iops": r["iops"], "argv": r["argv"]}
                    log(f"[{rep + 1}/{args.repeat}] {t.name:8} {key:18} {r['bw_bytes'] / 2**20:9.1f} MiB/s "
                        f"{r['iops']:10.0f} IOPS")
                    if not t.alive():
                        raise RuntimeError(f"{t.name} died during {key}; log: {t.logfile}")
        for t in targets:
            meta = metadata_loop(t.path, args.files, caches)
            for op, v in meta.items():
                samples[t.name].setdefault(f"{op} files", []).append(v)
                log(f"[{rep + 1}/{args.repeat}] {t.name:8} {op + ' files':18} {v:9.0f} ops/s")
    results: dict[str, dict] = {}
    for t in targets:
        for f in t.path.glob("bench.*"):
            f.unlink()
        results[t.name] = {}
        for key, xs in samples[t.name].items():
            results[t.name][key] = {"value": median(xs), "samples": xs,
                                    "unit": "ops/s" if key.endswith(" files") else "MiB/s",
                                    **extra[t.name].get(key, {})}
    return results


# ============================================================================ reporting
def row_keys(args) -> list[tuple[str, float | None]]:
    keys = [(f"{label} j{nj}", goal) for label, _rw, _bs, goal in WORKLOADS for nj in args.numjobs]
    return keys + [(f"{op} files", None) for op in META_OPS]


def verdict(res: dict, key: str, goal: float | None) -> tuple[str, bool | None]:
    """Goal check for hycache: fraction of raw, and at least mergerfs."""
    if "hycache" not in res or key not in res["hycache"]:
        return "", None
    hv = res["hycache"][key]["value"]
    parts, ok = [], True
    if goal is not None and "raw" in res:
        want = goal * res["raw"][key]["value"]
        ok &= hv >= want
        parts.append(f"≥{goal:.0%} raw")
    if "mergerfs" in res:
        ok &= hv >= res["mergerfs"][key]["value"]
        parts.append("≥ mergerfs")
    if not parts:
        return "", None
    return " & ".join(parts), ok


def fmt(v: float, unit: str) -> str:
    return f"{v:,.0f}" if unit == "ops/s" or v >= 100 else f"{v:,.1f}"


def table_rows(res: dict, targets: list[str], args) -> list[list[str]]:
    rows = []
    for key, goal in row_keys(args):
        unit = next(res[t][key]["unit"] for t in targets if key in res.get(t, {}))
        row = [key, unit]
        for t in targets:
            if key not in res.get(t, {}):
                row.append("—")
                continue
            v = res[t][key]["value"]
            cell = fmt(v, unit)
            if t != "raw" and "raw" in res and key in res["raw"]:
                cell += f" ({v / res['raw'][key]['value']:.0%})"
            row.append(cell)
        goal_txt, ok = verdict(res, key, goal)
        row.append("" if ok is None else f"{'PASS' if ok else 'MISS'} ({goal_txt})")
        rows.append(row)
    return rows


def print_table(res: dict, targets: list[str], args) -> None:
    from rich.console import Console
    from rich.table import Table

    tbl = Table(title="fs_bench: throughput (and % of raw fast dir)")
    for col in ["workload", "unit", *targets, "hycache goal"]:
        tbl.add_column(col, justify="left" if col in ("workload", "unit", "hycache goal") else "right")
    for row in table_rows(res, targets, args):
        style = "green" if row[-1].startswith("PASS") else "red" if row[-1].startswith("MISS") else None
        tbl.add_row(*row[:-1], f"[{style}]{row[-1]}[/{style}]" if style else row[-1])
    Console(width=None if sys.stdout.isatty() else 150).print(tbl)


def machine_info(workdir: Path) -> dict[str, str]:
    info = {}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "?"
    info["CPU"] = f"{cpu}, {os.cpu_count()} cores"
    try:
        mem_kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        info["RAM"] = f"{mem_kb / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    try:
        osname = next(line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                      if line.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        osname = platform.system()
    info["OS / kernel"] = f"{osname}, Linux {platform.release()}"
    fm = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(workdir)]).stdout.strip()
    info["work dir file system"] = f"{workdir}: {fm}"
    info["fio"] = run(["fio", "--version"]).stdout.strip()
    mv = run(["mergerfs", "--version"])
    info["mergerfs"] = (mv.stdout or mv.stderr).strip().splitlines()[0] if shutil.which("mergerfs") else "-"
    info["python"] = platform.python_version()
    info["HyCache commit"] = run(["git", "-C", str(REPO), "describe", "--always", "--dirty"]).stdout.strip()
    return info


def plot(res: dict, targets: list[str], args, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = row_keys(args)
    others = [t for t in targets if t != "raw"]
    if "raw" not in res or not others:
        return
    labels = [k for k, _ in keys]
    y = np.arange(len(labels))
    h = 0.8 / len(others)
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(labels) + 1.6))
    colors = {"mergerfs": "#8c8c8c", "hycache": "#1f77b4", "hycache-nopt": "#9ecae1", "slow": "#ff7f0e"}
    for i, t in enumerate(others):
        vals = [100 * res[t][k]["value"] / res["raw"][k]["value"] if k in res.get(t, {}) else 0 for k in labels]
        ax.barh(y + (i - (len(others) - 1) / 2) * h, vals, h, label=t, color=colors.get(t))
    for j, (_k, goal) in enumerate(keys):
        if goal is not None:
            ax.plot([goal * 100] * 2, [j - 0.45, j + 0.45], color="red", lw=1.2)
    ax.axvline(100, color="black", lw=0.8, ls="--")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("% of raw fast directory (red ticks: HyCache goals)")
    ax.set_title("fs_bench: throughput relative to the raw fast directory")
    ax.legend(loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def write_report(res: dict, targets: list[str], args, info: dict, descriptions: dict, md: Path,
                 png: Path, cmdline: str, elapsed: float) -> None:
    rows = table_rows(res, targets, args)
    header = ["workload", "unit", *targets, "hycache goal"]
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
        + (" (**--quick**: small files, short runs — indicative only)" if args.quick else ""),
        "",
        "## Results",
        "",
        "Throughput in MiB/s (fio) or operations per second (metadata loop); in brackets the "
        "share of the raw fast directory. Goals for HyCache: ≥ 80 % of raw at 1 MiB sequential, "
        "≥ 50 % at 4 KiB, and at least mergerfs everywhere. `jN` = fio numjobs (N files, N "
        "processes).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * len(targets) + ["---"]) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(row) + " |")
    missed = [r[0] for r in rows if r[-1].startswith("MISS")]
    lines += [""]
    if "hycache" in targets:
        lines.append(f"HyCache goals missed: {len(missed)} of {sum(1 for r in rows if r[-1])}"
                     + (f" ({', '.join(missed)})." if missed else "."))
        lines.append("")
    lines += [f"![relative throughput]({os.path.relpath(png, md.parent)})", "", "## Method", ""]
    lines += [
        f"- fio: `ioengine=psync`, buffered I/O (`direct=0`), `fallocate=none`, `end_fsync=1`, "
        f"`--size={args.size}` per job, time-based `--runtime={args.runtime}` s, numjobs "
        f"{', '.join(map(str, args.numjobs))}, `group_reporting`, `--output-format=json`; "
        f"median of {args.repeat} pass(es). "
        "Files are laid out once per target (sequential 1 MiB writes, through the target); "
        "the write jobs overwrite them.",
        "- Cold start: `sync; echo 3 > /proc/sys/vm/drop_caches` before every job"
        + ("" if args.drop_caches else " (**disabled for this run: --warm**)")
        + ". A time-based run loops over its file, so later passes of a sequential read can hit "
          "the page cache; this is the same for every target.",
        f"- Metadata: {args.files} files of 4 KiB in one directory: create (open O_CREAT|O_EXCL, "
        "write, close), stat, unlink, from one Python process; caches dropped before each phase.",
        "- Every target lives on the same file system (below), so they share one disk: `raw` is the "
        "limit a tier-over-the-fast-dir can reach. All targets are mounted for the whole run and "
        "the jobs are interleaved (each workload on every target in turn), so changes in "
        "background load hit every target alike. The machine is shared: see the load average "
        "below; numbers move by ±30 % between runs on a busy 2-core machine.",
        "",
        "| target | how |",
        "|---|---|",
    ]
    for t in targets:
        lines.append(f"| {t} | `{descriptions.get(t, '')}` |")
    lines += [
        "",
        f"mergerfs options (chosen to be fair: page cache on as for HyCache, create on the first "
        f"branch = the fast dir, spill to the next branch when full): `{MERGERFS_OPTS}`.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    for k, v in info.items():
        lines.append(f"| {k} | {v} |")
    lines.append("")
    # A hand-written "## Notes" section (analysis) survives regeneration.
    if md.exists():
        old = md.read_text()
        if NOTES_MARKER in old:
            lines += ["", old[old.index(NOTES_MARKER):].rstrip(), ""]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))


# ============================================================================ main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: .venv/bin/python bench/fs_bench.py --quick --targets raw,mergerfs",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help=f"comma-separated, from {','.join(ALL_TARGETS)} (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="small files, 1 s runs, 300 metadata files (~1-2 min); "
                         "writes to .work/bench/quick/ unless --out is given")
    ap.add_argument("--out", type=Path, default=None,
                    help="Markdown report (default docs/benchmarks.md; the plot goes to "
                         "img/bench_fs.png beside it)")
    ap.add_argument("--workdir", type=Path, default=REPO / ".work" / "bench",
                    help="scratch directory; every target lives under it (default: %(default)s)")
    ap.add_argument("--size", default=None, help="file size per fio job (default 256M, quick 32M)")
    ap.add_argument("--runtime", type=float, default=None, help="seconds per fio job (default 5, quick 1)")
    ap.add_argument("--numjobs", default="1,4", help="fio numjobs values (default: %(default)s)")
    ap.add_argument("--files", type=int, default=None, help="metadata loop files (default 2000, quick 300)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes over all workloads; the median is reported (default: %(default)s)")
    ap.add_argument("--warm", dest="drop_caches", action="store_false",
                    help="do not drop the page cache before each job")
    a = ap.parse_args(argv)
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    bad = [t for t in a.targets if t not in ALL_TARGETS]
    if bad:
        ap.error(f"unknown target(s) {bad}; choose from {ALL_TARGETS}")
    a.targets = [t for t in ALL_TARGETS if t in a.targets]  # raw first
    a.numjobs = [int(x) for x in a.numjobs.split(",")]
    a.size = a.size or ("32M" if a.quick else "256M")
    a.runtime = a.runtime or (1 if a.quick else 5)
    a.files = a.files or (300 if a.quick else 2000)
    if a.out is None:
        a.out = (REPO / ".work" / "bench" / "quick" / "benchmarks.md") if a.quick else (REPO / "docs" / "benchmarks.md")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    cmdline = "python bench/fs_bench.py " + " ".join(shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))
    for tool in ["fio"] + (["mergerfs"] if "mergerfs" in args.targets else []) \
            + (["fusermount3"] if set(args.targets) & {"mergerfs", "hycache", "hycache-nopt"} else []):
        if shutil.which(tool) is None:
            print(f"fs_bench: {tool} not found: run scripts/bootstrap.sh", file=sys.stderr)
            return 2
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for mp in mounts_under(workdir):  # leftovers of a killed run
        log(f"unmounting stale {mp}")
        force_unmount(mp)
    free = shutil.disk_usage(workdir).free
    need = 2 * max(args.numjobs) * parse_size(args.size) + (64 << 20)
    if free < need:
        print(f"fs_bench: {workdir} has {free >> 20} MiB free, needs {need >> 20} MiB", file=sys.stderr)
        return 2

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    caches = Caches(args.drop_caches)
    descriptions: dict[str, str] = {}
    t_start = time.monotonic()
    load_before = os.getloadavg()
    started: list[Target] = []
    try:
        for name in args.targets:
            t = Target(name, workdir / name)
            started.append(t)
            log(f"starting {name}")
            t.start()
            descriptions[name] = t.description
        res = bench_all(started, args, caches)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    except Exception as e:
        log(f"error: {e}")
        for t in started:
            if t.logfile and t.logfile.exists():
                log(f"{t.name} log tail:\n" + t.logfile.read_text(errors="replace")[-2000:])
        return 1
    finally:
        for t in reversed(started):
            t.stop()
        for mp in mounts_under(workdir):
            force_unmount(mp)
    elapsed = time.monotonic() - t_start
    load_after = os.getloadavg()

    print_table(res, args.targets, args)
    info = machine_info(workdir)
    info["load average (1 min) before / after"] = f"{load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} cores"
    md = args.out.resolve()
    png = md.parent / "img" / "bench_fs.png"
    raw_json = workdir / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    raw_json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "machine": info,
                                    "descriptions": descriptions, "results": res}, indent=1))
    plot(res, args.targets, args, png)
    write_report(res, args.targets, args, info, descriptions, md, png, cmdline, elapsed)
    log(f"done in {elapsed / 60:.1f} min: {md}, {png}, {raw_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

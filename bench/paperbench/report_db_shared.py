"""The tables and figures of the ``db`` and ``shared`` rows (report.py calls these)."""

from __future__ import annotations

from pathlib import Path

from .report import _num, _ratio, _save, _table
from .targets import LABELS

SHARED_LABELS = {"alone": "shared device alone", "fast": "local disk alone (ceiling)", "hycache": "HyCache",
                 "juicefs": "JuiceFS (one volume)"}
DB_METRICS = [("select", "tps", "pgbench -S (read-only), TPS"), ("tpcb", "tps", "pgbench TPC-B, TPS"),
              ("select", "latency_ms", "pgbench -S latency, ms"), ("tpcb", "latency_ms", "pgbench TPC-B latency, ms")]


def _why(error: str) -> str:
    """A failure's first line and the server's first ERROR or FATAL line."""
    lines = error.splitlines()
    logged = [line for line in lines if "ERROR:" in line or "FATAL:" in line]
    return lines[0][:200] + (f" (server: {logged[0][-200:]})" if logged else "")


def db_table(res: dict) -> list[str]:
    db = res["rows"].get("db")
    if not db:
        return []
    names = [n for n in res["targets"] if n in db["targets"]]
    got = {n: db["targets"][n] for n in names}
    head = ["db row", *[LABELS[n] for n in names], "HyCache vs HDD", "HyCache vs JuiceFS"]
    rows = []
    for phase, key, label in DB_METRICS:
        cells = {n: got[n][phase][key] if phase in got[n] else None for n in names}
        h, hdd, jfs = cells.get("hycache"), cells.get("hdd"), cells.get("juicefs")
        lower = key == "latency_ms"  # a speedup: the other's latency over HyCache's
        rows.append([label, *[_num(cells[n]) for n in names],
                     _ratio(hdd, h) if lower else _ratio(h, hdd), _ratio(jfs, h) if lower else _ratio(h, jfs)])
    load = {n: got[n].get("load_s") for n in names}
    rows.append(["pgbench -i (load + CHECKPOINT), s", *[_num(load[n]) for n in names],
                 _ratio(load.get("hdd"), load.get("hycache")), _ratio(load.get("juicefs"), load.get("hycache"))])
    size = max((g.get("db_mb", 0) for g in got.values()), default=0)
    note = (f"scale {db['scale']}, {db['partitions']} partitions, database {size:,.0f} MB, fast tiers "
            f"{db['fast_mib']} MiB, {db['clients']} clients, {db['seconds']} s per phase")
    errors = [f"{n}: {_why(got[n]['error'])}" for n in names if "error" in got[n]]
    return ["", note, "", *_table(head, rows), *[f"- failed: {e}" for e in errors]]


def shared_table(res: dict) -> list[str]:
    sh = res["rows"].get("shared")
    if not sh:
        return []
    n = sh["nodes"]
    head = ["shared store, aggregate MB/s", "1 node, 1st pass", f"{n} nodes, 1st pass", "1 node, re-reads",
            f"{n} nodes, re-reads", f"re-reads {n}/1", "1 node, all passes", f"{n} nodes, all passes",
            f"all passes {n}/1"]
    rows = []
    for kind, label in SHARED_LABELS.items():
        one, many = sh["configs"].get(f"{kind}1"), sh["configs"].get(f"{kind}{n}")
        if not one or not many:
            continue
        rows.append([label, _num(one["cold_mbps"]), _num(many["cold_mbps"]), _num(one["warm_mbps"]),
                     _num(many["warm_mbps"]), _ratio(many["warm_mbps"], one["warm_mbps"]),
                     _num(one["overall_mbps"]), _num(many["overall_mbps"]),
                     _ratio(many["overall_mbps"], one["overall_mbps"])])
    note = (f"{sh['files']} files of {sh['file_mib']} MiB per node ({sh['set_mb_per_node']:,.0f} MB), fast tiers "
            f"{sh['fast_mib']} MiB, {sh['passes']} passes; one shared device: {sh['device']}")
    waits = [f"{label} x{k[len(kind):]} {max(c['settle_s']):.2f} s" for kind, label in SHARED_LABELS.items()
             for k, c in sh["configs"].items() if k.startswith(kind) and k[len(kind):].isdigit() and any(c.get("settle_s", []))]
    if waits:  # the promotions a pass started, still copying when its readers were done
        note += "; waited before a re-read for the promotions to finish, at most: " + ", ".join(waits)
    return ["", note, "", *_table(head, rows)]


def figures(res: dict, img: Path, prefix: str, plt) -> list[Path]:
    made = []
    db = res["rows"].get("db")
    if db:
        names = [n for n in res["targets"] if "select" in db["targets"].get(n, {})]
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for ax, (phase, title) in zip(axes, (("select", "pgbench -S (read-only)"), ("tpcb", "pgbench TPC-B")),
                                      strict=True):
            ax.bar([LABELS[n] for n in names], [db["targets"][n][phase]["tps"] for n in names])
            if "hdd" in names:
                ax.axhline(1.15 * db["targets"]["hdd"][phase]["tps"], color="k", ls="--",
                           label="goal: 1.15x HDD Ext4 (journal Fig. 17)")
                ax.legend(fontsize=8)
            ax.set_ylabel("TPS")
            ax.set_title(f"{title}: {db['scale']} scale, {db['fast_mib']} MiB fast tiers")
            ax.tick_params(axis="x", labelsize=7, rotation=20)
        made.append(_save(plt, fig, img / f"{prefix}_fig17_db.png"))
    sh = res["rows"].get("shared")
    if sh:
        n = sh["nodes"]
        kinds = [k for k in SHARED_LABELS if f"{k}1" in sh["configs"]]
        fig, ax = plt.subplots(figsize=(9, 4))
        xs = range(len(kinds))
        for j, (nodes, what) in enumerate(((1, "warm_mbps"), (n, "warm_mbps"), (1, "overall_mbps"),
                                           (n, "overall_mbps"))):
            ys = [sh["configs"][f"{k}{nodes}"][what] for k in kinds]
            label = f"{nodes} node{'s' if nodes > 1 else ''}, {'re-reads' if what == 'warm_mbps' else 'all passes'}"
            ax.bar([x + (j - 1.5) * 0.2 for x in xs], ys, width=0.2, label=label)
        ax.set_xticks(list(xs), [SHARED_LABELS[k] for k in kinds], fontsize=8)
        ax.set_ylabel("aggregate MB/s")
        ax.set_title(f"one shared slow store, 1 and {n} nodes (HyCache+ §IV)")
        ax.legend(fontsize=8)
        made.append(_save(plt, fig, img / f"{prefix}_shared_store.png"))
    return made

"""The matrix's tables (Markdown) and one PNG per paper figure, the papers' numbers beside
ours.  The papers' numbers are those their text states (the HyCache paper, and the journal
version's Table 2 / Fig. 12-14); ratios are against HDD Ext4 measured in the same run."""

from __future__ import annotations

from pathlib import Path

from . import hitratio
from .targets import LABELS

# what the papers report (speedup over their HDD Ext4, or absolute numbers)
PAPER = {
    "seq_speedup": {"4k": 0.5, "16m": {"read": 2.2, "write": 2.18}, "other": 2.0},
    "iops": {"hycache": 14878, "hdd": 195},
    "aggregate_12": {"hycache_64k": 578, "hdd_64k": 86, "hycache_4k": 306},
    "cold_vs_hdd": 1.0,
    "postmark": "up to 18 % over a hybrid drive; speedup falls as the set outgrows the 4 GB cache",
}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *["| " + " | ".join(r) + " |" for r in rows]]


def tables(res: dict) -> list[str]:
    """The Markdown tables of every row the run has."""
    names = res["targets"]
    head = ["row", *[LABELS[n] for n in names], "HyCache vs HDD", "HyCache vs JuiceFS"]
    out: list[str] = []
    r = res["rows"]

    def line(label: str, cells: dict, seconds: bool = False) -> list[str]:
        """A row of values; the ratios are speedups (for times: the other's time / HyCache's)."""
        vals = [cells.get(n) for n in names]
        h, hdd, jfs = cells.get("hycache"), cells.get("hdd"), cells.get("juicefs")
        if seconds:
            return [label, *[_num(v) for v in vals], _ratio(hdd, h), _ratio(jfs, h)]
        return [label, *[_num(v) for v in vals], _ratio(h, hdd), _ratio(h, jfs)]

    rows: list[list[str]] = []
    if "seq" in r:
        for op in ("write", "read"):
            for bs in res["params"]["seq_sizes"]:
                rows.append(line(f"seq {op} {bs}, MB/s", {n: r["seq"][n][op].get(bs) for n in names}))
    if "iops" in r:
        rows.append(line("4 KiB random writes + fsync, IOPS", {n: r["iops"][n]["randwrite"] for n in names}))
        rows.append(line("4 KiB random reads O_DIRECT, IOPS", {n: r["iops"][n]["randread"] for n in names}))
    if "aggregate" in r:
        for bs in ("4k", "64k"):
            for c in res["params"]["counts"]:
                rows.append(line(f"aggregate read {bs} x{c}, MB/s", {n: r["aggregate"][n][bs].get(str(c))
                                                                      for n in names}))
    if "cold" in r:
        rows.append(line(f"cold read {res['params']['cold_size']}, MB/s", {n: r["cold"][n]["mbps"] for n in names}))
    if "postmark" in r:
        for f in res["params"]["factors"]:
            key = f"{f:g}"
            cells = {n: r["postmark"][n][key]["total_s"] for n in names}
            mb = r["postmark"][names[0]][key]["set_mb"]
            rows.append(line(f"PostMark {f:g}x fast tier ({mb:,.0f} MB), s", cells, seconds=True))
    if "postmark_small" in r:
        rows.append(line("PostMark small set, s", {n: r["postmark_small"][n]["total_s"] for n in names},
                         seconds=True))
    if rows:
        out += _table(head, rows)
    if "hitratio" in r:
        out += ["", *hitratio.table(r["hitratio"])] if out else hitratio.table(r["hitratio"])
    from . import report_db_shared  # it imports this module's helpers

    return out + report_db_shared.db_table(res) + report_db_shared.shared_table(res)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figures(res: dict, img: Path, prefix: str = "papers") -> list[Path]:
    """One PNG per paper figure the run has data for; returns their paths."""
    img.mkdir(parents=True, exist_ok=True)
    made = []
    r, names = res["rows"], res["targets"]
    plt = _plt()
    if "seq" in r and "hdd" in names:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        sizes = res["params"]["seq_sizes"]
        for ax, op in zip(axes, ("read", "write"), strict=True):
            for n in names:
                ys = [(r["seq"][n][op].get(bs) or 0) / (r["seq"]["hdd"][op].get(bs) or 1) for bs in sizes]
                ax.plot(sizes, ys, marker="o", label=LABELS[n])
            paper = [PAPER["seq_speedup"]["4k"] if bs == "4k" else PAPER["seq_speedup"]["16m"][op]
                     if bs == "16m" else PAPER["seq_speedup"]["other"] for bs in sizes]
            ax.plot(sizes, paper, "k--", label="paper: HyCache / HDD Ext4")
            ax.set_yscale("log")
            ax.set_title(f"IOzone-style {op} (HyCache Fig. 7-8): speedup over HDD Ext4")
            ax.set_xlabel("block size")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        made.append(_save(plt, fig, img / f"{prefix}_fig7_8_bandwidth.png"))
    if "iops" in r:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [LABELS[n] for n in names] + ["paper: HyCache", "paper: HDD Ext4"]
        vals = [r["iops"][n]["randwrite"] for n in names] + [PAPER["iops"]["hycache"], PAPER["iops"]["hdd"]]
        ax.bar(labels, vals, color=["C0"] * len(names) + ["0.6", "0.6"])
        ax.set_yscale("log")
        ax.set_ylabel("4 KiB random-write IOPS (fsync included)")
        ax.set_title("IOPS (HyCache Table II / journal Table 2)")
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        made.append(_save(plt, fig, img / f"{prefix}_table2_iops.png"))
    if "aggregate" in r:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        counts = res["params"]["counts"]
        for ax, bs in zip(axes, ("4k", "64k"), strict=True):
            for n in names:
                ax.plot(counts, [r["aggregate"][n][bs].get(str(c)) for c in counts], marker="o", label=LABELS[n])
            if bs == "64k":
                ax.plot([12], [PAPER["aggregate_12"]["hycache_64k"]], "k*", ms=12, label="paper: HyCache, 12 procs")
                ax.plot([12], [PAPER["aggregate_12"]["hdd_64k"]], "kx", ms=10, label="paper: HDD Ext4, 12 procs")
            else:
                ax.plot([12], [PAPER["aggregate_12"]["hycache_4k"]], "k*", ms=12, label="paper: HyCache limit")
            ax.set_yscale("log")
            ax.set_title(f"aggregate read bandwidth, {bs} (HyCache Fig. 9)")
            ax.set_xlabel("processes")
            ax.set_ylabel("MB/s")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=8)
        made.append(_save(plt, fig, img / f"{prefix}_fig9_aggregate.png"))
    if "postmark" in r and "hdd" in names:
        fig, ax = plt.subplots(figsize=(8, 4))
        fs = res["params"]["factors"]
        for n in names:
            ax.plot(fs, [r["postmark"]["hdd"][f"{f:g}"]["total_s"] / r["postmark"][n][f"{f:g}"]["total_s"]
                         for f in fs], marker="o", label=LABELS[n])
        ax.axhline(1.0, color="k", ls="--", label="HDD Ext4 (goal: above it)")
        ax.axhline(1.18, color="0.5", ls=":", label="paper: up to 1.18x (over a hybrid drive)")
        ax.set_xlabel("data set / fast tier")
        ax.set_ylabel("speedup over HDD Ext4 (time)")
        ax.set_yscale("log")
        ax.set_title("PostMark sweep (HyCache Fig. 11-12)")
        ax.legend(fontsize=8)
        made.append(_save(plt, fig, img / f"{prefix}_fig11_postmark.png"))
    if "hitratio" in r:
        made.append(hitratio.figure(plt, r["hitratio"], img / f"{prefix}_hitratio.png"))
    from . import report_db_shared

    return made + report_db_shared.figures(res, img, prefix, plt)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

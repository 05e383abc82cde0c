"""Presenting a :class:`Simulation`: a rich table, and a matplotlib figure."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..sizes import format_size
from .runner import Simulation


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:,.2f} h"
    if s >= 60:
        return f"{s / 60:,.1f} min"
    return f"{s:,.2f} s"


def render_table(sim: Simulation, console: Console) -> None:
    t = sim.trace
    m = sim.model
    table = Table(
        title=(
            f"{len(t):,} references, {t.distinct_files:,} files, {format_size(t.total_bytes)} accessed; "
            f"cache {format_size(sim.capacity)}"
        ),
        title_justify="left",
    )
    for col, just in [
        ("policy", "left"), ("hits", "right"), ("misses", "right"), ("hit ratio", "right"),
        ("byte hit ratio", "right"), ("slow read", "right"), ("slow written", "right"),
        ("modelled time", "right"), ("slow-tier time", "right"), ("× optimal", "right"),
    ]:
        table.add_column(col, justify=just, no_wrap=col == "policy")  # type: ignore[arg-type]
    opt = sim.results.get("optimal")
    opt_time = opt.stats.modelled_seconds(m) if opt else None
    for name, r in sim.results.items():
        st = r.stats
        d = st.as_dict(m)
        vs = ""
        if opt_time:
            vs = f"{st.modelled_seconds(m) / opt_time:.2f}"
        table.add_row(
            name,
            f"{st.hits:,}",
            f"{st.misses:,}",
            f"{d['hit_ratio']:.2%}",
            f"{d['byte_hit_ratio']:.2%}",
            format_size(st.slow_bytes_read),
            format_size(st.slow_bytes_written),
            _seconds(st.modelled_seconds(m)),
            _seconds(st.slow_seconds(m)),
            vs,
        )
    console.print(table)
    if opt is not None:
        e = opt.extra
        bound = int(e["bound_slow_bytes_read"])  # type: ignore[call-overload]
        gap = opt.stats.slow_bytes_read - bound
        exact = "exact" if e.get("exact") else f"within {format_size(gap)} of the bound"
        console.print(
            f"optimal = best offline schedule found ({e['method']}; {exact}); no policy can read less than "
            f"{format_size(bound)} from the slow tier.  ILP: {e.get('ilp')}.",
            highlight=False,
        )
    console.print(
        f"model: fast tier {m.fast_read_bw / 1e6:g}/{m.fast_write_bw / 1e6:g} MB/s read/write, "
        f"{m.fast_latency * 1e3:.3g} ms; slow tier {m.slow_read_bw / 1e6:g}/{m.slow_write_bw / 1e6:g} MB/s, "
        f"{m.slow_latency * 1e3:.3g} ms per file operation.  '× optimal' compares modelled time.",
        highlight=False,
        style="dim",
    )


def plot(sim: Simulation, path: str | Path) -> None:
    """Bar charts of the run: ratios, slow-tier bytes read (with the optimum's lower
    bound) and modelled time.  The format follows the file extension."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(sim.results)
    m = sim.model
    stats = [sim.results[n].stats for n in names]
    hr = [s.hits / s.refs if s.refs else 0 for s in stats]
    bhr = [s.hit_bytes / s.bytes_total if s.bytes_total else 0 for s in stats]
    gib = [s.slow_bytes_read / (1 << 30) for s in stats]
    secs = [s.modelled_seconds(m) for s in stats]
    slow_secs = [s.slow_seconds(m) for s in stats]
    x = range(len(names))
    fig, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 4.2))
    ax = axes[0]
    ax.bar([i - 0.2 for i in x], hr, width=0.4, label="hit ratio")
    ax.bar([i + 0.2 for i in x], bhr, width=0.4, label="byte hit ratio")
    ax.set_ylim(0, 1)
    ax.set_title("hit ratios")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1]
    ax.bar(x, gib, color="tab:red")
    ax.set_title("slow-tier bytes read (GiB)")
    opt = sim.results.get("optimal")
    if opt is not None:
        ax.axhline(int(opt.extra["bound_slow_bytes_read"]) / (1 << 30), ls="--", color="k", lw=1,  # type: ignore[call-overload]
                   label="lower bound (any policy)")
        ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    ax.bar(x, secs, color="tab:gray", label="modelled total")
    ax.bar(x, slow_secs, color="tab:purple", width=0.5, label="slow-tier share")
    ax.set_title("modelled time (s)")
    ax.legend(loc="upper right", fontsize=8)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right")
    fig.suptitle(
        f"{len(sim.trace):,} references, cache {format_size(sim.capacity)}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

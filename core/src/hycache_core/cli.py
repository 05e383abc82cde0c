"""``hycache``: the command line of the domain library.

    hycache simulate --trace FILE.csv --capacity 256M --policies lru,lfu,heuristic,optimal [--json] [--plot F]
    hycache simulate --manifest FILE.json --capacity 1G
    hycache simulate --generator round-robin --gen-opt files=4 --gen-opt volume=100G --capacity 256M
    hycache generate zipf --gen-opt refs=1e6 --out trace.csv
    hycache policies
    hycache place MANIFEST [--nodes N | --nodes a,b,c] [--solver local] [--slack 0.1] [--capacity SIZE] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from .manifest import ManifestError, load_manifest
from .sizes import parse_size

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from .sim.trace import Trace

DEFAULT_POLICIES = "lru,lfu,gdsf,arc,heuristic,optimal"
PROGRESS_MIN_REFS = 100_000


class CLIError(Exception):
    pass


def _kv(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return v


def _add_workload_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("--trace", metavar="FILE.csv", help="CSV trace: header row; columns file,size required; time,op,job optional")
    src.add_argument("--manifest", metavar="FILE.json", help="a HyCache manifest (jobs with ordered file accesses)")
    src.add_argument("--generator", metavar="NAME", help="a synthetic workload: round-robin, zipf, workflow")
    p.add_argument("--gen-opt", metavar="KEY=VALUE", type=_kv, action="append", default=[],
                   help="generator parameter (repeatable), e.g. files=4, volume=100G, refs=1000000")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")


def build_parser() -> argparse.ArgumentParser:
    from .sim.driver import CostModel

    d = CostModel()
    parser = argparse.ArgumentParser(prog="hycache", description="HyCache tools: cache policy simulator.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "simulate",
        help="replay a workload against a cache and compare policies",
        description="Replay a workload against a fast tier of --capacity bytes in front of a slow tier, once "
        "per policy, and report hits, byte hit ratio, slow-tier traffic and modelled time.  Online policies "
        "(lru, lfu, gdsf, arc, plug-ins) see only the past; heuristic, belady and optimal see the rest of the "
        "trace as the future.",
    )
    _add_workload_args(p)
    p.add_argument("--capacity", type=_size, required=True, metavar="SIZE", help="fast-tier capacity, e.g. 256M, 1.5G")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})")
    p.add_argument("--pin", action="append", default=[], metavar="PATH", help="a file that may never be evicted (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object {policy: {...}} instead of the table")
    p.add_argument("--plot", metavar="FILE", help="write a figure (.png, .svg, .pdf)")
    m = p.add_argument_group("device model (defaults: Table 1 of the HyCache paper, OCZ Octane SSD / Hitachi Deskstar HDD)")
    m.add_argument("--fast-read-bw", type=_positive, default=d.fast_read_bw / 1e6, metavar="MB/s")
    m.add_argument("--fast-write-bw", type=_positive, default=d.fast_write_bw / 1e6, metavar="MB/s")
    m.add_argument("--slow-read-bw", type=_positive, default=d.slow_read_bw / 1e6, metavar="MB/s")
    m.add_argument("--slow-write-bw", type=_positive, default=d.slow_write_bw / 1e6, metavar="MB/s")
    m.add_argument("--fast-latency-ms", type=_non_negative, default=d.fast_latency * 1e3, metavar="MS",
                   help="per file operation (default 1/26,000 IOPS)")
    m.add_argument("--slow-latency-ms", type=_non_negative, default=d.slow_latency * 1e3, metavar="MS",
                   help="per file operation (default 1/360 IOPS)")
    o = p.add_argument_group("policy options")
    o.add_argument("--fallback", default="lru", help="the heuristic's online fallback for unplanned accesses")
    o.add_argument("--admission", choices=("agent", "all"), default="agent",
                   help="an online policy's read miss: admitted as the agent's promotion on open admits it "
                        "(agent, default) or always when it fits (all: the papers' Algorithm 1)")
    o.add_argument("--ilp-max-intervals", type=int, default=3000,
                   help="solve the exact ILP for 'optimal' up to this many variables (default 3000; 0 disables)")
    o.add_argument("--ilp-time-limit", type=_positive, default=20.0, metavar="S", help="seconds (default 20)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    g = sub.add_parser("generate", help="write a synthetic workload as a CSV trace")
    g.add_argument("name", help="round-robin, zipf or workflow")
    g.add_argument("--gen-opt", metavar="KEY=VALUE", type=_kv, action="append", default=[])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True, metavar="FILE.csv")

    sub.add_parser("policies", help="list the policy names simulate accepts")

    from .scheduling import DEFAULT_MAKESPAN_SLACK, DEFAULT_SLACK, SOLVERS

    pl = sub.add_parser(
        "place",
        help="2-Layer Scheduling: place a workflow's jobs on nodes and plan each node's fast tier",
        description="Read a manifest (the project's format or a WfCommons WfFormat 1.4/1.5 instance, detected "
        "automatically), place its jobs on the nodes so that fewer bytes move between nodes (layer 1), and plan "
        "each node's prefetch/evict/pin/unpin steps with the cost/gain heuristic (layer 2).  No cluster needed.",
    )
    pl.add_argument("manifest", metavar="MANIFEST", help="a JSON manifest file")
    pl.add_argument("--nodes", metavar="N|a,b,c",
                    help="a node count (node-0 … node-N-1) or comma-separated names (default: the instance's recorded machines)")
    pl.add_argument("--solver", choices=SOLVERS, default="local", help="layer-1 solver (default local)")
    pl.add_argument("--slack", type=_non_negative, default=DEFAULT_SLACK,
                    help=f"load bound: no node above (1 + slack) x its share (default {DEFAULT_SLACK})")
    pl.add_argument("--capacity", type=_size, metavar="SIZE", help="each node's fast-tier capacity (default unbounded)")
    pl.add_argument("--location", metavar="FILE=NODE", type=_kv, action="append", default=[],
                    help="a file already on a node (repeatable); other unwritten files start on the slow tier")
    pl.add_argument("--time-limit", type=_positive, metavar="S", help="seconds for the exact solver or the local search")
    pl.add_argument("--makespan-slack", type=_non_negative, default=DEFAULT_MAKESPAN_SLACK, metavar="X",
                    help="the local solver takes the placement with the fewest bytes among its searches' results whose "
                         "makespan is at most (1 + X) x the shortest of them (default %(default)s)")
    pl.add_argument("--bytes-only", action="store_true", help="ignore the makespan: the fewest bytes win")
    pl.add_argument("--no-plans", action="store_true", help="layer 1 only")
    pl.add_argument("--json", action="store_true", help="print the JSON object instead of tables")
    return parser


def _load_workload(args: argparse.Namespace) -> Trace:
    from .sim.generators import generate
    from .sim.trace import TraceError, read_csv_trace, trace_from_manifest

    if args.trace:
        if args.gen_opt:
            raise CLIError("--gen-opt only applies to --generator")
        try:
            return read_csv_trace(args.trace)
        except TraceError as exc:
            raise CLIError(str(exc)) from None
    if args.manifest:
        try:
            return trace_from_manifest(load_manifest(args.manifest))
        except ManifestError as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"{args.manifest}: {exc.strerror}") from None
    try:
        return generate(args.generator, dict(args.gen_opt), seed=args.seed)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _progress_factory(console: Console, enabled: bool
                      ) -> tuple[Progress | None, Callable[[str, int], Callable[[int], None]] | None]:
    """A factory of per-policy progress callbacks drawing rich bars on stderr."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )

    def factory(name: str, total: int) -> Callable[[int], None]:
        task = progress.add_task(name, total=total)
        return lambda done: progress.update(task, completed=done)

    return progress, factory


@contextlib.contextmanager
def _native_stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr meanwhile: native solver code (HiGHS) may
    printf diagnostics, which must not corrupt the JSON or the table on stdout."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 (embedded use): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def cmd_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .sim.driver import MB, CostModel
    from .sim.report import plot, render_table
    from .sim.runner import SimOptions, known_policies, simulate

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise CLIError("--policies is empty")
    known = known_policies()
    for p in policies:
        if p not in known:
            raise CLIError(f"unknown policy {p!r}; available: {', '.join(known)}")
    if args.fallback not in known or args.fallback in ("heuristic", "belady", "optimal"):
        raise CLIError(f"--fallback must be an online policy, got {args.fallback!r}")
    model = CostModel(
        fast_read_bw=args.fast_read_bw * MB, fast_write_bw=args.fast_write_bw * MB,
        slow_read_bw=args.slow_read_bw * MB, slow_write_bw=args.slow_write_bw * MB,
        fast_latency=args.fast_latency_ms / 1e3, slow_latency=args.slow_latency_ms / 1e3,
    )
    trace = _load_workload(args)
    if args.pin:
        unknown = [p for p in args.pin if p not in trace._index]
        if unknown:
            print(f"hycache simulate: warning: --pin {', '.join(unknown)}: not in the workload", file=sys.stderr)
        trace.pin(args.pin)
    err = Console(stderr=True)
    show = not args.no_progress and len(trace) >= PROGRESS_MIN_REFS and err.is_terminal
    progress, factory = _progress_factory(err, show)
    options = SimOptions(fallback=args.fallback, ilp_max_intervals=args.ilp_max_intervals,
                         ilp_time_limit=args.ilp_time_limit, admission=args.admission)
    with _native_stdout_to_stderr():
        if progress is not None:
            with progress:
                sim = simulate(trace, args.capacity, policies, model, options, factory)
        else:
            sim = simulate(trace, args.capacity, policies, model, options)
    if args.json:
        json.dump(sim.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=160)  # files and pipes: one line per policy
        render_table(sim, out)
    if args.plot:
        try:
            plot(sim, args.plot)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--plot {args.plot}: {exc}") from None
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .sim.generators import generate

    try:
        trace = generate(args.name, dict(args.gen_opt), seed=args.seed)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    trace.write_csv(args.out)
    print(f"wrote {len(trace):,} references to {args.out}", file=sys.stderr)
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from .sim.runner import PLANNED, known_policies

    for name in known_policies():
        print(f"{name}\t{'planned (sees the future)' if name in PLANNED else 'online'}")
    return 0


def cmd_place(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .scheduling import PlacementError, node_names, place
    from .sizes import format_size
    from .workflow import WorkflowError, load_workflow

    try:
        wf = load_workflow(args.manifest)
    except WorkflowError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"{args.manifest}: {exc.strerror}") from None
    try:
        nodes = node_names(args.nodes, wf)
        with _native_stdout_to_stderr():
            result = place(wf, nodes, solver=args.solver, slack=args.slack, capacity=args.capacity,
                           locations=dict(args.location), plans=not args.no_plans, time_limit=args.time_limit,
                           makespan_slack=None if args.bytes_only else args.makespan_slack)
    except PlacementError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)
    tb = result["transfer_bytes"]
    sb = result["slow_tier_bytes"]
    t = Table(title=f"{wf.name or args.manifest}: {result['jobs']} jobs, {result['files']} files ({result['format']}), "
                    f"solver {result['solver']} in {result['seconds']:.3f}s")
    t.add_column("placement")
    t.add_column("bytes moved between nodes", justify="right")
    t.add_column("slow-tier bytes", justify="right")
    ms = result["makespan"]
    t.add_column(f"makespan ({result['makespan_unit']})", justify="right")
    for key, label in (("placed", "this placement"), ("round_robin", "round-robin"), ("recorded", "recorded")):
        span = "-" if ms.get(key) is None else f"{ms[key]:,.1f}"
        if tb[key] is None:
            t.add_row(label, "-", "-", span)
        else:
            t.add_row(label, f"{format_size(tb[key])} ({tb[key]:,})", format_size(sb[key]), span)
    t.add_row("lower bound", "", "", f"{ms['lower_bound']:,.1f}")
    out.print(t)
    by_node: dict[str, list[str]] = {n: [] for n in nodes}
    for job, node in result["placement"].items():
        by_node.setdefault(node, []).append(job)
    n = Table(title=f"load bound {result['load_bound']:.1%} of the total {result['load_unit']}")
    for col in ("node", "jobs", "load", "plan steps", "prefetch", "evict", "first jobs"):
        n.add_column(col, justify="left" if col in ("node", "first jobs") else "right")
    for node, jobs in by_node.items():
        steps = result["plans"].get(node, [])
        pre = sum(s["size"] for s in steps if s["action"] == "prefetch")
        ev = sum(1 for s in steps if s["action"] == "evict")
        shown = ", ".join(jobs[:4]) + (" …" if len(jobs) > 4 else "")
        n.add_row(node, str(len(jobs)), f"{result['load'].get(node, 0.0):.1%}", str(len(steps)), format_size(pre),
                  str(ev), shown)
    out.print(n)
    if result.get("load_bound_reason"):
        out.print(f"load bound raised from {result['load_bound_requested']:.1%}: {result['load_bound_reason']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"simulate": cmd_simulate, "generate": cmd_generate, "policies": cmd_policies,
               "place": cmd_place}[args.command]
    try:
        return handler(args)
    except CLIError as exc:
        print(f"hycache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

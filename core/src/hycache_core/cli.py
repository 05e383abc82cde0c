"""``hycache``: the command line of the domain library.

    hycache simulate --trace FILE.csv --capacity 256M --policies lru,lfu,heuristic,optimal [--json] [--plot F]
    hycache simulate --manifest FILE.json --capacity 1G
    hycache simulate --generator round-robin --gen-opt files=4 --gen-opt volume=100G --capacity 256M
    hycache generate zipf --gen-opt refs=1e6 --out trace.csv
    hycache policies
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence

from .manifest import ManifestError, load_manifest
from .sizes import parse_size

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
    return parser


def _load_workload(args: argparse.Namespace):
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


def _progress_factory(console, enabled: bool):
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
def _native_stdout_to_stderr():
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
                         ilp_time_limit=args.ilp_time_limit)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"simulate": cmd_simulate, "generate": cmd_generate, "policies": cmd_policies}[args.command]
    try:
        return handler(args)
    except CLIError as exc:
        print(f"hycache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

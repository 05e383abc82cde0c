"""Benchmark: 2LS layer 1 (a script, not a test).

    .venv/bin/python bench/placement_bench.py [--jobs 10000] [--files 50000] [--nodes 16]
        [--small 40] [--plot docs/img/placement_gap.png] [--json out.json]

1. Placement speed: a generated layered workflow (``synthetic_workflow``: 10 stages,
   each job reads three outputs of nearby jobs of the previous stage and often one
   shared reference file) of ``--jobs`` jobs and ``--files`` files on ``--nodes`` nodes:
   wall-clock seconds of the greedy and of the local search (greedy + moves/swaps), the
   bytes each moves between nodes, round-robin's, and the layer-2 planning time.
2. A generated workflow of ``--medium`` jobs on 4 nodes: greedy, local and the MILP
   (``--exact-time-limit`` seconds; when it stops at the limit its lower bound is shown).
3. Gap to the optimum: ``--small`` random small instances (8–14 jobs, 2–3 nodes, slack
   0.1) solved by greedy, local search and the exact MILP (HiGHS through scipy); the
   mean and worst gap of each heuristic, in % of the optimum's bytes.

Single process, wall clock; prints a table (and writes the figure / JSON when asked).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from hycache_core.scheduling import (
    _cost,
    make_problem,
    plan_nodes,
    solve_exact,
    solve_greedy,
    solve_local,
    solve_round_robin,
)
from hycache_core.sizes import format_size
from hycache_core.workflow import Workflow, WorkflowJob, synthetic_workflow


def small_instance(rng: random.Random, n_jobs: int) -> Workflow:
    """A random workflow: each job reads 1–3 files written by earlier jobs or inputs,
    writes 1–2 files."""
    sizes: dict[str, int] = {}
    jobs = []
    written: list[tuple[str, str]] = []
    for j in range(n_jobs):
        ins: dict[str, int] = {}
        parents = []
        for _ in range(rng.randint(1, 3)):
            if written and rng.random() < 0.7:
                w, f = rng.choice(written)
                parents.append(w)
            else:
                f = f"in{rng.randint(0, n_jobs // 2)}"
                sizes.setdefault(f, rng.randint(1, 100) << 20)
            ins[f] = sizes[f]
        outs = {}
        for o in range(rng.randint(1, 2)):
            f = f"j{j}.o{o}"
            sizes[f] = rng.randint(1, 100) << 20
            outs[f] = sizes[f]
            written.append((f"j{j}", f))
        jobs.append(WorkflowJob(f"j{j}", float(rng.randint(1, 10)), tuple(dict.fromkeys(parents)), ins, outs))
    return Workflow("random", jobs, sizes=sizes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--slack", type=float, default=0.1)
    ap.add_argument("--small", type=int, default=40, help="number of small instances for the gap (0: skip)")
    ap.add_argument("--medium", type=int, default=60, help="jobs of a generated workflow for greedy/local vs exact (0: skip)")
    ap.add_argument("--exact-time-limit", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", help="write a figure of the gaps (.png/.svg)")
    ap.add_argument("--json", help="write the numbers as JSON")
    args = ap.parse_args(argv)
    results: dict = {}

    t = time.perf_counter()
    wf = synthetic_workflow(args.jobs, args.files, seed=args.seed)
    gen = time.perf_counter() - t
    nodes = [f"node-{i}" for i in range(args.nodes)]
    t = time.perf_counter()
    p = make_problem(wf, nodes, slack=args.slack)
    index = time.perf_counter() - t
    print(f"workflow: {len(wf.jobs):,} jobs, {len(wf.sizes):,} files, {args.nodes} nodes "
          f"(generated in {gen:.2f}s, indexed in {index:.2f}s)")
    rows = []
    rr = solve_round_robin(p)
    rows.append(("round-robin", 0.0, _cost(p, rr)))
    t = time.perf_counter()
    g = solve_greedy(p)
    tg = time.perf_counter() - t
    rows.append(("greedy", tg, _cost(p, g)))
    t = time.perf_counter()
    loc = solve_local(p)
    tl = time.perf_counter() - t
    rows.append(("local (greedy + search)", tl, _cost(p, loc)))
    placement = {p.jobs[j]: nodes[n] for j, n in enumerate(loc)}
    t = time.perf_counter()
    plans = plan_nodes(wf, placement, nodes, capacity=4 << 30)
    tp = time.perf_counter() - t
    print(f"{'solver':<26}{'seconds':>10}{'bytes moved':>22}")
    for name, secs, moved in rows:
        print(f"{name:<26}{secs:>10.2f}{format_size(moved):>14} ({moved / rows[0][2]:6.1%})")
    steps = sum(len(s) for s in plans.values())
    print(f"layer-2 plans (4 GiB fast tier per node): {steps:,} steps in {tp:.2f}s")
    results["large"] = {"jobs": len(wf.jobs), "files": len(wf.sizes), "nodes": args.nodes,
                        "solvers": {n: {"seconds": s, "bytes": b} for n, s, b in rows},
                        "plan_seconds": tp, "plan_steps": steps}

    if args.medium:
        # a generated workflow small enough for the MILP within a time limit
        wf_m = synthetic_workflow(args.medium, 5 * args.medium, stages=5, shared=5, seed=args.seed)
        p_m = make_problem(wf_m, [f"n{i}" for i in range(4)], slack=args.slack)
        t = time.perf_counter()
        ex = solve_exact(p_m, time_limit=args.exact_time_limit)
        te = time.perf_counter() - t
        ce = _cost(p_m, ex.assign)
        print(f"\nmedium: {args.medium} jobs, {len(wf_m.sizes)} files, 4 nodes; exact {te:.1f}s "
              f"({'proven optimal' if ex.optimal else f'time limit, lower bound {format_size(ex.lower_bound)}'})")
        med = {"jobs": args.medium, "exact": {"seconds": te, "bytes": ce, "optimal": ex.optimal,
                                              "lower_bound": ex.lower_bound}}
        for name, fn in (("greedy", solve_greedy), ("local", solve_local)):
            t = time.perf_counter()
            c = _cost(p_m, fn(p_m))
            secs = time.perf_counter() - t
            gap = 100.0 * (c - ce) / ce if ce else 0.0
            print(f"{name:<8}{secs:>8.2f}s {format_size(c):>12}  gap to exact {gap:6.1f}%")
            med[name] = {"seconds": secs, "bytes": c, "gap_percent": gap}
        print(f"{'exact':<8}{te:>8.2f}s {format_size(ce):>12}")
        results["medium"] = med

    if args.small:
        rng = random.Random(args.seed)
        gaps: dict[str, list[float]] = {"greedy": [], "local": []}
        exact_secs = []
        proven = 0
        for _ in range(args.small):
            wf_s = small_instance(rng, rng.randint(8, 14))
            p_s = make_problem(wf_s, [f"n{i}" for i in range(rng.randint(2, 3))], slack=args.slack)
            t = time.perf_counter()
            ex = solve_exact(p_s, time_limit=60)
            exact_secs.append(time.perf_counter() - t)
            proven += ex.optimal
            opt = _cost(p_s, ex.assign)
            for name, assign in (("greedy", solve_greedy(p_s)), ("local", solve_local(p_s))):
                c = _cost(p_s, assign)
                gaps[name].append(0.0 if c == opt else (100.0 * (c - opt) / opt if opt else float("inf")))
        print(f"\ngap to the exact optimum on {args.small} small instances (8-14 jobs, 2-3 nodes, slack {args.slack}); "
              f"{proven} proven optimal, exact solve {statistics.mean(exact_secs):.2f}s mean / {max(exact_secs):.2f}s max")
        print(f"{'solver':<10}{'mean gap':>10}{'median':>10}{'worst':>10}{'optimal in':>14}")
        for name, gl in gaps.items():
            finite = [x for x in gl if x != float("inf")]
            print(f"{name:<10}{statistics.mean(finite):>9.1f}%{statistics.median(finite):>9.1f}%{max(finite):>9.1f}%"
                  f"{sum(1 for x in gl if x == 0):>8}/{len(gl)}")
        results["small"] = {"instances": args.small, "proven_optimal": proven, "gaps_percent": gaps,
                            "exact_seconds": exact_secs}
        if args.plot:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 3.5))
            data = [[x for x in gaps[n] if x != float("inf")] for n in gaps]
            ax.boxplot(data, tick_labels=list(gaps))
            ax.set_ylabel("bytes moved above the optimum (%)")
            ax.set_title(f"2LS layer 1: gap to the exact MILP ({args.small} instances)")
            fig.tight_layout()
            fig.savefig(args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

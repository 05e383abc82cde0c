"""2-Layer Scheduling (HyCache+ §III): place jobs on nodes, then plan each node's fast tier.

**Layer 1, job → node.**  The objective is the number of bytes that move between nodes,
defined (issue 9) as: a file written by a job lives on that job's node (and a file the
caller says is already on a node, ``locations``, lives there too); every node that runs
a job reading a file it does not hold receives the file's bytes once.  Files that no
job writes and that are on no node start on the shared slow tier: the bytes nodes read
from it are reported separately (``slow_tier_bytes``), never as transfers.  The
accounting does not depend on the order of the jobs: :func:`transfer_bytes`.

Every placement respects two constraints:

* **capacity**: a job goes only to a node whose fast tier can hold the job's footprint
  (its inputs plus its outputs) — the layer-2 planner can then stage the whole job;
* **load bound**: no node gets more than ``(1 + slack) × T / N`` of the total weight
  ``T`` (the jobs' runtimes; one per job when any runtime is missing) whenever some
  placement within the capacities meets it — checked exactly (:func:`balance`:
  heaviest-first packing, then a MILP) — and every solver's answer is brought within
  it (:func:`repair`).  Only when no such placement exists (a job heavier than the
  bound, 3 equal jobs on 2 nodes) is it raised, to the least maximum load, and the
  answer says why (``load_bound_reason``).  ``load_bound`` in the answer is the bound
  that was used.

Solvers (``SOLVERS``):

* ``greedy`` — the papers' Algorithm 1, corrected: jobs in a topological order, each on
  the node where the bytes of its inputs that are NOT already there are fewest (files
  live where they were located, written, or already fetched); ties by the slow-tier
  bytes, then the lighter node, then the node order.
* ``local`` — a local search (moves of one job to another node and swaps of two jobs
  between two nodes, applied while they strictly reduce the transferred bytes within
  the constraints) run from Mt-KaHyPar's partition, from the recorded placement (when
  it names the candidate nodes), and from the greedy; on small workflows also from
  random feasible placements; the best result kept.  Never worse than any of these
  starts that is within the bound, by construction.
* ``hypergraph`` — Mt-KaHyPar (quality preset, connectivity objective km1) on the
  job/file hypergraph (:func:`hypergraph_nets`), blocks held to the load bound, the
  located files' nodes as fixed vertices.
* ``exact`` — a mixed-integer program solved by HiGHS (``scipy.optimize.milp``) for
  small instances: ``x[j,n]`` places job ``j`` on node ``n``, ``y[f,n] ≥ x[j,n] −
  Σ_{w writes f} x[w,n] − [f located on n]`` for every reader ``j`` of ``f`` charges
  ``size(f)`` when node ``n`` must receive ``f``; minimise ``Σ size(f)·y[f,n]``.
* ``round-robin`` — the jobs in topological order dealt to the nodes in turn (the
  baseline; it ignores the constraints).

**Layer 2, each node's plan.**  The node's jobs, in order, make its reference string:
for each job, a *prefetch* reference to every input (the staging point ahead of the
job), the job's reads of its inputs, then its writes.  The cost/gain heuristic
(:class:`~hycache_core.policies.heuristic.HeuristicPolicy`, the code the simulator
runs; occurrence counts are precomputed, O(log n) per reference) decides what enters
and leaves the fast tier, and its decisions become steps tied to the job that needs
them; see :func:`plan_node`.

:func:`place` runs both layers and returns the dict that ``hycache place --json`` prints
and that the control plane's REST API returns.

The package, by responsibility (every name is importable from ``hycache_core.scheduling``):

* ``problem`` — the indexed problem (:class:`Problem`, :func:`make_problem`), the load
  bound (:func:`balance`, :func:`load_bound`), ``PlacementError`` and the constants;
* ``accounting`` — :func:`transfer_bytes` and the makespan (:func:`makespan`);
* ``solvers`` — layer 1: the solvers, the local search and :func:`repair`;
* ``plans`` — layer 2: :func:`plan_node`, :func:`plan_nodes`, :func:`node_state` (the census);
* ``online`` — :func:`choose_node`;
* this module — :func:`place` and :func:`node_names`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..workflow import Workflow
from .accounting import (
    DEFAULT_MAKESPAN_SLACK,
    LARGE_INSTANCE,
    _cost,
    _loads,
    _upward_rank,
    makespan,
    makespan_lower_bound,
    transfer_bytes,
)
from .online import choose_node
from .plans import node_state, plan_node, plan_nodes, plan_release, prefetch_sources
from .problem import (
    BALANCE_MILP_TIME_LIMIT,
    DEFAULT_SLACK,
    ELSEWHERE,
    EXACT_DEFAULT_TIME_LIMIT,
    SLOW,
    SOLVERS,
    Balance,
    PlacementError,
    Problem,
    balance,
    load_bound,
    make_problem,
)
from .solvers import (
    HYPERGRAPH_PRESET,
    HYPERGRAPH_SEED,
    ExactResult,
    _State,
    feasible,
    hypergraph_nets,
    local_search,
    repair,
    solve_exact,
    solve_greedy,
    solve_hypergraph,
    solve_local,
    solve_round_robin,
)

__all__ = [  # the responsibilities' names, importable from the package (the tests use _cost, _State)
    "DEFAULT_MAKESPAN_SLACK", "LARGE_INSTANCE", "_cost", "_loads", "_upward_rank", "makespan",
    "makespan_lower_bound", "transfer_bytes", "choose_node", "node_state", "plan_node", "plan_nodes",
    "plan_release", "prefetch_sources", "BALANCE_MILP_TIME_LIMIT", "DEFAULT_SLACK", "ELSEWHERE",
    "EXACT_DEFAULT_TIME_LIMIT", "SLOW", "SOLVERS", "Balance", "PlacementError", "Problem", "balance",
    "load_bound", "make_problem", "HYPERGRAPH_PRESET", "HYPERGRAPH_SEED", "ExactResult", "_State", "feasible",
    "hypergraph_nets", "local_search", "repair", "solve_exact", "solve_greedy", "solve_hypergraph",
    "solve_local", "solve_round_robin", "node_names", "place",
]

# -- everything at once ---------------------------------------------------------------------

def node_names(spec: int | str | Sequence[str] | None, wf: Workflow | None = None) -> list[str]:
    """``4`` → ``node-0 … node-3``; ``"a,b,c"`` → ``[a, b, c]``; None → the instance's
    recorded machines (PlacementError if it has none)."""
    if spec is None:
        rec = wf.recorded_placement() if wf is not None else None
        if not rec:
            raise PlacementError("no nodes given and the manifest records no machines: pass --nodes")
        return sorted(set(rec.values()))
    if isinstance(spec, int):
        if spec < 1:
            raise PlacementError(f"--nodes must be at least 1, got {spec}")
        return [f"node-{i}" for i in range(spec)]
    if isinstance(spec, str):
        text = spec.strip()
        if text.isdigit():
            return node_names(int(text))
        names = [s.strip() for s in text.split(",") if s.strip()]
    else:
        names = list(spec)
    if not names:
        raise PlacementError("--nodes is empty")
    if len(set(names)) != len(names):
        raise PlacementError(f"--nodes names a node twice: {','.join(names)}")
    return names


def place(wf: Workflow, nodes: Sequence[str], *, solver: str = "local", slack: float = DEFAULT_SLACK,
          capacity: int | Mapping[str, int | None] | None = None, locations: Mapping[str, str] | None = None,
          plans: bool = True, time_limit: float | None = None,
          makespan_slack: float | None = DEFAULT_MAKESPAN_SLACK,
          census: Mapping[str, Mapping[str, Any]] | None = None,
          fast_status: Mapping[str, Mapping[str, Any] | None] | None = None,
          first_reads_in_place: bool | None = None, release: str = "reads") -> dict[str, Any]:
    """Both layers of 2LS for a workflow: the dict ``hycache place --json`` prints.

    ``census`` (the workflow's existing files: ``{file: {"node", "tier", "size",
    "pinned"}}``, e.g. from the DHT) and ``fast_status`` (each node's heartbeat
    ``tiers.fast``) make layer 2 start from the nodes' real fast-tier contents
    (:func:`node_state`).  ``first_reads_in_place`` (default: with a census, i.e. on
    the live cluster) plans no prefetch or eviction for each node's first job
    (:func:`plan_node`).  ``release``: when the control plane releases a job's steps —
    once the job before it has read its inputs (``"reads"``) or has started
    (``"start"``); with ``"start"`` that job's inputs are open while they run, so they
    are not victims (:func:`plan_node`).

    ``{"placement": {job: node}, "transfer_bytes": {"placed", "round_robin", "recorded"},
    "slow_tier_bytes": {same keys}, "load": {node: share of the total weight},
    "load_bound": share bound, "load_bound_requested": (1 + slack) / N, "load_bound_reason":
    why it was raised (None when kept), "makespan": {"placed", "round_robin", "recorded",
    "lower_bound"} (list scheduling per node, :func:`makespan`), "makespan_unit",
    "makespan_slack", "plans": {node: [steps]}, "solver", "optimal" (exact
    only), "seconds", "jobs", "files", "format"}``.
    """
    if solver not in SOLVERS:
        raise PlacementError(f"unknown solver {solver!r}; available: {', '.join(SOLVERS)}")
    p = make_problem(wf, nodes, slack=slack, capacity=capacity, locations=locations)
    t0 = time.perf_counter()
    assign, optimal = _solve(wf, p, solver, time_limit, makespan_slack)
    seconds = time.perf_counter() - t0
    placement = {p.jobs[j]: p.nodes[n] for j, n in enumerate(assign)}
    total = sum(p.weight) or 1.0
    load = {n: 0.0 for n in p.nodes}
    for j, n in enumerate(assign):
        load[p.nodes[n]] += p.weight[j]
    others = _against_others(wf, p, assign, placement, locations)
    out: dict[str, Any] = {
        "placement": placement,
        "transfer_bytes": others["transfer_bytes"],
        "slow_tier_bytes": others["slow_tier_bytes"],
        "load": {n: v / total for n, v in load.items()},
        "load_bound": p.bound / total,
        "load_bound_requested": p.balance.requested / total if p.balance else p.bound / total,
        "load_bound_reason": p.balance.reason if p.balance else None,
        "load_unit": "runtime" if wf.runtimes_known() else "jobs",
        "makespan": others["makespan"],
        "makespan_unit": "seconds" if wf.runtimes_known() else "jobs",
        "makespan_slack": makespan_slack,
        "plans": plan_nodes(wf, placement, p.nodes, capacity, locations,
                            state=None if census is None else node_state(census, p.nodes, fast_status),
                            # on the live cluster (a census), a node's first job starts the
                            # moment its steps would be released: it reads in place
                            first_reads_in_place=census is not None if first_reads_in_place is None
                            else first_reads_in_place, release=release)
        if plans else {},
        "solver": solver,
        "optimal": optimal,
        "seconds": seconds,
        "format": wf.format,
        "jobs": len(p.jobs),
        "files": len(p.files),
    }
    return out


def _solve(wf: Workflow, p: Problem, solver: str, time_limit: float | None,
           makespan_slack: float | None) -> tuple[list[int], bool | None]:
    """Layer 1 by ``solver``: each job's node index, and whether it is optimal (exact only)."""
    if solver == "greedy":
        return solve_greedy(p), None
    if solver == "local":
        rec = wf.recorded_placement()
        node_ix = {n: i for i, n in enumerate(p.nodes)}
        seeds = [[node_ix[rec[j]] for j in p.jobs]] if rec and all(m in node_ix for m in rec.values()) else []
        return solve_local(p, time_limit=time_limit, seeds=seeds, makespan_slack=makespan_slack), None
    if solver == "hypergraph":
        return solve_hypergraph(p), None
    if solver == "exact":
        res = solve_exact(p, time_limit=time_limit or EXACT_DEFAULT_TIME_LIMIT)
        return res.assign, res.optimal
    return solve_round_robin(p), None


def _against_others(wf: Workflow, p: Problem, assign: Sequence[int], placement: Mapping[str, str],
                    locations: Mapping[str, str] | None) -> dict[str, Any]:
    """The placement's transfers and makespan beside round robin's and the recorded one's."""
    rr = {p.jobs[j]: p.nodes[n] for j, n in enumerate(solve_round_robin(p))}
    moved, slow = transfer_bytes(wf, placement, locations)
    rr_moved, rr_slow = transfer_bytes(wf, rr, locations)
    recorded = wf.recorded_placement()
    rec_moved = rec_slow = None
    if recorded is not None:
        rec_moved, rec_slow = transfer_bytes(wf, recorded, locations)
    rank = _upward_rank(p)
    node_ix = {n: i for i, n in enumerate(p.nodes)}
    spans = {"placed": makespan(p, assign, rank=rank), "round_robin": makespan(p, solve_round_robin(p), rank=rank),
             "recorded": None, "lower_bound": makespan_lower_bound(p)}
    if recorded is not None and all(m in node_ix for m in recorded.values()):
        spans["recorded"] = makespan(p, [node_ix[recorded[j]] for j in p.jobs], rank=rank)
    return {"transfer_bytes": {"placed": moved, "round_robin": rr_moved, "recorded": rec_moved},
            "slow_tier_bytes": {"placed": slow, "round_robin": rr_slow, "recorded": rec_slow},
            "makespan": spans}

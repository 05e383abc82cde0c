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
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .policies.heuristic import HeuristicPolicy
from .workflow import Workflow, WorkflowJob

SOLVERS = ("greedy", "local", "hypergraph", "exact", "round-robin")
DEFAULT_SLACK = 0.1
EXACT_DEFAULT_TIME_LIMIT = 60.0
SLOW = -1  # a file on the shared slow tier
ELSEWHERE = -2  # a file on a node that is not one of the candidate nodes


class PlacementError(ValueError):
    """No placement satisfies the constraints (or the input is unusable)."""


# -- the indexed problem ------------------------------------------------------------

@dataclass(slots=True)
class Problem:
    """A workflow indexed for the solvers: jobs ``0..J-1`` in topological order, files
    ``0..F-1``, nodes ``0..N-1``."""

    jobs: list[str]
    nodes: list[str]
    files: list[str]
    weight: list[float]
    inputs: list[list[int]]
    outputs: list[list[int]]
    size: list[int]
    init: list[int]  # node index, SLOW or ELSEWHERE
    footprint: list[int]
    capacity: list[int | None]
    bound: float
    writers: list[list[int]]
    readers: list[list[int]]
    balance: Balance | None = None
    parents: list[list[int]] | None = None

    @property
    def has_source(self) -> list[bool]:
        return [bool(self.writers[f]) or self.init[f] != SLOW for f in range(len(self.files))]

    def allowed(self, j: int, n: int) -> bool:
        cap = self.capacity[n]
        return cap is None or self.footprint[j] <= cap


@dataclass(frozen=True, slots=True)
class Balance:
    """The load bound a placement is held to (absolute weight), and why.

    ``requested`` is ``(1 + slack) × T / N``; ``bound`` equals it whenever some
    placement (within the nodes' capacities) keeps every node at or below it, else it is
    the least maximum load found (proven least when ``proven``); ``reason`` says why it
    was raised (None when kept); ``packing`` is a placement within ``bound`` (job →
    node index), a start for the solvers' repair."""

    bound: float
    requested: float
    reason: str | None
    packing: list[int]
    proven: bool = True


BALANCE_MILP_TIME_LIMIT = 5.0


def _pack_heuristic(weight: Sequence[float], allowed: Sequence[Sequence[int]], n_nodes: int,
                    bound: float) -> list[int] | None:
    """Heaviest job first, by two rules: the least loaded node (LPT) and the fullest node
    it still fits on (best fit).  A placement within ``bound`` or None."""
    order = sorted(range(len(weight)), key=lambda j: (-weight[j], j))
    for rule in ("lpt", "best-fit"):
        load = [0.0] * n_nodes
        assign = [0] * len(weight)
        ok = True
        for j in order:
            w = weight[j]
            fits = [n for n in allowed[j] if load[n] + w <= bound + _EPS]
            if not fits:
                ok = False
                break
            n = min(fits, key=(lambda m: (load[m], m)) if rule == "lpt" else (lambda m: (-load[m], m)))
            assign[j] = n
            load[n] += w
        if ok:
            return assign
    return None


def _lpt(weight: Sequence[float], allowed: Sequence[Sequence[int]], n_nodes: int) -> tuple[list[int], float]:
    """List scheduling, heaviest first, on the least loaded allowed node: a placement and
    its maximum load (at most 4/3 of the least possible on identical nodes)."""
    load = [0.0] * n_nodes
    assign = [0] * len(weight)
    for j in sorted(range(len(weight)), key=lambda j: (-weight[j], j)):
        n = min(allowed[j], key=lambda m: (load[m], m))
        assign[j] = n
        load[n] += weight[j]
    return assign, max(load, default=0.0)


def _pack_milp(weight: Sequence[float], allowed: Sequence[Sequence[int]], n_nodes: int, bound: float | None,
               time_limit: float) -> tuple[str, list[int] | None, float, float]:
    """Bin packing / P||Cmax as a MILP over job classes (equal weight and allowed nodes):
    ``x[c,n]`` jobs of class ``c`` on node ``n``.  With ``bound``: is there a placement
    within it?  Without: the least maximum load.  Returns ``(status, placement, value,
    lower bound)``, status ``"optimal"``, ``"infeasible"`` or ``"unknown"`` (time limit)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    classes: dict[tuple[float, tuple[int, ...]], list[int]] = {}
    for j, w in enumerate(weight):
        classes.setdefault((float(w), tuple(allowed[j])), []).append(j)
    keys = list(classes)
    C, N = len(keys), n_nodes
    nx = C * N
    nvar = nx + (0 if bound is not None else 1)
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    ub = np.zeros(nvar)
    for c, (w, ok) in enumerate(keys):
        cnt = len(classes[keys[c]])
        for n in ok:
            ub[c * N + n] = cnt
            rows.append(r); cols.append(c * N + n); vals.append(1.0)
        lo.append(cnt); hi.append(cnt); r += 1
    for n in range(N):
        for c, (w, _) in enumerate(keys):
            if w:
                rows.append(r); cols.append(c * N + n); vals.append(w)
        if bound is None:
            rows.append(r); cols.append(nx); vals.append(-1.0)
            lo.append(-np.inf); hi.append(0.0)
        else:
            lo.append(-np.inf); hi.append(bound + _EPS)
        r += 1
    cost = np.zeros(nvar)
    lb = np.zeros(nvar)
    if bound is None:
        cost[nx] = 1.0
        ub[nx] = float(sum(weight)) + 1.0
        lb[nx] = max(float(sum(weight)) / N, max(weight, default=0.0))
    integrality = np.ones(nvar)
    if bound is None:
        integrality[nx] = 0
    A = coo_array((vals, (rows, cols)), shape=(r, nvar)).tocsr()
    res = milp(cost, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
               bounds=Bounds(lb, ub), options={"time_limit": time_limit, "disp": False})
    if res.status == 2:
        return "infeasible", None, float("inf"), float("inf")
    if res.x is None:
        return "unknown", None, float("inf"), float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
    x = np.rint(res.x[:nx]).astype(int).reshape(C, N)
    assign = [0] * len(weight)
    load = [0.0] * N
    for c, key in enumerate(keys):
        jobs = iter(classes[key])
        for n in range(N):
            for _ in range(int(x[c, n])):
                j = next(jobs)
                assign[j] = n
                load[n] += weight[j]
    value = max(load, default=0.0)
    dual = getattr(res, "mip_dual_bound", None)
    return ("optimal" if res.status == 0 else "unknown"), assign, value, float(dual) if dual is not None else 0.0


def balance(weight: Sequence[float], allowed: Sequence[Sequence[int]], n_nodes: int,
            slack: float = DEFAULT_SLACK, *, names: Sequence[str] | None = None,
            time_limit: float = BALANCE_MILP_TIME_LIMIT) -> Balance:
    """The load bound for jobs of ``weight`` that may run on the nodes ``allowed[j]``.

    The requested ``(1 + slack) × T / N`` is kept when a placement within it exists:
    checked by heaviest-first packing (LPT, best fit) and, when those fail, exactly by a
    MILP (HiGHS).  Only when none exists is it raised, to the least maximum load (the
    MILP's optimum, or the LPT's when the MILP hits ``time_limit``), and ``reason``
    says why."""
    if n_nodes <= 0:
        raise PlacementError("no nodes")
    J = len(weight)
    total = float(sum(weight))
    share = total / n_nodes
    requested = (1.0 + slack) * share
    if not J:
        return Balance(0.0, 0.0, None, [])
    for j in range(J):
        if not allowed[j]:
            name = names[j] if names else j
            raise PlacementError(f"job {name!r}: no node has room for it on its fast tier")
    packed = _pack_heuristic(weight, allowed, n_nodes, requested)
    if packed is not None:
        return Balance(requested, requested, None, packed)
    j_max = max(range(J), key=lambda j: (weight[j], -j))
    w_max = weight[j_max]
    rel = (lambda v: v / share) if share else (lambda v: v)
    name = names[j_max] if names else str(j_max)
    if w_max > requested + _EPS:
        why = (f"job {name!r} alone weighs {rel(w_max):.3f} x a node's share, above the requested "
               f"{rel(requested):.3f}")
        status = "infeasible"
    else:
        status, sol, _, _ = _pack_milp(weight, allowed, n_nodes, requested, time_limit)
        if status == "optimal" and sol is not None:
            return Balance(requested, requested, None, sol)
        equal = min(weight) == w_max and all(len(a) == n_nodes for a in allowed)
        if equal and status == "infeasible":
            why = (f"{J} jobs of equal weight on {n_nodes} nodes: some node runs {-(-J // n_nodes)} of them, "
                   f"{rel(-(-J // n_nodes) * w_max):.3f} x its share")
        elif status == "infeasible":
            why = f"no placement keeps every node within {rel(requested):.3f} x its share (proven by the MILP)"
        else:
            why = (f"no placement within {rel(requested):.3f} x a node's share was found "
                   f"(heuristics, and the MILP within its {time_limit:g} s limit)")
    lpt, lpt_max = _lpt(weight, allowed, n_nodes)
    best, best_max, proven = lpt, lpt_max, False
    status2, sol2, val2, lower = _pack_milp(weight, allowed, n_nodes, None, time_limit)
    if sol2 is not None and val2 <= best_max + _EPS:
        best, best_max = sol2, val2
    proven = status2 == "optimal" or lpt_max <= max(lower, w_max, share) + _EPS
    if best_max <= requested + _EPS:  # the MILP's own search found one after all
        return Balance(requested, requested, None, best)
    why += f"; raised to {rel(best_max):.3f} x, the least maximum load {'possible' if proven else 'found'}"
    return Balance(best_max, requested, why, best, proven)


def load_bound(weights: Sequence[float], n_nodes: int, slack: float = DEFAULT_SLACK) -> float:
    """The load bound for jobs of ``weights`` on ``n_nodes`` interchangeable nodes (see
    :func:`balance`)."""
    return balance(weights, [range(n_nodes)] * len(weights), n_nodes, slack).bound


def make_problem(wf: Workflow, nodes: Sequence[str], *, slack: float = DEFAULT_SLACK,
                 capacity: int | Mapping[str, int | None] | None = None,
                 locations: Mapping[str, str] | None = None) -> Problem:
    if not nodes:
        raise PlacementError("no nodes to place on")
    if len(set(nodes)) != len(nodes):
        raise PlacementError("duplicate node names")
    if slack < 0:
        raise PlacementError("slack must not be negative")
    node_ix = {n: i for i, n in enumerate(nodes)}
    files: list[str] = []
    fix: dict[str, int] = {}

    def fid(name: str) -> int:
        i = fix.get(name)
        if i is None:
            i = fix[name] = len(files)
            files.append(name)
        return i

    inputs = [[fid(f) for f in j.inputs] for j in wf.jobs]
    outputs = [[fid(f) for f in j.outputs] for j in wf.jobs]
    size = [wf.sizes[f] for f in files]
    init = [SLOW] * len(files)
    for f, n in (locations or {}).items():
        if f in fix:
            init[fix[f]] = node_ix.get(n, ELSEWHERE)
    writers: list[list[int]] = [[] for _ in files]
    readers: list[list[int]] = [[] for _ in files]
    for j, (ins, outs) in enumerate(zip(inputs, outputs)):
        for f in ins:
            readers[f].append(j)
        for f in outs:
            writers[f].append(j)
    if wf.runtimes_known():
        weight = [float(j.runtime or 0.0) for j in wf.jobs]
    else:
        weight = [1.0] * len(wf.jobs)
    if isinstance(capacity, Mapping):
        caps = [capacity.get(n) for n in nodes]
    else:
        caps = [capacity] * len(nodes)
    footprint = [j.footprint() for j in wf.jobs]
    allowed = [[n for n, cap in enumerate(caps) if cap is None or fp <= cap] for fp in footprint]
    for j, ok in enumerate(allowed):
        if not ok:
            raise PlacementError(f"job {wf.jobs[j].id!r} needs {footprint[j]} bytes of fast tier: no node has room")
    bal = balance(weight, allowed, len(nodes), slack, names=[j.id for j in wf.jobs])
    jix = {j.id: i for i, j in enumerate(wf.jobs)}
    parents = [sorted({jix[q] for q in j.parents if q in jix}) for j in wf.jobs]
    return Problem(
        jobs=[j.id for j in wf.jobs], nodes=list(nodes), files=files, weight=weight,
        inputs=inputs, outputs=outputs, size=size, init=init,
        footprint=footprint, capacity=caps,
        bound=bal.bound, writers=writers, readers=readers, balance=bal, parents=parents,
    )


# -- the accounting -----------------------------------------------------------------

def transfer_bytes(wf: Workflow, placement: Mapping[str, str],
                   locations: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(bytes moved between nodes, bytes read from the shared slow tier)`` for a
    placement (job id → node name), by the issue's definition."""
    locations = locations or {}
    readers: dict[str, set[str]] = defaultdict(set)
    holders: dict[str, set[str]] = defaultdict(set)
    for job in wf.jobs:
        node = placement[job.id]
        for f in job.inputs:
            readers[f].add(node)
        for f in job.outputs:
            holders[f].add(node)
    moved = slow = 0
    for f, nodes in readers.items():
        held = holders.get(f, set())
        loc = locations.get(f)
        if held or loc is not None:
            if loc is not None:
                held = held | {loc}
            moved += wf.sizes[f] * len(nodes - held)
        else:
            slow += wf.sizes[f] * len(nodes)
    return moved, slow


def _cost(p: Problem, assign: Sequence[int]) -> int:
    moved = 0
    for f in range(len(p.files)):
        if not p.readers[f] or not (p.writers[f] or p.init[f] != SLOW):
            continue
        held = {assign[w] for w in p.writers[f]}
        held.add(p.init[f])
        moved += p.size[f] * len({assign[j] for j in p.readers[f]} - held)
    return moved


def _loads(p: Problem, assign: Sequence[int]) -> list[float]:
    load = [0.0] * len(p.nodes)
    for j, n in enumerate(assign):
        load[n] += p.weight[j]
    return load


# -- the makespan -------------------------------------------------------------------

DEFAULT_MAKESPAN_SLACK = 0.2
LARGE_INSTANCE = 1_000  # jobs: above, the local search starts only from Mt-KaHyPar's partition and the seeds


def _upward_rank(p: Problem) -> list[float]:
    """Each job's runtime plus the longest chain of runtimes below it."""
    children: list[list[int]] = [[] for _ in p.jobs]
    for j, ps in enumerate(p.parents or []):
        for q in ps:
            children[q].append(j)
    rank = [0.0] * len(p.jobs)
    for j in range(len(p.jobs) - 1, -1, -1):  # jobs are in topological order
        rank[j] = p.weight[j] + max((rank[c] for c in children[j]), default=0.0)
    return rank


def makespan(p: Problem, assign: Sequence[int], *, slots: int = 1, rank: Sequence[float] | None = None) -> float:
    """The placement's makespan by list scheduling on each node: a node runs ``slots``
    jobs at a time; a job is ready when its parents (the DAG) have finished; a free slot
    takes its node's ready job with the longest chain below it (upward rank, then the
    topological order).  Job durations are the weights (runtimes, or 1 per job when
    runtimes are unknown); transfers take no time here."""
    import heapq

    J = len(p.jobs)
    if not J:
        return 0.0
    rank = rank if rank is not None else _upward_rank(p)
    parents = p.parents or [[] for _ in range(J)]
    children: list[list[int]] = [[] for _ in range(J)]
    waiting = [len(ps) for ps in parents]
    for j, ps in enumerate(parents):
        for q in ps:
            children[q].append(j)
    ready: list[list[tuple[float, int]]] = [[] for _ in p.nodes]
    free = [slots] * len(p.nodes)
    events: list[tuple[float, int]] = []  # (finish time, job)
    for j in range(J):
        if not waiting[j]:
            heapq.heappush(ready[assign[j]], (-rank[j], j))
    now = 0.0
    done = 0

    def start(n: int) -> None:
        while free[n] and ready[n]:
            _, j = heapq.heappop(ready[n])
            free[n] -= 1
            heapq.heappush(events, (now + p.weight[j], j))

    for n in range(len(p.nodes)):
        start(n)
    while events:
        now, j = heapq.heappop(events)
        done += 1
        n = assign[j]
        free[n] += 1
        touched = {n}
        for c in children[j]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready[assign[c]], (-rank[c], c))
                touched.add(assign[c])
        for m in touched:
            start(m)
    return now


def makespan_lower_bound(p: Problem, *, slots: int = 1) -> float:
    """No placement finishes sooner: the longest chain, and the total over all slots."""
    if not p.jobs:
        return 0.0
    return max(max(_upward_rank(p)), sum(p.weight) / (len(p.nodes) * slots))


# -- layer 1: the solvers ---------------------------------------------------------------

_EPS = 1e-9


def solve_round_robin(p: Problem) -> list[int]:
    return [j % len(p.nodes) for j in range(len(p.jobs))]


def solve_greedy(p: Problem) -> list[int]:
    """Algorithm 1 corrected (see the module docstring)."""
    n_nodes = len(p.nodes)
    held: list[set[int]] = [{p.init[f]} if p.init[f] >= 0 else set() for f in range(len(p.files))]
    source = p.has_source
    load = [0.0] * n_nodes
    assign = [0] * len(p.jobs)
    for j in range(len(p.jobs)):
        saved_move: dict[int, int] = defaultdict(int)
        saved_slow: dict[int, int] = defaultdict(int)
        for f in p.inputs[j]:
            target = saved_move if source[f] else saved_slow
            s = p.size[f]
            for n in held[f]:
                target[n] += s
        w = p.weight[j]
        best: tuple | None = None
        for n in range(n_nodes):
            if load[n] + w > p.bound + _EPS or not p.allowed(j, n):
                continue
            key = (-saved_move.get(n, 0), -saved_slow.get(n, 0), load[n], n)
            if best is None or key < best:
                best = key
        if best is None:  # no node has room left: the lightest allowed one, repaired below
            fits = [n for n in range(n_nodes) if p.allowed(j, n)]
            n = min(fits, key=lambda m: (load[m], m))
        else:
            n = best[3]
        assign[j] = n
        load[n] += w
        for f in p.inputs[j]:
            held[f].add(n)
        for f in p.outputs[j]:
            held[f].add(n)
    return repair(p, assign)


class _State:
    """Per-file reader/writer counts per node, so that moving a job changes the
    transferred bytes by an amount computed in O(files of the job).

    ``miss[f]`` counts the nodes that read ``f`` without holding it (no writer there,
    not located there); the transferred bytes are ``Σ size(f) × miss[f]`` over the
    files that have a source.
    """

    def __init__(self, p: Problem, assign: list[int]) -> None:
        self.p = p
        self.assign = assign
        self.rc: list[dict[int, int]] = [{} for _ in p.files]
        self.wc: list[dict[int, int]] = [{} for _ in p.files]
        self.load = _loads(p, assign)
        self.source = p.has_source
        self.jfiles = [sorted(set(p.inputs[j]) | set(p.outputs[j])) for j in range(len(p.jobs))]
        for j, n in enumerate(assign):
            for f in p.inputs[j]:
                self.rc[f][n] = self.rc[f].get(n, 0) + 1
            for f in p.outputs[j]:
                self.wc[f][n] = self.wc[f].get(n, 0) + 1

    def _shift(self, j: int, a: int, b: int) -> int:
        """Move job ``j`` from node ``a`` to ``b``; the change in transferred bytes."""
        p = self.p
        delta = 0
        source, size, init = self.source, p.size, p.init
        for f in p.inputs[j]:
            rc, wc = self.rc[f], self.wc[f]
            c = rc[a] - 1
            if c:
                rc[a] = c
            else:
                del rc[a]
                if source[f] and a not in wc and a != init[f]:
                    delta -= size[f]
            c = rc.get(b, 0)
            rc[b] = c + 1
            if not c and source[f] and b not in wc and b != init[f]:
                delta += size[f]
        for f in p.outputs[j]:
            rc, wc = self.rc[f], self.wc[f]
            c = wc[a] - 1
            if c:
                wc[a] = c
            else:
                del wc[a]
                if a in rc and a != init[f]:  # a reads f and no longer holds it
                    delta += size[f]
            c = wc.get(b, 0)
            wc[b] = c + 1
            if not c and b in rc and b != init[f]:
                delta -= size[f]
        self.assign[j] = b
        w = p.weight[j]
        self.load[a] -= w
        self.load[b] += w
        return delta

    def delta_move(self, j: int, b: int) -> int:
        a = self.assign[j]
        d = self._shift(j, a, b)
        self._shift(j, b, a)
        return d

    def delta_swap(self, j: int, k: int) -> int:
        a, b = self.assign[j], self.assign[k]
        d = self._shift(j, a, b) + self._shift(k, b, a)
        self._shift(k, a, b)
        self._shift(j, b, a)
        return d

    def neighbours(self, j: int) -> set[int]:
        """Nodes where some file of ``j`` is read, written or located."""
        out: set[int] = set()
        for f in self.jfiles[j]:
            out.update(self.rc[f])
            out.update(self.wc[f])
            if self.p.init[f] >= 0:
                out.add(self.p.init[f])
        out.discard(self.assign[j])
        return out


def local_search(p: Problem, assign: Sequence[int], *, max_passes: int = 20, time_limit: float | None = None,
                 swap_candidates: int = 8, min_gain: float = 1e-3) -> list[int]:
    """Improve ``assign`` by strictly improving moves and swaps within the constraints.

    Each pass visits every job once: the best improving move of the job to a node that
    holds or reads one of its files, else — when such a node is full — the best
    improving swap with one of ``swap_candidates`` jobs there.  Stops after a pass that
    gained less than ``min_gain`` of the bytes, after ``max_passes``, or at
    ``time_limit`` seconds.
    """
    st = _State(p, list(assign))
    deadline = None if time_limit is None else time.monotonic() + time_limit
    jobs_on: list[dict[int, None]] = [{} for _ in p.nodes]
    for j, n in enumerate(st.assign):
        jobs_on[n][j] = None
    bound = p.bound + _EPS
    cost = _cost(p, st.assign)
    for _ in range(max_passes):
        gained = 0
        for j in range(len(p.jobs)):
            if deadline is not None and time.monotonic() > deadline:
                return st.assign
            a = st.assign[j]
            w = p.weight[j]
            best_d, best_b = 0, -1
            blocked: list[tuple[int, int]] = []
            for b in sorted(st.neighbours(j)):
                if not p.allowed(j, b):
                    continue
                d = st.delta_move(j, b)
                if d >= 0:
                    continue
                if st.load[b] + w > bound:
                    blocked.append((d, b))
                elif d < best_d:
                    best_d, best_b = d, b
            if best_b >= 0:
                st._shift(j, a, best_b)
                del jobs_on[a][j]
                jobs_on[best_b][j] = None
                gained -= best_d
                continue
            # the job would gain on a full node: swap it with a job there
            best_k = -1
            for _, b in sorted(blocked):
                tried = 0
                for k in jobs_on[b]:
                    if tried >= swap_candidates:
                        break
                    wk = p.weight[k]
                    if st.load[a] - w + wk > bound or st.load[b] - wk + w > bound or not p.allowed(k, a):
                        continue
                    tried += 1
                    d = st.delta_swap(j, k)
                    if d < best_d:
                        best_d, best_k = d, k
            if best_k >= 0:
                b = st.assign[best_k]
                st._shift(j, a, b)
                st._shift(best_k, b, a)
                del jobs_on[a][j]
                jobs_on[b][j] = None
                del jobs_on[b][best_k]
                jobs_on[a][best_k] = None
                gained -= best_d
        if gained <= min_gain * cost:
            break
        cost -= gained
    return st.assign


def feasible(p: Problem, assign: Sequence[int]) -> bool:
    """Within the load bound and the capacities."""
    return (all(p.allowed(j, n) for j, n in enumerate(assign))
            and max(_loads(p, assign), default=0.0) <= p.bound + _EPS)


def repair(p: Problem, assign: Sequence[int], *, max_moves: int | None = None) -> list[int]:
    """Bring a placement within the load bound and the capacities: while a node is over
    the bound (or a job is on a node without room for it), move the job whose move to a
    node with room adds the fewest bytes.  When moves alone cannot do it, the balance's
    packing (a placement within the bound) is returned.  A feasible input is returned
    unchanged."""
    assign = list(assign)
    if feasible(p, assign):
        return assign
    st = _State(p, assign)
    bound = p.bound + _EPS
    jobs_on: list[list[int]] = [[] for _ in p.nodes]
    for j, n in enumerate(assign):
        jobs_on[n].append(j)
    limit = max_moves if max_moves is not None else 4 * len(p.jobs) + 10
    for _ in range(limit):
        bad = [j for j, n in enumerate(st.assign) if not p.allowed(j, n)]
        if not bad:
            over = [n for n in range(len(p.nodes)) if st.load[n] > bound]
            if not over:
                return st.assign
            bad = [j for n in over for j in jobs_on[n]]
        best: tuple | None = None
        for j in bad:
            a, w = st.assign[j], p.weight[j]
            for b in range(len(p.nodes)):
                if b == a or not p.allowed(j, b) or st.load[b] + w > bound:
                    continue
                key = (st.delta_move(j, b), -w, j, b)
                if best is None or key < best:
                    best = key
        if best is None:
            break
        _, _, j, b = best
        a = st.assign[j]
        st._shift(j, a, b)
        jobs_on[a].remove(j)
        jobs_on[b].append(j)
    if p.balance is not None and p.balance.packing:
        return list(p.balance.packing)
    return st.assign


def _random_start(p: Problem, rng: Any) -> list[int]:
    """A random feasible placement: jobs in random order, each on a random node among
    those with room (the least loaded one when none has)."""
    load = [0.0] * len(p.nodes)
    assign = [0] * len(p.jobs)
    order = list(range(len(p.jobs)))
    rng.shuffle(order)
    for j in order:
        w = p.weight[j]
        ok = [n for n in range(len(p.nodes)) if p.allowed(j, n) and load[n] + w <= p.bound + _EPS]
        if not ok:
            ok = [min((n for n in range(len(p.nodes)) if p.allowed(j, n)), key=load.__getitem__)]
        n = rng.choice(ok)
        assign[j] = n
        load[n] += w
    return assign


def solve_local(p: Problem, *, restarts: int | None = None, seed: int = 0, time_limit: float | None = None,
                seeds: Iterable[Sequence[int]] = (), hypergraph: bool | Sequence[int] = True,
                makespan_slack: float | None = DEFAULT_MAKESPAN_SLACK, **kw: Any) -> list[int]:
    """The local search from Mt-KaHyPar's partition (:func:`solve_hypergraph`, unless
    ``hypergraph`` is false; or the partition ``hypergraph`` given), from each of ``seeds`` (e.g. the recorded placement;
    repaired into the bound first), and — up to ``LARGE_INSTANCE`` jobs — from the
    greedy, from the balance's packing (heaviest job first on the least loaded node: a
    short makespan) and from ``restarts`` random feasible placements (default: as many
    as fit in about 20,000 job visits, at least 0).

    Of the results, the one with the fewest bytes among those whose makespan
    (:func:`makespan`) is at most ``(1 + makespan_slack)`` × the shortest of them: a
    placement that saves bytes is not taken when it lengthens the makespan by more than
    that.  With ``makespan_slack=None`` the fewest bytes win, and the result is then
    never worse than the greedy, than Mt-KaHyPar's partition, nor than any seed within
    the bound."""
    import random

    deadline = None if time_limit is None else time.monotonic() + time_limit
    starts: list[Sequence[int]] = []
    if not isinstance(hypergraph, bool):
        starts.append(repair(p, hypergraph))  # a partition already computed
    elif hypergraph and len(p.nodes) > 1:
        starts.append(solve_hypergraph(p))
    small = len(p.jobs) <= LARGE_INSTANCE or not starts
    starts.extend(repair(p, s) if small else s for s in seeds)  # large: only seeds already within the bound
    if small and makespan_slack is not None and p.balance is not None and p.balance.packing:
        starts.append(p.balance.packing)
    if small:
        starts.append(solve_greedy(p))
    results: list[tuple[int, list[int]]] = []
    seen: set[tuple[int, ...]] = set()
    for start in starts:
        key = tuple(start)
        if key in seen or not feasible(p, start):
            continue
        seen.add(key)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        cand = local_search(p, start, time_limit=left, **kw)
        results.append((_cost(p, cand), cand))
    if not results:  # the bound could not be met by repair: fall back to the packing
        results.append((_cost(p, starts[-1]), list(starts[-1])))
    best_cost, best = min(results, key=lambda r: r[0])
    if restarts is None:
        restarts = min(50, 20_000 // max(1, len(p.jobs)) // 5) if small else 0
    rng = random.Random(seed)
    found = None
    for _ in range(restarts):
        if best_cost == 0:
            break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        start = _random_start(p, rng)
        if not feasible(p, start):
            continue
        cand = local_search(p, start, time_limit=left, **kw)
        c = _cost(p, cand)
        if c < best_cost:
            best, best_cost, found = cand, c, cand
    if found is not None:
        results.append((best_cost, found))
    if makespan_slack is None or len(results) == 1:
        return best
    rank = _upward_rank(p)
    spans = [makespan(p, a, rank=rank) for _, a in results]
    limit = min(spans) * (1.0 + makespan_slack) + _EPS
    eligible = [(c, i) for i, ((c, _), m) in enumerate(zip(results, spans)) if m <= limit]
    return results[min(eligible)[1]][1]


_MTK: Any = None
_MTK_LOCK = threading.Lock()
HYPERGRAPH_SEED = 0
# Mt-KaHyPar's quality configuration in its deterministic form: the same partition on
# every run (its "quality" preset gives a different one each time, even on one thread,
# within a few % of it; measured in docs/scheduling.md)
HYPERGRAPH_PRESET = "deterministic_quality"
_INT_MAX = (1 << 31) - 1


def _mtkahypar() -> Any:
    """Mt-KaHyPar, initialised once per process (its thread pool: every core)."""
    global _MTK
    with _MTK_LOCK:
        if _MTK is None:
            import mtkahypar

            init = mtkahypar.initialize(max(1, os.cpu_count() or 1), False)
            _MTK = (mtkahypar, init)
        return _MTK


def hypergraph_nets(p: Problem) -> tuple[list[list[int]], list[int], int, list[int]]:
    """The placement as hypergraph partitioning with the connectivity (λ − 1) objective:
    vertices are the jobs ``0..J-1`` and one fixed vertex per node (``J + n``, weight 0);
    each file that has a source and is read is a net over its writers, its readers and
    the node it is located on, weighted by its size in units of ``unit`` bytes (KiB, or
    coarser when the weights would overflow 32 bits).  For a file with one source the
    net's λ − 1 is exactly the number of nodes that receive it; with several writers it
    can count a writer's node that reads nothing.  Returns ``(nets, weights, unit, files)``
    (``files[i]``: the file of net ``i``)."""
    nets: list[list[int]] = []
    sizes: list[int] = []
    net_files: list[int] = []
    J = len(p.jobs)
    for f in range(len(p.files)):
        if not p.readers[f] or p.size[f] <= 0:
            continue
        init = p.init[f]
        if not p.writers[f] and init < 0:  # slow tier, or a node outside: no choice of ours changes it
            continue
        pins = set(p.writers[f]) | set(p.readers[f])
        if init >= 0:
            pins.add(J + init)
        if len(pins) < 2:
            continue
        nets.append(sorted(pins))
        sizes.append(p.size[f])
        net_files.append(f)
    unit = 1024
    k = max(1, len(p.nodes) - 1)
    while sum(-(-s // unit) for s in sizes) * k >= _INT_MAX:
        unit *= 2
    return nets, [-(-s // unit) for s in sizes], unit, net_files


def solve_hypergraph(p: Problem, *, preset: str = HYPERGRAPH_PRESET, seed: int = HYPERGRAPH_SEED) -> list[int]:
    """Mt-KaHyPar (``preset``, objective km1) on :func:`hypergraph_nets`, each
    block's weight held to the load bound (jobs weighted by their runtimes scaled to
    integers), the located files' nodes fixed; then :func:`repair` for the capacities
    and any rounding.  Within the bound whenever the bound is feasible."""
    J, N = len(p.jobs), len(p.nodes)
    if N == 1 or J == 0:
        return repair(p, [0] * J)
    nets, ew, _, _ = hypergraph_nets(p)
    total = sum(p.weight)
    scale = (1 << 30) / total if total > 0 else 1.0
    scale = min(scale, 1e6)  # runtimes to the microsecond at most
    vw = [int(w * scale) for w in p.weight]  # rounded down: the rounded loads never exceed the true ones' bound
    # Mt-KaHyPar ends the process when the blocks cannot hold the total weight, and hangs
    # on fixed vertices of weight 0: the node vertices weigh 1 and each block holds 1 more
    cap = math.ceil(p.bound * scale) + 1
    fixed_used = sorted({p.init[f] for f in range(len(p.files)) if p.init[f] >= 0})
    mtk, init = _mtkahypar()
    with _MTK_LOCK:
        mtk.set_seed(seed)
        ctx = init.context_from_preset(getattr(mtk.PresetType, preset.upper()))
        ctx.logging = False
        eps = max(0.0, p.bound / (total / N) - 1.0) if total > 0 else 0.0
        ctx.set_partitioning_parameters(N, eps, mtk.Objective.KM1)
        ctx.set_individual_target_block_weights([cap] * N)
        hg = init.create_hypergraph(ctx, J + N, len(nets), nets, vw + [1] * N, ew)
        if fixed_used:
            hg.add_fixed_vertices([-1] * J + list(range(N)), N)
        phg = hg.partition(ctx)
        blocks = phg.get_partition()
    return repair(p, [int(b) for b in blocks[:J]])


@dataclass(frozen=True, slots=True)
class ExactResult:
    assign: list[int]
    optimal: bool
    lower_bound: float


def solve_exact(p: Problem, *, time_limit: float = EXACT_DEFAULT_TIME_LIMIT) -> ExactResult:
    """The MILP of the module docstring, solved with HiGHS through scipy."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    J, N = len(p.jobs), len(p.nodes)
    src = p.has_source
    yfiles = [f for f in range(len(p.files)) if src[f] and p.readers[f]]
    nx = J * N
    nvar = nx + len(yfiles) * N
    c = np.zeros(nvar)
    for k, f in enumerate(yfiles):
        c[nx + k * N: nx + (k + 1) * N] = p.size[f]
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    for j in range(J):  # each job on one node
        for n in range(N):
            rows.append(r); cols.append(j * N + n); vals.append(1.0)
        lo.append(1.0); hi.append(1.0); r += 1
    for n in range(N):  # load bound
        for j in range(J):
            if p.weight[j]:
                rows.append(r); cols.append(j * N + n); vals.append(p.weight[j])
        lo.append(-np.inf); hi.append(p.bound + 1e-6); r += 1
    for k, f in enumerate(yfiles):
        for j in sorted(set(p.readers[f])):
            writes = set(p.writers[f])
            for n in range(N):
                if j not in writes:  # a job that writes what it reads holds it
                    rows.append(r); cols.append(j * N + n); vals.append(1.0)
                for w in writes - {j}:
                    rows.append(r); cols.append(w * N + n); vals.append(-1.0)
                rows.append(r); cols.append(nx + k * N + n); vals.append(-1.0)
                lo.append(-np.inf); hi.append(1.0 if p.init[f] == n else 0.0); r += 1
    ub = np.ones(nvar)
    for j in range(J):
        for n in range(N):
            if not p.allowed(j, n):
                ub[j * N + n] = 0.0
    symmetric = all(i < 0 for i in p.init) and len(set(p.capacity)) == 1
    lb = np.zeros(nvar)
    if symmetric and J:
        lb[0] = 1.0  # interchangeable nodes: job 0 on node 0
    A = coo_array((vals, (rows, cols)), shape=(r, nvar)).tocsr()
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(nvar),
               bounds=Bounds(lb, ub), options={"time_limit": time_limit, "disp": False})
    if res.x is None:
        raise PlacementError(f"the exact solver found no placement ({res.message})")
    x = np.asarray(res.x[:nx]).reshape(J, N) if J else np.zeros((0, N))
    assign = [int(np.argmax(x[j])) for j in range(J)]
    bound = getattr(res, "mip_dual_bound", None)
    return ExactResult(assign, res.status == 0, float(bound) if bound is not None else float("nan"))


# -- layer 2: each node's plan ----------------------------------------------------------

class _NodeCache:
    """The CacheView the heuristic needs, with pins that follow the plan."""

    def __init__(self, capacity: int, pinned: Iterable[Hashable]) -> None:
        self.capacity = capacity
        self.used = 0
        self.sizes: dict[Hashable, int] = {}
        self.always = frozenset(pinned)
        self.job: set[Hashable] = set()  # the running job's files: it needs them until it ends

    def is_pinned(self, key: Hashable) -> bool:
        return key in self.job or key in self.always


def plan_node(node: str, jobs: Sequence[WorkflowJob], capacity: int | None,
              source: Mapping[str, str], pinned: Iterable[str] = ()) -> list[dict[str, Any]]:
    """One node's ordered steps for its ``jobs`` (in execution order).

    Step actions: ``prefetch`` (bring ``path`` into the fast tier from ``source``: a
    node's name — this node's own name means promote the local copy — or ``"slow"``, the
    shared slow tier) and ``evict`` (drop it from the fast tier), both decided by the
    heuristic within ``capacity``; ``pin`` for each output the job writes that the plan
    keeps in the fast tier (the output is written there: the agent must keep it, not
    fetch it; it comes after the evictions that make its room); ``unpin`` after a job
    for each resident file with no planned reference left on this node (from then on
    the agent's own policy may evict it).
    Prefetched and pinned files are held for the plan until their ``evict`` or
    ``unpin``.  While a job is planned, the files it has in the fast tier are not
    chosen as victims for its other files: one input never pushes out another, so
    every input the plan stages is there when the job starts.  ``resident`` is the plan's fast-tier bytes after the step.
    """
    refs: list[tuple[str, str, int]] = []  # (file, kind, job index)
    for k, job in enumerate(jobs):
        refs.extend((f, "pre", k) for f in job.inputs)
        refs.extend((f, "read", k) for f in job.inputs)
        refs.extend((f, "write", k) for f in job.outputs)
    policy = HeuristicPolicy(f for f, _, _ in refs)
    cache = _NodeCache(capacity if capacity is not None else 1 << 62, pinned)
    steps: list[dict[str, Any]] = []

    def emit(job: str, action: str, path: str, size: int, src: str | None) -> None:
        steps.append({"step": len(steps) + 1, "job": job, "action": action, "path": path, "size": size,
                      "source": src, "resident": cache.used})

    i = 0
    while i < len(refs):
        k = refs[i][2]
        job = jobs[k]
        while i < len(refs) and refs[i][2] == k:
            f, kind, _ = refs[i]
            i += 1
            size = job.inputs[f] if kind != "write" else job.outputs[f]
            d = policy.access(f, size, cache)
            if d.hit:
                cache.job.add(f)
                continue
            for v in d.victims:
                vs = cache.sizes.pop(v)
                cache.used -= vs
                emit(job.id, "evict", str(v), vs, None)
            if d.admit:
                cache.sizes[f] = size
                cache.used += size
                cache.job.add(f)
                if kind == "write":
                    emit(job.id, "pin", f, size, None)
                else:
                    emit(job.id, "prefetch", f, size, source.get(f, "slow"))
        cache.job.clear()
        for f in dict.fromkeys([*job.inputs, *job.outputs]):
            if f in cache.sizes and policy.remaining(f) == 0:
                emit(job.id, "unpin", f, cache.sizes[f], None)
    return steps


def prefetch_sources(wf: Workflow, placement: Mapping[str, str],
                     locations: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """For each node, where each file it reads comes from: the node itself when it
    holds the file (written there or located there), else the first writer's node, else
    the located node, else ``"slow"``."""
    locations = locations or {}
    writer_nodes: dict[str, list[str]] = defaultdict(list)
    for job in wf.jobs:
        for f in job.outputs:
            writer_nodes[f].append(placement[job.id])
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for job in wf.jobs:
        node = placement[job.id]
        for f in job.inputs:
            holders = writer_nodes.get(f, [])
            if node in holders or locations.get(f) == node:
                out[node][f] = node
            elif holders:
                out[node][f] = holders[0]
            elif f in locations:
                out[node][f] = locations[f]
            else:
                out[node][f] = "slow"
    return out


def plan_nodes(wf: Workflow, placement: Mapping[str, str], nodes: Sequence[str],
               capacity: int | Mapping[str, int | None] | None = None,
               locations: Mapping[str, str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Layer 2 for every node of ``nodes``: :func:`plan_node` over its jobs in order."""
    by_node: dict[str, list[WorkflowJob]] = {n: [] for n in nodes}
    for job in wf.jobs:
        by_node.setdefault(placement[job.id], []).append(job)
    sources = prefetch_sources(wf, placement, locations)
    plans = {}
    for n, jobs in by_node.items():
        cap = capacity.get(n) if isinstance(capacity, Mapping) else capacity
        plans[n] = plan_node(n, jobs, cap, sources.get(n, {}), wf.pinned)
    return plans


# -- online: one ready job at a time ---------------------------------------------------------

def choose_node(inputs: Mapping[str, int], nodes: Sequence[str], *, locations: Mapping[str, str] | None = None,
                capacity: Mapping[str, int | None] | None = None, footprint: int | None = None,
                running: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Online layer 1: where a job that reads ``inputs`` (file → bytes) should run now.

    The bytes a node would receive are the inputs located on another node
    (``locations``, e.g. from the DHT); inputs on no node come from the shared slow tier
    wherever the job runs (``slow_tier_bytes``).  Among the nodes whose fast tier can
    hold the job's ``footprint`` (default: its inputs), the fewest bytes win; ties go to
    the node with the fewest ``running`` jobs, then to the order of ``nodes``.  Returns
    ``{"node", "bytes_moved": {node: bytes}, "slow_tier_bytes", "locations": {file: node
    or None}, "candidates": [nodes with room]}``; PlacementError when no node has room."""
    if not nodes:
        raise PlacementError("no nodes to place on")
    locations = locations or {}
    running = running or {}
    need = footprint if footprint is not None else sum(inputs.values())
    fits = [n for n in nodes if (capacity or {}).get(n) is None or need <= (capacity or {})[n]]  # type: ignore[operator]
    if not fits:
        raise PlacementError(f"the job needs {need} bytes of fast tier: no node has room")
    moved = {n: 0 for n in nodes}
    slow = 0
    for f, size in inputs.items():
        at = locations.get(f)
        if at is None:
            slow += size
            continue
        for n in nodes:
            if n != at:
                moved[n] += size
    order = {n: i for i, n in enumerate(nodes)}
    best = min(fits, key=lambda n: (moved[n], running.get(n, 0), order[n]))
    return {"node": best, "bytes_moved": moved, "slow_tier_bytes": slow,
            "locations": {f: locations.get(f) for f in inputs}, "candidates": fits}


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
          makespan_slack: float | None = DEFAULT_MAKESPAN_SLACK) -> dict[str, Any]:
    """Both layers of 2LS for a workflow: the dict ``hycache place --json`` prints.

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
    optimal: bool | None = None
    if solver == "greedy":
        assign = solve_greedy(p)
    elif solver == "local":
        rec = wf.recorded_placement()
        node_ix = {n: i for i, n in enumerate(p.nodes)}
        seeds = [[node_ix[rec[j]] for j in p.jobs]] if rec and all(m in node_ix for m in rec.values()) else []
        assign = solve_local(p, time_limit=time_limit, seeds=seeds, makespan_slack=makespan_slack)
    elif solver == "hypergraph":
        assign = solve_hypergraph(p)
    elif solver == "exact":
        res = solve_exact(p, time_limit=time_limit or EXACT_DEFAULT_TIME_LIMIT)
        assign, optimal = res.assign, res.optimal
    else:
        assign = solve_round_robin(p)
    seconds = time.perf_counter() - t0
    placement = {p.jobs[j]: p.nodes[n] for j, n in enumerate(assign)}
    rr = {p.jobs[j]: p.nodes[n] for j, n in enumerate(solve_round_robin(p))}
    moved, slow = transfer_bytes(wf, placement, locations)
    rr_moved, rr_slow = transfer_bytes(wf, rr, locations)
    recorded = wf.recorded_placement()
    rec_moved = rec_slow = None
    if recorded is not None:
        rec_moved, rec_slow = transfer_bytes(wf, recorded, locations)
    total = sum(p.weight) or 1.0
    rank = _upward_rank(p)
    node_ix = {n: i for i, n in enumerate(p.nodes)}
    spans = {"placed": makespan(p, assign, rank=rank), "round_robin": makespan(p, solve_round_robin(p), rank=rank),
             "recorded": None, "lower_bound": makespan_lower_bound(p)}
    if recorded is not None and all(m in node_ix for m in recorded.values()):
        spans["recorded"] = makespan(p, [node_ix[recorded[j]] for j in p.jobs], rank=rank)
    load = {n: 0.0 for n in p.nodes}
    for j, n in enumerate(assign):
        load[p.nodes[n]] += p.weight[j]
    out: dict[str, Any] = {
        "placement": placement,
        "transfer_bytes": {"placed": moved, "round_robin": rr_moved, "recorded": rec_moved},
        "slow_tier_bytes": {"placed": slow, "round_robin": rr_slow, "recorded": rec_slow},
        "load": {n: v / total for n, v in load.items()},
        "load_bound": p.bound / total,
        "load_bound_requested": p.balance.requested / total if p.balance else p.bound / total,
        "load_bound_reason": p.balance.reason if p.balance else None,
        "load_unit": "runtime" if wf.runtimes_known() else "jobs",
        "makespan": spans,
        "makespan_unit": "seconds" if wf.runtimes_known() else "jobs",
        "makespan_slack": makespan_slack,
        "plans": plan_nodes(wf, placement, p.nodes, capacity, locations) if plans else {},
        "solver": solver,
        "optimal": optimal,
        "seconds": seconds,
        "format": wf.format,
        "jobs": len(p.jobs),
        "files": len(p.files),
    }
    return out

"""2-Layer Scheduling: the indexed problem the solvers share (jobs, files, nodes, weights,
capacities) and the load bound, checked exactly (:func:`balance`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import milp
from ..workflow import Workflow

SOLVERS = ("greedy", "local", "hypergraph", "exact", "round-robin")
DEFAULT_SLACK = 0.1
EXACT_DEFAULT_TIME_LIMIT = 60.0
SLOW = -1  # a file on the shared slow tier
ELSEWHERE = -2  # a file on a node that is not one of the candidate nodes
_EPS = 1e-9


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
    from scipy.sparse import coo_array

    classes: dict[tuple[float, tuple[int, ...]], list[int]] = {}
    for j, w in enumerate(weight):
        classes.setdefault((float(w), tuple(allowed[j])), []).append(j)
    keys = list(classes)
    C, N = len(keys), n_nodes
    nx = C * N
    nvar = nx + (0 if bound is not None else 1)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    r = 0
    ub = np.zeros(nvar)
    for c, (_w, ok) in enumerate(keys):
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
    res = milp.solve(cost, A, lo, hi, integrality=integrality, lb=lb, ub=ub, time_limit=time_limit)
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

    def rel(v: float) -> float:  # in node shares, when there are any
        return v / share if share else v

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
        for fi in ins:
            readers[fi].append(j)
        for fi in outs:
            writers[fi].append(j)
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

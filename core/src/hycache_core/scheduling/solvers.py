"""2-Layer Scheduling, layer 1: the solvers (round-robin, greedy, the local search and its
repair, Mt-KaHyPar's ``hypergraph``, the ``exact`` MILP); see the package docstring."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import milp
from .accounting import DEFAULT_MAKESPAN_SLACK, LARGE_INSTANCE, _cost, _loads, _upward_rank, makespan
from .problem import _EPS, EXACT_DEFAULT_TIME_LIMIT, PlacementError, Problem

# -- layer 1: the solvers ---------------------------------------------------------------

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
        best: tuple[int, int, float, int] | None = None
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
        best: tuple[int, float, int, int] | None = None
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
    res = milp.solve(c, A, lo, hi, integrality=np.ones(nvar), lb=lb, ub=ub, time_limit=time_limit)
    if res.x is None:
        raise PlacementError(f"the exact solver found no placement ({res.message})")
    x = np.asarray(res.x[:nx]).reshape(J, N) if J else np.zeros((0, N))
    assign = [int(np.argmax(x[j])) for j in range(J)]
    bound = getattr(res, "mip_dual_bound", None)
    return ExactResult(assign, res.status == 0, float(bound) if bound is not None else float("nan"))

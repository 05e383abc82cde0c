"""Offline references: how well could any policy have done on this reference string?

Objective.  The papers' goal is "to minimize the total I/O cost of the disk", i.e. the
bytes read from the slow tier.  A reference that is served from the cache saves its
file's bytes; so the offline optimum maximizes the *read bytes served from cache*
(``objective="bytes"``, the default; ``"hits"`` counts references instead).

Model (the same one the simulator's cache driver enforces).  A file can only be served
from the cache at reference ``j`` if it stayed resident since its previous reference
``i`` to the same path with the same size: the *interval* ``[i, j)``.  A schedule is a
set of kept intervals whose sizes, at every instant, sum to at most the capacity.  An
interval only counts when its end ``j`` is a read: keeping a file until it is
overwritten saves no slow-tier read, so such intervals are not offered.

* :func:`next_reads` — for each position, the end of the interval that starts there.
* :func:`fractional_bound` — an upper bound on the read bytes any schedule can serve
  from cache, computed exactly in O(m log m): with every byte weighted alike, the LP
  relaxation (files may be kept in part) is the maximum-size packing of unit
  intervals into ``capacity`` tracks, which the furthest-end-first greedy solves
  exactly (Carlsson & Nilsson; Yannakakis & Gavril 1987) — i.e. Belady's rule applied
  byte by byte.  With files of one size ``s`` the capacity is rounded down to a
  multiple of ``s`` and the bound is exact: it is Belady's MIN.  The greedy also says
  which intervals it kept whole: they form a feasible integral schedule (the FOO-U
  style rounding of Berger et al., SIGMETRICS 2018).
* :func:`solve_ilp` — the exact integer program on small instances, with HiGHS
  through :func:`scipy.optimize.milp` (binary ``x`` per interval, one capacity row per
  interval start, rows that can never overflow dropped).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def next_reads(keys: Sequence[int], sizes: Sequence[int], writes: Sequence[int]) -> list[int]:
    """``nxt[i]``: the position of the next reference to ``keys[i]`` if it is a read of
    the same size (so a copy kept since ``i`` would serve it), else ``len(keys)``."""
    n = len(keys)
    nxt = [n] * n
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        k = keys[i]
        j = last.get(k)
        if j is not None and not writes[j] and sizes[j] == sizes[i]:
            nxt[i] = j
        last[k] = i
    return nxt


def effective_capacity(sizes: Sequence[int], nxt: Sequence[int], capacity: int) -> int:
    """The capacity rounded down to a multiple of the file size when every interval
    has the same size (then the fractional bound is Belady's MIN exactly)."""
    n = len(nxt)
    common = None
    for i in range(n):
        if nxt[i] < n and sizes[i] <= capacity:
            s = sizes[i]
            if common is None:
                common = s
            elif s != common:
                return capacity
    if common:
        return capacity // common * common
    return capacity


@dataclass(frozen=True)
class FractionalBound:
    capacity_used: int       # the (possibly rounded) capacity of the relaxation
    read_hit_bytes: float    # upper bound on read bytes served from cache
    whole: bytearray         # whole[i] = 1 if interval i was kept whole by the greedy


def fractional_bound(
    keys: Sequence[int], sizes: Sequence[int], nxt: Sequence[int], capacity: int
) -> FractionalBound:
    """Exact optimum of the byte-weighted LP relaxation (see module docstring)."""
    n = len(keys)
    cap = effective_capacity(sizes, nxt, capacity)
    amount: dict[int, int] = {}  # open interval (its start) -> bytes still kept
    end_of: dict[int, int] = {}  # end position -> start of the interval ending there
    heap: list[tuple[int, int]] = []  # (-end, start)
    whole = bytearray(n)
    load = 0
    hit = 0
    for t in range(n):
        start = end_of.pop(t, None)
        if start is not None:
            a = amount.pop(start, 0)
            if a:
                load -= a
                hit += a
                if a == sizes[start]:
                    whole[start] = 1
        e = nxt[t]
        s = sizes[t]
        if e < n and 0 < s <= cap:
            amount[t] = s
            end_of[e] = t
            load += s
            heapq.heappush(heap, (-e, t))
            while load > cap:
                start = heap[0][1]
                kept = amount.get(start)
                if kept is None:
                    heapq.heappop(heap)
                    continue
                excess = load - cap
                if kept <= excess:
                    heapq.heappop(heap)
                    del amount[start]
                    load -= kept
                else:
                    amount[start] = kept - excess
                    load = cap
        elif e < n and s == 0:
            whole[t] = 1  # an empty file costs no room
    return FractionalBound(cap, float(hit), whole)


def _repair(x: np.ndarray, idx: np.ndarray, end: np.ndarray, sizes: Sequence[int], capacity: int,
            weight: np.ndarray) -> bool:
    """Check the solver's schedule in exact integer arithmetic (the solver works to a
    tolerance); drop the lightest offending intervals if it overflows anywhere.
    Returns whether anything had to be dropped."""
    repaired = False
    while True:
        chosen = np.nonzero(x)[0]
        if not len(chosen):
            return repaired
        size = np.array([sizes[int(idx[k])] for k in chosen], dtype=np.int64)
        starts, ends = idx[chosen], end[chosen]
        times = np.unique(starts)
        load = np.zeros(len(times) + 1, dtype=np.int64)
        np.add.at(load, np.searchsorted(times, starts), size)
        np.add.at(load, np.searchsorted(times, ends), -size)
        load = np.cumsum(load)[: len(times)]
        over = np.nonzero(load > capacity)[0]
        if not len(over):
            return repaired
        t = times[over[0]]
        covering = chosen[(starts <= t) & (t < ends)]
        x[covering[np.argmin(weight[covering])]] = False
        repaired = True


@dataclass(frozen=True)
class ILPResult:
    status: str               # "optimal", "time-limit", "approximate", "infeasible", "failed"
    keep: bytearray | None    # keep[i] = 1: keep the file from reference i to nxt[i]
    objective: float          # value of the returned schedule
    bound: float              # upper bound on the objective (== objective if optimal)
    seconds: float
    intervals: int
    rows: int


def ilp_size(sizes: Sequence[int], nxt: Sequence[int], capacity: int) -> int:
    """Number of binary variables :func:`solve_ilp` would use."""
    n = len(nxt)
    return sum(1 for i in range(n) if nxt[i] < n and sizes[i] <= capacity)


def _binding_rows(idx: np.ndarray, size: np.ndarray, end: np.ndarray, capacity: int
                  ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The capacity rows that can bind (at an interval start whose offered load exceeds
    ``capacity``; the others can never bind and are dropped), and each variable's
    entries in them: ``(binding starts, row indices, column indices)``.  A variable
    never covered by a binding row is free: the solver keeps it."""
    m = len(idx)
    first_row = np.arange(m)                          # interval k covers starts idx[k] ..
    last_row = np.searchsorted(idx, end, side="left")  # .. up to (excluding) its end
    diff = np.zeros(m + 1)
    np.add.at(diff, first_row, size)
    np.add.at(diff, last_row, -size)
    load = np.cumsum(diff)[:m]
    binding = np.nonzero(load > capacity)[0]
    row_of = -np.ones(m, dtype=np.int64)
    row_of[binding] = np.arange(len(binding))
    rows_list, cols_list = [], []
    for k in range(m):
        r = row_of[first_row[k] : last_row[k]]
        r = r[r >= 0]
        if len(r):
            rows_list.append(r)
            cols_list.append(np.full(len(r), k, dtype=np.int64))
    return binding, rows_list, cols_list


def solve_ilp(
    sizes: Sequence[int],
    nxt: Sequence[int],
    capacity: int,
    objective: str = "bytes",
    time_limit: float = 30.0,
    pinned_intervals: Sequence[int] = (),
) -> ILPResult:
    """The exact offline optimum as a 0/1 program, solved by HiGHS.

    ``pinned_intervals``: interval starts forced to be kept (unused by the simulator,
    which skips the ILP when files are pinned; kept for planners).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array

    t0 = time.perf_counter()
    n = len(nxt)
    idx = np.array([i for i in range(n) if nxt[i] < n and sizes[i] <= capacity], dtype=np.int64)
    m = len(idx)
    if m == 0:
        return ILPResult("optimal", bytearray(n), 0.0, 0.0, time.perf_counter() - t0, 0, 0)
    size = np.array([sizes[i] for i in idx], dtype=np.float64)
    end = np.array([nxt[i] for i in idx], dtype=np.int64)
    weight = size if objective == "bytes" else np.ones(m)
    binding, rows_list, cols_list = _binding_rows(idx, size, end, capacity)
    lower = np.zeros(m)
    for p in pinned_intervals:
        pos = np.searchsorted(idx, p)
        if pos < m and idx[pos] == p:
            lower[pos] = 1
    if not rows_list:
        keep = bytearray(n)
        for i in idx:
            keep[i] = 1
        obj = float(weight.sum())
        return ILPResult("optimal", keep, obj, obj, time.perf_counter() - t0, m, 0)
    rows = np.concatenate(rows_list)
    cols = np.concatenate(cols_list)
    # Scaled to O(1) coefficients (sizes / capacity, weights / max weight): byte
    # counts of 1e8-1e10 make HiGHS's simplex numerically unhappy.
    a = csr_array((size[cols] / capacity, (rows, cols)), shape=(len(binding), m))
    scale = float(weight.max())
    res = milp(
        c=-weight / scale,
        constraints=LinearConstraint(a, -np.inf, 1.0),
        integrality=np.ones(m),
        bounds=Bounds(lower, np.ones(m)),
        options={"time_limit": float(time_limit), "disp": False, "mip_rel_gap": 0.0},
    )
    seconds = time.perf_counter() - t0
    if res.x is None:
        status = "infeasible" if res.status == 2 else "failed"
        return ILPResult(status, None, 0.0, float("inf"), seconds, m, len(binding))
    status, keep, obj, bound = _ilp_schedule(res, n, idx, end, sizes, capacity, weight, scale)
    return ILPResult(status, keep, obj, bound, seconds, m, len(binding))


def _ilp_schedule(res: Any, n: int, idx: np.ndarray, end: np.ndarray, sizes: Sequence[int], capacity: int,
                  weight: np.ndarray, scale: float) -> tuple[str, bytearray, float, float]:
    """The schedule of HiGHS's solution ``res`` (repaired if it overfills the cache):
    ``(status, keep, objective, upper bound)``."""
    x = res.x > 0.5
    repaired = _repair(x, idx, end, sizes, capacity, weight)
    keep = bytearray(n)
    for k in np.nonzero(x)[0]:
        keep[int(idx[k])] = 1
    obj = float(weight[x].sum())
    dual = getattr(res, "mip_dual_bound", None)
    bound = -float(dual) * scale if dual is not None and np.isfinite(dual) else float("inf")
    status = "optimal" if res.status == 0 and not repaired else "time-limit" if res.status == 1 else "approximate"
    if status == "optimal":
        bound = obj
    return status, keep, obj, max(bound, obj)

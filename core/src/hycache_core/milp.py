"""HiGHS (through :func:`scipy.optimize.milp`), with its answers checked.

HiGHS's presolve (SciPy 1.16.3) has answered "optimal" with a point that breaks a
constraint row: for the load bound of jobs weighing [6, 7, 12, 6, 5] on three nodes, 12
each (none exists; the least is 13), it put 6 + 7 on one node.  :func:`solve` checks the
rounded answer against every row and variable bound and, when it breaks one, solves the
same program again without presolve (which answered "infeasible" there, correctly).  The
placement's bound (scheduling/problem.py) and the exact placement (scheduling/solvers.py)
both solve through it."""

from __future__ import annotations

from typing import Any

#: how far a checked answer may stray outside a row or a bound (HiGHS's own tolerances are 1e-7)
TOLERANCE = 1e-6


def solve(cost: Any, A: Any, lo: Any, hi: Any, *, integrality: Any, lb: Any, ub: Any,
          time_limit: float, **options: Any) -> Any:
    """``min cost·x`` subject to ``lo <= A x <= hi``, ``lb <= x <= ub``, ``x`` integer where
    ``integrality`` is 1.  Returns SciPy's OptimizeResult; its ``x``, when there is one,
    keeps every row and bound once its integer variables are rounded."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    lo, hi = np.broadcast_to(np.asarray(lo, dtype=float), (A.shape[0],)), np.broadcast_to(
        np.asarray(hi, dtype=float), (A.shape[0],))
    lb, ub = np.asarray(lb, dtype=float), np.asarray(ub, dtype=float)
    integer = np.asarray(integrality) != 0

    def run(presolve: bool) -> Any:
        return milp(cost, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
                    bounds=Bounds(lb, ub),
                    options={"time_limit": time_limit, "disp": False, "presolve": presolve, **options})

    res = run(True)
    if res.x is not None:
        x = np.where(integer, np.rint(res.x), res.x)
        got = A @ x
        if (np.any(got < lo - TOLERANCE) or np.any(got > hi + TOLERANCE)
                or np.any(x < lb - TOLERANCE) or np.any(x > ub + TOLERANCE)):
            res = run(False)
    return res

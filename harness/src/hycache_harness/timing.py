"""What the benches share to measure and report: percentiles, medians, a timed call, JSON out."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def pct(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank below: the value at index ``int(q * n)`` of
    the sorted values (the largest for ``q`` = 1); NaN for no values."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def median(values: Iterable[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()``'s result and the seconds it took (perf_counter)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def write_json(path: Path | str, data: Any, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON to ``path`` (a bench's ``--json FILE``)."""
    p = Path(path)
    p.write_text(json.dumps(data, indent=indent))
    return p

"""An agent's heartbeat status as the control plane reads it: a field dug out of nested
dicts, and values coerced to what the API shows (a number that is not finite, or a
value of the wrong type, becomes None): whatever an agent sends, a reader never fails."""

from __future__ import annotations

from typing import Any


def dig(d: dict | None, *path: str, default: Any = 0) -> Any:
    """``d[path[0]][path[1]]...``, or ``default`` where a level is missing or not a dict."""
    for p in path:
        if not isinstance(d, dict):
            return default
        d = d.get(p)
    return default if d is None else d


def as_int(x: Any) -> int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return None
    return int(x)


def as_float(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return None
    return float(x)


def as_num(x: Any) -> float:
    """:func:`as_float`, 0 for no value."""
    v = as_float(x)
    return 0.0 if v is None else v


def as_str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def as_dict(x: Any) -> dict | None:
    return x if isinstance(x, dict) else None

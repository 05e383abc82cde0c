"""Cache policies.  Online policies are found by name through the ``hycache.policies``
entry-point group, so third-party packages can add their own (the group is read once
per process: a plug-in installed later needs a restart)."""

from __future__ import annotations

import functools
import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from .arc import ARCPolicy
from .base import OnlinePolicy, Usage
from .gdsf import GDSFPolicy
from .heuristic import Decision, HeuristicPolicy, plan_heuristic
from .online import LFUPolicy, LRUPolicy

ENTRY_POINT_GROUP = "hycache.policies"


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, EntryPoint]:
    """The entry points, read once per process (reading them costs milliseconds;
    the simulator instantiates policies thousands of times)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_policies() -> list[str]:
    return sorted(_registry())


def load_policy(name: str, **options: Any) -> OnlinePolicy:
    """Instantiate the online policy registered under ``name``; ValueError if unknown.

    ``options`` (e.g. ``capacity=``) are passed to the policy's constructor when it
    accepts them and ignored otherwise, so callers can offer what they know.
    """
    ep = _registry().get(name)
    if ep is None:
        raise ValueError(f"unknown policy {name!r}; available: {', '.join(available_policies())}")
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, OnlinePolicy)):
        raise ValueError(f"policy plug-in {name!r} ({ep.value}) is not an OnlinePolicy")
    if options:
        params = inspect.signature(cls).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        options = {k: v for k, v in options.items() if takes_any or k in params}
    return cls(**options)


__all__ = [
    "OnlinePolicy",
    "Usage",
    "LRUPolicy",
    "LFUPolicy",
    "GDSFPolicy",
    "ARCPolicy",
    "HeuristicPolicy",
    "Decision",
    "plan_heuristic",
    "load_policy",
    "available_policies",
    "ENTRY_POINT_GROUP",
]

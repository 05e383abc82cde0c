"""Cache policies.  Online policies are found by name through the ``hycache.policies``
entry-point group, so third-party packages can add their own."""

from __future__ import annotations

from importlib.metadata import entry_points

from .base import OnlinePolicy
from .online import LFUPolicy, LRUPolicy

ENTRY_POINT_GROUP = "hycache.policies"


def available_policies() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_policy(name: str) -> OnlinePolicy:
    """Instantiate the online policy registered under ``name``; ValueError if unknown."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, OnlinePolicy)):
                raise ValueError(f"policy plug-in {name!r} ({ep.value}) is not an OnlinePolicy")
            return cls()
    raise ValueError(f"unknown policy {name!r}; available: {', '.join(available_policies())}")


__all__ = ["OnlinePolicy", "LRUPolicy", "LFUPolicy", "load_policy", "available_policies", "ENTRY_POINT_GROUP"]

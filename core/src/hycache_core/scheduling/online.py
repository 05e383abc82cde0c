"""2-Layer Scheduling online: where one ready job should run now (:func:`choose_node`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .problem import PlacementError

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

"""The cache simulator: one driver, every policy, comparable numbers.

    from hycache_core.sim import generate, simulate
    sim = simulate(generate("zipf", {"refs": "100000"}), 1 << 30, ["lru", "heuristic", "optimal"])
    sim.as_json()
"""

from .driver import CacheDriver, CacheInvariantError, CostModel, RunResult, Stats
from .generators import GENERATORS, generate
from .runner import PLANNED, SimOptions, Simulation, known_policies, simulate
from .trace import Trace, TraceError, parse_csv_trace, read_csv_trace, trace_from_manifest

__all__ = [
    "CacheDriver",
    "CacheInvariantError",
    "CostModel",
    "RunResult",
    "Stats",
    "GENERATORS",
    "generate",
    "PLANNED",
    "SimOptions",
    "Simulation",
    "known_policies",
    "simulate",
    "Trace",
    "TraceError",
    "parse_csv_trace",
    "read_csv_trace",
    "trace_from_manifest",
]

"""Synthetic workloads.  Each generator is ``name -> f(rng, **params) -> Trace``;
parameters are given as ``key=value`` strings on the command line (sizes accept
``64M`` etc.) and every generator is deterministic for a given seed.

* ``round-robin`` — the papers' §IV-E / §7.5 workload: ``files`` files of random
  sizes between 6 and 250 MB, read over and over in a fixed order.
* ``zipf`` — independent references to ``files`` files with Zipf(``alpha``)
  popularity and log-uniform sizes; a ``write_ratio`` of the references are writes.
* ``workflow`` — a pipeline of ``stages`` stages of ``width`` jobs: each job reads
  its inputs from the previous stage plus ``shared`` common files (a reference
  genome, a calibration table...) and writes one output; writes and reads mix.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import numpy as np

from ..sizes import parse_size
from .trace import Trace

MIB = 1 << 20


def round_robin(
    rng: np.random.Generator,
    files: int = 4,
    min_size: int = 6 * MIB,
    max_size: int = 250 * MIB,
    volume: int = 0,
    rounds: int = 0,
) -> Trace:
    """Read ``files`` files round-robin until ``volume`` bytes were read (or for
    ``rounds`` full rounds).  Sizes are uniform in ``[min_size, max_size]``."""
    if files < 1:
        raise ValueError("files must be at least 1")
    if not 0 < min_size <= max_size:
        raise ValueError("need 0 < min_size <= max_size")
    if (volume > 0) == (rounds > 0):
        raise ValueError("give exactly one of volume (bytes) and rounds")
    sizes = [int(s) for s in rng.integers(min_size, max_size + 1, size=files)]
    trace = Trace()
    keys = [trace.key_of(f"rr/{i:05d}") for i in range(files)]
    round_bytes = sum(sizes)
    n_rounds = rounds if rounds else volume // round_bytes
    out_keys, out_sizes = trace.keys, trace.sizes
    for _ in range(n_rounds):
        out_keys.extend(keys)
        out_sizes.extend(sizes)
    if volume:  # finish the partial last round
        left = volume - n_rounds * round_bytes
        i = 0
        while left > 0:
            out_keys.append(keys[i])
            out_sizes.append(sizes[i])
            left -= sizes[i]
            i += 1
    trace.writes = bytearray(len(out_keys))
    return trace


def zipf(
    rng: np.random.Generator,
    files: int = 10_000,
    refs: int = 100_000,
    alpha: float = 0.9,
    min_size: int = 4 << 10,
    max_size: int = 256 * MIB,
    write_ratio: float = 0.0,
) -> Trace:
    """Independent references with Zipf popularity (rank ``r`` has weight ``r^-alpha``);
    sizes log-uniform in ``[min_size, max_size]``, independent of popularity."""
    if files < 1 or refs < 1:
        raise ValueError("files and refs must be at least 1")
    if not 0 < min_size <= max_size:
        raise ValueError("need 0 < min_size <= max_size")
    if not 0.0 <= write_ratio <= 1.0:
        raise ValueError("write_ratio must be within [0, 1]")
    weights = np.arange(1, files + 1, dtype=np.float64) ** -alpha
    weights /= weights.sum()
    picks = rng.choice(files, size=refs, p=weights)
    sizes = np.exp(rng.uniform(math.log(min_size), math.log(max_size), size=files)).astype(np.int64)
    trace = Trace()
    for i in range(files):
        trace.key_of(f"z/{i:07d}")
    trace.keys = picks.tolist()
    trace.sizes = sizes[picks].tolist()
    trace.writes = bytearray((rng.random(refs) < write_ratio).astype(np.uint8).tobytes())
    return trace


def workflow(
    rng: np.random.Generator,
    stages: int = 10,
    width: int = 16,
    fan_in: int = 3,
    shared: int = 4,
    min_size: int = 1 * MIB,
    max_size: int = 128 * MIB,
    shared_size: int = 512 * MIB,
) -> Trace:
    """A staged workflow: stage ``s`` job ``j`` reads ``fan_in`` outputs of stage
    ``s-1`` and all ``shared`` files, then writes its own output."""
    if stages < 1 or width < 1 or fan_in < 0 or shared < 0:
        raise ValueError("stages and width must be at least 1; fan_in and shared non-negative")
    trace = Trace(jobs=[])
    shared_sizes = [int(s) for s in rng.integers(max(1, shared_size // 2), shared_size + 1, size=shared)]
    prev: list[tuple[str, int]] = []
    for s in range(stages):
        outputs = []
        for j in range(width):
            job = f"s{s:03d}-j{j:04d}"
            for i, size in enumerate(shared_sizes):
                trace.append(f"shared/{i}", size)
                trace.jobs.append(job)  # type: ignore[union-attr]
            if prev:
                for idx in rng.choice(len(prev), size=min(fan_in, len(prev)), replace=False):
                    name, size = prev[int(idx)]
                    trace.append(name, size)
                    trace.jobs.append(job)  # type: ignore[union-attr]
            out = (f"out/{job}", int(rng.integers(min_size, max_size + 1)))
            trace.append(out[0], out[1], write=True)
            trace.jobs.append(job)  # type: ignore[union-attr]
            outputs.append(out)
        prev = outputs
    return trace


GENERATORS: dict[str, Callable[..., Trace]] = {
    "round-robin": round_robin,
    "zipf": zipf,
    "workflow": workflow,
}


def generator_params(name: str) -> dict[str, object]:
    """Parameter names and defaults of a generator."""
    fn = GENERATORS[name]
    return {p.name: p.default for p in list(inspect.signature(fn).parameters.values())[1:]}


def generate(name: str, params: dict[str, str] | None = None, seed: int = 0) -> Trace:
    """Build a workload; ``params`` values are strings converted by the defaults' types."""
    if name not in GENERATORS:
        raise ValueError(f"unknown generator {name!r}; available: {', '.join(GENERATORS)}")
    defaults = generator_params(name)
    kwargs: dict[str, object] = {}
    for key, text in (params or {}).items():
        k = key.replace("-", "_")
        if k not in defaults:
            raise ValueError(f"generator {name!r} has no parameter {key!r}; it takes: {', '.join(defaults)}")
        default = defaults[k]
        try:
            if k.endswith("size") or k == "volume":
                kwargs[k] = parse_size(text)
            elif isinstance(default, float):
                kwargs[k] = float(text)
            else:
                kwargs[k] = int(float(text)) if "e" in text.lower() else int(text)
        except ValueError as exc:
            raise ValueError(f"generator {name!r}, parameter {key!r}: {exc}") from None
    return GENERATORS[name](np.random.default_rng(seed), **kwargs)

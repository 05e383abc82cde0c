"""Benchmark: the simulator on one million references (a script, not a test).

    cd /work/main && uv run python bench/simulate_1m.py [--refs 1000000] [--files 100000]

Generates a Zipf trace (alpha 0.9, log-uniform sizes 4 KiB-256 MiB), writes it as CSV,
then times parsing the CSV and one simulate() call with every policy (as
``hycache simulate`` does; single process, wall clock).  Prints one line per step
with references per second.  The optimum's line counts only its own work (the
fractional bound and the rounded schedule); it reuses the heuristic's and Belady's
runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

from hycache_core.sim import generate, read_csv_trace, simulate
from hycache_core.sim.runner import SimOptions
from hycache_core.sizes import format_size, parse_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--capacity", default="64G", help="about 1/400 of the bytes referenced (default 64G)")
    ap.add_argument("--policies", default="lru,lfu,gdsf,arc,heuristic,belady,optimal")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    capacity = parse_size(args.capacity)

    t0 = time.perf_counter()
    trace = generate("zipf", {"refs": str(args.refs), "files": str(args.files)}, seed=args.seed)
    gen_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.csv")
        trace.write_csv(path)
        mb = os.path.getsize(path) / 1e6
        t0 = time.perf_counter()
        trace = read_csv_trace(path)
        parse_s = time.perf_counter() - t0
    print(f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"# {len(trace):,} references, {trace.distinct_files:,} files, {format_size(trace.total_bytes)}; "
          f"cache {format_size(capacity)}")
    print(f"{'step':<12} {'seconds':>8} {'refs/s':>12}")
    print(f"{'generate':<12} {gen_s:8.2f} {len(trace) / gen_s:12,.0f}")
    print(f"{'parse csv':<12} {parse_s:8.2f} {len(trace) / parse_s:12,.0f}   ({mb:.0f} MB)")
    # One simulate() call, as `hycache simulate` does: the optimum reuses the
    # heuristic's and Belady's runs.  Per-policy wall time is measured inside.
    t0 = time.perf_counter()
    sim = simulate(trace, capacity, args.policies.split(","), options=SimOptions(ilp_max_intervals=0))
    sim_s = time.perf_counter() - t0
    for name, r in sim.results.items():
        st = r.stats
        print(f"{name:<12} {r.seconds:8.2f} {len(trace) / r.seconds:12,.0f}   hit ratio {st.hits / st.refs:.3f}, "
              f"byte hit ratio {st.hit_bytes / st.bytes_total:.3f}")
    print(f"{'all':<12} {sim_s:8.2f}   (every policy above, one simulate() call)")
    print(f"{'total':<12} {parse_s + sim_s:8.2f}   (parse + simulate)")

if __name__ == "__main__":
    main()

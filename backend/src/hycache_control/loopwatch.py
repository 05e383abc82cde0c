"""What holds the event loop: its lateness and the garbage collector's pauses, measured in
the process (docs/scaling.md, issue 20's heartbeat tail).

``LoopWatch.run`` is a task on the event loop that sleeps ``PERIOD`` and records how late
it woke (a request waiting for the loop waits as long); ``gc.callbacks`` time every
collection by generation.  Both are histograms on ``GET /metrics``
(``hycache_control_loop_lag_seconds``, ``hycache_control_gc_pause_seconds``), which
``bench/heartbeat_bench.py`` reads before and after its measured run."""

from __future__ import annotations

import gc
import threading
import time

import anyio

PERIOD = 0.01
#: upper bounds of the histogram buckets (seconds)
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class Histogram:
    """Cumulative counts per bucket, a sum and the maximum (thread-safe enough: the GIL and
    one writer per histogram)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: above every bound
        self.total = 0.0
        self.max = 0.0

    def add(self, v: float) -> None:
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += v
        if v > self.max:
            self.max = v

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for b, c in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            acc += c
            out.append((b, acc))
        return out


#: a tick later than this is a stall, attributed by the process's CPU time meanwhile
STALL = 0.02


class LoopWatch:
    """``stalls["busy"]``: ticks late by more than ``STALL`` while the process used at least
    half a core meanwhile (its own work: the loop's callbacks, another thread holding the
    GIL, the collector); ``stalls["starved"]``: late while it used less (the process waited
    for a CPU: the machine's other load)."""

    def __init__(self) -> None:
        self.stalls = {"busy": 0, "starved": 0}
        self.lag = Histogram()
        self.gc = {g: Histogram() for g in range(3)}
        self._gc_start: dict[int, float] = {}
        self._lock = threading.Lock()

    async def run(self) -> None:
        while True:
            t0, c0 = time.perf_counter(), time.process_time()
            await anyio.sleep(PERIOD)
            elapsed = time.perf_counter() - t0
            late = max(0.0, elapsed - PERIOD)
            self.lag.add(late)
            if late > STALL:
                self.stalls["busy" if time.process_time() - c0 >= 0.5 * elapsed else "starved"] += 1

    def _on_gc(self, phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self._gc_start[tid] = time.perf_counter()
        else:
            t0 = self._gc_start.pop(tid, None)
            if t0 is not None:
                self.gc[info.get("generation", 2)].add(time.perf_counter() - t0)

    def install_gc(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

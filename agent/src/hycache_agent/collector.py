"""The cyclic garbage collector, paced by the event loop.

CPython collects its youngest generation whenever allocations minus deallocations of
container objects pass 700, on whichever thread allocated last — in the agent that is the
event loop, or the publisher's thread (nice 10), the kernel-read follower's or a pool
refill's.  A collection holds the GIL: on a niced thread it held it while the scheduler ran
the callers' processes, and the event loop waited for both.  Measured during mdtest (4 ranks
× 1,000 files, 4 rounds): ~1,100 young collections, ~100 middle and 9 full ones, 1.7-2.8 s
of the agent's time in all (a third of it on the publisher's thread), pauses of 40-220 ms,
and 4,000-8,000 objects found unreachable in all that: the agent makes few cycles.  With
the automatic collector off, creates ran 11 % faster, stats 9 % and removes 5 %
(docs/benchmarks.md, "The garbage collector paced by the event loop").

So the agent turns the automatic collector off once it serves (:meth:`Collector.install`)
and collects from a task of its event loop (:meth:`Collector.run`): generations 0 and 1
every ``interval`` seconds — what survived since the last one, a few thousand objects per
second of creates — and all of them every ``full_interval`` seconds.  Cycles made in
between wait at most ``interval`` for their memory.  ``interval`` 0 leaves CPython's own
thresholds in charge.  ``status`` -> ``gc`` shows the collections, their time and the
longest pause of each generation."""

from __future__ import annotations

import gc
import time
from typing import Any

import trio


class Collector:
    def __init__(self, interval: float, full_interval: float) -> None:
        self.interval = interval
        self.full_interval = max(full_interval, interval)
        self.runs = [0, 0, 0]  # collections of each oldest generation (ours and any others')
        self.seconds = [0.0, 0.0, 0.0]  # wall time (what a request waiting for the GIL waits)
        self.cpu_seconds = [0.0, 0.0, 0.0]  # the collecting thread's CPU time
        self.longest = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self._started: tuple[float, float] | None = None
        self._timing = False

    @property
    def paced(self) -> bool:
        return self.interval > 0

    def install(self) -> None:
        """Time every collection from now on; when paced, turn the automatic one off."""
        if not self._timing:
            gc.callbacks.append(self._timed)
            self._timing = True
        if self.paced:
            gc.disable()

    def uninstall(self) -> None:
        if self._timing:
            gc.callbacks.remove(self._timed)
            self._timing = False
        gc.enable()

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = (time.perf_counter(), time.thread_time())
            return
        if self._started is None:
            return
        (t0, c0), self._started = self._started, None
        took = time.perf_counter() - t0
        g = info["generation"]
        self.runs[g] += 1
        self.seconds[g] += took
        self.cpu_seconds[g] += time.thread_time() - c0
        self.longest[g] = max(self.longest[g], took)
        self.collected[g] += info["collected"]

    async def run(self) -> None:
        """Collect on the event loop's thread: the young generations every ``interval``,
        all of them every ``full_interval``."""
        if not self.paced:
            return
        next_full = trio.current_time() + self.full_interval
        while True:
            await trio.sleep(self.interval)
            if trio.current_time() >= next_full:
                next_full = trio.current_time() + self.full_interval
                gc.collect(2)
            else:
                gc.collect(1)

    def status(self) -> dict[str, Any]:
        names = ("young", "middle", "full")
        return {
            "paced": self.paced,
            "interval_seconds": self.interval,
            "full_interval_seconds": self.full_interval if self.paced else None,
            "automatic": gc.isenabled(),
            "pending": gc.get_count()[0],  # container objects allocated since the last collection, net
            "collections": {n: self.runs[g] for g, n in enumerate(names)},
            "seconds": {n: round(self.seconds[g], 4) for g, n in enumerate(names)},
            "cpu_seconds": {n: round(self.cpu_seconds[g], 4) for g, n in enumerate(names)},
            "longest_ms": {n: round(self.longest[g] * 1000, 2) for g, n in enumerate(names)},
            "collected": {n: self.collected[g] for g, n in enumerate(names)},
        }

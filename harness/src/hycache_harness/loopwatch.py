"""How long a trio loop is ever away (tests, benchmark): a task ticks every ``interval``
seconds and records the time between its ticks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def loop_gaps(interval: float = 0.01) -> AsyncIterator[list[float]]:
    """The list of gaps (seconds) between ticks, filled while the block runs."""
    gaps: list[float] = []
    done = trio.Event()

    async def ticker() -> None:
        last = trio.current_time()
        while not done.is_set():
            await trio.sleep(interval)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    async with trio.open_nursery() as n:
        n.start_soon(ticker)
        try:
            yield gaps
        finally:
            done.set()

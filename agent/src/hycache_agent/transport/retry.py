"""The peer client's one retry policy."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


class Again(Exception):
    """Ask again at once, not counted as an attempt (a reused keep-alive connection that
    the server had closed meanwhile)."""


class Retry:
    """Call an attempt until it returns.  On a ``retryable`` error (for which
    ``retry_if``, if given, is true) it is called again after an exponential backoff from
    ``backoff`` up to ``max_backoff`` seconds, jittered (half to all of it), at most
    ``retries`` more times; then ``fail(last error, attempts)`` is raised.  An attempt that
    made progress (``progressed()``) starts the count again; :class:`Again` asks again at
    once, uncounted.  ``stats.retries`` counts the retries."""

    def __init__(self, retries: int, backoff: float, max_backoff: float, stats) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stats = stats

    async def sleep(self, attempt: int) -> None:
        delay = min(self.max_backoff, self.backoff * (2 ** attempt))
        self.stats.retries += 1
        await trio.sleep(delay * (0.5 + random.random() / 2))

    async def run(self, attempt: Callable[[], Awaitable[T]], retryable: tuple[type[BaseException], ...],
                  fail: Callable[[BaseException, int], BaseException], *,
                  progressed: Callable[[], bool] | None = None,
                  retry_if: Callable[[BaseException], bool] | None = None) -> T:
        fails = 0
        while True:
            try:
                return await attempt()
            except Again:
                continue
            except retryable as e:
                if retry_if is not None and not retry_if(e):
                    raise
                if progressed is not None and progressed():
                    fails = 0
                if fails >= self.retries:
                    raise fail(e, fails + 1) from e
                await self.sleep(fails)
                fails += 1

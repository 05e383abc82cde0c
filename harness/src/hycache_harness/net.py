"""Loopback ports, polling waits and the Redis seeds string."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(pred: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.1, *,
             ignore: tuple[type[BaseException], ...] = (), error: type[BaseException] = AssertionError) -> T:
    """Call ``pred`` every ``interval`` s until it returns a true value, and return that value.
    An exception of a type in ``ignore`` counts as "not yet"; after ``timeout`` s ``error``
    is raised, naming ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = pred()
            if last:
                return last
        except ignore as e:
            last = e
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def redis_seeds(nodes: Iterable[tuple[str, int]], count: int | None = 3) -> str:
    """The ``--redis`` seeds string, ``host:port,host:port,...``, of the first ``count``
    nodes (all of them with ``count=None``)."""
    nodes = list(nodes)
    return ",".join(f"{h}:{p}" for h, p in (nodes if count is None else nodes[:count]))

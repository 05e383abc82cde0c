"""The cluster link's background tasks."""

from __future__ import annotations

import trio


class Background:
    """The link's nursery once it runs: background tasks start there (none before)."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """The link runs: tasks spawned from now on start in ``nursery``."""
        self.nursery = nursery

    @property
    def running(self) -> bool:
        return self.nursery is not None

    def spawn(self, fn, *args) -> None:
        if self.nursery is not None:
            self.nursery.start_soon(fn, *args)

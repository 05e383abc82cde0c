"""The agent's state (``hycache-agent status --json``, the heartbeat's ``status``, the
/metrics scrape): the engine's part, with the cluster link's, HCCache's and the control
link's parts filled in by whoever has them."""

from __future__ import annotations

from typing import Any

from hycache_agent.fs.engine import TieringEngine


class AgentStatus:
    """``await status(max_age)``: the whole status dict.  ``control``: an object with a
    ``status_dict()`` (the control-plane link); the link itself, which needs the status
    for its heartbeat, is given one without and adds its own part."""

    def __init__(self, engine: TieringEngine, cluster=None, control=None, collector=None) -> None:
        self.engine = engine
        self.cluster = cluster
        self.control = control
        self.collector = collector  # hycache_agent.collector.Collector: status -> gc

    @property
    def node_id(self) -> str | None:
        return self.cluster.node_id if self.cluster is not None else self.engine.config.node_id

    def counters(self) -> dict[str, Any]:
        """Cumulative counters since start, shaped as the heartbeat's ``counters``."""
        d = self.engine.counters_dict()
        if self.cluster is not None:
            d["remote"]["fetches"] = self.cluster.status.remote_fetches
            d["remote"]["fetch_bytes"] = self.cluster.status.remote_bytes
        return d

    async def __call__(self, max_age: float = 0.0) -> dict[str, Any]:
        st = await self.engine.status(max_age)
        cluster = self.cluster
        if cluster is not None:
            st["counters"] = self.counters()
            st["cluster"] = cluster.status_dict()
            st["hccache"] = None if cluster.reader is None else cluster.reader.status()
        if self.control is not None:
            st["control"] = self.control.status_dict()
        if self.collector is not None:
            st["gc"] = self.collector.status()
        return st

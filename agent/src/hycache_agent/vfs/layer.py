"""The vfs layer in one object, as the FUSE adapter is given it: the names, the
extended attributes and the opens, over one view of what is local and what is remote."""

from __future__ import annotations

from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.passthrough import Backings
from hycache_agent.remote.backing import RemoteBackings
from hycache_agent.vfs.names import Names
from hycache_agent.vfs.opens import Opens
from hycache_agent.vfs.view import View
from hycache_agent.vfs.xattrs import Xattrs


class Vfs:
    """``backings``: the kernel's passthrough of local blobs; ``remote_backings``: of whole
    copies of other nodes' files (shared with the cluster link, which parks a copy's
    registration when it lands and drops it when the copy goes)."""

    def __init__(self, engine: TieringEngine, backings: Backings, cluster=None,
                 remote_backings: RemoteBackings | None = None) -> None:
        self.engine = engine
        self.ns = engine.ns
        self.cluster = cluster
        self.backings = backings
        self.remote_backings = remote_backings if remote_backings is not None else RemoteBackings(engine)
        self.view = View(engine, cluster)
        self.names = Names(engine, self.view, backings, self.remote_backings)
        self.xattrs = Xattrs(engine, self.view, backings)
        self.opens = Opens(engine, self.view, backings, self.remote_backings)

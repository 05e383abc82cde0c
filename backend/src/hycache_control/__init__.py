"""HyCache control plane: the REST API operators and the dashboard use, its database, and
the agents' heartbeat link (docs/control-plane.md)."""

__version__ = "0.1.0"

"""The errors of the peer client (see :mod:`hycache_agent.transport.client`)."""

from __future__ import annotations


class PeerError(Exception):
    def __init__(self, message: str, *, addr: str = "", path: bytes | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.addr = addr
        self.path = path
        self.status = status


class PeerUnavailable(PeerError):
    """The peer could not be reached, or kept dropping the transfer, after the retries."""


class PeerNotFound(PeerError):
    """404: the peer does not have the file."""


class PeerAuthError(PeerError):
    """401: the peer rejected our signature (wrong cluster secret, or clocks > 60 s apart)."""


class PeerChanged(PeerError):
    """The file's version (ETag) changed during the transfer, or is not the one expected."""

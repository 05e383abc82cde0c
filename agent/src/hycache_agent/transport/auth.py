"""Authentication of the peer protocol: the shared cluster secret and request signatures.

Every request except health carries ``Authorization: HyCache <node>:<unix-time>:<hex mac>``
with mac = HMAC-SHA256(cluster secret, METHOD "\\n" request-target "\\n" node "\\n" time),
request-target being the exact bytes of the path and query on the request line.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time

from hycache_agent.secretfile import read_protected
from hycache_agent.transport.wire import NODE_ID_RE

AUTH_SCHEME = "HyCache"
MAX_SKEW = 60  # seconds between the signer's clock and ours
MIN_SECRET = 16  # bytes


class SecretFileError(Exception):
    """The cluster secret file is missing, unsafe or unusable."""


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the shared cluster secret (the bytes of the file, surrounding whitespace
    stripped).  Refuses a file that other users can access (any of o+rwx), one that is not
    a regular file, and a secret shorter than 16 bytes.  Blocking: call it at start-up or
    through ``trio.to_thread.run_sync``."""
    path = os.fspath(path)
    data = read_protected(path, what="cluster secret file", error=SecretFileError, forbidden=0o007,
                          refusal="{what} {path} is accessible by other users (mode {mode}); run: "
                                  "chmod o-rwx {path}   (0600, or 0640 to share it with a group)")
    secret = data.strip()
    if len(secret) < MIN_SECRET:
        raise SecretFileError(
            f"cluster secret in {path} is {len(secret)} bytes; need at least {MIN_SECRET} "
            f"(e.g. head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path})")
    return secret


def _as_bytes(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8")


def sign(secret: bytes, method: str, target: str | bytes, node_id: str, ts: int) -> str:
    """Hex HMAC-SHA256 of ``METHOD\\ntarget\\nnode\\nts``; ``target`` is the request-target
    (path and query) exactly as it appears on the request line."""
    msg = b"\n".join((method.upper().encode("ascii"), _as_bytes(target), node_id.encode("ascii"),
                      str(int(ts)).encode("ascii")))
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def authorization(secret: bytes, node_id: str, method: str, target: str | bytes,
                  now: float | None = None) -> str:
    """The ``Authorization`` header value for one request."""
    if not NODE_ID_RE.match(node_id):
        raise ValueError(f"invalid node id {node_id!r} (letters, digits, '.', '_', '-'; at most 64)")
    ts = int(time.time() if now is None else now)
    return f"{AUTH_SCHEME} {node_id}:{ts}:{sign(secret, method, target, node_id, ts)}"


class AuthError(Exception):
    pass


def verify_authorization(secret: bytes, value: str | None, method: str, target: bytes,
                         now: float, max_skew: float = MAX_SKEW) -> str:
    """Check an ``Authorization`` header; return the signer's node id or raise AuthError."""
    if not value:
        raise AuthError("missing Authorization header")
    scheme, _, cred = value.strip().partition(" ")
    if scheme.lower() != AUTH_SCHEME.lower():
        raise AuthError(f"Authorization scheme must be {AUTH_SCHEME}")
    parts = cred.strip().split(":")
    if len(parts) != 3:
        raise AuthError("malformed credentials (want <node-id>:<unix-time>:<hex-hmac>)")
    node, ts_s, mac = parts
    if not NODE_ID_RE.match(node) or not ts_s.isascii() or not ts_s.isdigit() or len(ts_s) > 12:
        raise AuthError("malformed credentials (want <node-id>:<unix-time>:<hex-hmac>)")
    skew = now - int(ts_s)
    if abs(skew) > max_skew:
        raise AuthError(f"request time is {abs(skew):.0f} s {'behind' if skew > 0 else 'ahead of'} "
                        f"this node's clock (allowed: {max_skew:.0f} s)")
    expected = sign(secret, method, target, node, int(ts_s))
    if not hmac.compare_digest(expected, mac.strip().lower()):
        raise AuthError("bad signature")
    return node


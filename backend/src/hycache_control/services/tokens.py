"""API tokens: random secrets stored as sha256, scopes admin/read/node, revocation."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import func, select, update

from ..db import Database
from ..models import Token
from .errors import NotFound

PREFIX = "hct_"
#: last_used_at is written at most this often per token (it is not worth a write per request)
LAST_USED_RESOLUTION = 60.0


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Caller:
    id: int
    name: str
    scope: str
    node_id: str | None


class TokenService:
    def __init__(self, db: Database, cache_seconds: float = 5.0) -> None:
        self.db = db
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[Caller | None, float]] = {}
        self._last_used: dict[int, float] = {}
        self._unsaved: dict[int, float] = {}
        self._lock = threading.Lock()

    def create(self, name: str, scope: str, node_id: str | None = None, secret: str | None = None) -> tuple[Token, str]:
        if scope not in ("admin", "read", "node"):
            raise ValueError(f"scope must be admin, read or node, not {scope!r}")
        if (scope == "node") != bool(node_id):
            raise ValueError("a node token needs --node-id; other scopes take none")
        secret = secret or new_secret()
        row = Token(name=name, scope=scope, node_id=node_id, hash=hash_secret(secret), created_at=time.time())
        with self.db.session() as s:
            s.add(row)
        return row, secret

    def ensure(self, secret: str, name: str, scope: str = "admin") -> bool:
        """Install ``secret`` (a configured admin token) unless it is already there; True if added."""
        h = hash_secret(secret)
        with self.db.session() as s:
            if s.scalar(select(Token).where(Token.hash == h)) is not None:
                return False
        self.create(name, scope, secret=secret)
        return True

    def list(self, limit: int = 100, offset: int = 0) -> tuple[list[Token], int]:
        with self.db.session() as s:
            total = s.scalar(select(func.count()).select_from(Token)) or 0
            rows = list(s.scalars(select(Token).order_by(Token.id).limit(limit).offset(offset)))
        return rows, total

    def get(self, token_id: int) -> Token:
        with self.db.session() as s:
            row = s.get(Token, token_id)
        if row is None:
            raise NotFound(("path", "token_id"), f"no token {token_id}")
        return row

    def revoke(self, token_id: int) -> Token:
        with self.db.session() as s:
            row = s.get(Token, token_id)
            if row is None:
                raise NotFound(("path", "token_id"), f"no token {token_id}")
            if row.revoked_at is None:
                row.revoked_at = time.time()
        with self._lock:
            self._cache.clear()
        return row

    def active_admins(self) -> int:
        with self.db.session() as s:
            return s.scalar(select(func.count()).select_from(Token).where(
                Token.scope == "admin", Token.revoked_at.is_(None))) or 0

    def authenticate(self, secret: str) -> Caller | None:
        """The caller a secret belongs to, or None (unknown or revoked).  Lookups are cached
        for ``cache_seconds`` (a revocation through the CLI of another process takes that
        long to apply; through the API it applies at once)."""
        h = hash_secret(secret)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(h)
        if hit is not None and hit[1] > now:
            caller = hit[0]
        else:
            with self.db.session() as s:
                row = s.scalar(select(Token).where(Token.hash == h))
                caller = None if row is None or row.revoked_at is not None else \
                    Caller(row.id, row.name, row.scope, row.node_id)
            with self._lock:
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[h] = (caller, now + self.cache_seconds)
        if caller is not None:
            self._touch(caller.id)
        return caller

    def _touch(self, token_id: int) -> None:
        now = time.time()
        with self._lock:
            if now - self._last_used.get(token_id, 0.0) < LAST_USED_RESOLUTION:
                return
            self._last_used[token_id] = now
            self._unsaved[token_id] = now

    def flush(self) -> None:
        """Write the queued ``last_used_at`` values (one transaction; the writer thread's)."""
        with self._lock:
            batch, self._unsaved = self._unsaved, {}
        if batch:
            with self.db.session() as s:
                s.execute(update(Token), [{"id": k, "last_used_at": v} for k, v in batch.items()])

"""API tokens: random secrets stored as sha256, scopes admin/read/node, revocation."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from ..db import Database
from ..models import Token
from .errors import Conflict, NotFound

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
    """Tokens in the database, and an in-memory table of them for the request path: every
    token (hash -> caller, or revoked) is loaded at start and reloaded every ``cache_seconds``
    by :meth:`refresh` (the monitor thread's), so a request checks its token without a
    database round trip.  A secret the table does not know (created by another process
    since the last reload) is looked up once; unknown secrets are remembered for
    ``cache_seconds`` so a flood of bad tokens costs no query each."""

    def __init__(self, db: Database, cache_seconds: float = 5.0) -> None:
        self.db = db
        self.cache_seconds = cache_seconds
        self._table: dict[str, Caller | None] = {}  # hash -> caller (None: revoked)
        self._unknown: dict[str, float] = {}  # hash -> until (monotonic)
        self._loaded_at = float("-inf")
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
        with self._lock:
            self._table[row.hash] = Caller(row.id, row.name, row.scope, row.node_id)
            self._unknown.pop(row.hash, None)
        return row, secret

    def ensure(self, secret: str, name: str, scope: str = "admin") -> bool:
        """Install ``secret`` (a configured admin token) unless it is already there; True if added."""
        if self._installed(secret):
            return False
        try:
            self.create(name, scope, secret=secret)
        except IntegrityError:
            # another process of this control plane (``serve --workers N`` starts them
            # together) installed it between the check and the insert: it is there
            if self._installed(secret):
                return False
            raise
        return True

    def _installed(self, secret: str) -> bool:
        with self.db.session() as s:
            return s.scalar(select(Token.id).where(Token.hash == hash_secret(secret))) is not None

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
        """Revoke a token; the last active admin token is refused (Conflict): nobody could
        manage the control plane after it."""
        with self.db.session() as s:
            row = s.get(Token, token_id)
            if row is None:
                raise NotFound(("path", "token_id"), f"no token {token_id}")
            if row.revoked_at is None and row.scope == "admin":
                # lock the active admin rows (PostgreSQL): two revocations at once cannot both pass
                admins = s.scalars(select(Token.id).where(Token.scope == "admin", Token.revoked_at.is_(None))
                                   .with_for_update()).all()
                if set(admins) <= {row.id}:
                    raise Conflict(("path", "token_id"),
                                   f"token {token_id} is the last active admin token; revoking it would lock "
                                   "every administrator out (create another admin token first)")
            if row.revoked_at is None:
                row.revoked_at = time.time()
        with self._lock:
            self._table[row.hash] = None
        return row

    def active_admins(self) -> int:
        with self.db.session() as s:
            return s.scalar(select(func.count()).select_from(Token).where(
                Token.scope == "admin", Token.revoked_at.is_(None))) or 0

    def refresh(self, force: bool = False) -> None:
        """Reload the token table (blocking; at most once per ``cache_seconds`` unless forced)."""
        now = time.monotonic()
        if not force and now - self._loaded_at < self.cache_seconds:
            return
        with self.db.session() as s:
            rows = s.execute(select(Token.id, Token.hash, Token.name, Token.scope, Token.node_id,
                                    Token.revoked_at)).all()
        table = {r.hash: (None if r.revoked_at is not None else Caller(r.id, r.name, r.scope, r.node_id))
                 for r in rows}
        with self._lock:
            self._table = table
            self._unknown = {h: t for h, t in self._unknown.items() if t > now and h not in table}
            self._loaded_at = now

    def cached(self, secret: str) -> Caller | None | Literal[False]:
        """The caller from the in-memory table (no I/O): a Caller, None (unknown or revoked),
        or False when only the database can tell (call :meth:`authenticate` in a thread)."""
        h = hash_secret(secret)
        with self._lock:
            if h in self._table:
                caller = self._table[h]
            elif self._unknown.get(h, 0.0) > time.monotonic():
                return None
            else:
                return False
        if caller is not None:
            self._touch(caller.id)
        return caller

    def authenticate(self, secret: str) -> Caller | None:
        """The caller a secret belongs to, or None (unknown or revoked); blocking when the
        table does not know the secret.  A revocation through the API applies at once; one
        through the CLI or another process within ``cache_seconds``."""
        hit = self.cached(secret)
        if hit is not False:
            return hit
        h = hash_secret(secret)
        with self.db.session() as s:
            row = s.scalar(select(Token).where(Token.hash == h))
            caller = None if row is None or row.revoked_at is not None else \
                Caller(row.id, row.name, row.scope, row.node_id)
        with self._lock:
            if row is None:
                if len(self._unknown) > 100_000:
                    self._unknown.clear()
                self._unknown[h] = time.monotonic() + self.cache_seconds
            else:
                self._table[h] = caller
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

"""Routing, retries and durable acknowledgement over redis-py's ``RedisCluster``.

redis-py's ``RedisCluster`` discovers the topology (``nodes_manager``) and owns one
connection pool per node; this module sends each batch of commands for one master down
ONE connection of that master as a pipeline, and appends ``WAIT <replicas> <ms>`` to
batches that write. ``WAIT`` only covers writes made on the same connection, which is why
the batches are not sent through ``RedisCluster``'s own command routing.

Failover handling: connection errors, ``CLUSTERDOWN``, ``TRYAGAIN``, ``MASTERDOWN``,
``LOADING``, ``MOVED`` (and a replica that did not acknowledge in time) make the whole
batch go again after a jittered exponential backoff and a topology refresh, until the
operation's deadline; then :class:`~hycache_dht.meta.DHTUnavailable` (or
:class:`~hycache_dht.meta.NotDurable`) is raised. A batch can be sent twice (its reply may
have been lost), so every script in it is replay-safe (see lua.py). ``NOSCRIPT`` (a
promoted replica has an empty script cache) loads the scripts on that node and retries.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis import exceptions as rex
from redis.cluster import ClusterNode, RedisCluster

from .meta import DHTAuthError, DHTUnavailable, NotDurable

log = logging.getLogger(__name__)

RETRIABLE = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.ClusterDownError,
    rex.TryAgainError,
    rex.MasterDownError,
    rex.BusyLoadingError,
    rex.MovedError,
    rex.AskError,
    rex.SlotNotCoveredError,
    rex.ClusterError,
    rex.RedisClusterException,
    rex.ReadOnlyError,
    OSError,
)


# Replies of a Redis server that refuses a client's credentials (redis-py raises them as
# AuthenticationError/ResponseError, or wraps them in a RedisClusterException).
_AUTH_REPLIES = ("WRONGPASS", "NOAUTH", "NOPERM", "invalid username-password", "Authentication required",
                 "invalid password", "AUTH <password> called without any password")


def is_auth_error(exc: BaseException) -> bool:
    return isinstance(exc, rex.AuthenticationError) or any(r in str(exc) for r in _AUTH_REPLIES)


def auth_message(username: str | None, exc: BaseException) -> str:
    who = f"user {username!r}" if username else "the default user (no --redis-user)"
    return (f"Redis refused the credentials of {who}: {exc} "
            "(check --redis-user and the password in --redis-password-file against the cluster's ACL)")


def check_credentials(startup_nodes: Sequence[tuple[str, int]], username: str | None, password: str | None,
                      timeout: float = 3.0) -> bool:
    """Authenticate once against the startup nodes, one after the other, and PING.

    True when a node accepted; False when none answered within ``timeout`` seconds in all
    (Redis may come later, or this host may be cut off: callers carry on, and the start of
    an agent must not wait a timeout per seed). Raises :class:`DHTAuthError` as soon as a
    node refuses the credentials (or wants some and none were given). Blocking: call it
    at start-up.
    """
    import time

    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    deadline = time.monotonic() + timeout
    for host, port in startup_nodes:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r = redis.Redis(host=host, port=int(port), username=username, password=password,
                        socket_timeout=left, socket_connect_timeout=left,
                        retry=Retry(NoBackoff(), 0))  # one try per seed: the budget is the deadline
        try:
            r.ping()
            return True
        except rex.AuthenticationError as e:
            raise DHTAuthError(auth_message(username, e)) from e
        except rex.ResponseError as e:
            if is_auth_error(e):
                raise DHTAuthError(auth_message(username, e)) from e
            return True  # it answered (with something else than an auth error)
        except (rex.ConnectionError, rex.TimeoutError, OSError) as e:
            log.debug("credential check: %s:%s unreachable: %s", host, port, e)
        finally:
            r.close()
    return False


@dataclass
class ClientConfig:
    """Knobs of the Redis engine; :meth:`checked` clamps bad values with a warning."""

    op_timeout: float = 30.0  # give up (DHTUnavailable) after this long without success
    durable_replicas: int = 1  # WAIT for this many replicas (capped by those that exist)
    wait_timeout_ms: int = 1000
    socket_timeout: float = 5.0
    connect_timeout: float = 2.0
    backoff_base: float = 0.02
    backoff_cap: float = 0.5
    refresh_interval: float = 0.1  # at most one topology refresh per interval
    #: re-read the topology at least this often: a replica that finished its first sync
    #: (CLUSTER SLOTS lists it only then) is WAITed for from the next refresh on
    topology_ttl: float = 5.0
    #: Redis ACL user and password (None: the default user, no AUTH)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def checked(self) -> ClientConfig:
        def clamp(name: str, lo: float, hi: float) -> None:
            v = getattr(self, name)
            c = min(max(v, lo), hi)
            if c != v:
                log.warning("dht config: %s=%r out of range, using %r", name, v, c)
                setattr(self, name, type(v)(c))

        clamp("op_timeout", 0.5, 3600.0)
        clamp("durable_replicas", 0, 16)
        clamp("wait_timeout_ms", 10, 60000)
        clamp("socket_timeout", 0.1, 600.0)
        clamp("connect_timeout", 0.1, 600.0)
        clamp("backoff_base", 0.001, 5.0)
        clamp("backoff_cap", self.backoff_base, 30.0)
        clamp("refresh_interval", 0.0, 10.0)
        clamp("topology_ttl", 0.5, 3600.0)
        return self


@dataclass
class Item:
    """One command of a batch, routed by its key."""

    key: bytes
    args: tuple[Any, ...]
    write: bool = True
    result: Any = None  # the reply (its shape is the command's), or the ResponseError
    done: bool = False
    #: an earlier attempt may have executed (its reply was lost): a replayed write answers
    #: "already done" instead of "done now", callers map that (see lua.py)
    ambiguous: bool = False
    sent: bool = False
    slot: int = field(default=-1)


class ClusterClient:
    def __init__(self, startup_nodes: Sequence[tuple[str, int]], config: ClientConfig,
                 scripts: dict[str, str]) -> None:
        if not startup_nodes:
            raise ValueError("need at least one startup node")
        self.config = config.checked()
        self.scripts = {n: (hashlib.sha1(s.encode()).hexdigest(), s) for n, s in scripts.items()}
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last_refresh = 0.0
        self._startup = [ClusterNode(h, int(p)) for h, p in startup_nodes]
        deadline = time.monotonic() + self.config.op_timeout
        attempt = 0
        while True:
            try:
                self.rc = RedisCluster(
                    startup_nodes=list(self._startup),
                    socket_timeout=self.config.socket_timeout,
                    socket_connect_timeout=self.config.connect_timeout,
                    require_full_coverage=False,
                    decode_responses=False,
                    username=self.config.username,
                    password=self.config.password,
                )
                self._last_refresh = time.monotonic()
                break
            except RETRIABLE as e:
                if is_auth_error(e):
                    raise DHTAuthError(auth_message(self.config.username, e)) from e
                attempt += 1
                if time.monotonic() > deadline:
                    raise DHTUnavailable(f"no Redis Cluster at {list(startup_nodes)}: {e}") from e
                time.sleep(self.backoff(attempt))

    # -- helpers ------------------------------------------------------------------------

    def keyslot(self, key: bytes) -> int:
        slot: int = self.rc.keyslot(key)
        return slot

    def backoff(self, attempt: int) -> float:
        c = self.config
        return random.uniform(0, min(c.backoff_cap, c.backoff_base * (2 ** min(attempt, 16))))

    def refresh(self, force: bool = False) -> None:
        """Re-read the topology (rate limited)."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_refresh < self.config.refresh_interval:
                return
            self._last_refresh = now
        self.stats["refresh"] += 1
        try:
            self.rc.nodes_manager.initialize(disconnect_startup_nodes_pools=False)
        except RETRIABLE as e:
            log.debug("topology refresh failed: %s", e)

    def _route(self, slot: int) -> tuple[ClusterNode, int]:
        """The master serving ``slot`` and how many replicas it has (per the topology)."""
        nodes = self.rc.nodes_manager.slots_cache.get(slot)
        if not nodes:
            raise rex.SlotNotCoveredError(f"slot {slot} not covered")
        return nodes[0], len(nodes) - 1

    def _load_scripts(self, conn: redis.Redis) -> None:
        self.stats["script_load"] += 1
        for sha, src in self.scripts.values():
            got = conn.script_load(src)
            got = got.decode() if isinstance(got, bytes) else got
            assert got == sha, (got, sha)

    def script_args(self, name: str, key: bytes, *argv: Any) -> tuple[Any, ...]:
        return ("EVALSHA", self.scripts[name][0], 1, key, *argv)

    # -- execution ----------------------------------------------------------------------

    def run(self, items: list[Item], *, deadline: float | None = None) -> list[Item]:
        """Execute every item (one pipeline per master, WAIT after writes); retry failures
        until the deadline. Results (or non-retriable ResponseErrors) land in ``item.result``."""
        cfg = self.config
        if deadline is None:
            deadline = time.monotonic() + cfg.op_timeout
        if time.monotonic() - self._last_refresh > cfg.topology_ttl:
            self.refresh()
        for it in items:
            if it.slot < 0:
                it.slot = self.keyslot(it.key)
                if it.args and it.args[0] == "EVALSHA" and int(it.args[2]) > 1:
                    # the hash-tag policy (keys.py): a script's keys share one slot
                    if any(self.keyslot(k) != it.slot for k in it.args[3:3 + int(it.args[2])]):
                        raise ValueError(f"script keys span slots: {it.args[3:3 + int(it.args[2])]}")
        pending = [it for it in items if not it.done]
        attempt = 0
        last_error: BaseException | None = None
        not_durable = False
        while pending:
            groups: dict[str, tuple[ClusterNode, int, list[Item]]] = {}
            retry: list[Item] = []
            for it in pending:
                try:
                    node, nrep = self._route(it.slot)
                except RETRIABLE as e:
                    last_error = e
                    retry.append(it)
                    continue
                g = groups.setdefault(node.name, (node, nrep, []))
                g[2].append(it)
            for node, nrep, group in groups.values():
                err = self._run_group(node, nrep, group)
                if err is not None:
                    last_error = err
                    not_durable = isinstance(err, _ShortWait)
                    retry.extend(it for it in group if not it.done)
            if not retry:
                break
            # keep the original order of the retried items (per-key order matters)
            order = {id(it): i for i, it in enumerate(items)}
            pending = sorted(retry, key=lambda it: order[id(it)])
            attempt += 1
            self.stats["retry"] += 1
            if time.monotonic() >= deadline:
                msg = f"Redis Cluster did not complete the operation in time: {last_error!r}"
                raise (NotDurable if not_durable else DHTUnavailable)(msg) from last_error
            log.debug("dht retry %d after %r", attempt, last_error)
            time.sleep(min(self.backoff(attempt), max(0.0, deadline - time.monotonic())))
            self.refresh()
        return items

    def _run_group(self, node: ClusterNode, nrep: int, group: list[Item]) -> BaseException | None:
        """One pipeline on one connection of ``node``. Returns the retriable error, if any."""
        writes = any(it.write for it in group)
        want = min(self.config.durable_replicas, nrep) if writes else 0
        try:
            conn = self.rc.get_redis_connection(node)
            for _ in range(2):  # second round after loading the scripts (NOSCRIPT)
                pipe = conn.pipeline(transaction=False)
                for it in group:
                    pipe.execute_command(*it.args)
                if want:
                    pipe.execute_command("WAIT", want, self.config.wait_timeout_ms)
                for it in group:
                    # sent before without an answer: that attempt may have executed
                    it.ambiguous = it.ambiguous or (it.sent and it.write)
                    it.sent = True
                res = pipe.execute(raise_on_error=False)
                if any(isinstance(r, rex.NoScriptError) for r in res):
                    self._load_scripts(conn)
                    for it, r in zip(group, res):  # refused, so not executed
                        it.sent = it.sent and not isinstance(r, rex.NoScriptError)
                    continue
                break
        except RETRIABLE as e:
            self.stats["conn_error"] += 1
            return e
        err: BaseException | None = None
        for it, r in zip(group, res):
            if isinstance(r, RETRIABLE) or isinstance(r, rex.NoScriptError):
                err = err or (r if isinstance(r, RETRIABLE) else rex.ConnectionError(str(r)))
                if isinstance(r, (rex.MovedError, rex.AskError)):
                    self.stats["moved"] += 1
                continue
            it.result = r  # a value, or a non-retriable ResponseError for the caller
            it.done = True
        if want:
            acked = res[len(group)]
            if isinstance(acked, BaseException) or int(acked) < want:
                # applied on the master, not confirmed by a replica: go again (replay-safe)
                self.stats["short_wait"] += 1
                for it in group:
                    it.done = False
                return _ShortWait(f"{node.name}: WAIT {want} -> {acked!r}")
        return err

    def one(self, key: bytes, args: tuple[Any, ...], *, write: bool = True, deadline: float | None = None) -> Item:
        it = Item(key, args, write)
        self.run([it], deadline=deadline)
        if isinstance(it.result, BaseException):
            raise it.result
        return it

    def primaries(self) -> list[redis.Redis]:
        return [self.rc.get_redis_connection(n) for n in self.rc.get_primaries()]

    def ping(self) -> bool:
        try:
            return all(r.ping() for r in self.primaries())
        except RETRIABLE:
            return False

    def close(self) -> None:
        self.rc.close()


class _ShortWait(rex.ConnectionError):
    """WAIT returned fewer replicas than asked (treated like a lost connection: retry)."""

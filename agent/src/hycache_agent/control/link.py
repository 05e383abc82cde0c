"""The agent's link to the control plane: heartbeats up, actions and policies down.

The protocol is in docs/control-plane.md ("The agents' link"): every ``interval`` seconds
the agent POSTs ``/api/v1/nodes/{node_id}/heartbeats`` with its status and cumulative
counters; the answer carries the actions to apply (pin, unpin, promote, demote of a path),
the policy to run, and the action results the control plane has stored.

Beside the heartbeat, a push channel (``poll_plans``): a long-poll of
``GET /api/v1/nodes/{node_id}/plan?wait=…&after=<version>`` that the control plane answers
as soon as plan steps or actions become deliverable to the node, so they arrive without
waiting for the next heartbeat; a finished action's result triggers an early heartbeat.
When the channel breaks, the heartbeat answers still carry every item (logged once per
state change) and the channel is retried with back-off.

The link never touches the data path: a control plane that is down, slow or refusing the
token costs a logged warning per state change and a back-off, nothing else.  The pieces
that decide (building a heartbeat, handling an answer) are methods that tests call
directly with a real engine; :meth:`ControlLink.run` only adds the HTTP round trips.
What it needs is given to its constructor (mount.py): the engine, the agent's status
(the heartbeat's, without this link's own part, which it adds), the prefetch of a plan
step and, in a cluster, the link's ``drop_copy``.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import FsError
from hycache_agent.fs.placement import PolicyError
from hycache_agent.secretfile import read_protected

log = logging.getLogger(__name__)

ACTIONS = ("pin", "unpin", "promote", "demote", "prefetch")
# a plan step's fields (2-layer scheduling), copied from the action into its result
PLAN_FIELDS = ("manifest_id", "job", "step")
MAX_BACKOFF = 10.0  # network errors back off to this at most
AUTH_RETRY = 10.0  # 401/403: retried slowly (a revoked token must not flood anything)
REQUEST_TIMEOUT = 5.0
MIN_INTERVAL, MAX_INTERVAL = 0.2, 300.0
SEEN_ACTIONS = 100_000  # action ids remembered (each is applied once)
MAX_TOKEN = 64 << 10
STATUS_MAX_AGE = 5.0  # seconds the file counts in a heartbeat's status may lag (counters never do)
MAX_RESULTS = 1000  # action results per heartbeat (the oldest first; the rest follow)
MAX_DETAIL = 2000  # characters of a result's detail
PUSH_WAIT = 30.0  # seconds a plan long-poll may wait on the control plane
PUSH_BACKOFF = (1.0, 30.0)  # a broken push channel is retried after 1 s, doubling to 30 s
MIN_KICK_GAP = 0.05  # a result sends the heartbeat early, at most once per this many seconds
MIN_POLL_GAP = 0.02  # plan long-polls answered at once twice in a row: the next one after this


class TokenFileError(Exception):
    """The control-plane token file is missing, unsafe or empty."""


def load_token(path: str | os.PathLike[str]) -> str:
    """Read this node's control-plane token (the file's text, surrounding whitespace
    stripped).  Refuses a file that is not a regular file, that another user owns, or
    that anyone but its owner may read or write (mode 0600 or stricter).  Blocking."""
    path = os.fspath(path)
    data = read_protected(path, what="control token file", error=TokenFileError, forbidden=0o177,
                          refusal="{what} {path} has mode {mode}; it must be 0600 or stricter "
                                  "(run: chmod 600 {path})", must_own=True,
                          limit=MAX_TOKEN)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"control token file {path} is not ASCII text") from None
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise TokenFileError(f"control token file {path} must hold one token (no spaces), "
                             f"e.g. the output of `hycache-control token create --scope node`")
    return token


class ControlLink:
    """Heartbeats to one control plane and what its answers ask for."""

    def __init__(self, engine: TieringEngine, url: str, token: str, *, node_id: str,
                 address: str | None, interval: float = 1.0, version: str | None = None,
                 push: bool = True, status: Callable[..., Awaitable[dict[str, Any]]] | None = None,
                 prefetch: Callable[[str], Awaitable[str]] | None = None,
                 drop_copy: Callable[[bytes], Awaitable[int | None]] | None = None) -> None:
        from hycache_agent.transport.wire import agent_version

        self.engine = engine
        # the agent's status without this link's part (default: the engine's alone)
        self._status = status if status is not None else engine.status
        # a plan step's prefetch (default: of local files only) and, in a cluster, the
        # drop of this node's copy of a file another node holds (a demote of it)
        self._prefetch_path = prefetch
        self._drop_copy_of = drop_copy
        self.url = url.rstrip("/")
        self._token = token
        self.node_id = node_id
        self.address = address
        self.version = version or agent_version()
        self.interval = interval
        self.boot_id = str(uuid.uuid4())
        self.seq = 0
        self.state = "connecting"  # connecting | ok | unreachable | unauthorized
        self.since = time.time()
        self.last_error: str | None = None
        self.heartbeats_sent = 0
        self.last_ok: float | None = None
        self.policy_error: str | None = None
        self._bad_policy_version: int | None = None
        # results waiting for the control plane's acknowledgement, by action id
        self.pending: dict[int, dict[str, Any]] = {}
        self._seen: collections.OrderedDict[tuple[int, Any], None] = collections.OrderedDict()
        self.running: set[int] = set()
        self._nursery: trio.Nursery | None = None
        self.actions_applied = 0
        # the push channel (GET …/plan): off | connecting | ok | broken
        self.push = push
        self.push_state = "connecting" if push else "off"
        self.push_version: str | None = None
        self.push_answers = 0
        self.pushed_actions = 0
        self._kick = trio.Event()  # set when a result is waiting: the heartbeat goes early

    @property
    def heartbeat_url(self) -> str:
        return f"{self.url}/api/v1/nodes/{self.node_id}/heartbeats"

    @property
    def plan_url(self) -> str:
        return f"{self.url}/api/v1/nodes/{self.node_id}/plan"

    def status_dict(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "since": self.since, "last_error": self.last_error,
                "heartbeats_sent": self.heartbeats_sent, "last_ok": self.last_ok,
                "boot_id": self.boot_id, "interval": self.interval,
                "pending_results": len(self.pending), "actions_running": len(self.running),
                "actions_applied": self.actions_applied, "policy_error": self.policy_error,
                "push": self.push_state, "pushed_actions": self.pushed_actions}

    # ------------------------------------------------------------------ heartbeat
    async def agent_status(self, max_age: float = 0.0) -> dict[str, Any]:
        """The agent's status with this link's part: the heartbeat's ``status``."""
        st = await self._status(max_age)
        st["control"] = self.status_dict()
        return st

    def build_heartbeat(self, status: dict[str, Any]) -> dict[str, Any]:
        """The next heartbeat's body from a status dict (``await engine.status()``)."""
        self.seq += 1
        return {
            "node_id": self.node_id,
            "version": self.version,
            "boot_id": self.boot_id,
            "seq": self.seq,
            "sent_at": round(time.time(), 3),
            "address": self.address,
            "status": status,
            "counters": status["counters"],
            "policy_version": self.engine.policy_version,
            "action_results": list(itertools.islice(self.pending.values(), MAX_RESULTS)),
        }

    async def handle_answer(self, answer: dict[str, Any], nursery: trio.Nursery | None = None,
                            sent: dict[int | None, dict[str, Any]] | None = None) -> None:
        """Apply a heartbeat's answer: drop acknowledged results, run the policy, start
        the new actions (in ``nursery``, default the link's own).  A malformed part is
        logged and skipped; the rest still applies.  ``sent``: the results the heartbeat
        carried (id → result); an acknowledged id whose result has been replaced since —
        a retried plan step (``attempt``) ran again meanwhile — keeps the new result."""
        if not isinstance(answer, dict):
            raise ValueError("the answer is not a JSON object")
        interval = answer.get("interval")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool):
            self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(interval)))
        for acked in answer.get("acked_results") or ():
            if isinstance(acked, int) and (sent is None or self.pending.get(acked) is sent.get(acked)):
                self.pending.pop(acked, None)
        policy = answer.get("policy")
        if policy is not None:
            await self.apply_policy(policy)
        await self.start_actions(answer.get("actions"), nursery)

    async def start_actions(self, actions: Any, nursery: trio.Nursery | None = None) -> int:
        """Start the actions not seen before (in ``nursery``, default the link's own);
        returns how many were new."""
        if actions is None:
            actions = []
        if not isinstance(actions, list):
            log.warning("control plane: 'actions' is not a list; ignored")
            return 0
        nursery = nursery or self._nursery
        new = 0
        for action in actions:
            aid = action.get("id") if isinstance(action, dict) else None
            if not isinstance(aid, int) or isinstance(aid, bool):
                log.warning("control plane: an action without an integer id: %r; ignored", action)
                continue
            key = (aid, action.get("attempt"))  # a step retried by the control plane comes again
            if key in self._seen:  # delivered again: applied (or being applied) once only
                continue
            self._seen[key] = None
            new += 1
            while len(self._seen) > SEEN_ACTIONS:
                self._seen.popitem(last=False)
            if nursery is None:
                await self._run_action(action)
            else:
                self.running.add(aid)
                nursery.start_soon(self._run_action, action)
        return new

    async def _run_action(self, action: dict[str, Any]) -> None:
        aid = action["id"]
        try:
            result = await self.apply_action(action)
        except Exception as exc:
            log.exception("control plane action %r failed", action)
            result = {"id": aid, "state": "failed", "detail": f"internal error: {exc}"}
        finally:
            self.running.discard(aid)
        if isinstance(result.get("detail"), str) and len(result["detail"]) > MAX_DETAIL:
            result["detail"] = result["detail"][:MAX_DETAIL - 1] + "…"
        self.pending[aid] = result
        self.actions_applied += 1
        self._kick.set()

    async def apply_action(self, action: dict[str, Any]) -> dict[str, Any]:
        """Apply one action through the engine; returns its result for the heartbeat
        (with the plan step's ``manifest_id``, ``job`` and ``step`` when it is one)."""
        result = await self._apply(action)
        for key in PLAN_FIELDS:
            if key in action:
                result[key] = action[key]
        return result

    async def _apply(self, action: dict[str, Any]) -> dict[str, Any]:
        aid, kind, path = action.get("id"), action.get("action"), action.get("path")
        if kind not in ACTIONS:
            return {"id": aid, "state": "failed", "detail": f"action: unknown action {kind!r}"}
        if not isinstance(path, str) or not path.startswith("/"):
            return {"id": aid, "state": "failed", "detail": f"path: want an absolute path, got {path!r}"}
        engine = self.engine
        if kind == "prefetch":
            return await self._prefetch(aid, path)
        try:
            inode = engine.local_inode(path)
        except FsError as exc:
            if kind == "demote" and exc.errno == errno.ENOENT and self._drop_copy_of is not None:
                return await self._drop_copy(aid, path)
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return {"id": aid, "state": "failed", "detail": f"no such file on this node: {path}"}
            return {"id": aid, "state": "failed", "detail": f"{path}: {os.strerror(exc.errno)}"}
        if not inode.is_reg:
            return {"id": aid, "state": "failed", "detail": f"not a regular file: {path}"}
        log.info("control plane action %s: %s %s", aid, kind, path)
        if kind in ("pin", "unpin"):
            await engine.set_pinned(inode, kind == "pin")
            return {"id": aid, "state": "done", "detail": "pinned" if kind == "pin" else "unpinned",
                    "tier": inode.tier, "pinned": inode.pinned}
        tier = "fast" if kind == "promote" else "slow"
        try:
            why = await engine.move(inode, tier)
        except FsError as exc:
            why = exc.args[1] if len(exc.args) > 1 else os.strerror(exc.errno)
            if exc.errno == errno.ENOSPC:
                why = f"no room: {why}"
        if why is not None:
            return {"id": aid, "state": "failed", "detail": f"{path}: {why}", "tier": inode.tier}
        return {"id": aid, "state": "done", "detail": inode.tier, "tier": inode.tier}

    async def _drop_copy(self, aid: int | None, path: str) -> dict[str, Any]:
        """``demote`` of a file another node holds: this node's copy of it (a prefetch's, or
        a read's) leaves the fast tier, unless it is in use."""
        log.info("control plane action %s: demote %s (a remote copy)", aid, path)
        assert self._drop_copy_of is not None, "_apply asks for a dropped copy only with drop_copy"
        freed = await self._drop_copy_of(os.fsencode(path))
        if freed is None:
            return {"id": aid, "state": "failed", "detail": f"{path}: the remote copy is in use", "tier": "fast"}
        return {"id": aid, "state": "done", "detail": f"remote copy dropped ({freed} bytes)" if freed
                else "no remote copy here", "tier": "remote"}

    async def _prefetch(self, aid: int | None, path: str) -> dict[str, Any]:
        """A plan step: the file's bytes onto this node's fast tier (promoted if local,
        fetched into the remote cache if another node holds it)."""
        log.info("control plane action %s: prefetch %s", aid, path)
        try:
            prefetch = self._prefetch_path or self.engine.placement.prefetch
            detail = await prefetch(path)
        except FsError as exc:
            why = exc.args[1] if len(exc.args) > 1 else os.strerror(exc.errno)
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return {"id": aid, "state": "failed", "detail": f"no such file: {path}"}
            if exc.errno == errno.ENOSPC and not why.startswith("no room"):
                why = f"no room: {why}"
            return {"id": aid, "state": "failed", "detail": f"{path}: {why}"}
        return {"id": aid, "state": "done", "detail": detail, "tier": "fast"}

    async def apply_policy(self, policy: dict[str, Any]) -> bool:
        """Run the answer's policy if its version differs from the applied one; keep it in
        the state directory.  Returns True if it changed something."""
        try:
            version = int(policy["version"])
            name, high, low = policy["policy"], policy["high_watermark"], policy["low_watermark"]
        except (KeyError, TypeError, ValueError) as exc:
            self._policy_failed(None, f"malformed policy {policy!r}: {exc}")
            return False
        if version == self.engine.policy_version or version == self._bad_policy_version:
            return False
        try:
            self.engine.placement.apply_policy(name, high, low, version)
        except PolicyError as exc:
            self._bad_policy_version = version
            self._policy_failed(version, str(exc))
            return False
        self.policy_error = None
        try:
            await trio.to_thread.run_sync(self.engine.placement.save_policy)
        except OSError as exc:  # applied, but not kept: say so, keep running it
            log.error("could not save the policy in %s: %s", self.engine.config.state_dir, exc)
        return True

    def _policy_failed(self, version: int | None, why: str) -> None:
        if self.policy_error != why:
            log.error("control plane policy version %s not applied: %s", version, why)
        self.policy_error = why

    # ------------------------------------------------------------------ the loop
    def _set_state(self, state: str, error: str | None) -> None:
        self.last_error = error if state != "ok" else self.last_error
        if state == self.state:
            return
        previous, self.state, self.since = self.state, state, time.time()
        if state == "ok":
            log.info("control plane %s reachable%s", self.url, " again" if previous != "connecting" else "")
        elif state == "unauthorized":
            log.warning("control plane %s refuses this node's token (%s); retrying every %.0f s",
                        self.url, error, AUTH_RETRY)
        else:
            log.warning("control plane %s unreachable (%s); retrying with back-off", self.url, error)

    async def heartbeat(self, client) -> float:
        """One round trip; returns the delay before the next one."""
        import httpx

        hb = self.build_heartbeat(await self.agent_status(max_age=STATUS_MAX_AGE))
        self.heartbeats_sent += 1
        try:
            resp = await client.post(self.heartbeat_url, json=hb)
        except httpx.HTTPError as exc:
            self._set_state("unreachable", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return -1.0
        if resp.status_code in (401, 403):
            self._set_state("unauthorized", f"HTTP {resp.status_code}: {resp.text[:200]}")
            return AUTH_RETRY
        if resp.status_code != 200:
            self._set_state("unreachable", f"HTTP {resp.status_code}: {resp.text[:200]}")
            return -1.0
        try:
            answer = resp.json()
        except ValueError as exc:
            answer = exc
        if not isinstance(answer, dict):
            self._set_state("unreachable", f"bad answer (not a JSON object): {resp.text[:200]!r}")
            return -1.0
        self._set_state("ok", None)
        self.last_ok = time.time()
        await self.handle_answer(answer, sent={r.get("id"): r for r in hb["action_results"] if isinstance(r, dict)})
        return self.interval

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat until cancelled.  Errors back off (doubling, ≤ MAX_BACKOFF)."""
        import httpx

        def make_client():  # loads the TLS trust store: not on the loop thread
            return httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT),
                                     headers={"authorization": f"Bearer {self._token}",
                                              "user-agent": f"hycache-agent/{self.version}"})

        client = await trio.to_thread.run_sync(make_client)
        failures = 0
        async with client, trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.push:
                nursery.start_soon(self.poll_plans, client)
            task_status.started()
            while True:
                t0 = trio.current_time()
                self._kick = trio.Event()  # a result from now on sends the next heartbeat early
                try:
                    delay = await self.heartbeat(client)
                except Exception as exc:
                    log.exception("control plane heartbeat failed")
                    self._set_state("unreachable", f"{type(exc).__name__}: {exc}")
                    delay = -1.0
                if delay < 0:
                    failures += 1
                    delay = min(MAX_BACKOFF, self.interval * 2 ** min(failures - 1, 8))
                    await trio.sleep_until(t0 + delay)
                    continue
                failures = 0
                with trio.move_on_at(t0 + delay):
                    await self._kick.wait()
                    await trio.sleep_until(t0 + MIN_KICK_GAP)  # results finishing together: one heartbeat

    # ------------------------------------------------------------------ the push channel
    def _set_push(self, state: str, error: str | None = None) -> None:
        if state == self.push_state:
            return
        previous, self.push_state = self.push_state, state
        if state == "ok":
            log.info("control plane %s: plan push channel open%s", self.url,
                     " again" if previous == "broken" else "")
        elif state == "broken":
            log.warning("control plane %s: plan push channel broken (%s); plan steps and actions come "
                        "with the heartbeat answers until it is back", self.url, error)

    async def poll_one(self, client, wait: float = PUSH_WAIT) -> int:
        """One long-poll; starts the actions it brings; returns how many were new.  Raises
        on a network error or an answer that is not a 200 with a JSON object."""
        import httpx

        params: dict[str, Any] = {"wait": wait}
        if self.push_version is not None:
            params["after"] = self.push_version
        resp = await client.get(self.plan_url, params=params,
                                timeout=httpx.Timeout(REQUEST_TIMEOUT, read=wait + REQUEST_TIMEOUT))
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        answer = resp.json()
        if not isinstance(answer, dict) or not isinstance(answer.get("version"), str):
            raise RuntimeError(f"bad answer: {resp.text[:200]!r}")
        self.push_version = answer["version"]
        self.push_answers += 1
        new = await self.start_actions(answer.get("actions"))
        self.pushed_actions += new
        return new

    async def poll_plans(self, client) -> None:
        """Keep the push channel open until cancelled; a failure is logged (once per state
        change) and retried with back-off while the heartbeats carry the items."""
        import httpx

        backoff = PUSH_BACKOFF[0]
        quick = False  # the previous answer came back at once
        while True:
            t0 = trio.current_time()
            try:
                await self.poll_one(client)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                self._set_push("broken", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                self.push_version = None
                await trio.sleep(backoff)
                backoff = min(PUSH_BACKOFF[1], backoff * 2)
                continue
            except Exception as exc:
                log.exception("control plane plan poll failed")
                self._set_push("broken", f"{type(exc).__name__}: {exc}")
                await trio.sleep(backoff)
                backoff = min(PUSH_BACKOFF[1], backoff * 2)
                continue
            self._set_push("ok")
            backoff = PUSH_BACKOFF[0]
            # answers that come back at once twice in a row (another process each time,
            # behind a load balancer) must not spin: at most ~50 polls a second.  One quick
            # answer alone polls again at once: a job's finish and the next job's start
            # come a few ms apart, and the start's release must not wait out a pause.
            was_quick, quick = quick, trio.current_time() - t0 < MIN_POLL_GAP
            if was_quick and quick:
                await trio.sleep_until(t0 + MIN_POLL_GAP)

"""The agent's local control channel: a Unix socket under ``ROOT/state`` speaking one JSON
request and one JSON reply per line.  Used by ``hycache-agent status``.

Per-file controls (where, pin, promote, demote) go through the ``user.hycache.*`` extended
attributes of the mount instead, so the kernel applies the file's permissions to them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger(__name__)

SOCKET_NAME = "agent.sock"


def socket_path(state_dir: Path) -> Path:
    return state_dir / SOCKET_NAME


class ControlServer:
    """``status``: the agent's status, ``await status()`` (hycache_agent.vfs.status)."""

    def __init__(self, status: Callable[[], Awaitable[dict[str, Any]]], path: Path) -> None:
        self.status = status
        self.path = path

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(self._handle, [listener])
        finally:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while b"\n" not in buf:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buf += chunk
                if len(buf) > 1 << 20:
                    return
            try:
                request = json.loads(buf.split(b"\n", 1)[0])
                reply = await self.dispatch(request)
            except Exception as exc:  # a bad request gets an error, never kills the agent
                reply = {"error": str(exc)}
            await stream.send_all(json.dumps(reply).encode() + b"\n")

    async def dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return await self.status()
        raise ValueError(f"unknown control op {op!r}")


def request(state_dir: Path, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Blocking client (used by the CLI).  Raises ConnectionError if no agent listens."""
    path = socket_path(state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ConnectionError(f"no HyCache agent is running for {state_dir.parent} ({path}: {exc.strerror})") from exc
        s.sendall(json.dumps(payload).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply = json.loads(buf)
    if "error" in reply:
        raise RuntimeError(reply["error"])
    return reply

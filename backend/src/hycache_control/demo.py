"""``hycache-control demo``: the whole product on one machine.

A local Redis Cluster, the control plane on SQLite, two agents with their own fast and
slow tiers and FUSE mounts linked to it (:class:`~hycache_control.stack.Stack`), and a
light workload — writes, re-reads of a hot set, cross-node reads — so the dashboard's
charts move. Prints the dashboard URL, the tokens and a curl example, checks that the
workload shows in the API's metrics, and runs until Ctrl-C (or ``--duration``), then
stops everything: agents unmounted, control plane and Redis stopped.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

from hycache_core.sizes import format_size, parse_size
from rich.console import Console
from rich.table import Table

from .stack import Stack

HOT_FILES = 6  # per node: re-read often, so they stay on the fast tier
COLD_FILES = 24  # per node: written once, read rarely: evicted by the hot set


class Workload:
    """Writes and reads through the mounts from a thread until stopped.

    Each node gets a hot set (re-read every round) and a growing cold set (written once,
    read now and then); every few rounds a node reads one of the other node's files, which
    is a remote read through the global namespace."""

    def __init__(self, mounts: dict[str, Path], file_size: int, seed: int = 1) -> None:
        self.mounts = mounts
        self.file_size = file_size
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.rounds = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="demo-workload", daemon=True)

    def start(self) -> None:
        self.prepare()
        self.thread.start()

    def prepare(self) -> None:
        """The hot files of every node."""
        for node, mnt in self.mounts.items():
            for i in range(HOT_FILES):
                self._write(mnt / f"hot-{node}-{i}.dat")

    def _write(self, path: Path) -> None:
        size = self.rng.randint(self.file_size // 2, self.file_size)
        path.write_bytes(os.urandom(size))
        self.bytes_written += size

    def _read(self, path: Path) -> None:
        self.bytes_read += len(path.read_bytes())

    def _run(self) -> None:
        while not self.stop.is_set():
            self.round()
            self.stop.wait(1.0)

    def round(self) -> None:
        """One round on every node: re-read its hot files, write one cold file, now and
        then read back an older cold one and a hot file of the next node."""
        nodes = sorted(self.mounts)
        self.rounds += 1
        for node in nodes:
            mnt = self.mounts[node]
            try:
                for i in range(HOT_FILES):
                    self._read(mnt / f"hot-{node}-{i}.dat")
                self._write(mnt / f"cold-{node}-{self.rounds % COLD_FILES}.dat")
                if self.rounds > 3 and self.rounds % 3 == 0:  # one written in the last COLD_FILES rounds
                    written = self.rng.randint(max(1, self.rounds - COLD_FILES + 1), self.rounds)
                    self._read(mnt / f"cold-{node}-{written % COLD_FILES}.dat")
                if len(nodes) > 1 and self.rounds % 5 == 0:
                    other = nodes[(nodes.index(node) + 1) % len(nodes)]
                    self._read(mnt / f"hot-{other}-{self.rng.randrange(HOT_FILES)}.dat")
            except OSError as exc:
                if len(self.errors) < 20:
                    self.errors.append(f"{node}: {exc}")

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)


def _get(base_url: str, token: str, path: str) -> dict:
    req = urllib.request.Request(base_url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _written_in_api(base_url: str, token: str, node: str, since: float) -> float:
    """Bytes the control plane's metric history says ``node`` wrote since ``since``."""
    samples = _get(base_url, token, f"/api/v1/nodes/{node}/metrics?since={since:.0f}")["samples"]
    total = 0.0
    for prev, cur in zip(samples, samples[1:]):
        dt = cur["ts"] - prev["ts"]
        total += ((cur.get("fast_write_bps") or 0) + (cur.get("slow_write_bps") or 0)) * dt
    return total


def _print_up(console: Console, st: dict, mounts: dict[str, Path], state_file: Path) -> None:
    base, admin, read = st["base_url"], st["admin_token"], st["read_token"]
    t = Table(title="HyCache is up", show_header=False)
    t.add_row("dashboard", f"{base}/")
    t.add_row("API docs", f"{base}/docs")
    t.add_row("admin token", admin)
    t.add_row("read-only token", read)
    for n, mnt in mounts.items():
        t.add_row(f"node {n} mount", str(mnt))
    t.add_row("state file", str(state_file))
    console.print(t)
    console.print("try:  [bold]curl -s -H 'Authorization: Bearer " + admin + f"' {base}/api/v1/nodes[/]",
                  soft_wrap=True)
    console.print(f"      [bold]ls {next(iter(mounts.values()))}[/]   (one namespace: every node's files)",
                  soft_wrap=True)


def _writes_reach_the_api(console: Console, base: str, read: str, node: str, started: float,
                          stopping: threading.Event) -> bool:
    """The workload must show in the API's metric history (heartbeats -> samples)."""
    deadline = time.monotonic() + 30
    seen = 0.0
    while time.monotonic() < deadline and not stopping.is_set():
        seen = _written_in_api(base, read, node, started - 5)
        if seen > 0:
            break
        time.sleep(1)
    if seen > 0:
        console.print(f"[green]the control plane's metrics show node {node} writing "
                      f"({format_size(int(seen))} so far)[/]")
        return True
    console.print(f"[red]no write throughput for node {node} reached the control plane in 30 s[/]")
    return False


def _print_summary(console: Console, base: str, read: str, rounds: int) -> None:
    nodes = _get(base, read, "/api/v1/nodes")["items"]
    summary = Table(title=f"after {rounds} workload rounds")
    for col in ("node", "state", "fast used", "slow used", "hit ratio"):
        summary.add_column(col)
    for n in nodes:
        hr = n.get("hit_ratio")
        summary.add_row(n["id"], n["state"], format_size(n["tiers"]["fast"]["used"] or 0),
                        format_size(n["tiers"]["slow"]["used"] or 0), "—" if hr is None else f"{hr:.2f}")
    console.print(summary)


def run_demo(*, agents: int = 2, fast_capacity: str = "16M", file_size: str = "1M",
             duration: float | None = None, workdir: str | None = None) -> int:
    console = Console()
    stopping = threading.Event()

    def on_signal(_signum, _frame):
        stopping.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    console.rule("[bold]HyCache: the whole product on this machine")
    console.print("starting a local Redis Cluster (6 redis-server processes), the control plane on SQLite "
                  f"and {agents} agents with {fast_capacity} fast tiers…")
    stack = Stack(workdir, agents=agents, fast_capacity=fast_capacity)
    workload: Workload | None = None
    failed = False
    try:
        st = stack.start()
        base, read = st["base_url"], st["read_token"]
        mounts = {n: Path(a["mountpoint"]) for n, a in st["agents"].items()}
        started = time.time()
        workload = Workload(mounts, parse_size(file_size))
        workload.start()
        _print_up(console, st, mounts, stack.state_file)
        failed = not _writes_reach_the_api(console, base, read, next(iter(mounts)), started, stopping)
        if duration is None:
            console.print("[bold]running a light workload; press Ctrl-C to stop everything[/]")
        end = None if duration is None else time.monotonic() + duration
        while not stopping.is_set() and (end is None or time.monotonic() < end):
            stopping.wait(1.0)
        _print_summary(console, base, read, workload.rounds)
        if workload.errors:
            failed = True
            console.print(f"[red]workload errors: {workload.errors}[/]")
    finally:
        if workload is not None:
            workload.close()
        console.print("stopping: agents (unmount), control plane, Redis…")
        stack.stop()
        if workdir is None and not any(os.path.ismount(a["mountpoint"]) for a in stack.state.get("agents", {}).values()):
            shutil.rmtree(stack.workdir, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    console.print("[green]stopped cleanly[/]" if not failed else "[red]the demo found a problem (above)[/]")
    return 1 if failed else 0

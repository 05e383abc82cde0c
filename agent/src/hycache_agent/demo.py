"""``hycache-agent demo``: a tiering file system over a temporary root, with a workload
that makes files move between the tiers, narrated on the terminal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hycache_core.sizes import format_size

FAST_CAPACITY = 8 << 20
FILE_SIZE = 1 << 20
N_FILES = 12


def _info(path: Path) -> dict:
    return json.loads(os.getxattr(path, "user.hycache.info"))


def _tier_table(mnt: Path, title: str) -> Table:
    t = Table(title=title)
    t.add_column("file")
    t.add_column("size", justify="right")
    t.add_column("tier")
    t.add_column("pinned")
    t.add_column("hits", justify="right")
    for p in sorted(mnt.iterdir()):
        if p.is_file():
            i = _info(p)
            colour = "green" if i["tier"] == "fast" else "yellow"
            t.add_row(p.name, format_size(i["size"]), f"[{colour}]{i['tier']}[/]", "yes" if i["pinned"] else "",
                      str(i["hits"]))
    return t


def _wait_mount(mnt: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"hycache-agent demo: the agent did not mount {mnt} (exit {proc.poll()})")
        time.sleep(0.05)


def _settle(mnt: Path, timeout: float = 10) -> None:
    """Wait until no migration is running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any("migration" in _info(p) for p in mnt.iterdir() if p.is_file()):
            return
        time.sleep(0.05)


def run_demo(keep: bool = False, root: Path | None = None) -> int:
    console = Console()
    made_root = root is None
    root = Path(tempfile.mkdtemp(prefix="hycache-demo-")) if root is None else root.resolve()
    mnt = root / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    agent = [sys.executable, "-m", "hycache_agent.cli"]
    log_path = root / "agent.log"
    console.rule("[bold]HyCache demo")
    console.print(f"root {root}: fast tier {root / 'fast'} (capacity {format_size(FAST_CAPACITY)}), "
                  f"slow tier {root / 'slow'}, mount {mnt}, agent log {log_path}")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(agent + ["mount", str(root), str(mnt), "--fast-capacity", str(FAST_CAPACITY),
                                         "--high-watermark", "0.9", "--low-watermark", "0.6"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_mount(mnt, proc)
        console.print(f"[bold]1.[/] writing {N_FILES} files of {format_size(FILE_SIZE)} "
                      f"({format_size(N_FILES * FILE_SIZE)}) into an {format_size(FAST_CAPACITY)} fast tier")
        digests = {}
        for i in range(N_FILES):
            data = os.urandom(FILE_SIZE)
            p = mnt / f"file{i:02d}.dat"
            p.write_bytes(data)
            digests[p.name] = hashlib.sha256(data).hexdigest()
        _settle(mnt)
        console.print(_tier_table(mnt, "after the writes: the oldest files were evicted (LRU)"))

        console.print("[bold]2.[/] pinning file11.dat, then reading file00.dat and file01.dat again")
        subprocess.run(agent + ["pin", str(mnt / "file11.dat")], check=True, stdout=subprocess.DEVNULL)
        for name in ("file00.dat", "file01.dat"):
            (mnt / name).read_bytes()
        _settle(mnt)
        console.print(_tier_table(mnt, "after the reads: evicted files came back (read-through, then promoted)"))

        console.print("[bold]3.[/] demoting file08.dat by hand: hycache-agent demote")
        subprocess.run(agent + ["demote", str(mnt / "file08.dat")], check=True)
        subprocess.run(agent + ["where", str(mnt / "file08.dat")], check=True)

        console.print("[bold]4.[/] checking every file's bytes")
        bad = [n for n, d in digests.items() if hashlib.sha256((mnt / n).read_bytes()).hexdigest() != d]
        console.print("[green]all checksums match[/]" if not bad else f"[red]mismatch: {bad}[/]")
        subprocess.run(agent + ["status", str(root)], check=True)
        if keep:
            console.print(f"[bold]The mount stays up at {mnt}; press Ctrl-C to unmount.[/]")
            try:
                proc.wait()
            except KeyboardInterrupt:
                pass
        return 1 if bad else 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
                proc.kill()
        console.print(f"agent exited with status {proc.returncode}")
        if made_root and not keep:
            shutil.rmtree(root, ignore_errors=True)

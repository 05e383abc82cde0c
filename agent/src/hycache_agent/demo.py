"""``hycache-agent demo``: a tiering file system over a temporary root, with a workload
that makes files move between the tiers, then a two-node cluster on a local Redis Cluster
(global namespace, write takeover, replicas, a node killed), narrated on the terminal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hycache_core.sizes import format_size
from hycache_harness import Agent, HarnessError, cluster_secret, redis_seeds, start_redis_cluster
from rich.console import Console
from rich.table import Table

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


def _settle(mnt: Path, timeout: float = 10) -> None:
    """Wait until no migration is running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any("migration" in _info(p) for p in mnt.iterdir() if p.is_file()):
            return
        time.sleep(0.05)


def _start_agent(agent: list[str], root: Path, args: list[str], log_path: Path) -> Agent:
    """``hycache-agent mount ROOT ROOT/mnt ARGS``, its output appended to ``log_path``; mounted."""
    try:
        return Agent(root, "hycache-agent", *args, log=log_path, log_level=None, agent_bin=agent,
                     append_log=True).start()
    except HarnessError as e:
        raise SystemExit(f"hycache-agent demo: the agent did not mount {root / 'mnt'}\n{e}") from None


def _until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _cluster_table(mounts: dict[str, Path], title: str) -> Table:
    t = Table(title=title)
    t.add_column("file")
    for node in mounts:
        t.add_column(f"seen on {node}")
    names = sorted({p.name for m in mounts.values() for p in m.iterdir() if p.is_file()})
    for name in names:
        cells = []
        for m in mounts.values():
            try:
                i = _info(m / name)
            except OSError:
                cells.append("-")
                continue
            where = "[green]local[/]" if i["tier"] != "remote" else "remote"
            reps = f", replica on {','.join(i['replicas'])}" if i.get("replicas") else ""
            cells.append(f"{where} (primary {i.get('primary')}{reps})")
        t.add_row(name, *cells)
    return t


def run_cluster_demo(console: Console, base: Path, agent: list[str]) -> bool:
    """Two agents, a and b, sharing one namespace on a local Redis Cluster."""

    console.rule("[bold]two nodes, one namespace")
    console.print("[bold]5.[/] starting a local Redis Cluster (3 masters + 3 replicas) and two agents, "
                  "a and b, each with its own tiers, with --replicas 1")
    redis = start_redis_cluster(base / "redis", start=41000, stop=47000)
    secret = cluster_secret(base / "cluster.secret")
    agents: dict[str, Agent] = {}
    try:
        for node in ("a", "b"):
            agents[node] = Agent(base / node, node, "--fast-capacity", str(64 << 20), "--replicas", "1",
                                 "--replica-mode", "sync", redis=redis_seeds(redis.nodes), secret=secret,
                                 log=base / f"agent-{node}.log", log_level=None, agent_bin=agent, append_log=True)
            agents[node].start()
        a, b = agents["a"].mnt, agents["b"].mnt
        data = {"results.csv": os.urandom(FILE_SIZE), "model.bin": os.urandom(2 * FILE_SIZE)}
        for name, blob in data.items():
            (a / name).write_bytes(blob)
        ok = _until(lambda: all((b / n).exists() for n in data))
        console.print(_cluster_table({"a": a, "b": b}, "a wrote two files: b lists and reads them from a"))
        ok &= all((b / n).read_bytes() == blob for n, blob in data.items())

        console.print("[bold]6.[/] b appends to results.csv: writes are always local, so b takes the file over "
                      "(fetches it once, becomes its primary under a write lease); a drops its copy")
        with open(b / "results.csv", "ab") as f:
            f.write(b"appended on b\n")
        data["results.csv"] += b"appended on b\n"
        ok &= _until(lambda: _info(a / "results.csv").get("primary") == "b")
        console.print(_cluster_table({"a": a, "b": b}, "after b's append"))

        console.print("[bold]7.[/] kill -9 of node a: its files had a replica on b, so nothing is lost")
        proc = agents["a"].proc
        assert proc is not None, "node a's agent was started"
        proc.kill()
        proc.wait()
        survived = all((b / n).read_bytes() == blob for n, blob in data.items())
        console.print("[green]every file still reads correctly on b[/]" if survived
                      else "[red]a file was lost with node a[/]")
        return ok and survived
    finally:
        for started in agents.values():
            started.stop()
        redis.stop()


def run_demo(keep: bool = False, root: Path | None = None, cluster: bool = True) -> int:
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
    daemon = _start_agent(agent, root, ["--fast-capacity", str(FAST_CAPACITY), "--high-watermark", "0.9",
                                        "--low-watermark", "0.6"], log_path)
    try:
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
        if cluster and not run_cluster_demo(console, root / "cluster", agent):
            bad.append("cluster demo")
        if keep:
            console.print(f"[bold]The mount stays up at {mnt}; press Ctrl-C to unmount.[/]")
            assert daemon.proc is not None, "the agent was started"
            try:
                daemon.proc.wait()
            except KeyboardInterrupt:
                pass
        return 1 if bad else 0
    finally:
        rc = daemon.stop()
        console.print(f"agent exited with status {rc}")
        if made_root and not keep:
            shutil.rmtree(root, ignore_errors=True)

"""``hycache-agent demo``: a tiering file system over a temporary root, with a workload
that makes files move between the tiers, then a two-node cluster on a local Redis Cluster
(global namespace, write takeover, replicas, a node killed), narrated on the terminal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hycache_core.sizes import format_size
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


def _start_agent(agent: list[str], root: Path, args: list[str], log_path: Path) -> tuple[subprocess.Popen, Path]:
    mnt = root / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(agent + ["mount", str(root), str(mnt), *args], stdout=log, stderr=subprocess.STDOUT)
    _wait_mount(mnt, proc)
    return proc, mnt


def _stop(proc: subprocess.Popen, mnt: Path) -> None:
    """SIGTERM the agent (SIGKILL after 30 s); lazily unmount whatever is left (a killed agent)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # (a killed agent's mount answers ENOTCONN, which os.path.ismount reports as False)
    subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, stderr=subprocess.DEVNULL)


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
    from hycache_dht.localcluster import LocalRedisCluster, find_free_base

    console.rule("[bold]two nodes, one namespace")
    redis = LocalRedisCluster(base / "redis", find_free_base(6, start=41000, stop=47000))
    console.print("[bold]5.[/] starting a local Redis Cluster (3 masters + 3 replicas) and two agents, "
                  "a and b, each with its own tiers, with --replicas 1")
    redis.start()
    secret = base / "cluster.secret"
    secret.write_text(os.urandom(32).hex())
    secret.chmod(0o600)
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for node in ("a", "b"):
            args = ["--fast-capacity", str(64 << 20), "--redis", ",".join(f"{h}:{p}" for h, p in redis.nodes[:3]),
                    "--node-id", node, "--listen", f"127.0.0.1:{_free_port()}", "--cluster-secret-file", str(secret),
                    "--replicas", "1", "--replica-mode", "sync"]
            procs[node] = _start_agent(agent, base / node, args, base / f"agent-{node}.log")
        a, b = procs["a"][1], procs["b"][1]
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
        procs["a"][0].kill()
        procs["a"][0].wait()
        survived = all((b / n).read_bytes() == blob for n, blob in data.items())
        console.print("[green]every file still reads correctly on b[/]" if survived
                      else "[red]a file was lost with node a[/]")
        return ok and survived
    finally:
        for proc, mnt in procs.values():
            _stop(proc, mnt)
        redis.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        if cluster and not run_cluster_demo(console, root / "cluster", agent):
            bad.append("cluster demo")
        if keep:
            console.print(f"[bold]The mount stays up at {mnt}; press Ctrl-C to unmount.[/]")
            try:
                proc.wait()
            except KeyboardInterrupt:
                pass
        return 1 if bad else 0
    finally:
        _stop(proc, mnt)
        console.print(f"agent exited with status {proc.returncode}")
        if made_root and not keep:
            shutil.rmtree(root, ignore_errors=True)

#!/usr/bin/env python3
"""What counting the kernel's reads (fs/kreads.py) costs the agent: an agent with the
counts on and with ``--no-kernel-read-counts``, from two source trees (``--before``: the
code to compare with, e.g. main's, exported with ``git archive``; ``--after``: this one),
four configurations interleaved in one run, the order rotated every round.

Per configuration and round, one agent mounted alone (ROOT/fast and ROOT/slow under
--workdir, one file system):

  idle CPU    fio --rw=randread --bs=4k on a page-cached file on the fast tier's file
              system (NOT through the mount) for --seconds; the agent's CPU seconds
              (utime+stime, /proc) and its trace reader process's, and fio's IOPS
  opens       small files through the mount: open+read(4 KiB)+close, then stat, each for
              a few seconds, while that fio runs beside (every read it makes is an event)
  reads       fio 4 KiB random reads of a page-cached file through the mount (passthrough)

    PYTHONPATH=... python bench/ktrace_bench.py --before /tmp/before --after . --workdir /tmp/kb
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hycache_harness.daemon import Agent

TICK = os.sysconf("SC_CLK_TCK")
PY_DIRS = ("agent/src", "backend/src", "core/src", "dht/src", "harness/src")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def fio(name: str, path: Path, seconds: float, size: str = "64M") -> subprocess.Popen[str]:
    return subprocess.Popen(["fio", f"--name={name}", f"--filename={path}", "--rw=randread", "--bs=4k",
                             f"--size={size}", "--ioengine=psync", "--time_based", f"--runtime={seconds}",
                             "--invalidate=0", "--output-format=json"], stdout=subprocess.PIPE, text=True)


def iops(p: subprocess.Popen[str]) -> float:
    out, _ = p.communicate()
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def warm(path: Path, size: int = 64 << 20) -> None:
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def rate(fn, files: list[Path], seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in files:
            fn(p)
        n += len(files)
    return n / (time.perf_counter() - t0)


def open_read(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    os.read(fd, 4096)
    os.close(fd)


def one(tree: Path, counts: bool, root: Path, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in PY_DIRS)}
    extra = [] if counts else ["--no-kernel-read-counts"]
    agent = Agent(root, "kb", "--fast-capacity", "1G", "--passthrough", "on", *extra,
                  agent_bin=[sys.executable, "-m", "hycache_agent.cli"], env=env, log_level="warning").start()
    try:
        pid = agent.pid
        assert pid is not None
        st = agent.status()
        mnt = agent.mnt
        files = []
        for i in range(300):
            p = mnt / f"s{i}"
            if not p.exists():
                p.write_bytes(b"y" * 4096)
            files.append(p)
        warm(mnt / "big")
        side = root / "side.dat"  # on the fast tier's file system, not through the mount
        warm(side)
        time.sleep(1)
        procs = [pid, *children(pid)]
        c0 = [cpu_seconds(p) for p in procs]
        bg = fio("side", side, seconds)
        time.sleep(seconds + 0.5)
        side_iops = iops(bg)
        c1 = [cpu_seconds(p) for p in procs]
        bg = fio("side", side, 9)
        time.sleep(0.5)
        opens = rate(open_read, files, 4)
        stats = rate(os.stat, files, 4)
        iops(bg)
        through = iops(fio("mnt", mnt / "big", 8))
        kr = agent.status()["counters"]["counting"]["kernel_reads"]
        return {"agent_cpu_s": c1[0] - c0[0], "reader_cpu_s": sum(c1[1:]) - sum(c0[1:]),
                "side_fio_iops": side_iops, "opens_per_s": opens, "stats_per_s": stats,
                "mount_randread_iops": through, "lost_events": kr["lost_events"],
                "traced": bool(st["counters"]["counting"]["kernel_reads"]["active"])}
    finally:
        agent.stop()


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--before", type=Path, required=True)
    a.add_argument("--after", type=Path, required=True)
    a.add_argument("--workdir", type=Path, required=True)
    a.add_argument("--seconds", type=float, default=30)
    a.add_argument("--rounds", type=int, default=2)
    args = a.parse_args()
    configs = [(tree, label, counts) for tree, label in ((args.before, "before"), (args.after, "after"))
               for counts in (True, False)]
    results: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for k in range(len(configs)):
            tree, label, counts = configs[(k + r) % len(configs)]
            name = f"{label} {'counts on' if counts else '--no-kernel-read-counts'}"
            row = one(tree.resolve(), counts, args.workdir / name.replace(" ", "_").replace("-", ""), args.seconds)
            print(name, json.dumps(row), flush=True)
            results.setdefault(name, []).append(row)
    print("\nmeans:")
    for name, rows in results.items():
        print(name, {k: round(sum(float(x[k]) for x in rows) / len(rows), 2) for k in rows[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes with replicas none / async / sync, the replica holder on a device of its own
(issue 33), the three modes interleaved pass by pass, with where the CPU went.

One local Redis Cluster; per mode a writer agent and a holder agent in a namespace of
their own (so a writer's replica can only go to its holder, and all six agents run at
once: no agent is restarted between passes).  The holders' tiers are on one loop-mounted
ext4 image in /dev/shm (another machine's disk); the writers' on this machine's disk.
Each pass writes ``--writes`` files of ``--write-size`` through each writer's mount with
1 MiB writes + fsync + close (``dd bs=1M conv=fsync``), the modes' order rotated from
pass to pass, ``sync; echo 3 > drop_caches`` before each mode's turn.  For async, the
time until every replica is acknowledged (the writer's ``user.hycache.info`` names it) is
reported too ("async, pushed": MB/s up to then).  CPU seconds of the writer agent, the
holder agent and the writing process itself are taken from /proc over the writes (for
async: until pushed), so a change can be read as "less CPU on the writer's side".

``--baseline-src DIR`` (another checkout's agent/src): every mode also run by a writer and
a holder of that build (``MODE@base``), in the same rotation, each build's modes read
against its own "none".

Usage: bench/replica_bench.py [--passes 3] [--warmup 1] [--writes 8] [--write-size 64M] [--json FILE]
                              [--agent-bin PATH] [--extra "ARGS"] [--baseline-src DIR]
Needs root (FUSE mounts, drop_caches, the loop device).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hycache_core.sizes import parse_size
from hycache_harness import Agent, drop_caches, executable, free_page_reporting, redis_seeds, start_redis_cluster
from remote_bench import own_device, ready, write_files

MODES = {"none": [], "async": ["--replicas", "1", "--replica-mode", "async"],
         "sync": ["--replicas", "1", "--replica-mode", "sync"]}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of ``pid`` and its threads (0 once it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def pushed(files: list[Path], timeout: float = 300.0) -> None:
    """Until every one of ``files`` names its replica (``user.hycache.info``), polled
    every 20 ms (a finer poll is CPU the writer's agent spends on getxattr)."""
    t0 = time.monotonic()
    left = list(files)
    while left:
        left = [f for f in left if not json.loads(os.getxattr(f, "user.hycache.info")).get("replicas")]
        if left and time.monotonic() - t0 > timeout:
            raise SystemExit(f"{len(left)} replicas still pending after {timeout:.0f} s")
        if left:
            time.sleep(0.02)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="passes run first and not counted (every mode once each: the page cache's and the "
                        "holders' device's memory in use before the measured passes; default 1)")
    p.add_argument("--writes", type=int, default=8)
    p.add_argument("--write-size", default="64M")
    p.add_argument("--device-size", default="6G", type=parse_size)
    p.add_argument("--agent-bin", default=executable("hycache-agent"))
    p.add_argument("--extra", default="", help="more mount arguments for every agent (e.g. '--no-passthrough')")
    p.add_argument("--json", type=Path)
    p.add_argument("--perf", type=Path, metavar="PREFIX",
                   help="perf record -g the writer and holder agents over each replica turn into PREFIX.MODE.PASS")
    p.add_argument("--baseline-src", type=Path, help="agent/src of another checkout: every mode also as MODE@base")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("replica_bench: needs root", file=sys.stderr)
        return 2
    wsize = parse_size(a.write_size)
    work = Path(tempfile.mkdtemp(prefix="hycache-repbench-", dir=os.environ.get("BENCH_DIR")))
    secret_file = work / "secret"
    secret_file.write_bytes(os.urandom(24).hex().encode())
    secret_file.chmod(0o600)
    cluster = start_redis_cluster(work / "redis", start=45000, stop=49000)
    common = dict(redis=redis_seeds(cluster.nodes), secret=secret_file, agent_bin=a.agent_bin)
    extra = shlex.split(a.extra)
    rows: dict[str, list[float]] = {}
    agents: list[Agent] = []

    warming = False  # (a warm-up pass: nothing counted)

    def add(key: str, value: float) -> None:
        if not warming:
            rows.setdefault(key, []).append(value)

    try:
        with own_device(work / "dev", a.device_size) as dev:
            try:
                writers: dict[str, Agent] = {}
                holders: dict[str, Agent] = {}
                names = [m + build for m in MODES for build in ("", "@base")[:1 + (a.baseline_src is not None)]]
                for key in names:
                    mode, _, build = key.partition("@")
                    env = None if not build else {**os.environ, "PYTHONPATH": os.pathsep.join(
                        [str(a.baseline_src.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
                    ns, tag = f"repbench-{os.getpid()}-{mode}{build}", f"{mode}{build}"
                    h = Agent(dev / f"h-{tag}", f"h{tag}", "--rebalance-interval", "0", *extra, namespace=ns, env=env,
                              **common).start()
                    agents.append(h)
                    w = Agent(work / f"w-{tag}", f"w{tag}", "--rebalance-interval", "0", *MODES[mode], *extra,
                              namespace=ns, env=env, **common).start()
                    agents.append(w)
                    writers[key], holders[key] = w, h
                for ag in agents:
                    ready(ag)
                time.sleep(2.5)  # a heartbeat: the writers know their holders
                for i in range(-a.warmup, a.passes):  # (negative: a warm-up pass, not counted)
                    r = i % len(names)
                    warming = i < 0
                    for key in names[r:] + names[:r]:
                        mode = key.partition("@")[0]
                        w, h = writers[key], holders[key]
                        drop_caches()
                        perf = None
                        if a.perf and mode != "none":
                            perf = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "499", "-o", f"{a.perf}.{key}.{i}",
                                                     "-p", f"{w.pid},{h.pid}"], stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
                            time.sleep(0.5)
                        c0 = (cpu_seconds(w.pid), cpu_seconds(h.pid), sum(os.times()[:2]))
                        t0 = time.perf_counter()
                        add(f"write {key}", write_files(w.mnt / f"p{i}", a.writes, wsize))
                        add(f"cpu {key} writer agent", cpu_seconds(w.pid) - c0[0])
                        add(f"cpu {key} holder agent", cpu_seconds(h.pid) - c0[1])
                        add(f"cpu {key} dd", sum(os.times()[:2]) - c0[2])
                        if mode != "none":  # (sync: already there when the writes return)
                            pushed([w.mnt / f"p{i}" / f"w{k}" for k in range(a.writes)])
                        if mode == "async":
                            add(f"write {key}, pushed", a.writes * wsize / (time.perf_counter() - t0) / 1e6)
                            add(f"cpu {key}, pushed writer agent", cpu_seconds(w.pid) - c0[0])
                            add(f"cpu {key}, pushed holder agent", cpu_seconds(h.pid) - c0[1])
                            add(f"cpu {key}, pushed dd", sum(os.times()[:2]) - c0[2])
                        if perf is not None:
                            perf.send_signal(signal.SIGINT)
                            perf.wait(30)
                        for k in range(a.writes):  # (the holder drops its replicas: its device stays small)
                            (w.mnt / f"p{i}" / f"w{k}").unlink()
                    print(f"pass {i} done" if i >= 0 else "warm-up pass done", flush=True)
            finally:  # (stopped before the device is unmounted)
                for ag in agents:
                    ag.stop()
    finally:
        for ag in agents:
            ag.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, a)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "passes": a.passes, "writes": a.writes,
                                      "write_size": wsize, "extra": a.extra}, indent=2))
    return 0


def print_table(rows: dict[str, list[float]], a) -> None:
    print(f"\nreplica_bench: {a.writes} × {a.write_size} per pass, {a.passes} passes, modes interleaved, holder on "
          f"its own device{' (' + a.extra + ')' if a.extra else ''}; load average {os.getloadavg()[0]:.2f}; "
          f"free page reporting {free_page_reporting() or 'off'}")
    print("| replicas | writer MB/s: median | per-pass ratio to none: median (IQR) | per pass (× none) "
          "| CPU s writer agent / holder / dd |")
    print("|---|---:|---:|---|---|")
    for build in ("", "@base"):
        if f"write none{build}" not in rows:
            continue
        none = rows[f"write none{build}"]
        for mode in ("none", "async", "async, pushed", "sync"):
            key = f"write {mode.replace(',', build + ',') if ',' in mode else mode + build}"
            xs = rows[key]
            cpu = " / ".join(f"{statistics.median(rows[f'cpu {key[6:]} {who}']):.2f}"
                             for who in ("writer agent", "holder agent", "dd"))
            ratios = [x / n for x, n in zip(xs, none)]
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            per = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"| {key[6:]} | {statistics.median(xs):,.0f} | {statistics.median(ratios):.2f} "
                  f"({q[0]:.2f}–{q[2]:.2f}) | {per} | {cpu} |")

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One caller's metadata rates by where the caller and the agent run (issue 17).

A program that waits for each answer before it sends its next request (one writer
creating, statting or removing files) and the agent's request loop hand the CPU to each
other at every request. Whether that is a switch on one CPU or a wake-up of another one
decides the rate on a virtual machine whose idle vCPUs halt (`cpuidle-haltpoll` with
`guest_halt_poll_ns=0`, as here): this script mounts one fs_bench target and runs one
writer's create / stat / remove phases (fs_bench's: open O_CREAT + 4 KiB + close, stat,
unlink; caches dropped before stat and remove) three ways:

  same       the agent's threads and the writer pinned to CPU 0
  apart      the agent's threads on CPU 0, the writer on CPU 1
  free       neither pinned (what fs_bench measures)

E.g.

    .venv/bin/python bench/cpu_placement.py --target hycache-dht --repeat 2
    .venv/bin/python bench/cpu_placement.py --target hycache --agent-args "--loop-spin-us 0"

Prints results only. Needs root (cache drop, passthrough), two CPUs or more, and, for
hycache-dht, redis-server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import fs_bench as fb

PLACEMENTS = {"same": ({0}, {0}), "apart": ({0}, {1}), "free": (None, None)}


def pin_process(pid: int, cpus: set[int] | None) -> None:
    """Every thread of ``pid`` on ``cpus`` (None: all CPUs)."""
    cpus = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that just ended
            pass


def _pinned_meta_worker(cpus: set[int] | None, directory: str, n: int, barrier, conn) -> None:
    """fs_bench's writer process (``_meta_worker``), on ``cpus``."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    fb._meta_worker(directory, n, barrier, conn)


def one_writer(directory: Path, files: int, cpus: set[int] | None, caches: fb.Caches) -> tuple[float, ...]:
    """(creates/s, stats/s, removes/s) of one fs_bench writer process on ``cpus``: its
    phases as ``fs_bench.metadata_run`` runs them (the caches dropped before each)."""
    with fb._workers(_pinned_meta_worker, [(cpus, str(directory), files, fb.FORK.Barrier(1))]) as (conn,):
        rates = []
        for op in fb.META_OPS:
            caches.drop()
            conn.send(op)
            rates.append(files / fb._answer(conn, f"one writer: {op}"))
        conn.send(None)
    return tuple(rates)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Placements: same, apart, free (see the module's docstring).")
    ap.add_argument("--target", default="hycache-dht", choices=sorted(fb.AGENT_TARGETS - fb.BASE_TARGETS))
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--placements", default="same,apart,free")
    ap.add_argument("--agent-args", default="", help="more `hycache-agent mount` flags, e.g. \"--loop-spin-us 0\"")
    ap.add_argument("--workdir", type=Path, default=fb.REPO / ".work" / "cpu_placement")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (cache drop, passthrough)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("needs two CPUs or more", file=sys.stderr)
        return 2
    placements = args.placements.split(",")
    if not set(placements) <= set(PLACEMENTS):
        ap.error(f"--placements: some of {', '.join(PLACEMENTS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    cluster = fb.Cluster(args.workdir) if args.target in fb.DHT_TARGETS else None
    t = fb.Target(args.target, args.workdir / args.target, agent_args=tuple(shlex.split(args.agent_args)))
    caches = fb.Caches(True)
    try:
        if cluster is not None:
            cluster.start()
        t.start(cluster)
        pid = t.daemon.proc.pid
        print(f"{args.target}: {shlex.join(t.daemon.argv)}")
        print(f"{'placement':10s} {'creates/s':>10s} {'stats/s':>10s} {'removes/s':>10s}")
        for rep in range(args.repeat):
            for name in placements:
                agent_cpus, writer_cpus = PLACEMENTS[name]
                pin_process(pid, agent_cpus)
                d = t.path / f"{name}-{rep}"
                d.mkdir()
                rates = one_writer(d, args.files, writer_cpus, caches)
                d.rmdir()
                if cluster is not None:
                    t.daemon.wait_published(timeout=120)
                print(f"{name:10s} {rates[0]:10,.0f} {rates[1]:10,.0f} {rates[2]:10,.0f}", flush=True)
        pin_process(pid, None)
    finally:
        t.stop()
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

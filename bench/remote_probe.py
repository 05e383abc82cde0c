#!/usr/bin/env python3
"""Reader modes side by side (issue 18): the large-file rows of ``remote_bench.py`` read
by fresh readers of each mode in turn (off, hybrid, off, hybrid, ...), in one run, each
read timed apart: the open (for a large file: the whole-file stream into the fast tier)
and the reads after it.  Printed results only, not a test.

``remote_bench.py`` gives each mode one reader and 3 passes, one mode after the other: a
difference between modes there is also a difference in time (what else the machine was
doing).  Here every round starts a new reader per mode and the modes alternate, so both
see the same machine; with ``--rounds`` × ``--files`` first reads per mode the
distributions can be compared.  Per reader: ``--files`` sequential first reads of a
``--size`` file (``seq``: open ms, reads ms, MB/s; then ``seq again`` after ``echo 1 > drop_caches``), one
random-4-KiB read of another
(``rand``, as remote_bench's), and 4 readers on 4 files of ``--size``/4 (``4 streams``).
``sync; echo 3 > drop_caches`` before each, as remote_bench does.

``--small N``: then N small files (4-32 KiB) read cold (open + read + close each, after
``drop_caches``) with the kernel's FUSE trace points of the reader's connection on (as
``bench/fuse_requests.py``): mean and p99 per file, per opcode the count, mean and max
time the kernel waited, and the requests of the slowest files; with ``--holder-log
DEBUG`` also the holder's own time per small-file GET (from its log).  ``--small-only``:
that row alone (no large files written or read; --small 200 unless given).
``--steps``: every small file's time split into its steps on both sides (the agents'
DEBUG lines of the peer service, the peer client and the copy, switched on alone through
$HYCACHE_DEBUG_LOGGERS): the median file and the slowest 1 % are printed (the cold
small-file tail, docs/archive/benchmarks-history.md "The cold small-file tail").

``head`` (with ``--rows``): each reader first times the open and first 4 KiB of another
``--size`` file (``head``, before its seq reads), then waits for that file's copy to be
whole (``copies_filling`` in the reader's status) so the seq rows see a quiet reader: the
first bytes against the whole read of a file of the same size.  ``--rows`` picks the rows
(default ``head,seq,rand,streams``).  ``--baseline-src DIR``: every mode also run by an
agent whose code is DIR (``agent/src`` of another checkout, first on its PYTHONPATH),
named ``MODE@base``, alternating with this one in each round (before/after in one run;
not the ``ra`` modes, whose flag an older agent may not have).

``--perf FILE``: ``perf record -a -g`` around the last seq read of the first reader of
each mode (FILE.MODE), for the time split of a first open.

Usage: bench/remote_probe.py [--modes off,hybrid] [--rounds 3] [--files 3] [--size 256M]
                             [--rows head,seq,rand,streams] [--baseline-src DIR]
                             [--agent-bin PATH] [--json FILE] [--perf FILE]
                             [--small N] [--small-only] [--steps] [--keep]
Needs root (FUSE mounts, drop_caches).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import remote_bench as rb
from fuse_requests import OPCODES, TRACEFS
from hycache_harness import Agent, cluster_secret, drop_caches, redis_seeds, start_redis_cluster
from remote_bench import MODES, MiB, ready

TRACE = TRACEFS / "instances" / "hycache-rmprobe"
# remote_bench's modes, and each with the mount's read-ahead at 1 MiB (``--read-ahead-kb
# 1024``: the kernel's READs of a copy still filling are then 1 MiB instead of 128 KiB)
MODES = {**MODES, **{f"{m}ra": [*flags, "--read-ahead-kb", "1024"] for m, flags in MODES.items()}}
# --steps: the modules whose DEBUG lines time a small file's steps (the agents read
# $HYCACHE_DEBUG_LOGGERS)
STEP_LOGGERS = ",".join(["hycache_agent.transport.server", "hycache_agent.transport.client",
                         "hycache_agent.remote.copy"])


def trace_start(mnt: Path) -> None:
    TRACE.mkdir(exist_ok=True)
    (TRACE / "tracing_on").write_text("0")
    (TRACE / "buffer_size_kb").write_text("16384")
    (TRACE / "trace_clock").write_text("mono")  # time.monotonic()'s clock
    (TRACE / "trace").write_text("")
    conn = os.minor(os.stat(mnt).st_dev)
    for ev in ("fuse_request_send", "fuse_request_end"):
        (TRACE / "events/fuse" / ev / "filter").write_text(f"connection == {conn}")
        (TRACE / "events/fuse" / ev / "enable").write_text("1")
    (TRACE / "tracing_on").write_text("1")


def trace_stop() -> list[tuple[float, float, str]]:
    """[(sent, ended, opcode)] of every request answered while tracing."""
    (TRACE / "tracing_on").write_text("0")
    text = (TRACE / "trace").read_text()
    for ev in ("fuse_request_send", "fuse_request_end"):
        (TRACE / "events/fuse" / ev / "enable").write_text("0")
    reqs, sent = [], {}
    for line in text.splitlines():
        if line.startswith("#") or ": fuse_request_" not in line:
            continue
        head, rest = line.split(": fuse_request_", 1)
        ts = float(head.split()[-1].rstrip(":"))
        f = rest.split()
        if f[0] == "send:":
            sent[int(f[4])] = (ts, int(f[6]))
        elif f[0] == "end:" and int(f[4]) in sent:
            t0, op = sent.pop(int(f[4]))
            reqs.append((t0, ts, OPCODES.get(op, str(op))))
    return reqs


def small_traced(mnt: Path, paths: list[Path]) -> dict:
    """Cold open + read + close of each file with the FUSE trace on."""
    trace_start(mnt)
    lat = []
    try:
        for path in paths:
            t = time.monotonic()
            with open(path, "rb", buffering=0) as f:
                while f.read(MiB):
                    pass
            lat.append((t, time.monotonic() - t))
    finally:
        reqs = trace_stop()
    ls = sorted(x[1] for x in lat)
    ops: dict[str, list[float]] = {}
    for t0, t1, op in reqs:
        ops.setdefault(op, []).append((t1 - t0) * 1e3)
    files = []
    for path, (t, dt) in zip(paths, lat):
        during: dict[str, float] = {}
        for t0, t1, op in reqs:
            if t - 1e-4 <= t0 <= t + dt:
                during[op] = during.get(op, 0.0) + (t1 - t0) * 1e3
        files.append({"path": "/" + "/".join(path.parts[-3:]), "ms": dt * 1e3, "ops": during})
    slow = []
    for i in sorted(range(len(lat)), key=lambda i: -lat[i][1])[:3]:
        t, dt = lat[i]
        rs = [f"{op} {(t1 - t0) * 1e3:.1f}" for t0, t1, op in reqs if t - 1e-4 <= t0 <= t + dt and t1 - t0 > 0.3e-3]
        slow.append(f"#{i} {dt * 1e3:.1f} ms: {', '.join(rs)}")
    return {"mean_ms": statistics.fmean(ls) * 1e3, "p99_ms": ls[min(len(ls) - 1, int(len(ls) * 0.99))] * 1e3,
            "ops": {op: (len(v), statistics.fmean(v), max(v)) for op, v in ops.items()}, "slow": slow,
            "files": files}


def _steps(text: str, pattern: str) -> dict[str, dict[str, float]]:
    """{path: {step: ms}} of the log lines matching ``pattern`` (groups: path, then the
    "name ms name ms ..." list)."""
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(pattern, text):
        f = m.group(2).split()
        out[m.group(1)] = {f[k]: float(f[k + 1]) for k in range(0, len(f) - 1, 2)
                           if re.fullmatch(r"[0-9.]+", f[k + 1])}
    return out


def steps_report(rows: dict, modes: list[str], holder_log: str, reader_logs: dict[str, str]) -> dict:
    """Each cold small file's time split into its steps: the kernel's requests (trace);
    the reader's copy (``copy``: the stream task's start, the fetch, the write hop, the
    memory insert; in the write hop: waiting for the thread, the open(2), write, close,
    back on the loop); the fetch's GET (``get``: a pooled connection or a new one, the
    request sent, until the response head); the holder's GET (``holder``: auth until
    open_for_peer, open_for_peer, the head prepared, waiting for a worker thread, the
    blob's open and read, back on the loop, the response sent).  Printed: the median file
    and the slowest 1 %; returned for --json."""
    holder = _steps(holder_log, r"GET b'([^']+)' done in [0-9.]+ s \(ms: ([^)]*)\)")
    report = {}
    for m in modes:
        per_file = []
        for r, sm in enumerate(rows.get(f"{m} small", [])):
            text = reader_logs.get(f"{m}{r}", "")
            copies = _steps(text, r"small copy of b'([^']+)': ms (.*)")
            gets = _steps(text, r"GET /v1/files\?path=(\S+): ms (.*)")
            for f in sm["files"]:
                p = f["path"]
                per_file.append({"path": p, "ms": f["ms"], "ops": f["ops"], "copy": copies.get(p, {}),
                                 "get": gets.get(p, {}), "holder": holder.get(p, {})})
        per_file.sort(key=lambda x: x["ms"])
        report[m] = per_file
        if not per_file:
            continue

        def line(x: dict) -> str:
            parts = [f"{x['ms']:.2f} ms {x['path']}", " ".join(f"{k} {v:.2f}" for k, v in x["ops"].items())]
            for key in ("copy", "get", "holder"):
                parts.append(key + ": " + " ".join(f"{k} {v:.2f}" for k, v in x[key].items()))
            return " | ".join(parts)

        print(f"{m}: median file: {line(per_file[len(per_file) // 2])}")
        for x in per_file[-max(3, len(per_file) // 100):][::-1]:
            print(f"{m}: slow: {line(x)}")
    return report


def timed_seq(path: Path) -> tuple[float, float, float]:
    """(MB/s, open s, reads s) of one sequential read with 1 MiB reads."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    t1 = time.perf_counter()
    n = 0
    try:
        while chunk := os.read(fd, MiB):
            n += len(chunk)
    finally:
        t2 = time.perf_counter()
        os.close(fd)
    return n / (t2 - t0) / 1e6, t1 - t0, t2 - t1


def timed_head(path: Path) -> float:
    """Seconds from the open to the first 4 KiB read."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        if len(os.read(fd, 4096)) != 4096:
            raise SystemExit(f"{path}: short first read")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def wait_whole(agent: Agent, timeout: float = 60.0) -> None:
    """Until no copy streams into the agent's fast tier (a build without the field: at once)."""
    t0 = time.monotonic()
    while (agent.status().get("cluster") or {}).get("copies_filling", 0):
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{agent.name}: a copy still filling after {timeout:.0f} s")
        time.sleep(0.05)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="off,hybrid")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--files", type=int, default=3, help="sequential first reads per reader")
    p.add_argument("--size", default="256M")
    p.add_argument("--rand-reads", type=int, default=2000)
    p.add_argument("--agent-bin", default=rb.AGENT_BIN)
    p.add_argument("--json", type=Path)
    p.add_argument("--perf", help="perf record -a -g of one seq read per mode into PERF.MODE")
    p.add_argument("--small", type=int, default=0, help="small files read cold per reader, traced")
    p.add_argument("--holder-log", default="WARNING", help="DEBUG: the holder's time per small-file GET")
    p.add_argument("--small-only", action="store_true",
                   help="only the --small row (no large files): the cold small-file tail, file by file")
    p.add_argument("--steps", action="store_true",
                   help="with --small: each file's time split into its steps on the reader and the holder "
                        "(their DEBUG lines of the peer service, the peer client and the small copy)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (the agents' logs)")
    p.add_argument("--rows", default="head,seq,rand,streams", help="large-file rows to run")
    p.add_argument("--baseline-src", type=Path, help="agent/src of another checkout: every mode also as MODE@base")
    a = p.parse_args()
    rows_wanted = set(a.rows.split(","))
    if os.geteuid() != 0:
        print("remote_probe: needs root", file=sys.stderr)
        return 2
    size = rb.parse_size(a.size)
    modes = a.modes.split(",")
    if a.baseline_src is not None:
        modes = [x for m in modes for x in ((m,) if m.endswith("ra") else (m, f"{m}@base"))]
    if a.small_only and not a.small:
        a.small = 200
    if a.steps:  # the agents log these modules' DEBUG lines (the rest at --holder-log / WARNING)
        os.environ["HYCACHE_DEBUG_LOGGERS"] = STEP_LOGGERS
    reader_logs: dict[str, str] = {}
    work = Path(tempfile.mkdtemp(prefix="hycache-rmprobe-", dir=os.environ.get("BENCH_DIR")))
    secret = cluster_secret(work / "secret", 24)
    cluster = start_redis_cluster(work / "redis", start=45000, stop=49000)
    redis = redis_seeds(cluster.nodes)
    common = dict(redis=redis, secret=secret, namespace=f"rmprobe-{os.getpid()}", agent_bin=a.agent_bin)
    rows: dict[str, list] = {}
    t_start = time.monotonic()
    holder = Agent(work / "a", "a", "--rebalance-interval", "0", log_level=a.holder_log, **common).start()
    ready(holder)
    try:
        block = os.urandom(MiB)
        readers = [(r, m) for r in range(a.rounds) for m in modes]
        for r, m in readers:
            d = holder.mnt / f"{m}{r}"
            d.mkdir()
            large = [] if a.small_only else [
                *((f"big{j}", size) for j in range(a.files if "seq" in rows_wanted else 0)),
                *((("head", size),) if "head" in rows_wanted else ()),
                *((("rand", size),) if "rand" in rows_wanted else ()),
                *((f"s{k}", size // 4) for k in range(4 if "streams" in rows_wanted else 0))]
            for name, n in large:
                with open(d / name, "wb") as f:
                    for _ in range(n // MiB):
                        f.write(block)
            rnd = random.Random(r)
            if a.small:
                (d / "small").mkdir()
            for i in range(a.small):
                (d / "small" / f"f{i}").write_bytes(os.urandom(rnd.randint(4, 32) * 1024))
        holder.wait_published()
        time.sleep(1.2)  # the readers' listing caches (1 s)
        for j in range(0 if a.small_only or "seq" not in rows_wanted else a.files):
            drop_caches()
            rows.setdefault("local seq", []).append(timed_seq(holder.mnt / f"{modes[0]}0" / f"big{j}"))
        print(f"files written, local done ({time.monotonic() - t_start:.0f} s)", flush=True)
        for r, m in readers:
            mode, _, build = m.partition("@")
            env = None
            if build:
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(a.baseline_src.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
            b = Agent(work / f"b-{mode}{build}{r}", f"b{mode}{build}{r}", "--rebalance-interval", "0", *MODES[mode],
                      env=env, **common).start()
            ready(b)
            try:
                d = b.mnt / f"{m}{r}"
                if "head" in rows_wanted and not a.small_only:
                    drop_caches()
                    head = timed_head(d / "head")
                    wait_whole(b)
                    rows.setdefault(f"{m} head", []).append(head)
                    print(f"{m} r{r} first 4 KiB {head * 1e3:7.1f} ms", flush=True)
                for j in range(0 if a.small_only or "seq" not in rows_wanted else a.files):
                    drop_caches()
                    perf = None
                    if a.perf and r == 0 and j == a.files - 1:
                        perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "1999", "-o", f"{a.perf}.{m}"],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(1.0)
                    got = timed_seq(d / f"big{j}")
                    if perf is not None:
                        perf.send_signal(signal.SIGINT)
                        perf.wait()
                    rows.setdefault(f"{m} seq", []).append(got)
                    drop_caches(1)  # as remote_bench's "seq again": page cache dropped, inodes kept
                    again = timed_seq(d / f"big{j}")[0]
                    rows.setdefault(f"{m} seq again", []).append(again)
                    cl = b.status().get("cluster") or {}
                    print(f"{m} r{r} seq {j}: {got[0]:7,.0f} MB/s  open {got[1] * 1e3:6.1f} ms  "
                          f"reads {got[2] * 1e3:5.1f} ms; again {again:7,.0f} MB/s; reads of filling copies "
                          f"so far {cl.get('filling_reads', '-')} (waited {cl.get('filling_waits', '-')})", flush=True)
                if not a.small_only and "rand" in rows_wanted:
                    drop_caches()
                    got = rb.rand_read(d / "rand", a.rand_reads, r)
                    rows.setdefault(f"{m} rand", []).append(got)
                    print(f"{m} r{r} rand {got:5.1f} MB/s", flush=True)
                if not a.small_only and "streams" in rows_wanted:
                    drop_caches()
                    got4 = rb.concurrent([lambda n=n: rb.read_all(d / n) for n in ("s0", "s1", "s2", "s3")])
                    rows.setdefault(f"{m} 4 streams", []).append(got4)
                    print(f"{m} r{r} 4 streams {got4:7,.0f} MB/s", flush=True)
                if a.small:
                    drop_caches()
                    sm = small_traced(b.mnt, [d / "small" / f"f{i}" for i in range(a.small)])
                    rows.setdefault(f"{m} small", []).append(sm)
                    ops = ", ".join(f"{op} {n}x {mean:.2f}/{mx:.1f}" for op, (n, mean, mx) in sm["ops"].items())
                    print(f"{m} r{r} small cold: mean {sm['mean_ms']:.2f} ms  p99 {sm['p99_ms']:.2f} ms\n"
                          f"    requests (count, mean/max ms): {ops}\n    slowest: {'; '.join(sm['slow'])}", flush=True)
            finally:
                b.stop()
                if a.steps:
                    reader_logs[f"{m}{r}"] = (b.root / "agent.log").read_text(errors="replace")
    finally:
        holder.stop()
        cluster.stop()
        try:
            TRACE.rmdir()
        except OSError:
            pass
        log = (work / "a" / "agent.log").read_text(errors="replace")
        if a.keep:
            print(f"kept {work} (agents' logs, tiers, Redis)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    gets = sorted(float(x) * 1e3 for x in re.findall(r"GET b'/[a-z]+\d+/small/f\d+' done in ([0-9.]+) s", log))
    if gets:
        rows["holder small GET ms"] = gets
        print(f"holder's small-file GETs: {len(gets)}, mean {statistics.fmean(gets):.2f} ms, "
              f"p99 {gets[int(len(gets) * 0.99)]:.2f} ms, max {gets[-1]:.2f} ms, over 5 ms: {sum(g > 5 for g in gets)}")
    if a.steps:
        rows["steps"] = steps_report(rows, modes, log, reader_logs)
    print(f"\nremote_probe: {a.rounds} rounds x {modes}, {a.files} seq reads each; median [min-max]")
    ls = [x[0] for x in rows.get("local seq", [])]
    if ls:
        print(f"local seq {statistics.median(ls):,.0f} MB/s [{min(ls):,.0f}-{max(ls):,.0f}]")
    for m in modes:
        if f"{m} head" in rows:
            hd = rows[f"{m} head"]
            line = f"{m:7s} first 4 KiB {statistics.median(hd) * 1e3:.1f} ms [{min(hd) * 1e3:.1f}-{max(hd) * 1e3:.1f}]"
            if f"{m} seq" in rows:
                whole = statistics.median(x[1] + x[2] for x in rows[f"{m} seq"])
                line += f"; whole read {whole * 1e3:.0f} ms; ratio {statistics.median(hd) / whole:.3f}"
            print(line)
        if a.small_only:
            sm = rows[f"{m} small"]
            print(f"{m:7s} small cold mean {statistics.median(x['mean_ms'] for x in sm):.2f} ms "
                  f"p99 {statistics.median(x['p99_ms'] for x in sm):.2f} ms "
                  f"[{min(x['p99_ms'] for x in sm):.2f}-{max(x['p99_ms'] for x in sm):.2f}]")
            continue
        if f"{m} seq" not in rows:
            continue
        seq = rows[f"{m} seq"]
        mb, op, rd = ([x[i] for x in seq] for i in range(3))
        first = [x[0] for k, x in enumerate(seq) if k % a.files == 0]
        ratio = statistics.median(mb) / statistics.median(ls) if ls else float("nan")
        print(f"{m:7s} seq {statistics.median(mb):7,.0f} MB/s [{min(mb):,.0f}-{max(mb):,.0f}] "
              f"({ratio:.2f}x local)  open {statistics.median(op) * 1e3:.0f} ms "
              f"[{min(op) * 1e3:.0f}-{max(op) * 1e3:.0f}]  reads {statistics.median(rd) * 1e3:.1f} ms; "
              f"first read of each reader {statistics.median(first):,.0f} MB/s")
        for row in ("seq again", "rand", "4 streams"):
            v = rows.get(f"{m} {row}")
            if not v:
                continue
            print(f"{m:7s} {row} {statistics.median(v):,.1f} MB/s [{min(v):,.1f}-{max(v):,.1f}]")
        if a.small:
            sm = rows[f"{m} small"]
            print(f"{m:7s} small cold mean {statistics.median(x['mean_ms'] for x in sm):.2f} ms "
                  f"p99 {statistics.median(x['p99_ms'] for x in sm):.2f} ms "
                  f"[{min(x['p99_ms'] for x in sm):.2f}-{max(x['p99_ms'] for x in sm):.2f}]")
    if a.json:
        a.json.write_text(json.dumps({"size": size, "rounds": a.rounds, "files": a.files, "modes": modes,
                                      "agent_bin": str(a.agent_bin), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

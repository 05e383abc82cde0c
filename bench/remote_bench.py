#!/usr/bin/env python3
"""Remote data benchmark (issue 18): a file another node holds, read through this node's
mount, against the same file read on its holder, and against the peer service's raw HTTP
GET (the ceiling); then writes with replicas none / async / sync.

Two agents on one local Redis Cluster (started here): the holder ``a`` writes the files;
for every reader mode a *fresh* reader agent ``b`` (``off`` = ``--hccache-size 0``,
``block`` = ``--hccache-mode block``, ``hybrid`` = the default) reads them through its
mount.  Every pass uses files that reader has never opened, so "first" reads are cold on
the reader; ``sync; echo 3 > /proc/sys/vm/drop_caches`` runs before every measured step
(as ``bench/fs_bench.py`` does), so the holder's disk is read too, except "again" rows:
those read right after ``echo 1`` (page cache dropped; the agents' inodes, and with them
the reader's fast-tier copy, stay).

Rows (median and min–max of ``--passes``):

* ``seq``      the large file read sequentially with 1 MiB reads (``dd bs=1M``)
* ``seq again`` the same file once more (the reader's cached copy: memory or fast tier)
* ``rand``     ``--rand-reads`` random 4 KiB preads of a large file (one open)
* ``small``    ``--small`` files of 4–32 KiB, open + read + close each: mean and p99
  per file, first pass (cold) and again (cached)
* ``mixed``    4 readers at once: 2 read a large file each sequentially, 2 read small
  files; aggregate MB/s
* ``4 streams`` 4 readers on 4 different large files; aggregate MB/s
* ``GET``      the raw peer GET of the large file (Python ``http.client`` into memory)
* ``write``    ``--writes`` files of ``--write-size`` written with 1 MiB writes + fsync +
  close (``dd bs=1M conv=fsync``) by a writer with ``--replicas 1`` async / sync, and
  none; MB/s seen by the writer, and for async also until every replica was pushed
* ``2disk write`` the same write rows with the replica's node ``r`` on a device of its
  own (a loop-mounted ext4 image in /dev/shm: another machine's disk), the writer on
  this machine's disk as before; printed beside the same-disk rows, never instead
  (``--no-two-disk`` leaves them out)
* ``takeover`` the reader appends one byte to a large file the holder wrote (the reader
  becomes the primary): seconds and MB/s of the file's size

Reader order (``--order``): ``rotate`` (the default) starts a fresh reader per mode for
every pass and rotates the modes' order from pass to pass (pass 0 off, block, hybrid;
pass 1 block, hybrid, off; ...), so a slow stretch of the machine (this VM has streams
2× slower for a while: docs/benchmarks.md) does not land on one mode; ``fixed`` is the
earlier order (one reader per mode for all its passes, off first).  After the table,
every mode against off row by row: the ratio of the medians and of each pass.

Usage: bench/remote_bench.py [--size 256M] [--passes 3] [--small 200] [--modes off,block,hybrid]
                             [--order rotate|fixed] [--agent-bin PATH] [--json FILE] [--plot FILE.png]
                             [--no-two-disk]
Needs root (FUSE mounts, drop_caches, the loop device).  Prints a table; writes nothing else unless --json/--plot.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from hycache_agent.transport.auth import authorization
from hycache_agent.transport.wire import files_target
from hycache_core.sizes import parse_size
from hycache_harness import Agent, drop_caches, executable, redis_seeds, start_redis_cluster

REPO = Path(__file__).resolve().parent.parent
AGENT_BIN = Path(executable("hycache-agent"))

MODES = {"off": ["--hccache-size", "0"], "block": ["--hccache-mode", "block"], "hybrid": []}
MiB = 1 << 20
NODE_TTL = 10  # hycache_dht.registry.NODE_TTL_SECONDS: a stopped agent counts as alive this long


def seq_read(path: Path) -> float:
    """MB/s of one sequential read with 1 MiB reads."""
    t0 = time.perf_counter()
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, MiB):
            n += len(chunk)
    finally:
        os.close(fd)
    return n / (time.perf_counter() - t0) / 1e6


def rand_read(path: Path, count: int, seed: int) -> float:
    """MB/s of ``count`` random 4 KiB preads (distinct blocks) of one open file."""
    size = os.stat(path).st_size
    blocks = random.Random(seed).sample(range(size // 4096), count)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        for b in blocks:
            if len(os.pread(fd, 4096, b * 4096)) != 4096:
                raise SystemExit(f"short read of {path}")
    finally:
        os.close(fd)
    return count * 4096 / (time.perf_counter() - t0) / 1e6


def small_read(paths: list[Path]) -> dict:
    """open + read + close of each file: mean, p99 (ms) and MB/s."""
    lat = []
    total = 0
    t0 = time.perf_counter()
    for p in paths:
        t = time.perf_counter()
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                total += len(chunk)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    lat.sort()
    return {"mean_ms": statistics.fmean(lat) * 1e3, "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
            "MBps": total / wall / 1e6}


def concurrent(jobs: list) -> float:
    """Run ``jobs`` (callables returning bytes read) in threads; aggregate MB/s."""
    out = [0] * len(jobs)
    errors: list[BaseException] = []

    def run(i, fn):
        try:
            out[i] = fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(jobs)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(out) / (time.perf_counter() - t0) / 1e6


def read_all(path: Path) -> int:
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MiB):
            n += len(chunk)
    return n


def read_many(paths: list[Path]) -> int:
    return sum(read_all(p) for p in paths)


def raw_get(addr: str, path: bytes, secret: bytes) -> float:
    """MB/s of one peer GET of the whole file (the ceiling: no FUSE, no file written)."""
    host, port = addr.rsplit(":", 1)
    target = files_target(path)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    t0 = time.perf_counter()
    conn.request("GET", target, headers={"Authorization": authorization(secret, "bench", "GET", target)})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"GET {target}: {resp.status} {resp.read()[:200]!r}")
    n = 0
    buf = bytearray(MiB)
    while got := resp.readinto(buf):
        n += got
    conn.close()
    return n / (time.perf_counter() - t0) / 1e6


def write_files(d: Path, count: int, size: int) -> float:
    """``dd bs=1M conv=fsync`` ``count`` times: MB/s."""
    d.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MiB)
    t0 = time.perf_counter()
    for i in range(count):
        fd = os.open(d / f"w{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _ in range(size // MiB):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
    return count * size / (time.perf_counter() - t0) / 1e6


def wait_replicated(files: list[Path], timeout: float = 120.0) -> None:
    """Until every one of ``files`` has its replica (the writer's ``user.hycache.info``
    xattr names one: set once the push is acknowledged; a cheap getxattr, polled every
    5 ms, not a ``status`` subprocess that walks the tree)."""
    t0 = time.monotonic()
    left = list(files)
    while left:
        left = [f for f in left if not json.loads(os.getxattr(f, "user.hycache.info")).get("replicas")]
        if not left:
            return
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{len(left)} replicas still pending after {timeout:.0f} s")
        time.sleep(0.005)


def ready(agent: Agent, timeout: float = 60.0) -> Agent:
    """Until the agent is connected to the DHT (before that it answers lookups from its
    own names only: another node's file would be ENOENT)."""
    t0 = time.monotonic()
    while (agent.status().get("cluster") or {}).get("state") != "ok":
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{agent.name}: not connected to the DHT after {timeout:.0f} s")
        time.sleep(0.1)
    return agent


def write_holder_files(a: Agent, size: int, passes: int, nsmall: int) -> None:
    block = os.urandom(MiB)
    rnd = random.Random(18)
    for p in range(passes):
        d = a.mnt / f"p{p}"
        (d / "small").mkdir(parents=True, exist_ok=True)
        for name in ["big", "rand", "mix0", "mix1", "s0", "s1", "s2", "s3", "take"]:
            n = size if name in ("big", "rand", "take") else size // 4
            with open(d / name, "wb") as f:
                for _ in range(n // MiB):
                    f.write(block)
        for i in range(nsmall):
            (d / "small" / f"f{i}").write_bytes(os.urandom(rnd.randint(4, 32) * 1024))
    a.wait_published()
    time.sleep(1.2)  # the readers' listing caches (1 s)


def write_rows(a, work: Path, common: dict, wsize: int, add, prefix: str) -> None:
    """The write rows: a fresh writer with replicas none / async / sync (keys
    ``{prefix}write MODE``), its replicas going to the other agents of ``common``'s
    namespace."""
    for rmode, extra in [("none", []), ("async", ["--replicas", "1", "--replica-mode", "async"]),
                         ("sync", ["--replicas", "1", "--replica-mode", "sync"])]:
        tag = prefix.strip().replace(" ", "")
        w = Agent(work / f"w{tag}-{rmode}", f"w{tag}{rmode}", "--rebalance-interval", "0", *extra, **common).start()
        ready(w)
        try:
            time.sleep(2.5)  # a heartbeat: the writer knows its replica peers
            for i in range(a.passes):
                drop_caches()
                t0 = time.perf_counter()
                add(f"{prefix}write {rmode}", write_files(w.mnt / f"{rmode}{i}", a.writes, wsize))
                if rmode == "async":  # what the writer saw, and until every replica was pushed
                    wait_replicated([w.mnt / f"{rmode}{i}" / f"w{k}" for k in range(a.writes)])
                    add(f"{prefix}write async, pushed", a.writes * wsize / (time.perf_counter() - t0) / 1e6)
        finally:
            w.stop()
        time.sleep(NODE_TTL + 1)  # a stopped writer must not be picked as the next one's replica peer


@contextlib.contextmanager
def own_device(mnt: Path, size: int):
    """An ext4 file system on a loop device backed by a file in /dev/shm (RAM), mounted at
    ``mnt``: a disk of its own, as another machine's would be.

    The image is written whole first (zeros) and made and mounted without discards, so
    every block the file system writes lands on RAM already in use: on a VM whose memory
    the host hands over at a page's first touch (this project's Firecracker machine), a
    sparse image's new blocks cost a fault on the host each — a device that fell from
    ~1.1 GB/s to ~170 MB/s once the first GiB was written (2026-12-02), setting the
    replica rows instead of the agents."""
    import subprocess

    image = Path(tempfile.mkdtemp(prefix="hycache-rmbench-dev-", dir="/dev/shm")) / "disk.img"
    chunk = bytes(1 << 20)
    print(f"own_device: writing its {size / 2**30:.1f} GiB image in RAM whole", flush=True)
    with open(image, "wb") as f:
        for _ in range(size >> 20):
            f.write(chunk)
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(image)], check=True)
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(image.parent, ignore_errors=True)


def reader_pass(a, b: Agent, mode: str, i: int, modes: list[str], add) -> None:
    """Pass ``i`` of reader ``b`` (HCCache ``mode``): the files of ``p{i}``, which no reader
    of this mode opened before."""
    d = b.mnt / f"p{i}"
    drop_caches()
    add(f"{mode} seq", seq_read(d / "big"))
    drop_caches(1)
    add(f"{mode} seq again", seq_read(d / "big"))
    drop_caches()
    add(f"{mode} rand", rand_read(d / "rand", a.rand_reads, i))
    drop_caches()
    smalls = sorted((d / "small").iterdir())
    r = small_read(smalls)
    add(f"{mode} small mean_ms", r["mean_ms"])
    add(f"{mode} small p99_ms", r["p99_ms"])
    drop_caches(1)
    r = small_read(smalls)
    add(f"{mode} small again mean_ms", r["mean_ms"])
    add(f"{mode} small again p99_ms", r["p99_ms"])
    drop_caches()
    add(f"{mode} mixed", concurrent([lambda: read_all(d / "mix0"), lambda: read_all(d / "mix1"),
                                     lambda: read_many(smalls[::2]), lambda: read_many(smalls[1::2])]))
    drop_caches()
    add(f"{mode} 4 streams", concurrent([lambda n=n: read_all(d / n) for n in ("s0", "s1", "s2", "s3")]))
    if mode == modes[-1]:
        drop_caches()
        t0 = time.perf_counter()
        with open(d / "take", "ab") as f:
            f.write(b"x")
        add("takeover s", time.perf_counter() - t0)


def med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "passes": xs}


def main() -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM: stop the agents and Redis too
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256M", help="large file size (default 256M)")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--small", type=int, default=200, help="small files per pass")
    p.add_argument("--rand-reads", type=int, default=2000)
    p.add_argument("--writes", type=int, default=8)
    p.add_argument("--write-size", default="64M")
    p.add_argument("--modes", default="off,block,hybrid")
    p.add_argument("--order", choices=("rotate", "fixed"), default="rotate",
                   help="rotate (default): each pass a fresh reader per mode, the modes' order rotated per pass "
                        "(a slow stretch of the machine does not land on one mode); fixed: one reader per mode "
                        "for all passes, the modes one after the other (the earlier sessions' order)")
    p.add_argument("--no-writes", action="store_true")
    p.add_argument("--only-writes", action="store_true",
                   help="only the write rows (no holder files, local/GET or reader rows: their table stays empty)")
    p.add_argument("--two-disk", action=argparse.BooleanOptionalAction, default=True,
                   help="also the write rows with the replica's node on its own device (default on)")
    p.add_argument("--two-disk-size", default="6G", type=parse_size,
                   help="size of that device (a sparse ext4 image in /dev/shm; default 6G)")
    p.add_argument("--agent-bin", default=AGENT_BIN, help="the hycache-agent to run (A/B against another tree)")
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--replot", type=Path, metavar="JSON", help="only redraw --plot (and the table) from a --json file")
    a = p.parse_args()
    if a.replot:
        res = json.loads(a.replot.read_text())
        print_table(res, a.modes.split(","))
        if a.plot:
            plot(res, a.modes.split(","), a.plot)
        return 0
    if os.geteuid() != 0:
        print("remote_bench: needs root", file=sys.stderr)
        return 2
    size, wsize = parse_size(a.size), parse_size(a.write_size)
    work = Path(tempfile.mkdtemp(prefix="hycache-rmbench-", dir=os.environ.get("BENCH_DIR")))
    secret_file = work / "secret"
    secret = os.urandom(24).hex().encode()
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    cluster = start_redis_cluster(work / "redis", start=41000, stop=45000)
    redis = redis_seeds(cluster.nodes)
    ns = f"rmbench-{os.getpid()}"
    common = dict(redis=redis, secret=secret_file, namespace=ns, agent_bin=a.agent_bin)
    res: dict = {"size": size, "passes": a.passes, "small": a.small, "agent_bin": str(a.agent_bin),
                 "order": a.order, "rows": {}}
    rows = res["rows"]

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    t_start = time.monotonic()
    holder = Agent(work / "a", "a", "--rebalance-interval", "0", **common).start()
    ready(holder)
    try:
        if not a.only_writes:
            write_holder_files(holder, size, a.passes, a.small)
        addr = holder.argv[holder.argv.index("--listen") + 1]
        for i in range(0 if a.only_writes else a.passes):
            d = holder.mnt / f"p{i}"
            drop_caches()
            add("local seq", seq_read(d / "big"))
            drop_caches(1)
            add("local seq again", seq_read(d / "big"))
            drop_caches()
            add("local rand", rand_read(d / "rand", a.rand_reads, i))
            drop_caches()
            smalls = sorted((d / "small").iterdir())
            r = small_read(smalls)
            add("local small mean_ms", r["mean_ms"])
            add("local small p99_ms", r["p99_ms"])
            drop_caches(1)
            r = small_read(smalls)
            add("local small again mean_ms", r["mean_ms"])
            add("local small again p99_ms", r["p99_ms"])
            drop_caches()
            add("local mixed", concurrent([lambda: read_all(d / "mix0"), lambda: read_all(d / "mix1"),
                                           lambda: read_many(smalls[::2]), lambda: read_many(smalls[1::2])]))
            drop_caches()
            add("local 4 streams", concurrent([lambda n=n: read_all(d / n) for n in ("s0", "s1", "s2", "s3")]))
            drop_caches()
            add("GET", raw_get(addr, f"/p{i}/big".encode(), secret))
        print(f"local and GET done ({time.monotonic() - t_start:.0f} s)", flush=True)
        if not a.no_writes:
            write_rows(a, work, common, wsize, add, "")
            if a.two_disk:
                # the replica's node on its own device: a loop-mounted ext4 image in RAM
                # (/dev/shm) stands for the second machine's disk; the writer stays on this
                # one.  Its own namespace: only the writer and r are nodes there.
                with own_device(work / "r-dev", a.two_disk_size) as dev:
                    r = Agent(dev / "r", "r", "--rebalance-interval", "0",
                              **{**common, "namespace": ns + "-2d"}).start()
                    ready(r)
                    try:
                        write_rows(a, work, {**common, "namespace": ns + "-2d"}, wsize, add, "2disk ")
                    finally:
                        r.stop()
            print(f"writes done ({time.monotonic() - t_start:.0f} s)", flush=True)
        modes = [] if a.only_writes else a.modes.split(",")
        if a.order == "fixed":  # one reader per mode for every pass, the modes one after the other
            for mode in modes:
                b = Agent(work / f"b-{mode}", f"b{mode}", "--rebalance-interval", "0", *MODES[mode], **common).start()
                ready(b)
                try:
                    for i in range(a.passes):
                        reader_pass(a, b, mode, i, modes, add)
                    print(f"reader {mode} done ({time.monotonic() - t_start:.0f} s)", flush=True)
                finally:
                    b.stop()
        else:  # rotate: each pass a fresh reader per mode, the modes' order rotated per pass
            for i in range(a.passes if modes else 0):
                order = modes[i % len(modes):] + modes[:i % len(modes)]
                for mode in order:
                    b = Agent(work / f"b-{mode}-{i}", f"b{mode}{i}", "--rebalance-interval", "0", *MODES[mode],
                              **common).start()
                    ready(b)
                    try:
                        reader_pass(a, b, mode, i, modes, add)
                    finally:
                        b.stop()
                res.setdefault("pass_orders", []).append(order)
                print(f"pass {i} ({', '.join(order)}) done ({time.monotonic() - t_start:.0f} s)", flush=True)
    finally:
        holder.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    res["summary"] = {k: med(v) for k, v in rows.items()}
    res["ratios"] = ratios(res, a.modes.split(","))
    print_table(res, a.modes.split(","))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    if a.plot:
        plot(res, a.modes.split(","), a.plot)
        print(f"plot written to {a.plot}")
    return 0


def cell(s: dict, key: str, ref: str | None = None, fmt: str = "{:,.0f}") -> str:
    v = s.get(key)
    if v is None:
        return "—"
    out = fmt.format(v["median"])
    if ref and s.get(ref):
        out += f" ({v['median'] / s[ref]['median']:.2f}×)"
    return out + "<br>" + fmt.format(v["min"]) + "–" + fmt.format(v["max"])


READ_ROWS = [("seq", "MB/s", "{:,.0f}"), ("seq again", "MB/s", "{:,.0f}"), ("rand", "MB/s", "{:,.1f}"),
             ("small mean_ms", "ms/file", "{:.2f}"), ("small p99_ms", "ms/file", "{:.2f}"),
             ("small again mean_ms", "ms/file", "{:.2f}"), ("small again p99_ms", "ms/file", "{:.2f}"),
             ("mixed", "MB/s", "{:,.0f}"), ("4 streams", "MB/s", "{:,.0f}")]


def ratios(res: dict, modes: list[str]) -> dict:
    """Each HCCache mode against off, row by row: the ratio of the medians, the ratio in
    each pass (the same files, read by the two modes' readers of that pass), and whether
    the mode is not slower than off (MB/s rows: ratio ≥ 1; ms rows: ≤ 1)."""
    s, rows = res.get("summary", {}), res.get("rows", {})
    out: dict = {}
    if "off" not in modes:
        return out
    for mode in modes:
        if mode == "off":
            continue
        for row, unit, _fmt in READ_ROWS:
            mine, off = s.get(f"{mode} {row}"), s.get(f"off {row}")
            if not mine or not off or not off["median"]:
                continue
            ratio = mine["median"] / off["median"]
            per_pass = [x / y if y else None for x, y in zip(rows[f"{mode} {row}"], rows[f"off {row}"])]
            out[f"{mode}/off {row}"] = {"median_ratio": ratio, "per_pass": per_pass, "unit": unit,
                                        "not_slower": ratio <= 1.0 if unit == "ms/file" else ratio >= 1.0}
    return out


def print_ratios(res: dict, modes: list[str]) -> None:
    r = res.get("ratios") or ratios(res, modes)
    others = [m for m in modes if m != "off" and any(k.startswith(f"{m}/off ") for k in r)]
    if not others:
        return
    print(f"\nagainst off (order {res.get('order', 'fixed')}: ratio of the medians; per pass; "
          "ms rows: < 1 is faster, MB/s rows: > 1 is faster)")
    print("| row | unit | " + " | ".join(f"{m} / off" for m in others) + " |")
    print("|---|---|" + "---|" * len(others))
    for row, unit, _fmt in READ_ROWS:
        cells = []
        for m in others:
            v = r.get(f"{m}/off {row}")
            if v is None:
                cells.append("—")
                continue
            passes = ", ".join("—" if x is None else f"{x:.2f}" for x in v["per_pass"])
            cells.append(f"{v['median_ratio']:.2f}{'' if v['not_slower'] else ' (slower)'}<br>{passes}")
        print(f"| {row.replace('_ms', '')} | {unit} | " + " | ".join(cells) + " |")


def print_table(res: dict, modes: list[str]) -> None:
    s = res["summary"]
    print(f"\nremote_bench: {res['size'] >> 20} MiB files, {res['passes']} passes, {res['small']} small files; "
          "median (× local) and min–max")
    head = "| row | unit | local | " + " | ".join(f"remote, HCCache {m}" for m in modes) + " | peer GET |"
    print(head)
    print("|---|---|" + "---:|" * (len(modes) + 2))
    for row, unit, fmt in READ_ROWS:
        cells = [cell(s, f"local {row}", fmt=fmt)] + [cell(s, f"{m} {row}", f"local {row}", fmt) for m in modes]
        cells.append(cell(s, "GET", "local seq") if row == "seq" else "—")
        print(f"| {row.replace('_ms', '')} | {unit} | " + " | ".join(cells) + " |")
    print_ratios(res, modes)
    if "write none" in s:
        two = "2disk write none" in s
        print("\n| writes | same disk: MB/s (× none) |" + (" replica's node on its own device (× none) |" if two else "")
              + "\n|---|---:|" + ("---:|" if two else ""))
        for m in ("none", "async", "async, pushed", "sync"):
            line = f"| replicas {m} | {cell(s, f'write {m}', 'write none')} |"
            if two:
                line += f" {cell(s, f'2disk write {m}', '2disk write none')} |"
            print(line)
    if "takeover s" in s:
        t = s["takeover s"]
        print(f"\ntakeover (append 1 byte to a {res['size'] >> 20} MiB remote file): {t['median']:.2f} s "
              f"({res['size'] / t['median'] / 1e6:,.0f} MB/s; min–max {t['min']:.2f}–{t['max']:.2f} s)")


def plot(res: dict, modes: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["summary"]
    groups = ["seq", "seq again", "rand", "mixed", "4 streams"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    series = ["local", *modes]
    w = 0.8 / len(series)
    for k, name in enumerate(series):
        ys, lo, hi = [], [], []
        for g in groups:
            v = s.get(f"{name} {g}")
            base = s[f"local {g}"]["median"]
            ys.append(v["median"] / base if v else 0)
            lo.append((v["median"] - v["min"]) / base if v else 0)
            hi.append((v["max"] - v["median"]) / base if v else 0)
        ax1.bar([i + k * w for i in range(len(groups))], ys, w, yerr=[lo, hi], capsize=2,
                label=name if name == "local" else f"remote, HCCache {name}")
    ax1.axhline(0.8, color="grey", ls="--", lw=0.8)
    ax1.set_xticks([i + 0.4 - w / 2 for i in range(len(groups))], groups)
    ax1.set_ylabel("× local read (median, min–max)")
    ax1.legend(fontsize=8)
    ax1.set_title(f"reads of another node's files ({res['size'] >> 20} MiB)")
    if "write none" in s:
        names = ["none", "async", "async, pushed", "sync"]
        layouts = [("", "same disk")] + ([("2disk ", "replica on its own device")] if "2disk write none" in s else [])
        bw = 0.8 / len(layouts)
        for k, (prefix, label) in enumerate(layouts):
            base = s[f"{prefix}write none"]["median"]
            vals = [s[f"{prefix}write {n}"] for n in names]
            ax2.bar([i + k * bw for i in range(len(names))], [v["median"] / base for v in vals], bw,
                    yerr=[[(v["median"] - v["min"]) / base for v in vals],
                          [(v["max"] - v["median"]) / base for v in vals]], capsize=3, label=label)
        ax2.set_xticks([i + 0.4 - bw / 2 for i in range(len(names))], [n.replace(", ", ",\n") for n in names])
        ax2.axhline(0.7, color="grey", ls="--", lw=0.8)
        ax2.axhline(0.5, color="grey", ls=":", lw=0.8)
        ax2.legend(fontsize=7)
        ax2.set_title("writes with replicas (× none)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

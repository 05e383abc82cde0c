"""Redis commands and time per write-open of a file this node created (issue 17).

A script with printed results, not a test (root: FUSE mounts). One local Redis Cluster;
for each agent (this checkout's, and with ``--baseline DIR`` that checkout's beside it,
each in its own DHT namespace): N files are created (open O_CREAT + 4 KiB + close) and
their publication awaited; then the masters' command counters are reset and the files
are opened as mdtest's read phase opens them (``O_RDWR`` + 4 KiB read + close), the
publication awaited again, and the Redis commands the masters served in that phase are
read from ``INFO commandstats`` (summed over the masters: EVALSHA is one Lua call of
the store). Printed per target: opens/s of the open phase and commands per open,
split by command.

    .venv/bin/python bench/lease_probe.py --files 2000 --baseline /work/base
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from fs_bench import Cluster, Target
from hycache_harness import force_unmount

REPO = Path(__file__).resolve().parent.parent


def masters(cluster: Cluster):
    import redis

    return [redis.Redis(host=h, port=p) for h, p in cluster.cluster.nodes[:3]]


def reset(cluster: Cluster) -> None:
    for r in masters(cluster):
        r.config_resetstat()


def commandstats(cluster: Cluster) -> Counter:
    total: Counter = Counter()
    for r in masters(cluster):
        for name, st in r.info("commandstats").items():
            total[name.removeprefix("cmdstat_")] += int(st["calls"])
    return total


def probe(t: Target, cluster: Cluster, n: int) -> dict:
    d = t.path / "probe"
    d.mkdir()
    block = os.urandom(4096)
    for i in range(n):
        fd = os.open(d / f"f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, block)
        os.close(fd)
    t.daemon.wait_published()
    time.sleep(0.3)  # the last batch's linger
    reset(cluster)
    # the agent's background traffic (heartbeats, inbox polls, renewals) over the same time
    # is measured separately below and subtracted
    t0 = time.monotonic()
    for i in range(n):
        fd = os.open(d / f"f{i}", os.O_RDWR)
        os.read(fd, 4096)
        os.close(fd)
    seconds = time.monotonic() - t0
    t.daemon.wait_published()
    time.sleep(0.3)
    during = commandstats(cluster)
    reset(cluster)
    time.sleep(seconds + 0.3 + 0.3)
    background = commandstats(cluster)
    net = Counter({k: during[k] - background[k] for k in during if during[k] - background[k] > 0})
    shutil.rmtree(d, ignore_errors=True)
    return {"opens_per_s": n / seconds, "per_open": {k: v / n for k, v in net.most_common()},
            "total_per_open": sum(net.values()) / n, "background": dict(background)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout whose agent runs beside")
    ap.add_argument("--workdir", type=Path, default=REPO / ".work" / "bench" / "lease-probe")
    args = ap.parse_args(argv)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(workdir)
    cluster.start()
    targets = []
    try:
        names = ["hycache-dht"] + (["base-hycache-dht"] if args.baseline else [])
        for name in names:
            t = Target(name, workdir / name, fio=False)
            if name.startswith("base-"):
                t.agent_bin = args.baseline / ".venv" / "bin" / "hycache-agent"
            t.start(cluster)
            targets.append(t)
        for t in targets:
            r = probe(t, cluster, args.files)
            split = ", ".join(f"{k} {v:.2f}" for k, v in r["per_open"].items())
            print(f"{t.name:18s} {r['opens_per_s']:8.0f} opens/s (O_RDWR + 4 KiB read + close), "
                  f"{r['total_per_open']:.2f} Redis commands per open ({split or 'none'}); "
                  f"background over the same time: {r['background']}", flush=True)
    finally:
        for t in reversed(targets):
            t.stop()
        for mp in Path(workdir).rglob("mnt"):
            force_unmount(mp)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

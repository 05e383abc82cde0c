#!/usr/bin/env python3
"""Promotion on open: read-through + background copy vs copy-before-open (Algorithm 1).

For each mode a fresh agent mounts a temp root; a file is written, demoted to the slow
tier, the page cache is dropped, and then the file is opened and read twice.  Printed per
mode: time to the first byte after open(), time to read the whole file the first time,
time of a second full read, and when the file reached the fast tier.

Usage: bench/promotion_bench.py [--size 512M] [--modes background,before-open,never]
Needs root (drop_caches).  Writes results to stdout (and --json FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hycache_core.sizes import format_size, parse_size
from hycache_harness import Agent, HarnessError, drop_caches, write_json

CHUNK = 1 << 20


def tier_of(path: Path) -> str:
    return json.loads(os.getxattr(path, "user.hycache.info"))["tier"]


def run_mode(mode: str, size: int, workdir: Path) -> dict:
    root = workdir / mode
    promote = ["--no-promote-on-open"] if mode == "never" else ["--promote-mode", mode]
    agent = Agent(root, mode, "--fast-capacity", str(4 * size), *promote, log_level=None)
    try:
        agent.start()
    except HarnessError as e:
        raise SystemExit(f"agent did not mount ({mode}): {e}") from None
    try:
        path = agent.mnt / "data.bin"
        block = os.urandom(CHUNK)
        with open(path, "wb") as f:
            for _ in range(size // CHUNK):
                f.write(block)
        agent.cli("demote", str(path))
        assert tier_of(path) == "slow"
        drop_caches()

        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 4096)
        ttfb = time.perf_counter() - t0
        while os.read(fd, CHUNK):
            pass
        first = time.perf_counter() - t0
        os.close(fd)
        fast_at = None
        while time.perf_counter() - t0 < 120 and mode != "never":
            if tier_of(path) == "fast":
                fast_at = time.perf_counter() - t0
                break
            time.sleep(0.01)
        drop_caches()
        t1 = time.perf_counter()
        with open(path, "rb") as f:
            while f.read(CHUNK):
                pass
        second = time.perf_counter() - t1
        return {"mode": mode, "ttfb_s": ttfb, "first_read_s": first, "second_read_s": second,
                "on_fast_after_s": fast_at, "first_MBps": size / first / 1e6, "second_MBps": size / second / 1e6}
    finally:
        agent.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="512M", help="file size (default 512M)")
    p.add_argument("--modes", default="background,before-open,never")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--dir", type=Path, help="work directory (default: a temp dir on /tmp's file system)")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("promotion_bench: needs root (drop_caches)", file=sys.stderr)
        return 2
    size = parse_size(a.size)
    workdir = Path(tempfile.mkdtemp(prefix="hycache-promo-", dir=a.dir))
    results = []
    try:
        for mode in a.modes.split(","):
            r = run_mode(mode, size, workdir)
            results.append(r)
            fast = "-" if r["on_fast_after_s"] is None else f"{r['on_fast_after_s']:.2f} s"
            print(f"{mode:12s} first byte {r['ttfb_s'] * 1e3:8.1f} ms | first full read {r['first_read_s']:6.2f} s "
                  f"({r['first_MBps']:6.0f} MB/s) | second read {r['second_read_s']:6.2f} s "
                  f"({r['second_MBps']:6.0f} MB/s) | on fast tier after "
                  f"{fast}",
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"file size {format_size(size)}; fast and slow tiers on the same device here, so the slow tier "
          "is not slower: the numbers show the cost structure (latency to first byte), not HDD speed.")
    if a.json:
        write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

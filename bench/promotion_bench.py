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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENT = str(REPO / ".venv" / "bin" / "hycache-agent")
sys.path.insert(0, str(REPO / "core" / "src"))
from hycache_core.sizes import format_size, parse_size  # noqa: E402

CHUNK = 1 << 20


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def tier_of(path: Path) -> str:
    return json.loads(os.getxattr(path, "user.hycache.info"))["tier"]


def run_mode(mode: str, size: int, workdir: Path) -> dict:
    root = workdir / mode
    mnt = root / "mnt"
    mnt.mkdir(parents=True)
    args = [AGENT, "mount", str(root), str(mnt), "--fast-capacity", str(4 * size)]
    if mode == "never":
        args.append("--no-promote-on-open")
    else:
        args += ["--promote-mode", mode]
    log = open(root / "agent.log", "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"agent did not mount ({mode}); see {root / 'agent.log'}")
            time.sleep(0.05)
        path = mnt / "data.bin"
        block = os.urandom(CHUNK)
        with open(path, "wb") as f:
            for _ in range(size // CHUNK):
                f.write(block)
        subprocess.run([AGENT, "demote", str(path)], check=True, stdout=subprocess.DEVNULL)
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
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-uz", str(mnt)])
            proc.kill()
        log.close()


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
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``GET /api/v1/files`` on a directory of N entries (default 1,000,000) in a real local
Redis Cluster (3 masters + 3 replicas), through a real ``hycache-control serve``: the
latency of each page while following ``next_cursor``, and of pages with a ``prefix``.

    .venv/bin/python bench/files_bench.py --entries 1000000 --pages 200 \\
        --baseline /work/main/.venv/bin/hycache-control      # A/B in one run

The entries are created through the DHT client's own batched path (``apply``: the Lua
scripts the agents use).  ``--baseline BIN`` measures another build on the same cluster
and directory first (``--baseline-pages`` pages: main read the whole directory per page).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from hycache_harness import ControlPlane, pct, redis_seeds, start_redis_cluster

BIN = Path(sys.executable).parent / "hycache-control"


def fill(store, n: int, batch: int = 5000) -> float:
    from hycache_dht.meta import EntryMeta, Op, dir_meta
    t0 = time.monotonic()
    store.create(b"/big", dir_meta())
    now = time.time_ns()
    for k in range(0, n, batch):
        ops = [Op.create(f"/big/f{i:07d}".encode(),
                         EntryMeta("file", stat.S_IFREG | 0o644, 0, 0, i, now, now, now, primary=f"n{i % 100}",
                                   tier="fast" if i % 3 else "slow"))
               for i in range(k, min(n, k + batch))]
        bad = [r for r in store.apply(ops) if r is not True]
        if bad:
            raise SystemExit(f"create failed: {bad[:3]}")
        if k and k % 100_000 == 0:
            print(f"  {k:,} entries ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    return time.monotonic() - t0


def measure(label, binary, seeds, namespace, args, tmp) -> dict:
    import httpx
    from hycache_control.db import Database
    from hycache_control.models import Token
    from hycache_control.services.tokens import hash_secret, new_secret
    db_url = f"sqlite:///{tmp / f'{label}.db'}"
    db = Database(db_url)
    db.upgrade()
    admin = new_secret()
    with db.session() as s:
        s.add(Token(name="bench", scope="admin", hash=hash_secret(admin), created_at=time.time()))
    db.close()
    control = ControlPlane("--redis", seeds, "--dht-namespace", namespace, "--log-level", "warning", db=db_url,
                           state_dir=tmp, log=tmp / f"{label}.log", binary=str(binary), append_log=False,
                           ready_path="/healthz")
    url = control.url
    out = {"label": label, "pages": [], "prefix": [], "entries": 0, "prefix_pages": 0, "prefix_found": 0}
    try:
        control.start(120)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=600) as c:
            c.get("/api/v1/files", params={"path": "/", "limit": 1})  # connects the store
            cursor = None
            pages = args.pages if label != "before" else args.baseline_pages
            for _ in range(pages):
                t0 = time.perf_counter()
                r = c.get("/api/v1/files", params={"path": "/big", "limit": args.limit,
                                                   **({"cursor": cursor} if cursor else {})})
                out["pages"].append(time.perf_counter() - t0)
                r.raise_for_status()
                body = r.json()
                out["entries"] += len(body["items"])
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            # a rare prefix (10 names of the directory) followed to the end, bounded in pages
            if label != "before":  # (main ignored prefix)
                cursor = None
                for _ in range(args.prefix_pages):
                    t0 = time.perf_counter()
                    r = c.get("/api/v1/files", params={"path": "/big", "limit": args.limit, "prefix": "f000012",
                                                       **({"cursor": cursor} if cursor else {})})
                    out["prefix"].append(time.perf_counter() - t0)
                    r.raise_for_status()
                    body = r.json()
                    out["prefix_found"] += sum(e["name"].startswith("f000012") for e in body["items"])
                    out["prefix_pages"] += 1
                    cursor = body["next_cursor"]
                    if cursor is None:
                        break
    finally:
        control.stop(60)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--pages", type=int, default=200, help="pages followed (limit each)")
    ap.add_argument("--limit", type=int, default=500, help="entries per page (the dashboard asks 500)")
    ap.add_argument("--prefix-pages", type=int, default=200, help="pages followed for the rare prefix")
    ap.add_argument("--baseline", metavar="BIN", help="another hycache-control to measure first")
    ap.add_argument("--baseline-pages", type=int, default=3)
    args = ap.parse_args()

    from hycache_dht.redis_store import RedisClusterStore
    tmp = Path(tempfile.mkdtemp(prefix="hc-files-bench-"))
    cluster = start_redis_cluster(tmp / "redis")
    rows = []
    try:
        seeds = redis_seeds(cluster.nodes)
        store = RedisClusterStore(cluster.nodes[:3], namespace="bench", op_timeout=30.0)
        fill_s = fill(store, args.entries)
        store.close()
        print(f"filled /big with {args.entries:,} entries in {fill_s:.0f} s", file=sys.stderr, flush=True)
        runs = ([("before", Path(args.baseline))] if args.baseline else []) + [("after" if args.baseline else "this", BIN)]
        for label, binary in runs:
            rows.append(measure(label, binary, seeds, "bench", args, tmp))
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"GET /api/v1/files?path=/big&limit={args.limit}, a directory of {args.entries:,} entries in a local "
          f"Redis Cluster (3+3), {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| build | pages followed | entries returned | page p50 | page p99 | page max "
          "| prefix pages (to the end) | prefix page p50 / p99 | prefix names found |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pr = (f"{pct(r['prefix'], 0.50) * 1000:.1f} / {pct(r['prefix'], 0.99) * 1000:.1f} ms" if r["prefix"] else "-")
        print(f"| {r['label']} | {len(r['pages'])} | {r['entries']:,} | {pct(r['pages'], 0.50) * 1000:.1f} ms "
              f"| {pct(r['pages'], 0.99) * 1000:.1f} ms | {max(r['pages']) * 1000:.0f} ms | {r['prefix_pages']} "
              f"| {pr} | {r['prefix_found']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

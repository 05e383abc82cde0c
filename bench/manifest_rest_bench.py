"""How long the control plane takes to answer ``POST /api/v1/manifests`` for a real
instance (a script, not a test): a real ``hycache-control serve`` on SQLite on loopback
(no Redis: no DHT locations), ``--nodes`` nodes that have sent one heartbeat, then the
instance posted plain and gzipped, with and without layer-2 plans, ``--repeat`` times
each.  Prints the body sizes and the wall-clock seconds of each request.

    .venv/bin/python bench/manifest_rest_bench.py INSTANCE.json [--nodes 5] [--repeat 2]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from hycache_control.db import Database
from hycache_control.services.tokens import TokenService
from hycache_harness import ControlPlane, HarnessError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("instance", type=Path)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    raw = args.instance.read_bytes()
    packed = gzip.compress(raw)
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{tmp}/control.db"
        db = Database(db_url)
        db.upgrade()
        tokens = TokenService(db)
        admin = tokens.create("bench-admin", "admin")[1]
        nodes = [f"n{i}" for i in range(args.nodes)]
        node_tokens = {n: tokens.create(f"node-{n}", "node", n)[1] for n in nodes}
        db.close()
        control = ControlPlane("--ui-dir", f"{tmp}/no-ui", db=db_url, state_dir=tmp, log=Path(tmp) / "control.log",
                               env={**os.environ, "HYCACHE_CONTROL_HEARTBEAT_INTERVAL": "60"}, ready_path="/healthz")
        url = control.url
        try:
            try:
                control.start(90)
            except HarnessError as e:
                print(f"the control plane did not start: {e}", file=sys.stderr)
                return 1
            status = {"tiers": {"fast": {"capacity": 1 << 40, "used": 0}, "slow": {"capacity": 1 << 42, "used": 0}}}
            for n in nodes:
                body = {"node_id": n, "version": "0.1.0", "boot_id": "b", "seq": 1, "sent_at": time.time(),
                        "address": None, "status": status, "counters": {}, "policy_version": 0, "action_results": []}
                httpx.post(f"{url}/api/v1/nodes/{n}/heartbeats", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {node_tokens[n]}"}).raise_for_status()
            print(f"{args.instance.name}: {len(raw):,} bytes, {len(packed):,} gzipped; {args.nodes} nodes")
            print(f"{'body':<8}{'plans':<7}{'status':>7}{'seconds (each run)':>28}")
            for enc in ("plain", "gzip"):
                for plans in ("false", "true"):
                    secs, code = [], None
                    for _ in range(args.repeat):
                        headers = {"Authorization": f"Bearer {admin}", "content-type": "application/json"}
                        if enc == "gzip":
                            headers["content-encoding"] = "gzip"
                        t = time.perf_counter()
                        r = httpx.post(f"{url}/api/v1/manifests?plans={plans}&nodes={','.join(nodes)}",
                                       content=packed if enc == "gzip" else raw, headers=headers, timeout=600)
                        secs.append(time.perf_counter() - t)
                        code = r.status_code
                    shown = " ".join(f"{s:.2f}" for s in secs)
                    print(f"{enc:<8}{plans:<7}{code:>7}{shown:>22}  (median {statistics.median(secs):.2f})")
        finally:
            control.stop(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

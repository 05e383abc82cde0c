"""``hycache-control``: serve the API, upgrade the database, manage tokens, print OpenAPI."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .settings import Settings, load_settings


def _common(p: argparse.ArgumentParser, *, db_required: bool = False) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML settings file (keys as the long flags, with _)")
    p.add_argument("--db", metavar="URL", required=db_required,
                   help="database URL: sqlite:///FILE or postgresql+psycopg://USER:PASS@HOST:PORT/DB "
                        "(default: SQLite under --state-dir)")
    p.add_argument("--state-dir", metavar="DIR", help="where the default SQLite database lives")
    p.add_argument("--dev", action="store_true", default=None,
                   help="development mode: accept default or short secrets")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hycache-control", description="HyCache control plane (docs/control-plane.md)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _serve_parser(sub)
    _admin_parsers(sub)
    _run_parser(sub)
    _client_parsers(sub)
    from .slurm_workflow import add_parser as _slurm_parser
    _slurm_parser(sub)
    o = sub.add_parser("openapi", help="print the OpenAPI document (JSON)")
    o.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    return ap


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="run the API server (uvicorn)")
    _common(s)
    s.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)")
    s.add_argument("--redis", metavar="SEED,...", help="Redis Cluster seeds HOST:PORT,... (the agents' DHT)")
    s.add_argument("--dht-namespace", metavar="NAME", help="the agents' dht_namespace (default hc)")
    s.add_argument("--redis-user", metavar="NAME", help="Redis ACL user of the control plane")
    s.add_argument("--redis-password-file", metavar="FILE",
                   help="file holding the Redis user's password (mode 0600; a wrong one fails the start)")
    s.add_argument("--ui-dir", metavar="DIR", help="built dashboard to serve at / (default frontend/dist)")
    s.add_argument("--admin-token-file", metavar="FILE", help="install this admin token at start (mode 0600)")
    s.add_argument("--heartbeat-interval", type=float, metavar="S",
                   help="shortest interval told to the agents (default 1)")
    s.add_argument("--max-heartbeats-per-second", type=float, metavar="N",
                   help="cap of the cluster's heartbeat rate: the interval grows to nodes / N (default 1000)")
    s.add_argument("--metrics-require-token", action="store_true", default=None,
                   help="GET /metrics needs a read token")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.add_argument("--workers", type=int, metavar="N",
                   help="server processes sharing the port (default 1; more need PostgreSQL)")


def _admin_parsers(sub) -> None:
    d = sub.add_parser("db", help="database maintenance")
    dsub = d.add_subparsers(dest="db_cmd", required=True)
    u = dsub.add_parser("upgrade", help="apply every Alembic migration")
    _common(u)

    t = sub.add_parser("token", help="API tokens")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create", help="create a token; prints the secret alone on stdout, once")
    _common(tc)
    tc.add_argument("--scope", required=True, choices=["admin", "read", "node"])
    tc.add_argument("--node-id", help="the node a node token speaks for")
    tc.add_argument("--name", help="a name for the audit log (default: SCOPE or node-ID)")
    tl = tsub.add_parser("list", help="list tokens (JSON lines)")
    _common(tl)
    tr = tsub.add_parser("revoke", help="revoke a token by id")
    _common(tr)
    tr.add_argument("id", type=int)
    dm = sub.add_parser("demo", help="the whole product on this machine: Redis Cluster, control plane, agents, "
                                     "a light workload; runs until Ctrl-C")
    dm.add_argument("--agents", type=int, default=2, help="number of agents (default 2)")
    dm.add_argument("--fast-capacity", default="16M", help="each agent's fast tier (default 16M)")
    dm.add_argument("--file-size", default="1M", help="largest workload file (default 1M)")
    dm.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: at Ctrl-C)")
    dm.add_argument("--dir", help="working directory (default: a new temporary directory)")


def _run_parser(sub) -> None:
    r = sub.add_parser("run", help="run a workflow manifest on the cluster through the nodes' mounts",
                       description="Submit MANIFEST, then run each job on its placed node as real reads and "
                                   "writes (sizes × --scale) through that node's mount, reporting start/finish.")
    r.add_argument("manifest", metavar="MANIFEST", help="a HyCache manifest or WfFormat 1.4/1.5 instance (JSON)")
    r.add_argument("--api", required=True, metavar="URL", help="the control plane, e.g. http://127.0.0.1:8080")
    r.add_argument("--token-file", required=True, metavar="FILE", help="an admin token")
    r.add_argument("--mount", action="append", required=True, metavar="NODE=MOUNTPOINT",
                   help="a node and its mount on this machine (repeat for every node to use)")
    r.add_argument("--scale", type=float, default=1.0, help="multiply every file size by this (default 1)")
    r.add_argument("--solver", default="local", choices=["greedy", "local", "hypergraph", "exact", "round-robin"])
    r.add_argument("--slack", type=float, default=0.1, help="load bound slack (default 0.1)")
    r.add_argument("--plan-wait", type=float, default=60.0, metavar="S",
                   help="wait at most S seconds for the prefetch under way of an input before reading it")
    r.add_argument("--compute-scale", type=float, default=0.0, metavar="X",
                   help="each job also computes (sleeps) X times its runtime from the manifest (default 0)")
    r.add_argument("--no-plans", action="store_true", help="placement only: no layer-2 plans are made or carried out")
    r.add_argument("--release", choices=["reads", "start"], default="reads",
                   help="release a job's prefetches when the job before it on the node has read its inputs "
                        "(default: the runner reports each job's reads done) or when it starts")
    r.add_argument("--json", action="store_true", help="print the result as JSON")


def _client_parsers(sub) -> None:
    pj = sub.add_parser("place", help="ask the control plane where a job that reads PATH... should run now",
                        description="POST /api/v1/placements: prints the chosen node (and, with --mount, its "
                                    "mount point on this machine); PATHs are namespace paths, or paths under a --mount.")
    pj.add_argument("paths", nargs="*", metavar="PATH", help="the files the job reads")
    pj.add_argument("--api", required=True, metavar="URL", help="the control plane, e.g. http://127.0.0.1:8080")
    pj.add_argument("--token-file", required=True, metavar="FILE", help="a read or admin token")
    pj.add_argument("--mount", action="append", default=[], metavar="NODE=MOUNTPOINT",
                    help="a node and its mount on this machine: restricts the candidates to these nodes")
    pj.add_argument("--footprint", type=int, metavar="BYTES", help="fast-tier bytes the job needs (default: its inputs)")
    pj.add_argument("--json", action="store_true", help="print the whole answer as JSON")

    sb = sub.add_parser("submit", help="run a workflow engine's job script on the node where its inputs are",
                        description="A submit command for Snakemake's generic cluster executor: reads the job "
                                    "script's properties (its inputs, relative to its working directory under one "
                                    "of the --mount points), asks POST /api/v1/placements where it should run, "
                                    "rewrites the script's paths onto that node's mount, starts it in the "
                                    "background and prints a job id (NODE-PID).")
    sb.add_argument("jobscript", metavar="JOBSCRIPT")
    sb.add_argument("--api", required=True, metavar="URL", help="the control plane, e.g. http://127.0.0.1:8080")
    sb.add_argument("--token-file", required=True, metavar="FILE", help="a read or admin token")
    sb.add_argument("--mount", action="append", required=True, metavar="NODE=MOUNTPOINT",
                    help="a node and its mount on this machine (repeat for every node to use)")
    sb.add_argument("--log-dir", metavar="DIR", help="where each job's output goes (default: the system's temp dir)")


def _place(args: argparse.Namespace) -> int:
    import httpx

    mounts: dict[str, Path] = {}
    for m in args.mount:
        node, sep, mp = m.partition("=")
        if not sep or not node or not mp:
            return _die(f"--mount {m!r}: expected NODE=MOUNTPOINT")
        mounts[node] = Path(mp).resolve()
    paths = []
    for p in args.paths:
        ns = p
        for mp in mounts.values():
            try:
                ns = "/" + str(Path(p).resolve().relative_to(mp))
                break
            except ValueError:
                continue
        paths.append(ns if ns.startswith("/") else "/" + ns)
    token = Path(args.token_file).read_text().strip()
    body = {"inputs": paths, "footprint": args.footprint, "nodes": list(mounts) or None}
    try:
        r = httpx.post(args.api.rstrip("/") + "/api/v1/placements", json=body, timeout=30.0,
                       headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as e:
        return _die(f"{args.api}: {e}")
    if r.status_code != 200:
        return _die(f"{r.status_code}: {r.text[:500]}")
    out = r.json()
    if args.json:
        print(json.dumps(out, indent=2))
    elif out["node"] in mounts:
        print(f"{out['node']} {mounts[out['node']]}")
    else:
        print(out["node"])
    return 0


def _settings(args: argparse.Namespace, *names: str) -> Settings:
    flags = {n: getattr(args, n, None) for n in ("db", "state_dir", "dev", *names)}
    return load_settings(getattr(args, "config", None), **flags)


def _die(msg: str) -> int:
    print(f"hycache-control: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except ValidationError as e:
        return _die("; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors()))
    except ValueError as e:
        return _die(str(e))


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "openapi":
        return _openapi(args)
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "demo":
        if not 1 <= args.agents <= 26:
            return _die("--agents: must be between 1 and 26")
        from .demo import run_demo
        return run_demo(agents=args.agents, fast_capacity=args.fast_capacity, file_size=args.file_size,
                        duration=args.duration, workdir=args.dir)
    if args.cmd == "run":
        from .runner import main as run_main
        return run_main(args)
    if args.cmd == "place":
        return _place(args)
    if args.cmd == "submit":
        from .submit import submit
        return submit(args)
    if args.cmd == "slurm":
        from .slurm_workflow import main as slurm_main
        return slurm_main(args)
    if args.cmd == "db":
        from .db import Database
        s = _settings(args)
        db = Database(s.db_url)
        db.upgrade()
        print(f"database {db.engine.url.render_as_string(hide_password=True)} is at the latest revision", file=sys.stderr)
        return 0
    if args.cmd == "token":
        return _token(args)
    return 2


def _openapi(args: argparse.Namespace) -> int:
    from .app import create_app
    doc = json.dumps(create_app(Settings.model_construct(**Settings.model_construct().model_dump())).openapi(),
                     indent=2, sort_keys=False)
    if args.output:
        with open(args.output, "w") as f:
            f.write(doc + "\n")
    else:
        print(doc)
    return 0


def _token(args: argparse.Namespace) -> int:
    from .db import Database
    from .services.tokens import TokenService
    s = _settings(args)
    db = Database(s.db_url)
    db.upgrade()
    tokens = TokenService(db)
    if args.token_cmd == "create":
        if args.scope == "node" and not args.node_id:
            return _die("--node-id is required for --scope node")
        if args.scope != "node" and args.node_id:
            return _die("--node-id is only for --scope node")
        name = args.name or (f"node-{args.node_id}" if args.scope == "node" else args.scope)
        row, secret = tokens.create(name, args.scope, args.node_id)
        print(f"created token {row.id} ({row.scope}{', node ' + row.node_id if row.node_id else ''}, "
              f"name {row.name!r}); it is shown once:", file=sys.stderr)
        print(secret)
        return 0
    if args.token_cmd == "list":
        rows, _ = tokens.list(limit=10**9)
        for r in rows:
            print(json.dumps({"id": r.id, "name": r.name, "scope": r.scope, "node_id": r.node_id,
                              "created_at": r.created_at, "last_used_at": r.last_used_at,
                              "revoked_at": r.revoked_at}))
        return 0
    if args.token_cmd == "revoke":
        from .services.errors import Conflict, NotFound
        try:
            r = tokens.revoke(args.id)
        except NotFound:
            return _die(f"id: no token {args.id}")
        except Conflict as e:
            return _die(e.msg)
        print(f"revoked token {r.id} ({r.name}) at {time.ctime(r.revoked_at)}", file=sys.stderr)
        return 0
    return 2


#: how long serve keeps an idle keep-alive connection (uvicorn's default is 5 s)
KEEP_ALIVE_SECONDS = 75
#: how long a stopping server process waits for the requests in flight: the agents' plan
#: long-polls (up to 60 s) are then cut and asked again elsewhere, so a stop (a restart,
#: the workers left behind by a killed parent) is not held up by them
STOP_GRACE_SECONDS = 5


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    s = _settings(args, "listen", "redis", "dht_namespace", "redis_user", "redis_password_file", "ui_dir",
                  "admin_token_file", "heartbeat_interval", "max_heartbeats_per_second", "metrics_require_token",
                  "log_level", "workers")
    if s.redis_seeds:
        from hycache_dht.cluster_client import check_credentials
        from hycache_dht.meta import DHTAuthError
        try:
            check_credentials(s.redis_seeds, s.redis_user, s.redis_password)
        except (DHTAuthError, ValueError, OSError) as e:
            return _die(str(e))
    logging.basicConfig(level=s.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = s.listen.rpartition(":")
    log = logging.getLogger("hycache_control")
    log.info("control plane on http://%s:%s (database %s, redis %s, dht_namespace %s)", host, port,
             s.db_url.split("@")[-1], s.redis or "none", s.dht_namespace)
    # uvloop and httptools: the event loop and HTTP parser in C (h11 and the pure-Python
    # loop cost more CPU per heartbeat, docs/scaling.md)
    # keep-alive: an idle connection is kept longer than the agents' heartbeat interval and
    # than a load balancer's idle pool, so the client side closes it first (docs/scaling.md)
    common: dict[str, Any] = dict(host=host.strip("[]"), port=int(port), log_level=s.log_level,
                                  access_log=s.log_level == "debug", loop="uvloop", http="httptools",
                                  timeout_keep_alive=KEEP_ALIVE_SECONDS, timeout_graceful_shutdown=STOP_GRACE_SECONDS)
    if s.workers == 1:
        # a start-up failure (the app's lifespan, the bind) ends uvicorn.run with SystemExit(3)
        uvicorn.run(create_app(s, tune_gc=True), **common)
        return 0
    return _serve_workers(s, common)


def _serve_workers(s: Settings, common: dict) -> int:
    """``serve --workers N``: N processes on one socket under uvicorn's supervisor.  A
    worker that fails at start-up stops them all, and the parent exits non-zero (uvicorn's
    own run() returns normally then, and systemd's Restart=on-failure would not restart it)."""
    import os

    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from .app import SETTINGS_ENV
    from .db import Database
    db = Database(s.db_url)
    try:
        if db.dialect != "postgresql":
            return _die("--workers above 1 needs PostgreSQL (--db postgresql+psycopg://...): the processes share "
                        "pending actions, liveness and events through it")
        db.upgrade()  # once, before the workers start
    except SQLAlchemyError as e:
        return _die(f"database {s.db_url.split('@')[-1]}: {e}")
    finally:
        db.close()
    os.environ[SETTINGS_ENV] = s.model_dump_json()
    config = uvicorn.Config("hycache_control.app:app_from_env", factory=True, workers=s.workers, **common)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
    if failed:
        return _die(f"worker process {', '.join(map(str, failed))} failed to start (its log above says why)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

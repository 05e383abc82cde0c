"""``hycache-agent``: mount the tiering file system and inspect or steer a running agent."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import time
from pathlib import Path

from hycache_core.sizes import format_size

SUBCOMMANDS = ("mount", "status", "where", "pin", "unpin", "promote", "demote", "demo")


def _setup_logging(level: str) -> None:
    """``level`` for every logger; the loggers named in $HYCACHE_DEBUG_LOGGERS (comma-separated,
    e.g. ``hycache_agent.transport.server``) at DEBUG whatever it is: one module's step timings
    without every module's DEBUG lines (bench/remote_probe.py --steps)."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for name in filter(None, os.environ.get("HYCACHE_DEBUG_LOGGERS", "").split(",")):
        logging.getLogger(name.strip()).setLevel(logging.DEBUG)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hycache-agent",
        description="HyCache node agent: one POSIX directory over a fast and a slow tier.",
        epilog="`hycache-agent ROOT MOUNTPOINT` is short for `hycache-agent mount ROOT MOUNTPOINT`.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = _mount_parser(sub)
    _cluster_options(m.add_argument_group("global namespace (several nodes)"))
    _control_options(m.add_argument_group("control plane and monitoring"))
    _hccache_options(m.add_argument_group("HCCache: memory cache of remote reads (paper 002)"))
    _kernel_options(m)
    _file_commands(sub)
    d = sub.add_parser("demo", help="mount a demo over a temporary root and show files moving between tiers")
    d.add_argument("--keep", action="store_true", help="leave the mount up until Ctrl-C")
    d.add_argument("--root", type=Path, help="demo root (default: a new temporary directory)")
    d.add_argument("--no-cluster", dest="cluster", action="store_false",
                   help="only the single-node part (no local Redis Cluster, no second agent)")
    return p


def _mount_parser(sub) -> argparse.ArgumentParser:
    m = sub.add_parser("mount", help="mount ROOT/fast + ROOT/slow at MOUNTPOINT (foreground)",
                       description="Mount the tiering file system and serve it until SIGTERM/SIGINT or "
                                   "`fusermount3 -u MOUNTPOINT`; exits 0 after a clean unmount.")
    m.add_argument("root", type=Path, help="agent root: holds fast/, slow/ and state/")
    m.add_argument("mountpoint", type=Path)
    m.add_argument("--config", type=Path, help="TOML file with the same keys (section [agent] or top level)")
    m.add_argument("--fast", type=Path, help="fast tier directory (default ROOT/fast)")
    m.add_argument("--slow", type=Path, help="slow tier directory (default ROOT/slow)")
    m.add_argument("--fast-capacity", help="bytes of the fast tier to use, K/M/G suffixes (default: its file system's size)")
    m.add_argument("--high-watermark", type=float, help="start evicting above this fraction of capacity (default 0.9)")
    m.add_argument("--low-watermark", type=float, help="evict down to this fraction (default 0.7)")
    m.add_argument("--write-slack", type=float,
                   help="fraction of the capacity writes may go above it while the evictor catches up, "
                        "bounded by the fast file system's free space (default 1; 0: a hard capacity)")
    m.add_argument("--policy", help="eviction policy: lru, lfu or an installed plug-in (default lru)")
    m.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    m.add_argument("--allow-other", dest="allow_other", action="store_true", default=None,
                   help="let other users use the mount (default when run as root)")
    m.add_argument("--no-allow-other", dest="allow_other", action="store_false")
    m.add_argument("--no-promote-on-open", dest="promote_on_open", action="store_false", default=None,
                   help="read evicted files from the slow tier without promoting them")
    m.add_argument("--promote-mode", choices=("background", "before-open"),
                   help="promote an evicted file while reads go to the slow tier (background, default) "
                        "or finish the copy before open() returns (before-open, the papers' Algorithm 1)")
    m.add_argument("--promote-before-write-mb", type=int,
                   help="with passthrough, an open for writing of an evicted file of up to this many MiB "
                        "that no handle holds, O_SYNC/O_DSYNC or of a file fsync'ed before, waits for its "
                        "promotion (a held file cannot move: its writes and fsyncs would go to the slow "
                        "tier until the last close) (default 64; 0: off)")
    m.add_argument("--no-kernel-cache", dest="kernel_cache", action="store_false", default=None,
                   help="do not keep the kernel page cache across opens")
    m.add_argument("--read-ahead-kb", type=int,
                   help="the mount's read-ahead window in KiB: the largest read the kernel asks the agent for "
                        "(e.g. 1024; default 0: the kernel's, 128)")
    return m


def _cluster_options(g) -> None:
    g.add_argument("--redis", help="Redis Cluster nodes HOST:PORT[,HOST:PORT...] holding the global namespace")
    g.add_argument("--meta-store", type=Path, help="a SQLite metadata store shared by agents on one host (instead of Redis)")
    g.add_argument("--dht-namespace", help="key prefix in Redis Cluster (default hc)")
    g.add_argument("--node-id", help="this node's name in the cluster (default: host name)")
    g.add_argument("--listen", help="HOST:PORT of the agent-to-agent data service (default 0.0.0.0:7070)")
    g.add_argument("--advertise", help="HOST:PORT other nodes use to reach this one (default: --listen)")
    g.add_argument("--cluster-secret-file", type=Path, help="shared secret authenticating agents (mode 0600)")
    g.add_argument("--redis-user", help="Redis ACL user of the agents (default: Redis's default user)")
    g.add_argument("--redis-password-file", type=Path,
                   help="file holding the Redis user's password (mode 0600; a wrong one fails the start)")
    g.add_argument("--write-lease-seconds", type=float,
                   help="lease of a file's write flag, renewed while it is open for writing (default 10)")
    g.add_argument("--write-lease-wait", type=float,
                   help="seconds an open for writing waits for another node's lease before EBUSY (default 30)")
    g.add_argument("--publish-storm-rate", type=float,
                   help="requests/s the node serves from which publication to the DHT waits (default 4000)")
    g.add_argument("--publish-yield-seconds", type=float,
                   help="how long publication may wait for a storm of requests to pass; 0: never (default 1)")
    g.add_argument("--replicas", type=int, help="push each written file to N other nodes (default 0)")
    g.add_argument("--replica-mode", choices=("async", "sync"),
                   help="sync: close(2) returns once the replicas are durable; async (default): pushed just after")
    g.add_argument("--push-streams", type=int,
                   help="a sync replica of 16 MiB or more is pushed in N byte ranges at once (default 2; 1: one stream)")
    g.add_argument("--rebalance-interval", type=float,
                   help="seconds between checks for a hot fast tier to hand files to cold nodes (default 30; 0: off)")
    g.add_argument("--rebalance-rounds", type=int,
                   help="consecutive hot checks before files are handed over (default 3)")


def _control_options(c) -> None:
    c.add_argument("--control-plane", metavar="URL",
                   help="send heartbeats to this control plane and apply its actions and policies")
    c.add_argument("--control-token-file", type=Path, metavar="FILE",
                   help="this node's control-plane token (mode 0600, owned by the agent's user)")
    c.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus GET /metrics here (a cluster agent also serves it on --listen)")


def _hccache_options(h) -> None:
    h.add_argument("--hccache-size", help="memory for the cache, K/M/G suffixes; 0 turns it off (default 256M)")
    h.add_argument("--hccache-mode", choices=("hybrid", "block"),
                   help="hybrid: small files are one entry (default); block: everything by blocks (baseline)")
    h.add_argument("--hccache-small-file", help="files below this size are cached whole (default 256K)")
    h.add_argument("--hccache-block-size", help="block size of larger files and of range requests (default 128K)")
    h.add_argument("--no-hccache-second-level", dest="hccache_second_level", action="store_false", default=None,
                   help="do not keep fast-tier copies of small remote files behind the memory cache")


def _kernel_options(m) -> None:
    m.add_argument("--no-writeback-cache", dest="writeback_cache", action="store_false", default=None,
                   help="send every write(2) to the agent instead of letting the kernel batch them")
    m.add_argument("--passthrough", choices=("auto", "on", "off"),
                   help="kernel FUSE passthrough for files on the local tiers: reads, writes and mmap "
                        "skip the agent (auto, default: when the kernel, the pyfuse3 build and root "
                        "privileges allow; on: fail to start otherwise; off: never)")
    m.add_argument("--open-prefetch-mb", type=int,
                   help="when a file on the fast tier is opened for reading through passthrough, read "
                        "this many MiB of it ahead in parallel (default 0: only the kernel's read-ahead)")
    m.add_argument("--follow-prefetch-mb", type=int,
                   help="keep this many MiB asked for just ahead of each process that reads a file on the "
                        "fast tier in order through passthrough, from the kernel read trace (default 32; 0: off)")
    m.add_argument("--follow-first-mb", type=int,
                   help="when a process is first seen reading such a file in order, ask for this many "
                        "MiB past it at once (default 256; at least --follow-prefetch-mb)")
    m.add_argument("--no-kernel-read-counts", dest="kernel_read_counts", action="store_false", default=None,
                   help="do not trace the kernel's reads of the tiers' files (the per-tier read bytes "
                        "then leave out what passthrough opens read)")
    m.add_argument("--no-answer-table", dest="answer_table", action="store_false", default=None,
                   help="answer every request in Python: no GETATTR, LOOKUP or GETXATTR security.capability "
                        "of files that are not open answered from the request reader's table")
    m.add_argument("--no-answer-opens", dest="answer_opens", action="store_false", default=None,
                   help="answer every OPEN and RELEASE in Python: no read-only open of a closed local "
                        "file answered by the request reader with its parked passthrough registration")
    m.add_argument("--blob-pool-reserve", type=int, metavar="N",
                   help="empty fast-tier files kept made ahead between bursts of creates, at least (also as "
                        "many as the largest burst of the last 10 minutes, within a quarter of the descriptor "
                        "limit; default 1024; 0: only the refill's 2 x its low watermark)")
    m.add_argument("--reader-thread", dest="reader_thread", action=argparse.BooleanOptionalAction, default=None,
                   help="read requests in a native thread that answers from the table without the GIL and "
                        "queues the rest for the event loop (default: on; --no-reader-thread: the event loop "
                        "reads them and the table answers there, between the Python requests and the agent's "
                        "own work)")
    m.add_argument("--fuse-uring", choices=("auto", "on", "off"),
                   help="take requests from FUSE's io_uring rings (one per CPU) instead of reading "
                        "/dev/fuse, with the reader thread (auto, default: when the kernel has it, Linux 6.14 "
                        "and later; fuse's enable_uring module parameter is turned on as root; on: fail to "
                        "start otherwise; off: never)")
    m.add_argument("--gil-switch-us", type=float, metavar="US",
                   help="how long a Python thread of the agent may hold the GIL while another waits for "
                        "it (default 250; CPython's own is 5000); the event loop lets go of it at every system call "
                        "and waited that long for it behind the publisher's or the journal's thread")
    m.add_argument("--gc-interval", type=float, metavar="S",
                   help="seconds between the garbage collector's young collections, run by the event loop "
                        "(default 0.2; 0: CPython's automatic collector, on whichever thread allocates)")
    m.add_argument("--gc-full-interval", type=float, metavar="S",
                   help="seconds between the event loop's full collections (default 60)")
    m.add_argument("--reader-nice", type=int, metavar="N",
                   help="nice value of the native reader thread, -20..19 (default -19: a request it "
                        "answers wakes the caller, and a woken caller or the agent's background work "
                        "no longer takes the core it needs for the next one; needs CAP_SYS_NICE, "
                        "else it stays at the process's)")
    m.add_argument("--loop-spin-us", type=float,
                   help="after answering a request and finding the queue empty, poll for the next one "
                        "this many microseconds before sleeping (default 50; 0: sleep at once). A caller "
                        "waiting for each answer in turn then does not pay the wake-up of a sleeping "
                        "thread, tens of microseconds on a VM whose idle vCPUs halt")


def _file_commands(sub) -> None:
    """status, where and the per-file controls of a running agent."""
    s = sub.add_parser("status", help="tiers, usage, file counts, policy, migrations of a running agent")
    s.add_argument("root", type=Path, help="the agent's ROOT (or its mount point)")
    s.add_argument("--json", action="store_true")

    w = sub.add_parser("where", help="which tier holds PATH (first word: fast or slow)")
    w.add_argument("path", type=Path)
    w.add_argument("--json", action="store_true")

    for name, text in (("pin", "never evict these files"), ("unpin", "let the policy evict these files again")):
        c = sub.add_parser(name, help=text)
        c.add_argument("paths", type=Path, nargs="+")
    for name, tier in (("promote", "fast"), ("demote", "slow")):
        c = sub.add_parser(name, help=f"move files to the {tier} tier now")
        c.add_argument("paths", type=Path, nargs="+")
        c.add_argument("--no-wait", action="store_true", help="start the migration and return")
        c.add_argument("--timeout", type=float, default=3600.0)


# ---------------------------------------------------------------- per-file controls
class NotServed(Exception):
    pass


def _info(path: Path) -> dict:
    try:
        raw = os.getxattr(path, "user.hycache.info")
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise NotServed(f"no HyCache agent serves {path}") from None
        # ECONNABORTED: the request was in flight when the kernel ended the connection (an
        # agent with io_uring rings: they are released after its process exited)
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise NotServed(f"the HyCache mount holding {path} is not connected: its agent has stopped") from None
        raise
    return json.loads(raw)


def _where(path: Path, as_json: bool) -> int:
    info = _info(path)
    if as_json:
        print(json.dumps({"path": str(path), **info}))
        return 0
    tier = info["tier"] or info["type"]
    extra = [format_size(info["size"])]
    if info.get("pinned"):
        extra.append("pinned")
    if "migration" in info:
        m = info["migration"]
        extra.append(f"migrating to {m['to']} {100 * m['copied'] / max(1, m['total']):.0f}%")
    print(f"{tier} {path} ({', '.join(extra)})")
    return 0


def _set_pin(paths: list[Path], pinned: bool) -> int:
    for path in paths:
        _info(path)
        os.setxattr(path, "user.hycache.pinned", b"1" if pinned else b"0")
        print(f"{'pinned' if pinned else 'unpinned'} {path}")
    return 0


def _move(paths: list[Path], tier: str, wait: bool, timeout: float) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    status = 0
    for path in paths:
        info = _info(path)
        if info["type"] != "file":
            print(f"hycache-agent: {path}: only regular files live on a tier", file=sys.stderr)
            status = 1
            continue
        if info["tier"] == tier:
            print(f"{tier} {path} (already there)")
            continue
        os.setxattr(path, "user.hycache.tier", tier.encode())
        if not wait:
            print(f"started moving {path} to {tier}")
            continue
        deadline = time.monotonic() + timeout
        with Progress(TextColumn(f"{path.name} → {tier}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("copy", total=max(1, info["size"]))
            while time.monotonic() < deadline:
                info = _info(path)
                if info["tier"] == tier:
                    break
                if "migration" not in info:
                    time.sleep(0.05)
                    info = _info(path)
                    if info["tier"] != tier and "migration" not in info and info.get("move_wanted") != tier:
                        break  # neither moving nor waiting to: the agent refused or gave up
                else:
                    bar.update(task, completed=info["migration"]["copied"], total=max(1, info["migration"]["total"]))
                time.sleep(0.05)
        if info["tier"] == tier:
            print(f"{tier} {path}")
        else:
            print(f"hycache-agent: {path} stayed on {info['tier']} (no room on the {tier} tier, "
                  "or the file changed during the copy)", file=sys.stderr)
            status = 1
    return status


# ---------------------------------------------------------------- status
def _state_dir_for(path: Path) -> Path:
    path = path.resolve()
    if (path / "state").is_dir():
        return path / "state"
    try:  # a path inside a mount: the file system names its agent's root
        info = json.loads(os.getxattr(path, "user.hycache.info"))
        return Path(info["agent_root"]) / "state"
    except OSError:
        pass
    raise NotServed(f"{path} is not a HyCache agent root (no state/ directory)")


def _status(root: Path, as_json: bool) -> int:
    from hycache_agent.control import local as control
    state = _state_dir_for(root)
    try:
        st = control.request(state, {"op": "status"})
    except ConnectionError as exc:
        raise NotServed(str(exc)) from None
    if as_json:
        print(json.dumps(st, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"HyCache agent {st['pid']} — {st['mountpoint']} (policy {st['policy']})")
    for col in ("tier", "path", "capacity", "used", "use%", "files", "device size", "device free"):
        t.add_column(col, justify="right" if col not in ("tier", "path") else "left")
    for name, tier in st["tiers"].items():
        cap = tier["capacity"]
        t.add_row(name, tier["path"], format_size(cap), format_size(tier["used"]),
                  f"{100 * tier['used'] / cap:.1f}%" if cap else "-", str(tier["files"]),
                  format_size(tier["device_capacity"]), format_size(tier["device_free"]))
    console.print(t)
    fast = st["tiers"]["fast"]
    if fast.get("write_ceiling", 0) > fast["capacity"]:
        over = max(0, fast["used"] - fast["capacity"])
        console.print(f"write slack: writes may fill the fast tier up to {format_size(fast['write_ceiling'])} "
                      f"while evictions catch up ({format_size(over)} above the capacity now)")
    mig = st["migrations"]
    console.print(f"watermarks high {st['watermarks']['high']:.2f} / low {st['watermarks']['low']:.2f}; "
                  f"migrations done {mig['migrations_done']} (evictions {mig['evictions']}, promotions "
                  f"{mig['promotions']}, {mig.get('promotions_declined', 0)} declined, {mig.get('promotions_for_write', 0)} for writers "
                  f"({mig.get('promotions_past_ceiling', 0)} past the ceiling), spills {mig['spills']}), abandoned {mig['migrations_abandoned']}, "
                  f"failed {mig['migrations_failed']}; promoted {format_size(mig['bytes_promoted'])}, "
                  f"demoted {format_size(mig['bytes_demoted'])}")
    for m in mig["active"]:
        console.print(f"  migrating inode {m['ino']} {m['from']}→{m['to']} ({m['reason']}): "
                      f"{format_size(m['copied'])} / {format_size(m['total'])}")
    cl = st.get("cluster")
    if cl:
        colour = "green" if cl["state"] == "ok" else "red"
        console.print(f"cluster: node {cl['node_id']} ({cl['advertise']}) [{colour}]{cl['state']}[/], "
                      f"backlog {cl['backlog']}, published {cl['published_ops']}, conflicts {cl['conflicts']}, "
                      f"remote fetches {cl['remote_fetches']} ({format_size(cl['remote_bytes'])})"
                      + (f"; last error: {cl['last_error']}" if cl["state"] != "ok" and cl["last_error"] else ""))
    ctl = st.get("control")
    if ctl:
        colour = "green" if ctl["state"] == "ok" else "red"
        console.print(f"control plane {ctl['url']}: [{colour}]{ctl['state']}[/], heartbeats {ctl['heartbeats_sent']}, "
                      f"policy version {st.get('policy_version', 0)}"
                      + (f"; last error: {ctl['last_error']}" if ctl["state"] != "ok" and ctl["last_error"] else ""))
    cnt = st["counters"]
    console.print(f"reads fast {format_size(cnt['fast']['read_bytes'])} / slow {format_size(cnt['slow']['read_bytes'])}"
                  f" / remote {format_size(cnt['remote']['read_bytes'])}; writes fast "
                  f"{format_size(cnt['fast']['write_bytes'])} / slow {format_size(cnt['slow']['write_bytes'])}; "
                  f"hits {cnt['fast']['hits']}, misses {cnt['misses']}, metadata ops {cnt['metadata_ops']}")
    hc = st.get("hccache")
    if hc:
        def ratio(v):
            return "-" if v is None else f"{100 * v:.1f}%"
        console.print(f"hccache ({hc['mode']}): {format_size(hc['memory_bytes'])} / {format_size(hc['limit_bytes'])}, "
                      f"hit ratio {ratio(hc['hit_ratio'])}, byte hit ratio {ratio(hc['byte_hit_ratio'])}, "
                      f"ABD {hc['abd'] if hc['abd'] is not None else '-'}, "
                      f"dedup saved {format_size(hc['dedup_saved_bytes'])}")
    console.print(f"directories {st['directories']}, open handles {st['open_handles']}, "
                  f"metadata commits {st['metadata']['commits']}"
                  + (f", METADATA ERROR: {st['metadata']['error']}" if st["metadata"]["error"] else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "mount")  # the papers' `hycache <root> <mount>`
    args = build_parser().parse_args(argv)
    try:
        if args.command == "mount":
            from hycache_agent.config import load_config
            from hycache_agent.mount import run_mount

            overrides = {k: getattr(args, k) for k in (
                "root", "mountpoint", "fast", "slow", "fast_capacity", "high_watermark", "low_watermark", "write_slack",
                "policy", "log_level", "allow_other", "promote_on_open", "promote_mode", "promote_before_write_mb", "kernel_cache", "read_ahead_kb",
                "open_prefetch_mb", "follow_prefetch_mb", "follow_first_mb",
                "writeback_cache", "passthrough", "kernel_read_counts", "answer_table", "answer_opens", "blob_pool_reserve", "reader_thread", "fuse_uring", "reader_nice", "gil_switch_us", "gc_interval", "gc_full_interval", "loop_spin_us", "redis", "meta_store", "dht_namespace", "node_id", "listen", "advertise",
                "cluster_secret_file", "redis_user", "redis_password_file", "write_lease_seconds", "write_lease_wait", "publish_storm_rate", "publish_yield_seconds", "replicas", "replica_mode", "push_streams",
                "rebalance_interval", "rebalance_rounds", "control_plane", "control_token_file",
                "metrics_listen", "hccache_size", "hccache_mode", "hccache_small_file",
                "hccache_block_size", "hccache_second_level")}
            overrides["root"] = args.root.resolve()
            overrides["mountpoint"] = args.mountpoint.resolve()
            try:
                config = load_config(args.config, overrides)
            except (ValueError, OSError) as exc:
                print(f"hycache-agent: bad configuration: {exc}", file=sys.stderr)
                return 2
            _setup_logging(config.log_level)
            return run_mount(config)
        if args.command == "status":
            return _status(args.root, args.json)
        if args.command == "where":
            return _where(args.path, args.json)
        if args.command in ("pin", "unpin"):
            return _set_pin(args.paths, args.command == "pin")
        if args.command in ("promote", "demote"):
            return _move(args.paths, "fast" if args.command == "promote" else "slow", not args.no_wait, args.timeout)
        if args.command == "demo":
            from hycache_agent.demo import run_demo

            _setup_logging("WARNING")
            return run_demo(keep=args.keep, root=args.root, cluster=args.cluster)
    except NotServed as exc:
        print(f"hycache-agent: {exc}", file=sys.stderr)
        return 3
    except FileNotFoundError as exc:
        print(f"hycache-agent: {exc.filename}: no such file or directory", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. ENOSPC from promote (no room on the fast tier), EACCES
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"hycache-agent: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())

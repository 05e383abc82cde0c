"""Running a mount: start-up, the trio main loop, clean shutdown on signals/unmount.

The one place that builds the agent (:func:`build_agent`): the engine, the cluster link,
the control link, the vfs layer and the FUSE adapter, each given its collaborators by its
constructor; :func:`serve` runs them.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import re
import resource
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from hycache_agent.collector import Collector
from hycache_agent.config import AgentConfig
from hycache_agent.control.local import ControlServer, socket_path
from hycache_agent.fs import passthrough
from hycache_agent.fs import tiers as T
from hycache_agent.fs.counters import reader_thread_id, requests_seen
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.kreads import KernelReads
from hycache_agent.fuse.operations import HyCacheOperations, invalidate_entry
from hycache_agent.remote.backing import RemoteBackings
from hycache_agent.vfs.layer import Vfs
from hycache_agent.vfs.prefetch import Prefetcher
from hycache_agent.vfs.status import AgentStatus

if TYPE_CHECKING:  # (imported when a mount needs them: see make_cluster, control_link)
    from hycache_agent.cluster.dht_link import ClusterLink
    from hycache_agent.control.link import ControlLink

log = logging.getLogger(__name__)


def mount_options(config: AgentConfig) -> set[str]:
    options = {"fsname=hycache", "subtype=hycache", "default_permissions"}
    if config.allow_other:
        options.add("allow_other")
    return options


def set_read_ahead(mountpoint: Path, kb: int) -> None:
    """(blocking) The FUSE mount at ``mountpoint`` reads ahead ``kb`` KiB (its bdi's
    read_ahead_kb; the INIT reply cannot raise it above the kernel's 128 and sets it, so
    this runs after it).  Found in /proc/self/mountinfo, not by a stat(2) of the mount
    point (a request to this process)."""
    dev = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fs_type = fields[fields.index("-") + 1]
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            if point == str(mountpoint) and fs_type.startswith("fuse"):
                dev = fields[2]  # the last one: the mount on top
    try:
        if dev is None:
            raise OSError(f"{mountpoint} not in /proc/self/mountinfo")
        Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(f"{kb}\n")
    except OSError as exc:
        log.warning("read-ahead of %s not set to %d KiB: %s", mountpoint, kb, exc)


SHUTDOWN_GRACE = 10.0


def _task_tree(task: trio.lowlevel.Task, depth: int = 0) -> list[str]:
    lines = ["  " * depth + task.name]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            lines.extend(_task_tree(child, depth + 1))
    return lines


async def _watch_signals(nursery: trio.Nursery, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()  # (from here on a SIGTERM unmounts instead of killing the agent)
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            break
    # Requests in flight get SHUTDOWN_GRACE seconds to finish; then everything is
    # cancelled so that a stuck request can never keep the agent from exiting.
    await trio.sleep(SHUTDOWN_GRACE)
    root = trio.lowlevel.current_root_task()  # (None only outside trio.run)
    log.warning("requests still running %.0f s after the signal; cancelling them:\n%s", SHUTDOWN_GRACE,
                "\n".join(_task_tree(root) if root is not None else []))
    nursery.cancel_scope.cancel()


@dataclass
class Agent:
    """What a mount runs, as :func:`build_agent` made it."""

    config: AgentConfig
    engine: TieringEngine
    ops: HyCacheOperations
    status: AgentStatus
    collector: Collector  # the garbage collector's pace (installed by run_mount)
    cluster: ClusterLink | None = None  # when in a global namespace
    control: ControlLink | None = None  # when linked to a control plane


def build_agent(config: AgentConfig, engine: TieringEngine, token: str | None = None) -> Agent:
    """The agent over a started ``engine``: the cluster link (in a global namespace), the
    control link (``token``: this node's control-plane token), the vfs layer and the FUSE
    adapter.  Nothing runs yet (:func:`serve`)."""
    backings = passthrough.Backings(engine)
    copies = RemoteBackings(engine)  # the kernel's passthrough of whole remote copies
    cluster = None
    if config.clustered:
        cluster = make_cluster(engine, copies, on_invalidate=functools.partial(invalidate_entry, backings.lane))
    control = None
    if token is not None:
        import socket

        assert config.control_plane is not None, "a token comes with the control plane's URL"

        control = control_link(engine, cluster, config.control_plane, token,
                               node_id=config.node_id or socket.gethostname(),
                               address=cluster.advertise if cluster is not None else None)
    vfs = Vfs(engine, backings, cluster, copies)
    # the kernel takes the mount's read-ahead from the INIT reply (at most its 128 KiB): a
    # larger one is set after it
    after_init = functools.partial(set_read_ahead, config.mountpoint, config.read_ahead_kb) \
        if config.read_ahead_kb else None
    ops = HyCacheOperations(vfs, passthrough=_choose_passthrough(config, engine), after_init=after_init)
    collector = Collector(config.gc_interval, config.gc_full_interval)
    return Agent(config, engine, ops, AgentStatus(engine, cluster, control, collector), collector, cluster, control)


def make_cluster(engine: TieringEngine, copies: RemoteBackings | None = None, on_invalidate=None):
    """Join the global namespace: the metadata store, the peer client, the outbox hooks."""
    from hycache_agent.cluster.dht_link import ClusterLink
    from hycache_agent.transport.auth import load_secret
    from hycache_agent.transport.client import PeerClient
    from hycache_agent.transport.wire import parse_addr

    config = engine.config
    if config.node_id is None or config.cluster_secret_file is None:
        raise ValueError("joining a cluster needs node_id and cluster_secret_file (set by AgentConfig's checks)")
    secret = load_secret(config.cluster_secret_file)
    host, port = parse_addr(config.listen)
    advertise = config.advertise or f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    cluster = ClusterLink(engine, _store_factory(config), node_id=config.node_id, advertise=advertise,
                          peer_client=PeerClient(config.node_id, secret, push_streams=config.push_streams), secret=secret,
                          lease_seconds=config.write_lease_seconds, lease_wait=config.write_lease_wait,
                          replicas=config.replicas, replica_mode=config.replica_mode,
                          rebalance_interval=config.rebalance_interval,
                          rebalance_rounds=config.rebalance_rounds, hccache=_make_hccache(config),
                          hccache_second_level=config.hccache_second_level,
                          copies=copies, on_invalidate=on_invalidate)
    # publication yields to a storm of requests (cluster/publisher.py)
    cluster.publisher.requests = functools.partial(requests_seen, engine.io)
    cluster.publisher.storm_rate = config.publish_storm_rate
    cluster.publisher.yield_max = config.publish_yield_seconds
    cluster.attach()
    return cluster


def _store_factory(config: AgentConfig):
    """How the cluster link connects to the metadata store (Redis Cluster, or a local one)."""
    if config.redis is not None:
        from hycache_dht.redis_store import RedisClusterStore

        nodes, namespace = config.redis_nodes, config.dht_namespace
        user, password = redis_credentials(config)

        def factory():
            # a short deadline: a lookup must not hang for long when Redis is away
            return RedisClusterStore(nodes, namespace=namespace, op_timeout=5.0, username=user, password=password)
    else:
        from hycache_dht.local_store import LocalStore

        path = config.meta_store

        def factory():
            return LocalStore(path)
    return factory


def control_link(engine: TieringEngine, cluster, url: str, token: str, *, node_id: str, address: str | None):
    """The link to the control plane: heartbeats with the agent's status, plan steps'
    prefetches (of other nodes' files too, in a cluster), demotes of remote copies."""
    from hycache_agent.control.link import ControlLink

    return ControlLink(engine, url, token, node_id=node_id, address=address,
                       status=AgentStatus(engine, cluster), prefetch=Prefetcher(engine, cluster).prefetch,
                       drop_copy=cluster.drop_copy if cluster is not None else None)


def _make_hccache(config):
    if not config.hccache_size:
        return None
    from hycache_core.hccache import HCCache, sha256

    hash_fn = sha256
    if os.environ.get("HYCACHE_HCCACHE_FORCE_COLLISIONS") == "1":  # tests only: every content collides
        log.warning("HCCache: every content hashes alike (HYCACHE_HCCACHE_FORCE_COLLISIONS=1, for tests)")

        def hash_fn(data: bytes) -> bytes:
            return b"collide"
    return HCCache(config.hccache_size, mode=config.hccache_mode, small_file=config.hccache_small_file,
                   block_size=config.hccache_block_size, hash_fn=hash_fn)


async def start_cluster(cluster, status: AgentStatus, nursery: trio.Nursery) -> None:
    """The peer service (which answers /metrics too) and the cluster link's tasks."""
    from hycache_agent.fs.tiers import remove_blob
    from hycache_agent.metrics import CONTENT_TYPE, render
    from hycache_agent.transport.server import PeerServer
    from hycache_agent.transport.wire import parse_addr

    async def metrics() -> tuple[bytes, str]:
        return await render(status, status.node_id), CONTENT_TYPE

    server = PeerServer(cluster.local_files, node_id=cluster.node_id, secret=cluster.secret, metrics=metrics,
                        remove_temp=remove_blob)
    host, port = parse_addr(cluster.engine.config.listen)
    await nursery.start(server.serve, host, port)
    await cluster.run(nursery)


FUSE_URING_PARAMETER = Path("/sys/module/fuse/parameters/enable_uring")


def _choose_fuse_uring(config: AgentConfig, threaded: bool) -> bool:
    """Whether to ask for FUSE over io_uring at INIT.  The kernel offers it while fuse's
    ``enable_uring`` parameter is on; the parameter only allows it (a FUSE server asks for
    it at INIT, others go on reading the device), so auto and on turn it on as root.  The
    reader thread takes the rings' requests: without it (or without the answer table)
    there are none."""
    if config.fuse_uring == "off":
        return False
    why = ""
    if not threaded:
        why = "the reader thread is off (--no-reader-thread or --no-answer-table)"
    elif not FUSE_URING_PARAMETER.exists():
        why = "this kernel's fuse has no io_uring (Linux 6.14 and later)"
    elif FUSE_URING_PARAMETER.read_text().strip() not in ("Y", "1"):
        try:
            FUSE_URING_PARAMETER.write_text("Y")
            log.info("fuse io_uring: turned %s on", FUSE_URING_PARAMETER)
        except OSError as exc:
            why = f"{FUSE_URING_PARAMETER} is off and could not be turned on ({exc.strerror})"
    if why and config.fuse_uring == "on":
        raise SystemExit(f"hycache-agent: --fuse-uring on: {why}")
    if why:
        log.info("fuse io_uring: off (%s): requests are read from /dev/fuse", why)
    return not why


def _choose_passthrough(config: AgentConfig, engine: TieringEngine) -> bool:
    """Whether to ask for kernel passthrough at INIT (when this host allows it); the
    registration itself is probed once the kernel has answered (HyCacheOperations.init)."""
    if config.passthrough == "off":
        engine.passthrough.update(enabled=False, reason="off (--passthrough off)")
        return False
    why_not = passthrough.supported()
    if why_not is not None:
        if config.passthrough == "on":
            raise SystemExit(f"hycache-agent: --passthrough on: {why_not}")
        engine.passthrough.update(enabled=False, reason=why_not)
        return False
    engine.passthrough.update(enabled=False, reason="asked for at INIT; not probed yet")
    engine.blobs.negotiating = True  # (until the probe: the pool's reserve waits for it)
    return True


async def serve(agent: Agent) -> None:
    engine, config = agent.engine, agent.config
    async with trio.open_nursery() as nursery:
        # first: the mount is visible already, and a SIGTERM before the watcher runs would
        # kill the agent with the default action (a test's teardown right after a restart
        # saw exit -15) instead of unmounting
        await nursery.start(_watch_signals, nursery)
        agent.ops.start(nursery)
        if config.reader_thread and config.answer_table:
            nursery.start_soon(_prioritise_reader, config.reader_nice)
        nursery.start_soon(agent.collector.run)
        await nursery.start(ControlServer(agent.status, socket_path(config.state_dir)).serve)
        await engine.run(nursery)
        if agent.cluster is not None:
            await start_cluster(agent.cluster, agent.status, nursery)
        if config.metrics_listen:
            from hycache_agent.metrics import MetricsServer
            from hycache_agent.transport.wire import parse_addr

            host, port = parse_addr(config.metrics_listen)
            await nursery.start(MetricsServer(agent.status, agent.status.node_id).serve, host, port)
        if agent.control is not None:
            await nursery.start(agent.control.run)
        log.info("serving %s (fast=%s capacity=%d, slow=%s, policy=%s)", config.mountpoint,
                 config.fast_dir, engine.capacity, config.slow_dir, engine.policy.name)
        try:
            await pyfuse3.main()
        finally:
            nursery.cancel_scope.cancel()


READER_START_SECONDS = 10.0


async def _prioritise_reader(nice: int) -> None:
    """Give the native request reader thread (started by pyfuse3.main) its nice value.
    A request it answers wakes the caller; on a node with more runnable threads than cores
    the woken caller, or the agent's own background work (commits, publication, the pool's
    refills), then took the core from the reader before it read the next request, with its
    lock held while it wrote the reply (docs/agent.md, "The metadata path")."""
    deadline = trio.current_time() + READER_START_SECONDS
    tid = None
    while tid is None:
        tid = await trio.to_thread.run_sync(reader_thread_id)
        if tid is None:
            if trio.current_time() > deadline:
                log.info("no native reader thread runs (a pyfuse3 build without it?): nice %d not applied", nice)
                return
            await trio.sleep(0.01)
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        if before != nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:
        log.warning("the reader thread stays at the process's nice value (setting %d: %s; "
                    "it needs CAP_SYS_NICE)", nice, exc.strerror)
        return
    log.info("the reader thread (%d) runs at nice %d", tid, nice)


def _unescape_mountinfo(field: bytes) -> bytes:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo (octal)
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


def is_mounted(mountpoint: os.PathLike | str) -> bool:
    """Whether ``mountpoint`` is a mount point, read from /proc/self/mountinfo without
    touching the mount itself (safe when its FUSE daemon is this very process)."""
    target = os.fsencode(os.path.abspath(mountpoint))
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return any(len(fields) > 4 and _unescape_mountinfo(fields[4]) == target
                       for fields in (line.split(b" ") for line in f))
    except OSError:
        return False


def redis_credentials(config: AgentConfig) -> tuple[str | None, str | None]:
    """The Redis ACL user and password (--redis-user, --redis-password-file)."""
    if config.redis_password_file is None:
        return config.redis_user, None
    from hycache_agent.secretfile import read_protected
    from hycache_agent.transport.auth import SecretFileError

    data = read_protected(config.redis_password_file, what="Redis password file", error=SecretFileError,
                          forbidden=0o007, refusal="{what} {path} is accessible by other users (mode {mode}); run: "
                                                   "chmod o-rwx {path}   (0600, or 0640 to share it with a group)")
    password = data.decode("utf-8", "replace").strip()
    if not password:
        raise SecretFileError(f"Redis password file {config.redis_password_file} is empty")
    return config.redis_user, password


def _check_redis_credentials(config: AgentConfig) -> None:
    """Fail the start with a clear message when Redis refuses the credentials (a node
    that does not answer yet is no reason to fail: the agent joins when it comes)."""
    from hycache_dht.cluster_client import check_credentials
    from hycache_dht.meta import DHTAuthError

    from hycache_agent.transport.auth import SecretFileError

    try:
        user, password = redis_credentials(config)
        check_credentials(config.redis_nodes, user, password)
    except (SecretFileError, DHTAuthError) as exc:
        raise SystemExit(f"hycache-agent: {exc}") from None


def _fuse_mounted(path: os.PathLike[str] | str) -> bool:
    """Whether a FUSE file system is mounted at ``path`` (the agent's own, or another).
    Any other mount there is fine to mount over: e.g. a bind mount that exports the file
    system to a container's host (docker-compose.yml), which is a mount point too."""
    if not os.path.ismount(path):
        return False
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return True  # cannot tell: be careful
    fstype = None
    for line in lines:  # the last mount at the path is the one on top
        fields = line.split()
        if len(fields) > 4 and "-" in fields and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                                                          fields[4]) == target:
            fstype = fields[fields.index("-") + 1]
    return fstype is None or fstype.startswith("fuse")


def _settle_gc() -> None:
    """Move what start-up made (modules, the namespace loaded from SQLite, the engine)
    out of the collector's reach: a full collection then walks only what was made since,
    instead of every object the agent holds, under the GIL (a collection of the whole heap
    stalled the request loop for 50-300 ms during creates; docs/archive/benchmarks-history.md, "What else
    the loop waits for"). Objects freed by their reference counts are freed as before;
    only cycles among the start-up objects would wait (there are none to speak of: the
    namespace's inodes are a tree of dicts by number)."""
    gc.collect()
    gc.freeze()


# Descriptor slots reserved at start-up (at most the soft RLIMIT_NOFILE): see _reserve_fd_table.
FD_TABLE_RESERVE = 16384
# The soft RLIMIT_NOFILE the agent raises itself to (at most its hard limit): see _raise_fd_limit.
NOFILE_WANTED = 1 << 20


def _raise_fd_limit() -> None:
    """Raise the soft descriptor limit to the hard one (at most NOFILE_WANTED), as Go's
    runtime does for every program.  What the agent
    keeps open is sized from the soft limit: parked passthrough registrations (a quarter of
    it, fs/passthrough.py), ready pool blobs (an eighth, fs/blobpool.py), remote copies.  A
    shell's soft limit of 1024 allowed 256 parked registrations, so a reader reopening more
    than 256 recent files paid a worker-thread open(2) + ioctl per open.  The soft limit of
    1024 exists for select(2) users; the agent waits on descriptors with epoll and poll."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(hard, NOFILE_WANTED)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as exc:
        log.warning("descriptor limit left at %d (raising it to %d: %s)", soft, want, exc)
        return
    log.info("descriptor limit raised from %d to %d", soft, want)


def _reserve_fd_table() -> None:
    """Grow the process's descriptor table once, now, to what the agent may hold (parked
    passthrough registrations, ready blobs, copies: a descriptor each).  The kernel grows
    a table by doubling it when a new descriptor does not fit, and in a process with
    threads every growth waits for an RCU grace period (``expand_files`` →
    ``synchronize_rcu``): 4-16 ms inside whichever open(2) crossed 64, 128, 256, ...
    descriptors.  A reader of small remote files keeps one descriptor per copy it
    registered, so its ~105th cold file of a pass waited that long in the open of its
    copy (remote_probe --steps, f104 of every round; perf sched_switch stacks).  A
    table never shrinks: one dup2 to the last slot wanted, then close it.  Costs
    ~9 bytes a slot (144 KiB for 16,384)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = FD_TABLE_RESERVE if soft == resource.RLIM_INFINITY else min(soft, FD_TABLE_RESERVE)
    if top <= 64:  # (the table a process starts with)
        return
    try:
        fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.dup2(fd, top - 1, inheritable=False)  # only the slot matters
            os.close(top - 1)
        finally:
            os.close(fd)
    except OSError as exc:
        log.debug("descriptor table not reserved: %s", exc)


def _check_start(config: AgentConfig) -> str | None:
    """Refuse a start that cannot work, with a clear message; the control-plane token."""
    mountpoint = config.mountpoint
    if not mountpoint.is_dir():
        raise SystemExit(f"hycache-agent: mount point {mountpoint} is not a directory")
    if _fuse_mounted(mountpoint):
        raise SystemExit(f"hycache-agent: {mountpoint} is already a mount point (a FUSE file system)")
    token = None
    if config.control_plane is not None:
        from hycache_agent.control.link import TokenFileError, load_token

        assert config.control_token_file is not None, "AgentConfig: control_plane comes with control_token_file"
        try:
            token = load_token(config.control_token_file)
        except TokenFileError as exc:
            raise SystemExit(f"hycache-agent: {exc}") from None
    if config.redis is not None:
        _check_redis_credentials(config)
    return token


def _count_kernel_reads(config: AgentConfig, engine: TieringEngine) -> None:
    """Trace the kernel's reads of the tiers' blobs (passthrough opens; fs/kreads.py)."""
    if config.passthrough == "off" or not config.kernel_read_counts:
        engine.kreads.reason = "off (--passthrough off or --no-kernel-read-counts)"
        return
    devices = {t: os.stat(tier.data_dir).st_dev for t, tier in engine.tiers.items()}
    if not engine.kreads.start(devices, engine.tiers[T.FAST].data_dir):
        log.info("%s: passthrough reads are not counted per tier", engine.kreads.reason)


def run_mount(config: AgentConfig) -> int:
    """Mount, serve until unmounted or signalled, return the exit status."""
    mountpoint = config.mountpoint
    token = _check_start(config)
    _raise_fd_limit()
    _reserve_fd_table()
    engine = TieringEngine(config, kreads=KernelReads(follow_mb=config.follow_prefetch_mb,
                                                         follow_first_mb=config.follow_first_mb))
    report = engine.start()
    agent = build_agent(config, engine, token)
    _count_kernel_reads(config, engine)
    log.info("metadata loaded: %d inodes; recovery %s", len(engine.ns.inodes), report)
    if hasattr(pyfuse3, "set_loop_spin"):  # the patched pyfuse3 (passthrough7 and later)
        pyfuse3.set_loop_spin(int(config.loop_spin_us * 1000))
    threaded = config.reader_thread and config.answer_table
    if hasattr(pyfuse3, "set_reader_thread"):  # passthrough17 and later
        pyfuse3.set_reader_thread(threaded)
    if hasattr(pyfuse3, "set_fuse_uring"):  # passthrough28 and later (before init: its replies)
        pyfuse3.set_fuse_uring(_choose_fuse_uring(config, threaded), nice=config.reader_nice)
    pyfuse3.init(agent.ops, str(mountpoint), mount_options(config))
    _settle_gc()
    agent.collector.install()  # (after the freeze: start-up's objects are out of its reach)
    sys.setswitchinterval(config.gil_switch_us / 1e6)
    unmounted_by_kernel = False
    try:
        trio.run(serve, agent)
    except BaseException:
        log.exception("agent failed; unmounting")
        raise
    finally:
        agent.collector.uninstall()
        # fusermount3 -u ends the session from outside: the mount is already gone.
        # Never stat() the mount point here: the FUSE loop has stopped, nobody would
        # answer the kernel's GETATTR and this process would hang forever.
        unmounted_by_kernel = not is_mounted(mountpoint)
        pyfuse3.close(unmount=not unmounted_by_kernel)
        engine.close()
        engine.kreads.stop()
        if agent.cluster is not None:
            agent.cluster.close()
    log.info("unmounted %s", mountpoint)
    return 0

"""The harness that tests, benches, the backend's stack and the demos start HyCache with:
agents (``hycache-agent mount``) and the control plane (``hycache-control serve``) as
processes, a local Redis Cluster, ports, waits, unmounts, cache drops and the timing and
JSON helpers of the benches. It runs the agent and the control plane as programs and
imports neither, so both may depend on it."""

from .control import ControlPlane, control_cli, create_token, wait_ready
from .daemon import Agent, FuseDaemon, opts_to_argv
from .machine import free_page_reporting
from .mounts import drop_caches, force_unmount, fuse_unusable_reason, in_mount_table, is_mounted, shared_tmpdir
from .net import free_port, redis_seeds, wait_for
from .procs import (
    HarnessError,
    executable,
    kill_pid,
    log_tail,
    open_storm,
    pid_alive,
    reap,
    spawn,
    stop_daemon,
    stop_pid,
    write_secret,
)
from .redis import cluster_secret, start_redis_cluster
from .timing import median, pct, timed, write_json

__all__ = [
    "Agent", "ControlPlane", "FuseDaemon", "HarnessError", "cluster_secret", "control_cli", "create_token",
    "drop_caches", "executable", "force_unmount", "free_page_reporting", "fuse_unusable_reason", "free_port", "in_mount_table", "is_mounted", "kill_pid",
    "log_tail", "median", "open_storm", "opts_to_argv", "pct", "pid_alive", "reap", "redis_seeds", "shared_tmpdir", "spawn", "start_redis_cluster",
    "stop_daemon", "stop_pid", "timed", "wait_for", "wait_ready", "write_json", "write_secret",
]

"""Agent configuration: command-line flags over an optional TOML file over defaults."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from hycache_core.sizes import parse_size
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class AgentConfig(BaseModel):
    """Everything one agent needs to mount its tiering file system.

    ``root`` holds ``fast/``, ``slow/`` and ``state/`` unless ``fast``/``slow`` point
    elsewhere; ``state/`` always lives under ``root`` (metadata database, control socket).
    """

    model_config = ConfigDict(extra="forbid")

    root: Path
    mountpoint: Path
    fast: Path | None = None
    slow: Path | None = None
    fast_capacity: int | None = Field(default=None, description="bytes; default: size of the fast file system")
    high_watermark: float = Field(default=0.90, gt=0, le=1)
    low_watermark: float = Field(default=0.70, ge=0, lt=1)
    # writes may take this fraction of the capacity above it while the evictor catches up
    # (never more than the fast file system has free beyond 5 % of its size); 0: writes
    # wait for evictions at the capacity
    write_slack: float = Field(default=1.0, ge=0, le=4)
    policy: str = "lru"
    log_level: str = "INFO"
    allow_other: bool = Field(default_factory=lambda: os.geteuid() == 0)
    promote_on_open: bool = True
    # "background": open() returns at once and reads come from the slow tier until the
    # copy switches over; "before-open": open() waits for the copy (Algorithm 1 verbatim)
    promote_mode: Literal["background", "before-open"] = "background"
    # with passthrough a held file's blob cannot move, so a writer of an evicted file would
    # write (and fsync) the slow tier until the last close: an open for writing of an
    # evicted file of up to this many MiB that no handle holds, O_SYNC/O_DSYNC or of a file
    # fsync'ed before, waits for its promotion; 0: off
    promote_before_write_mb: int = Field(default=64, ge=0, le=1 << 20)
    kernel_cache: bool = True
    # the mount's read-ahead window (its bdi's read_ahead_kb), hence the largest READ the
    # kernel sends for a file the agent serves (a remote copy still filling, passthrough
    # off): 1024 makes 1 MiB READs, an eighth of the requests of the kernel's 128 KiB
    # (docs/agent.md, "Read-ahead"); 0: the kernel's
    read_ahead_kb: int = Field(default=0, ge=0, le=16384)
    # MiB of a blob read ahead, in parallel, when a file on the fast tier is opened for
    # reading through passthrough (fs/prefetch.py); 0: only the kernel's read-ahead
    open_prefetch_mb: int = Field(default=0, ge=0, le=1 << 20)
    # MiB kept asked for just past each thread that reads a fast-tier blob in order through
    # passthrough, by the kernel read trace's reader (fs/ktrace_reader.py); 0: off (it needs
    # the trace: off too with --no-kernel-read-counts)
    follow_prefetch_mb: int = Field(default=32, ge=0, le=4096)
    # MiB of a followed blob asked for at once past its first thread seen reading it in
    # order, or to its end if nearer (at least follow_prefetch_mb); the window above is kept
    # past it afterwards
    follow_first_mb: int = Field(default=256, ge=0, le=4096)
    writeback_cache: bool = True
    # FUSE passthrough: reads, writes and mmap of files on the local tiers go from the
    # kernel straight to the blob.  auto: when the kernel, pyfuse3 and the privileges allow
    passthrough: Literal["auto", "on", "off"] = "auto"
    # count the bytes the kernel reads from the tiers' blobs for passthrough opens, from
    # the filemap trace point (fs/kreads.py): needs a writable tracefs; off: never try
    kernel_read_counts: bool = True
    # after answering a request and finding no other, the request loop polls /dev/fuse this
    # long before it sleeps (docs/agent.md, "The metadata path"); 0: sleep at once
    loop_spin_us: float = Field(default=50.0, ge=0, le=10_000,
                                description="µs the request loop polls for the next request before it sleeps")
    # answer GETATTR, LOOKUP and GETXATTR security.capability of local files that are not
    # open from a table in the request reader, without Python (fuse/answers.py)
    answer_table: bool = True
    # (with the table and passthrough) answer read-only OPENs of closed local files, and
    # their RELEASEs, in the request reader with the file's parked registration
    answer_opens: bool = True
    # empty fast-tier blobs the pool keeps made between bursts of creates, at least (it
    # also keeps as many as the largest burst of the last 10 minutes), within the
    # descriptor budget: fs/blobpool.py, "The reserve"
    blob_pool_reserve: int = Field(default=1024, ge=0, le=1 << 20,
                                   description="empty fast-tier blobs kept ready between bursts of creates")
    # (with the table) read requests in a native thread of the patched pyfuse3 that answers
    # from the table without the GIL and queues the rest for the event loop (docs/agent.md);
    # on since pyfuse3 passthrough21; the fsx size race it still lost 1 run in 4 to (an offer
    # after a take-back with lent opens unknown to the agent) closed in passthrough22
    reader_thread: bool = True
    # FUSE over io_uring (Linux 6.14+, fuse's enable_uring module parameter, turned on as
    # root): the reader's requests come from a ring per CPU instead of read(2) and writev(2)
    # on /dev/fuse (auto: when the kernel has it; on: fail to start otherwise; off: never)
    fuse_uring: Literal["auto", "on", "off"] = "auto"
    # how long a Python thread may hold the GIL while another waits for it (CPython's
    # sys.setswitchinterval; its default is 5 ms): every system call of the event loop lets
    # go of the GIL, and getting it back waited for whichever background thread (the
    # publisher's, the journal's, a pool refill) ran Python meanwhile (docs/agent.md)
    gil_switch_us: float = Field(default=250.0, ge=50, le=100_000,
                                 description="µs a Python thread holds the GIL while another waits")
    # the reader thread's nice value (docs/agent.md, "The metadata path"): a request it
    # answers wakes the caller, and on a busy node the woken caller (or the agent's own
    # background threads) took the core the reader needed for the next request; below 0
    # it is scheduled ahead of them (needs CAP_SYS_NICE: else it stays at the process's)
    reader_nice: int = Field(default=-19, ge=-20, le=19,
                             description="nice value of the native request reader thread")
    # the cyclic garbage collector, paced by the event loop (hycache_agent/collector.py):
    # the automatic one (every 700 net allocations, on whichever thread, holding the GIL)
    # is off, and the loop collects the young generations every gc_interval seconds and
    # all of them every gc_full_interval; 0 leaves CPython's thresholds in charge
    gc_interval: float = Field(default=0.2, ge=0, le=3600,
                               description="seconds between the event loop's young collections (0: CPython's own)")
    gc_full_interval: float = Field(default=60.0, gt=0, le=86400,
                                    description="seconds between the event loop's full collections")
    # global namespace (HyCache+): metadata in Redis Cluster (or a shared SQLite file)
    redis: str | None = Field(default=None, description="HOST:PORT[,HOST:PORT...] of Redis Cluster nodes")
    meta_store: Path | None = Field(default=None, description="a SQLite metadata store shared by agents on one host")
    node_id: str | None = None
    dht_namespace: str = "hc"  # key prefix in Redis: several HyCache clusters can share one Redis Cluster
    listen: str = "0.0.0.0:7070"
    advertise: str | None = None
    cluster_secret_file: Path | None = None
    # Redis ACL credentials: the user and a file holding its password (mode 0600)
    redis_user: str | None = None
    redis_password_file: Path | None = None
    write_lease_seconds: float = Field(default=10.0, gt=0, description="write flag lease, renewed while open")
    write_lease_wait: float = Field(default=30.0, ge=0, description="how long an open waits for another node's lease")
    # publication to the DHT yields to a storm of requests (cluster/publisher.py): the
    # global namespace may lag a node that serves more than publish_storm_rate requests a
    # second by up to publish_yield_seconds, and the cores go to the requests meanwhile
    publish_storm_rate: float = Field(default=4000.0, gt=0, description="requests/s from which publication yields")
    publish_yield_seconds: float = Field(default=1.0, ge=0, le=60,
                                         description="how long publication may yield to a storm; 0: never")
    replicas: int = Field(default=0, ge=0, description="copies of each file pushed to other nodes")
    replica_mode: Literal["async", "sync"] = "async"
    push_streams: int = Field(default=2, ge=1, le=16,
                              description="parallel streams of a large replica push a writer waits for")
    rebalance_interval: float = Field(default=30.0, ge=0, description="seconds between rebalance checks; 0: off")
    rebalance_rounds: int = Field(default=3, ge=1, description="checks the fast tier must stay hot before acting")
    # the control plane (docs/control-plane.md): heartbeats up, actions and policies down
    control_plane: str | None = Field(default=None, description="URL of the control plane, e.g. http://cp:8000")
    control_token_file: Path | None = Field(default=None, description="this node's token (mode 0600, owned by the agent's user)")
    metrics_listen: str | None = Field(default=None, description="HOST:PORT serving GET /metrics (Prometheus)")
    # HCCache on the remote read path (paper 002): 0 turns it off (whole-file fetch)
    hccache_size: int = Field(default=256 << 20, ge=0, description="bytes of memory for HCCache; 0: off")
    hccache_mode: Literal["hybrid", "block"] = "hybrid"
    hccache_small_file: int = Field(default=256 << 10, ge=0, description="files below this are one cache entry")
    hccache_block_size: int = Field(default=128 << 10, gt=0, description="cache block (and range request) size")
    hccache_second_level: bool = True  # small files also keep a fast-tier copy (hybrid mode)

    @property
    def clustered(self) -> bool:
        return self.redis is not None or self.meta_store is not None

    @property
    def redis_nodes(self) -> list[tuple[str, int]]:
        out = []
        for item in (self.redis or "").split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--redis wants HOST:PORT[,HOST:PORT...], got {item!r}")
            out.append((host, int(port)))
        return out

    @field_validator("fast_capacity", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_size(v)

    @field_validator("hccache_size", "hccache_small_file", "hccache_block_size", mode="before")
    @classmethod
    def _hccache_size(cls, v: Any) -> Any:
        return parse_size(v)

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {v!r}")
        return v

    @model_validator(mode="after")
    def _cluster(self) -> AgentConfig:
        if self.clustered:
            if self.redis is not None:
                _ = self.redis_nodes  # validates
            if self.cluster_secret_file is None:
                raise ValueError("joining a cluster (--redis/--meta-store) needs --cluster-secret-file")
            if self.node_id is None:
                import socket

                self.node_id = socket.gethostname()
        return self

    @field_validator("control_plane")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            v = v.strip().rstrip("/")
            if not (v.startswith("http://") or v.startswith("https://")) or len(v) < 9:
                raise ValueError(f"control_plane: want an http:// or https:// URL, got {v!r}")
        return v

    @field_validator("metrics_listen")
    @classmethod
    def _hostport(cls, v: str | None) -> str | None:
        if v is not None:
            host, _, port = v.rpartition(":")
            if not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(f"metrics_listen: want HOST:PORT, got {v!r}")
        return v

    @model_validator(mode="after")
    def _control(self) -> AgentConfig:
        if (self.control_plane is None) != (self.control_token_file is None):
            raise ValueError("control_plane and control_token_file go together "
                             "(--control-plane URL --control-token-file FILE)")
        return self

    @model_validator(mode="after")
    def _watermarks(self) -> AgentConfig:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark})"
            )
        return self

    @property
    def fast_dir(self) -> Path:
        return self.fast or self.root / "fast"

    @property
    def slow_dir(self) -> Path:
        return self.slow or self.root / "slow"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"


def load_config(config_file: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    """Merge a TOML file (keys as in :class:`AgentConfig`, dashes allowed) with CLI overrides."""
    values: dict[str, Any] = {}
    if config_file is not None:
        with open(config_file, "rb") as f:
            data = tomllib.load(f)
        section = data.get("agent", data)
        values.update({k.replace("-", "_"): v for k, v in section.items()})
    values.update({k: v for k, v in overrides.items() if v is not None})
    return AgentConfig(**values)

"""The API's request and response shapes (docs/control-plane.md keeps the names)."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from .services.paths import MAX_PATH, check_name

Scope = Literal["admin", "read", "node"]
NodeState = Literal["up", "degraded", "down"]
ActionName = Literal["pin", "unpin", "promote", "demote"]
ItemState = Literal["pending", "delivered", "done", "failed"]
ActionState = Literal["pending", "running", "done", "failed"]
EventKind = Literal["audit", "node", "action", "policy", "cluster"]

MAX_PATHS_PER_ACTION = 1000
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# -- tokens ---------------------------------------------------------------------------------

class WhoAmI(BaseModel):
    name: str
    scope: Scope
    node_id: str | None


class TokenOut(BaseModel):
    id: int
    name: str
    scope: Scope
    node_id: str | None
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    scope: Scope
    node_id: str | None = Field(None, pattern=NODE_ID_PATTERN)

    @model_validator(mode="after")
    def _node(self) -> TokenCreate:
        if self.scope == "node" and not self.node_id:
            raise ValueError("node_id is required for a node token")
        if self.scope != "node" and self.node_id:
            raise ValueError("node_id is only for node tokens")
        return self


class TokenCreated(TokenOut):
    token: str = Field(description="the secret, shown once")


# -- nodes ----------------------------------------------------------------------------------

class TierView(BaseModel):
    capacity: int | None = Field(None, description="bytes the agent may use on this tier")
    device_capacity: int | None = Field(None, description="size of the tier's file system")
    device_free: int | None = None
    #: bytes of the agent's files on this tier (fast: local files and copies of other nodes'
    #: files, kept copies included); on the fast tier it may exceed ``capacity`` up to
    #: ``write_ceiling``: that part is in the write slack
    used: int | None = None
    files: int | None = None
    high_watermark_bytes: int | None = None
    low_watermark_bytes: int | None = None
    #: (fast tier) the most ``used`` may reach with writes while the evictor catches up:
    #: ``capacity`` plus the write slack the tier's file system has room for (equal to
    #: ``capacity``: no slack); null from an agent that does not report it
    write_ceiling: int | None = None
    #: (fast tier) the part of ``used`` that is copies of other nodes' files (the kept
    #: copies included)
    remote_cache_bytes: int | None = None


class DhtView(BaseModel):
    state: str | None = Field(None, description="the agent's DHT link: connecting | ok | degraded (null: standalone)")
    backlog: int | None = None
    registry_alive: bool | None = Field(None, description="the DHT node registry's view")
    registry_age: float | None = None


class PolicyView(BaseModel):
    policy: str | None = None
    high_watermark: float | None = None
    low_watermark: float | None = None
    version: int = 0
    applied_version: int = 0


class MigrationActive(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: str | None = None
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    copied: int | None = None
    total: int | None = None


class MigrationsView(BaseModel):
    """The agent's migrations, counted since it started."""
    active: list[MigrationActive] = []
    #: migrations finished (evictions, promotions, spills) and the bytes they moved
    done: int = 0
    bytes: int = 0
    #: files the evictor moved to the slow tier (an operator's or a plan's demotions count
    #: in ``done`` only)
    evictions: int = 0
    #: files moved to the fast tier (on open, by a plan or an operator)
    promotions: int = 0
    #: evictions cancelled before their switch because a passthrough open took the file
    #: back: the file stayed on the fast tier and its slow copy was dropped
    evictions_taken_back: int = 0
    #: on-open promotions the admission rule turned down
    promotions_declined: int = 0
    #: files a write moved to the slow tier because the fast tier had no room for it
    spills: int = 0
    failed: int = 0
    abandoned: int = 0


class CopiesKeptView(BaseModel):
    """Copies of other nodes' files kept on the fast tier after the kernel forgot their
    inodes, for the next open of the same bytes (counted in the fast tier's ``used`` and
    ``remote_cache_bytes``)."""
    files: int = 0
    bytes: int = 0
    #: kept copies a new open of the same bytes took over since the agent started (a
    #: fetch saved each)
    adopted: int = 0


class Rates(BaseModel):
    ts: float | None = None
    fast_read_bps: float = 0.0
    fast_write_bps: float = 0.0
    slow_read_bps: float = 0.0
    slow_write_bps: float = 0.0
    remote_read_bps: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    hit_ratio: float | None = None
    metadata_ops_per_s: float = 0.0
    remote_fetches_per_s: float = 0.0
    migrations_per_s: float = 0.0
    migration_bps: float = 0.0
    migrations_in_flight: float = 0.0
    dht_backlog: float = 0.0
    fast_used: float = 0.0
    slow_used: float = 0.0


class TieringView(BaseModel):
    """What the tiering bought, summed from the agents' cumulative counters (each since
    its agent started).  What a byte count includes depends on how it was counted
    (``counting``: nodes per mode):

    - ``agent`` (passthrough off): every byte read or written through the mount, counted
      by the agent that served it;
    - ``traced`` (passthrough on, the default): reads — the bytes the kernel read from
      each tier's files for the mount's readers (page-cache hits and device reads alike,
      in whole pages; not O_DIRECT or mmap), from its ``filemap`` trace point; writes —
      how much the files grew, seen when the agent next looks (attributes, last close):
      overwrites in place are not counted;
    - ``untraced`` (passthrough on, no tracefs: e.g. an unprivileged container): writes as
      above, reads through passthrough not counted (the agent's own reads still are);
    - ``unknown``: an agent too old to say.
    """
    #: opens for reading whose bytes were on the fast tier / elsewhere (every mode)
    hits: int = 0
    misses: int = 0
    #: hits / (hits + misses) since the agents started (null before any open)
    hit_ratio: float | None = None
    #: bytes read from each tier (and from other nodes' files) through the mount
    fast_read_bytes: int = 0
    slow_read_bytes: int = 0
    remote_read_bytes: int = 0
    #: bytes written to each tier through the mount
    fast_write_bytes: int = 0
    slow_write_bytes: int = 0
    #: the parts of the above the kernel moved (passthrough): traced reads, file growth
    fast_kernel_read_bytes: int = 0
    slow_kernel_read_bytes: int = 0
    fast_grown_bytes: int = 0
    slow_grown_bytes: int = 0
    #: bytes moved to the fast tier by promotions / to the slow tier by evictions
    promoted_bytes: int = 0
    evicted_bytes: int = 0
    #: kernel reads the agents' tracers missed (their ring buffers overflowed): the traced
    #: read bytes are short by that many reads
    kernel_read_events_lost: int = 0
    counting: dict[str, int] = {}


class NodeOut(BaseModel):
    id: str
    address: str | None
    state: NodeState
    state_since: float
    version: str | None
    boot_id: str | None = None
    last_heartbeat: float | None
    heartbeats: int = 0
    dht: DhtView
    policy: PolicyView
    tiers: dict[str, TierView]
    hit_ratio: float | None
    rates: Rates | None
    #: the latest heartbeat's cumulative counters (of its boot_id), as the agent sent them
    counters: dict[str, Any] | None = None
    #: the same counters as what the tiering bought, and how they were counted
    tiering: TieringView = Field(default_factory=TieringView)
    #: the agent's HCCache (memory cache of remote reads, paper 002): mode, hit_ratio,
    #: byte_hit_ratio, abd, ecdal, ecdab, memory_bytes, limit_bytes, dedup_saved_bytes, …;
    #: null when the agent runs without it
    hccache: dict[str, Any] | None = None
    #: kernel FUSE passthrough on that agent: {enabled, reason, drop_waits (registrations that
    #: waited for dropped ones to be closed: a disk slow to free deleted files)}
    passthrough: dict[str, Any] | None = None
    migrations: MigrationsView
    #: kept remote copies (null: a standalone agent, or one too old to report them)
    copies_kept: CopiesKeptView | None = None
    updated_at: float


class NodePage(Page[NodeOut]):
    pass


NodeSort = Literal["id", "state", "last_heartbeat", "heartbeats", "fast_used", "slow_used", "hit_ratio"]


class TierSummary(BaseModel):
    capacity: int = 0
    used: int = 0
    files: int = 0


class NodeSummary(BaseModel):
    """Every node, summed by the server (the dashboard's overview at any cluster size)."""
    nodes: int
    up: int
    degraded: int
    down: int
    #: the heartbeat interval handed to the agents now (adaptive: max(base, nodes / cap))
    interval: float
    tiers: dict[str, TierSummary]
    #: cluster-wide rates: the sum of every node's latest sample (bytes/s, per second)
    rates: dict[str, float]
    #: hits / (hits + misses) over the cluster's latest samples (null without any)
    hit_ratio: float | None
    ts: float
    #: every node's cumulative tiering counters summed (a down node's last ones included)
    tiering: TieringView = Field(default_factory=TieringView)


class SummaryPoint(BaseModel):
    """The cluster's summary at one time (``GET /summary/history``): every node summed."""
    ts: float
    nodes: int
    up: int
    degraded: int
    down: int
    fast_capacity: int
    fast_used: int
    #: used / capacity in percent (null without capacity)
    fast_used_pct: float | None
    slow_capacity: int
    slow_used: int
    slow_used_pct: float | None
    #: bytes/s, every node's latest sample summed
    read_bps: float
    write_bps: float
    remote_read_bps: float
    hit_ratio: float | None
    #: bytes/s read from each tier, and moved between the tiers (the summary's ``tiering``
    #: says what the byte counts include)
    fast_read_bps: float = 0.0
    slow_read_bps: float = 0.0
    migration_bps: float = 0.0


class SummaryHistory(BaseModel):
    #: seconds between points
    period: float
    points: list[SummaryPoint]


# -- metrics --------------------------------------------------------------------------------

class Sample(Rates):
    ts: float


class MetricsOut(BaseModel):
    node_id: str
    step: float
    since: float
    until: float
    resolution: int = Field(description="stored resolution the samples come from (1 or 60 s)")
    samples: list[Sample]


# -- files ----------------------------------------------------------------------------------

class FileEntry(BaseModel):
    name: str
    path: str
    kind: Literal["file", "dir", "symlink", "special"]
    size: int
    mtime: float
    primary: str | None
    tier: str | None
    replicas: list[str]
    pinned: bool
    version: int


class FileListing(BaseModel):
    path: str
    items: list[FileEntry]
    next_cursor: str | None


class ActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: ActionName
    paths: list[str] = Field(min_length=1, max_length=MAX_PATHS_PER_ACTION)

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        return value  # each path is checked by the route, naming its index


class ActionItemOut(BaseModel):
    id: int
    path: str
    node: str | None
    state: ItemState
    detail: str | None
    tier: str | None = None


class ActionOut(BaseModel):
    id: int
    action: ActionName
    state: ActionState
    actor: str | None = None
    items: list[ActionItemOut]
    created_at: float
    updated_at: float


class ActionPage(Page[ActionOut]):
    pass


# -- policies -------------------------------------------------------------------------------

class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(min_length=1, max_length=64)
    high_watermark: float = Field(gt=0, le=1)
    low_watermark: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _order(self) -> PolicyIn:
        if not self.low_watermark < self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        return self


class PolicyOut(BaseModel):
    node_id: str
    policy: str | None
    high_watermark: float | None
    low_watermark: float | None
    version: int
    applied_version: int
    updated_at: float | None


# -- events ---------------------------------------------------------------------------------

class EventOut(BaseModel):
    id: int
    ts: float
    kind: EventKind
    node: str | None
    actor: str | None
    action: str
    result: str
    detail: str | None


class EventPage(Page[EventOut]):
    pass


# -- heartbeats (the agents' link) ----------------------------------------------------------

# The counters' defaults are given by keyword, Field(default=0): a type checker reads a
# positional default as none (and Counters' default_factory=TierCounters as a bad call).
class TierCounters(BaseModel):
    model_config = ConfigDict(extra="allow")
    read_bytes: int = Field(default=0, ge=0)
    write_bytes: int = Field(default=0, ge=0)
    reads: int = Field(default=0, ge=0)
    writes: int = Field(default=0, ge=0)
    hits: int = Field(default=0, ge=0)


class RemoteCounters(BaseModel):
    model_config = ConfigDict(extra="allow")
    read_bytes: int = Field(default=0, ge=0)
    fetches: int = Field(default=0, ge=0)
    fetch_bytes: int = Field(default=0, ge=0)


class Counters(BaseModel):
    model_config = ConfigDict(extra="allow")
    fast: TierCounters = Field(default_factory=TierCounters)
    slow: TierCounters = Field(default_factory=TierCounters)
    remote: RemoteCounters = Field(default_factory=RemoteCounters)
    misses: int = Field(default=0, ge=0)
    metadata_ops: int = Field(default=0, ge=0)
    migrations: int = Field(default=0, ge=0)
    migration_bytes: int = Field(default=0, ge=0)


class ActionResult(BaseModel):
    id: int
    state: Literal["done", "failed"]
    detail: str | None = Field(None, max_length=4096)
    tier: str | None = Field(None, max_length=16)


class Heartbeat(BaseModel):
    node_id: str = Field(pattern=NODE_ID_PATTERN)
    version: str | None = Field(None, max_length=64)
    boot_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0)
    sent_at: float
    address: str | None = Field(None, max_length=300)
    status: dict[str, Any] | None = None
    counters: Counters = Field(default_factory=Counters)
    policy_version: int = Field(0, ge=0)
    action_results: list[ActionResult] = Field([], max_length=10000)


class PolicyDelivery(BaseModel):
    version: int
    policy: str
    high_watermark: float
    low_watermark: float


class ActionDelivery(BaseModel):
    id: int
    action: Literal["pin", "unpin", "promote", "demote", "prefetch"]
    path: str
    #: plan steps only (2-Layer Scheduling): which manifest, job and step of its node's plan
    manifest_id: int | None = None
    job: str | None = None
    step: int | None = None
    attempt: int | None = Field(None, description="1 when a plan step that failed for room is delivered again "
                                                  "(the agent applies it although it saw the id)")


class HeartbeatAnswer(BaseModel):
    interval: float
    policy: PolicyDelivery | None
    actions: list[ActionDelivery]
    acked_results: list[int]
    plans: list[dict[str, Any]] = []


class PlanPush(BaseModel):
    """GET /nodes/{id}/plan: the node's deliverable items, and the version to ask after."""
    version: str
    actions: list[ActionDelivery]


# -- health ---------------------------------------------------------------------------------

class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    database: str
    redis: str


class ErrorOut(BaseModel):
    detail: Any


class PlacementRequest(BaseModel):
    """A ready job: the namespace paths it reads (and, optionally, its fast-tier footprint)."""

    inputs: list[Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(check_name)]] = Field(
        max_length=100_000)
    footprint: int | None = Field(None, ge=0, description="bytes it needs on the fast tier (default: its inputs)")
    nodes: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=10_000, description="candidate node ids (default: the live nodes)")


class PlacementOut(BaseModel):
    node: str = Field(description="where the job should run now")
    bytes_moved: dict[str, int] = Field(description="bytes each candidate node would receive")
    slow_tier_bytes: int = Field(description="input bytes on no node (read from the slow tier wherever it runs)")
    locations: dict[str, str | None] = Field(description="each input's node (its primary copy), null when on none")
    candidates: list[str] = Field(description="the nodes whose fast tier can hold the job")


# -- Slurm (docs/slurm.md) -------------------------------------------------------------------

NsPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(check_name)]
NodeName = Annotated[str, Field(pattern=NODE_ID_PATTERN)]


class SlurmJobData(BaseModel):
    """What a Slurm job declares: a manifest's job (``manifest_id`` and ``job``), or the
    namespace paths it reads and writes."""

    manifest_id: int | None = Field(None, ge=1, le=2**31 - 1, description="the manifest whose job this is")
    job: str | None = Field(None, min_length=1, max_length=200, description="the manifest's job id")
    inputs: list[NsPath] = Field([], max_length=100_000, description="namespace paths the job reads")
    outputs: list[NsPath] = Field([], max_length=100_000, description="namespace paths the job writes")


class SlurmPlacementRequest(SlurmJobData):
    nodes: list[NodeName] | None = Field(None, max_length=10_000,
                                         description="Slurm's candidate nodes (default: the live nodes)")

    @model_validator(mode="after")
    def _declared(self) -> SlurmPlacementRequest:
        if (self.manifest_id is None) != (self.job is None):
            raise ValueError("manifest_id and job go together")
        if self.manifest_id is None and not self.inputs:
            raise ValueError("a job is declared by manifest_id and job, or by its inputs")
        return self


class SlurmPlacementOut(BaseModel):
    node: str = Field(description="the node 2-Layer Scheduling chose")
    source: Literal["manifest", "placement"] = Field(
        description="the manifest's placement, or the online placement of these inputs")
    inputs: list[str] = Field(description="the inputs the choice was made for (namespace paths)")


class SlurmStageIn(SlurmJobData):
    node: NodeName | None = Field(None, description="the node the job will run on (default: chosen here)")
    stage: bool = Field(True, description="false: record the job and its node only (no prefetches, no pins, no "
                                          "staging again at pre-run): node choice without burst-buffer staging")


class SlurmPreRun(BaseModel):
    node: NodeName = Field(description="the node Slurm runs the job on")


class SlurmPostRun(BaseModel):
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)


class SlurmTeardown(BaseModel):
    hurry: bool = False


class SlurmHook(BaseModel):
    hook: str
    at: float
    detail: str | None


class SlurmSteps(BaseModel):
    total: int
    done: int
    failed: int
    pending: int
    delivered: int


class SlurmJobOut(BaseModel):
    id: int = Field(description="Slurm's job id")
    manifest_id: int | None
    job: str | None
    inputs: list[str]
    outputs: list[str]
    state: Literal["pending", "staging", "running", "finished", "done"]
    staged_on: str | None = Field(description="the node its inputs were staged on")
    ran_on: str | None = Field(description="the node Slurm ran it on (known at pre-run)")
    staging: Literal["none", "staging", "staged", "failed"]
    failures: list[str] = Field(description="the failed prefetches: 'PATH: reason'")
    steps: SlurmSteps
    step_items: list[dict[str, Any]]
    hooks: list[SlurmHook] = Field(description="the burst-buffer hooks reported, in order")
    published: dict[str, dict[str, Any] | None] | None = Field(
        description="after the run: each output's node and size in the namespace, null when missing")
    outputs_missing: int = Field(description="outputs not in the namespace at the last post-run")
    exit_code: int | None
    created_at: float
    updated_at: float


class SlurmStatus(BaseModel):
    text: str = Field(description="what `scontrol show bbstat` prints")
    jobs: list[SlurmJobOut]

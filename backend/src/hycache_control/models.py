"""The control plane's database (SQLAlchemy 2, typed).  Alembic migrations in migrations/."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


def table_of(cls: type[Base]) -> Table:
    """The Table a class maps, for Core statements (declarative types ``__table__`` as any
    FromClause; every class here maps a Table)."""
    t = cls.__table__
    if not isinstance(t, Table):
        raise TypeError(f"{cls.__name__} does not map a Table")
    return t


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    scope: Mapped[str] = mapped_column(String(16))  # admin | read | node
    node_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Node(Base):
    """What the control plane knows of a node beyond the DHT registry: its last heartbeat."""

    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    address: Mapped[str | None] = mapped_column(String(300), nullable=True)
    version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    boot_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeats: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(16), default="down")
    state_since: Mapped[float] = mapped_column(Float)
    status: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    counters: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class Policy(Base):
    __tablename__ = "policies"
    node_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    policy: Mapped[str] = mapped_column(String(64))
    high_watermark: Mapped[float] = mapped_column(Float)
    low_watermark: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer)
    applied_version: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float)


class Action(Base):
    __tablename__ = "actions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[str] = mapped_column(String(16))  # pin | unpin | promote | demote | plan (a manifest's steps)
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    #: set for the action that carries a manifest's plan steps (not listed under /actions)
    manifest_id: Mapped[int | None] = mapped_column(ForeignKey("manifests.id", ondelete="CASCADE"), nullable=True,
                                                    index=True)
    items: Mapped[list[ActionItem]] = relationship(back_populates="parent", order_by="ActionItem.id",
                                                   cascade="all, delete-orphan")


class ActionItem(Base):
    """One path of an action; its id is what the node sees and reports back."""

    __tablename__ = "action_items"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    action_id: Mapped[int] = mapped_column(ForeignKey("actions.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    #: pending | delivered | done | failed; plan steps also skipped (their job finished
    #: before delivery) | cancelled (the manifest was deleted before delivery)
    state: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    tier: Mapped[str | None] = mapped_column(String(16), nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    # -- plan steps only (null for plain file actions) --
    #: the agent action of this step: prefetch | demote | pin | unpin (evict is sent as demote)
    kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    job: Mapped[str | None] = mapped_column(String(200), nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    plan_action: Mapped[str | None] = mapped_column(String(16), nullable=True)  # as planned: prefetch | evict | pin | unpin
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source: Mapped[str | None] = mapped_column(String(200), nullable=True)
    #: a prefetch of a file a job of the manifest writes: that job (held until it has finished)
    after_job: Mapped[str | None] = mapped_column(String(200), nullable=True)
    parent: Mapped[Action] = relationship(back_populates="items")

    __table_args__ = (Index("ix_action_items_node_state", "node", "state"),)


class Manifest(Base):
    """A submitted workflow manifest, its placement (2LS layer 1) and plans (layer 2)."""

    __tablename__ = "manifests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    format: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))  # planned | running | done | cancelled
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)  # hycache_core.scheduling.place() output
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    jobs: Mapped[list[ManifestJob]] = relationship(back_populates="manifest", order_by="ManifestJob.id",
                                                   cascade="all, delete-orphan")


class ManifestJob(Base):
    __tablename__ = "manifest_jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    manifest_id: Mapped[int] = mapped_column(ForeignKey("manifests.id", ondelete="CASCADE"), index=True)
    job: Mapped[str] = mapped_column(String(200))
    node: Mapped[str] = mapped_column(String(200))
    position: Mapped[int] = mapped_column(Integer)  # order of the job among its node's jobs (0 first)
    parents: Mapped[list[str]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16))  # pending | running | done
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # when the job reported it had read its inputs (``…/reads-done``): the next job's
    # prefetches on the node are released then (docs/scheduling.md, "When a job starts")
    reads_done_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # when its prefetch/evict steps were planned from the node's contents at their release
    # (None: not yet; they are held until then — docs/scheduling.md, "Plans made at release")
    planned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    manifest: Mapped[Manifest] = relationship(back_populates="jobs")

    __table_args__ = (Index("ix_manifest_jobs_manifest_job", "manifest_id", "job", unique=True),)


class SlurmJob(Base):
    """A Slurm batch job HyCache places and stages for (docs/slurm.md): its declared data,
    the node the control plane chose, the node it really ran on, and the hooks seen."""

    __tablename__ = "slurm_jobs"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # Slurm's job id
    manifest_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    job: Mapped[str | None] = mapped_column(String(200), nullable=True)  # the manifest's job id
    inputs: Mapped[list[str]] = mapped_column(JSON, default=list)
    outputs: Mapped[list[str]] = mapped_column(JSON, default=list)
    #: where its inputs are staged (the node chosen at stage-in, then the node it ran on)
    staged_on: Mapped[str | None] = mapped_column(String(200), nullable=True)
    ran_on: Mapped[str | None] = mapped_column(String(200), nullable=True)
    #: pending | staging | running | finished | done (torn down)
    state: Mapped[str] = mapped_column(String(16))
    #: the action whose items are this job's prefetches (and pins) on ``staged_on``
    stage_action_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pin_action_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: [[hook, unix time, detail]] in the order the burst-buffer hooks reported them
    hooks: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)
    #: each output as published after the run: {path: {node, size} | null}
    published: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(16))  # audit | node | action | policy | cluster
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    action: Mapped[str] = mapped_column(String(200))
    result: Mapped[str] = mapped_column(String(200))
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


#: the rate/gauge columns of a sample (names of the API's sample fields)
SAMPLE_FIELDS = (
    "fast_read_bps", "fast_write_bps", "slow_read_bps", "slow_write_bps", "remote_read_bps",
    "hits", "misses", "hit_ratio", "metadata_ops_per_s", "remote_fetches_per_s", "migrations_per_s",
    "migration_bps", "migrations_in_flight", "dht_backlog", "fast_used", "slow_used",
)


class MetricSample(Base):
    """One node's rates over one heartbeat interval (resolution 1) or averaged over a minute
    (resolution 60)."""

    __tablename__ = "metric_samples"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(200))
    resolution: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    fast_read_bps: Mapped[float] = mapped_column(Float, default=0.0)
    fast_write_bps: Mapped[float] = mapped_column(Float, default=0.0)
    slow_read_bps: Mapped[float] = mapped_column(Float, default=0.0)
    slow_write_bps: Mapped[float] = mapped_column(Float, default=0.0)
    remote_read_bps: Mapped[float] = mapped_column(Float, default=0.0)
    hits: Mapped[float] = mapped_column(Float, default=0.0)
    misses: Mapped[float] = mapped_column(Float, default=0.0)
    hit_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    metadata_ops_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    remote_fetches_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    migrations_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    migration_bps: Mapped[float] = mapped_column(Float, default=0.0)
    migrations_in_flight: Mapped[float] = mapped_column(Float, default=0.0)
    dht_backlog: Mapped[float] = mapped_column(Float, default=0.0)
    fast_used: Mapped[float] = mapped_column(Float, default=0.0)
    slow_used: Mapped[float] = mapped_column(Float, default=0.0)

    __table_args__ = (Index("ix_metric_samples_node_res_ts", "node_id", "resolution", "ts"),)

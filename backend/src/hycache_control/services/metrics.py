"""Node metrics: rates from the agents' cumulative counters, a background writer that
batches inserts, retention and downsampling (1 s samples for ``raw_retention_s``, 1 min
averages for ``minute_retention_s``), and range queries."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, func, insert, select

from ..db import Database
from ..models import SAMPLE_FIELDS, MetricSample, table_of
from .errors import Invalid
from .status import dig

log = logging.getLogger(__name__)

#: at most this many samples per query answer
MAX_SAMPLES = 20_000
#: rate fields averaged when downsampling; the others are gauges (also averaged)
RATE_FIELDS = tuple(f for f in SAMPLE_FIELDS if f != "hit_ratio")


def gauges(status: dict | None) -> dict[str, float]:
    """The gauges of a sample, from the agent's status (``hycache-agent status --json``)."""
    active = dig(status, "migrations", "active", default=[])
    return {
        "migrations_in_flight": float(len(active) if isinstance(active, list) else 0),
        "dht_backlog": float(dig(status, "cluster", "backlog")),
        "fast_used": float(dig(status, "tiers", "fast", "used")),
        "slow_used": float(dig(status, "tiers", "slow", "used")),
    }


def rates(prev: dict, prev_sent: float, cur: dict, cur_sent: float) -> dict[str, float | None] | None:
    """Per-second rates between two counter snapshots of ONE boot; None when they cannot
    be compared (no time passed, or a counter went backwards: the agent restarted without
    a new boot id, so nothing is invented)."""
    dt = cur_sent - prev_sent
    if dt <= 0:
        return None

    def delta(*path: str) -> float | None:
        a, b = float(dig(cur, *path)), float(dig(prev, *path))
        return None if a < b else a - b

    pairs = {
        "fast_read_bps": ("fast", "read_bytes"), "fast_write_bps": ("fast", "write_bytes"),
        "slow_read_bps": ("slow", "read_bytes"), "slow_write_bps": ("slow", "write_bytes"),
        "remote_read_bps": ("remote", "read_bytes"), "hits": ("fast", "hits"), "misses": ("misses",),
        "metadata_ops_per_s": ("metadata_ops",), "remote_fetches_per_s": ("remote", "fetches"),
        "migrations_per_s": ("migrations",), "migration_bps": ("migration_bytes",),
    }
    out: dict[str, float] = {}
    for name, path in pairs.items():
        d = delta(*path)
        if d is None:
            return None
        out[name] = d / dt
    total = out["hits"] + out["misses"]
    return {**out, "hit_ratio": out["hits"] / total if total > 0 else None}


SAMPLE_COLUMNS = ("node_id", "ts", "resolution", *SAMPLE_FIELDS)


def insert_samples(s, samples: list[dict]) -> None:
    """Insert samples in the session's transaction: COPY on PostgreSQL (1,000 rows a second
    cost a few ms, where a multi-row INSERT spent more converting its parameters), a
    Core bulk insert elsewhere."""
    if s.get_bind().dialect.name == "postgresql":
        conn = s.connection().connection.driver_connection  # psycopg, inside this transaction
        with conn.cursor() as cur, cur.copy(f"COPY {MetricSample.__tablename__} ({', '.join(SAMPLE_COLUMNS)}) "
                                            "FROM STDIN") as cp:
            for r in samples:
                cp.write_row([r.get(c, 0.0 if c in SAMPLE_FIELDS and c != "hit_ratio" else None)
                              for c in SAMPLE_COLUMNS])
    else:
        s.execute(table_of(MetricSample).insert(), samples)


class MetricsQueue:
    """The samples and node rows waiting for the :class:`MetricsWriter` (a heartbeat costs
    a queue put, not a commit)."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()

    def sample(self, row: dict) -> None:
        self.q.put(("sample", row))

    def node(self, row: dict) -> None:
        self.q.put(("node", row))


class MetricsWriter:
    """A thread that flushes queued samples and node rows (``rows``) in batches (one
    transaction per ``flush_interval``)."""

    def __init__(self, db: Database, flush_interval: float, node_sink: Callable[[Any, list[dict]], None],
                 also: list[Callable[[], None]] | None = None, after: list[Callable[[], None]] | None = None,
                 rows: MetricsQueue | None = None) -> None:
        self.db = db
        self.rows = rows if rows is not None else MetricsQueue()
        self.also = also or []  # other batched writes flushed by this thread (events, token use)
        self.after = after or []  # ... and after the samples and node rows (shared liveness)
        self.flush_interval = flush_interval
        self.node_sink = node_sink
        self.q = self.rows.q
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
        # one flush at a time: a flush() returns once what was queued before it is committed,
        # also when the writer's own flush had taken those rows and was still committing them
        # (a test's flush right after its heartbeats found the queue empty and returned first)
        self._flushing = threading.RLock()
        self.flushed_samples = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def sample(self, row: dict) -> None:
        self.rows.sample(row)

    def node(self, row: dict) -> None:
        self.rows.node(row)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self.flush()
        self.flush()

    def flush(self) -> None:
        with self._flushing:
            self._run_hooks(self.also)
            self._flush_queue()
            self._run_hooks(self.after)

    @staticmethod
    def _run_hooks(hooks) -> None:
        for fn in hooks:
            try:
                fn()
            except Exception as e:
                log.warning("writer: %s failed, retrying: %s", getattr(fn, "__qualname__", fn), e)

    def _flush_queue(self) -> None:
        samples: list[dict] = []
        nodes: dict[str, dict] = {}
        while True:
            try:
                kind, row = self.q.get_nowait()
            except queue.Empty:
                break
            if kind == "sample":
                samples.append(row)
            else:
                nodes[row["id"]] = row  # the latest row of a node wins
        if not samples and not nodes:
            return
        try:
            with self.db.session() as s:
                if samples:
                    insert_samples(s, samples)
                if nodes:
                    self.node_sink(s, list(nodes.values()))
            self.flushed_samples += len(samples)
            self.last_error = None
        except Exception as e:  # the database is away: keep the rows for the next flush
            self.last_error = str(e)
            log.warning("metrics writer: flush of %d samples failed, retrying: %s", len(samples), e)
            for r in samples:
                self.q.put(("sample", r))
            for r in nodes.values():
                self.q.put(("node", r))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


class MetricsService:
    def __init__(self, db: Database, raw_retention_s: float, minute_retention_s: float) -> None:
        self.db = db
        self.raw_retention_s = raw_retention_s
        self.minute_retention_s = minute_retention_s
        self._lock = threading.Lock()

    def add(self, node_id: str, ts: float, values: dict[str, float | None], resolution: int = 1) -> None:
        """(direct write, for tests and imports; heartbeats go through MetricsWriter)"""
        with self.db.session() as s:
            s.execute(insert(MetricSample), [{"node_id": node_id, "ts": ts, "resolution": resolution,
                                              **{f: values.get(f, 0.0) for f in SAMPLE_FIELDS}}])

    def query(self, node_id: str, since: float, until: float, step: float, now: float | None = None) -> tuple[int, list[dict]]:
        """(resolution used, samples) of ``node_id`` in [since, until], averaged per ``step``."""
        now = time.time() if now is None else now
        if until < since:
            raise Invalid(("query", "until"), "until must not be before since")
        if (until - since) / step > MAX_SAMPLES:
            raise Invalid(("query", "step"), f"step too small for this range (at most {MAX_SAMPLES} samples)")
        resolution = 60 if step >= 60 or since < now - self.raw_retention_s else 1
        cols = [MetricSample.ts, *(getattr(MetricSample, f) for f in SAMPLE_FIELDS)]
        with self.db.session() as s:
            rows = s.execute(select(*cols).where(MetricSample.node_id == node_id,
                                                 MetricSample.resolution == resolution,
                                                 MetricSample.ts >= since, MetricSample.ts <= until)
                             .order_by(MetricSample.ts)).all()
        samples = [dict(zip(("ts", *SAMPLE_FIELDS), r)) for r in rows]
        if step <= resolution:
            return resolution, samples
        return resolution, _bucket(samples, since, step)

    def downsample(self, now: float | None = None) -> int:
        """Average every finished minute of 1 s samples into one 1 min sample (once per
        node and minute), then drop samples past their retention.  Returns minutes written."""
        now = time.time() if now is None else now
        boundary = math.floor(now / 60) * 60  # minutes before this one are finished
        with self._lock, self.db.session() as s:
            done = dict(s.execute(select(MetricSample.node_id, func.max(MetricSample.ts))
                                  .where(MetricSample.resolution == 60).group_by(MetricSample.node_id)).all())
            start = now - self.raw_retention_s - 120
            cols = [MetricSample.node_id, MetricSample.ts, *(getattr(MetricSample, f) for f in SAMPLE_FIELDS)]
            rows = s.execute(select(*cols).where(MetricSample.resolution == 1, MetricSample.ts >= start,
                                                 MetricSample.ts < boundary)).all()
            buckets: dict[tuple[str, float], list] = defaultdict(list)
            for r in rows:
                minute = math.floor(r[1] / 60) * 60
                if minute > done.get(r[0], -1.0):
                    buckets[(r[0], minute)].append(r[2:])
            out = []
            for (node, minute), vals in buckets.items():
                avg = {f: _mean([v[i] for v in vals]) for i, f in enumerate(SAMPLE_FIELDS)}
                for f in SAMPLE_FIELDS:
                    if avg[f] is None and f != "hit_ratio":
                        avg[f] = 0.0
                out.append({"node_id": node, "ts": float(minute), "resolution": 60, **avg})
            if out:
                s.execute(insert(MetricSample), out)
            s.execute(delete(MetricSample).where(MetricSample.resolution == 1,
                                                 MetricSample.ts < now - self.raw_retention_s))
            s.execute(delete(MetricSample).where(MetricSample.resolution == 60,
                                                 MetricSample.ts < now - self.minute_retention_s))
        return len(out)


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _bucket(samples: list[dict], since: float, step: float) -> list[dict]:
    groups: dict[int, list[dict]] = defaultdict(list)
    for smp in samples:
        groups[int((smp["ts"] - since) // step)].append(smp)
    out = []
    for k in sorted(groups):
        g = groups[k]
        row: dict[str, float | None] = {"ts": since + k * step}
        for f in SAMPLE_FIELDS:
            row[f] = _mean([x[f] for x in g])
            if row[f] is None and f != "hit_ratio":
                row[f] = 0.0
        out.append(row)
    return out

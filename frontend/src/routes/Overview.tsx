import { useState } from 'react';
import { useNodes, useNodeTable, useSummary, useSummaryHistory } from '../api/hooks';
import type { NodeSort, NodeState } from '../api/types';
import { NodeCard } from '../components/NodeCard';
import { NodeTable } from '../components/NodeTable';
import { EmptyState, ErrorState, LoadingState } from '../components/States';
import { ThroughputChart } from '../components/ThroughputChart';
import { TieringPanel } from '../components/TieringPanel';
import { formatBytes, formatPercent, formatRate } from '../format';

/** up to this many nodes the overview shows a card per node; above it, the node table */
export const CARDS_UP_TO = 24;
const PAGE = 50;
/** the window of the cluster-wide charts */
const HISTORY_SECONDS = 600;

export function Overview() {
  const summary = useSummary();
  const small = summary.data !== undefined && summary.data.nodes <= CARDS_UP_TO;
  return (
    <section aria-labelledby="overview-title">
      <h1 id="overview-title">Cluster overview</h1>
      {summary.isPending ? (
        <LoadingState label="Loading nodes" />
      ) : summary.isError && !summary.data ? (
        <ErrorState error={summary.error} title="Cannot load the nodes" />
      ) : summary.data.nodes === 0 ? (
        <EmptyState>No node has reported to the control plane yet. Start an agent with the control plane's URL and a node token.</EmptyState>
      ) : (
        <>
          {summary.isError && <ErrorState error={summary.error} title="Showing the last known state" />}
          <ClusterSummary />
          <ClusterTiering />
          <ClusterCharts />
          {small ? <NodeCards /> : <Nodes />}
        </>
      )}
    </section>
  );
}

function NodeCards() {
  const q = useNodes();
  return (
    <div className="grid">
      {(q.data?.items ?? []).map((n) => (
        <NodeCard key={n.id} node={n} />
      ))}
    </div>
  );
}

function Nodes() {
  const [sort, setSort] = useState<{ sort: NodeSort; desc: boolean }>({ sort: 'id', desc: false });
  const [filter, setFilter] = useState<{ state: NodeState | ''; q: string }>({ state: '', q: '' });
  const [offset, setOffset] = useState(0);
  const t = useNodeTable({ ...sort, state: filter.state || undefined, q: filter.q, offset, limit: PAGE });
  if (t.isError && !t.data) return <ErrorState error={t.error} title="Cannot load the node table" />;
  return (
    <NodeTable
      items={t.data?.items ?? []}
      total={t.data?.total ?? 0}
      {...sort}
      {...filter}
      offset={offset}
      pageSize={PAGE}
      onSort={(s, desc) => {
        setSort({ sort: s, desc });
        setOffset(0);
      }}
      onFilter={(state, q) => {
        setFilter({ state, q });
        setOffset(0);
      }}
      onPage={setOffset}
    />
  );
}

/** Computed by the server over every node (GET /summary), whatever the cluster's size. */
function ClusterSummary() {
  const { data: s } = useSummary();
  if (!s) return null;
  const r = s.rates;
  return (
    <dl className="summary card" aria-label="Cluster summary">
      <div><dt>Nodes up</dt><dd>{s.up}</dd></div>
      <div><dt>Degraded</dt><dd>{s.degraded}</dd></div>
      <div><dt>Down</dt><dd>{s.down}</dd></div>
      <div><dt>Hit ratio</dt><dd>{formatPercent(s.hit_ratio)}</dd></div>
      <div><dt>Read now</dt><dd>{formatRate((r.fast_read_bps ?? 0) + (r.slow_read_bps ?? 0))}</dd></div>
      <div><dt>Write now</dt><dd>{formatRate((r.fast_write_bps ?? 0) + (r.slow_write_bps ?? 0))}</dd></div>
      <div><dt>Fast tier</dt><dd>{formatBytes(s.tiers.fast?.used)} of {formatBytes(s.tiers.fast?.capacity)}</dd></div>
      <div><dt>Slow tier</dt><dd>{formatBytes(s.tiers.slow?.used)} of {formatBytes(s.tiers.slow?.capacity)}</dd></div>
      <div><dt>Heartbeat interval</dt><dd>{s.interval} s</dd></div>
    </dl>
  );
}

function ClusterTiering() {
  const { data: s } = useSummary();
  if (!s?.tiering) return null;
  return <TieringPanel tiering={s.tiering} label="What the tiering bought, cluster" />;
}

/** Capacity and throughput over every node, as the server sums them (GET /summary/history). */
function ClusterCharts() {
  const h = useSummaryHistory(HISTORY_SECONDS);
  if (h.isError && !h.data) return <ErrorState error={h.error} title="Cannot load the cluster's history" />;
  const points = h.data?.points ?? [];
  return (
    <div className="charts charts-2">
      <ThroughputChart
        title="Cluster capacity used per tier"
        unit="%"
        windowSeconds={HISTORY_SECONDS}
        samples={points}
        series={[
          { key: 'fast_used_pct', label: 'fast tier', color: 'var(--c1)' },
          { key: 'slow_used_pct', label: 'slow tier', color: 'var(--c3)' },
        ]}
      />
      <ThroughputChart
        title="Cluster throughput"
        unit="MB/s"
        scale={1e6}
        windowSeconds={HISTORY_SECONDS}
        samples={points}
        series={[
          { key: 'fast_read_bps', label: 'read from fast tier', color: 'var(--c1)' },
          { key: 'slow_read_bps', label: 'read from slow tier', color: 'var(--c3)' },
          { key: 'write_bps', label: 'write', color: 'var(--c2)' },
          { key: 'remote_read_bps', label: 'remote read', color: 'var(--c5)' },
          { key: 'migration_bps', label: 'promoted + evicted', color: 'var(--c4)' },
        ]}
      />
    </div>
  );
}

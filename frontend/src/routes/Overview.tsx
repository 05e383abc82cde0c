import { useNodes } from '../api/hooks';
import { NodeCard } from '../components/NodeCard';
import { EmptyState, ErrorState, LoadingState } from '../components/States';
import { formatPercent, formatRate } from '../format';

export function Overview() {
  const q = useNodes();
  return (
    <section aria-labelledby="overview-title">
      <h1 id="overview-title">Cluster overview</h1>
      {q.isPending ? (
        <LoadingState label="Loading nodes" />
      ) : q.isError && !q.data ? (
        <ErrorState error={q.error} title="Cannot load the nodes" />
      ) : q.data.items.length === 0 ? (
        <EmptyState>No node has reported to the control plane yet. Start an agent with the control plane's URL and a node token.</EmptyState>
      ) : (
        <>
          {q.isError && <ErrorState error={q.error} title="Showing the last known state" />}
          <ClusterSummary />
          <div className="grid">
            {q.data.items.map((n) => (
              <NodeCard key={n.id} node={n} />
            ))}
          </div>
        </>
      )}
    </section>
  );
}

function ClusterSummary() {
  const { data } = useNodes();
  const nodes = data?.items ?? [];
  const count = (s: string) => nodes.filter((n) => n.state === s).length;
  const sum = (f: (r: NonNullable<(typeof nodes)[number]['rates']>) => number | undefined) =>
    nodes.reduce((a, n) => a + (n.rates ? (f(n.rates) ?? 0) : 0), 0);
  const ratios = nodes.map((n) => n.hit_ratio).filter((r): r is number => typeof r === 'number');
  const backlog = nodes.reduce((a, n) => a + (n.dht.backlog ?? 0), 0);
  const migrating = nodes.reduce((a, n) => a + n.migrations.active.length, 0);
  return (
    <dl className="summary card" aria-label="Cluster summary">
      <div><dt>Nodes up</dt><dd>{count('up')}</dd></div>
      <div><dt>Degraded</dt><dd>{count('degraded')}</dd></div>
      <div><dt>Down</dt><dd>{count('down')}</dd></div>
      <div><dt>Mean hit ratio</dt><dd>{ratios.length ? formatPercent(ratios.reduce((a, b) => a + b, 0) / ratios.length) : '—'}</dd></div>
      <div><dt>Read now</dt><dd>{formatRate(sum((r) => (r.fast_read_bps ?? 0) + (r.slow_read_bps ?? 0)))}</dd></div>
      <div><dt>Write now</dt><dd>{formatRate(sum((r) => (r.fast_write_bps ?? 0) + (r.slow_write_bps ?? 0)))}</dd></div>
      <div><dt>Migrations</dt><dd>{migrating}</dd></div>
      <div><dt>DHT backlog</dt><dd>{backlog}</dd></div>
    </dl>
  );
}

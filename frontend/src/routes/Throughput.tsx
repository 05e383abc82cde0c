import { useMemo } from 'react';
import { useSearchParams } from 'react-router';
import { useLiveSamples, useMetrics, useNodes } from '../api/hooks';
import type { MetricSample } from '../api/types';
import { ThroughputChart } from '../components/ThroughputChart';
import { COUNTING } from '../components/TieringPanel';
import { EmptyState, ErrorState, LoadingState } from '../components/States';

export const WINDOWS = [
  { key: '5m', label: '5 min', seconds: 300 },
  { key: '1h', label: '1 hour', seconds: 3600 },
  { key: '6h', label: '6 hours', seconds: 6 * 3600 },
  { key: '24h', label: '24 hours', seconds: 86400 },
  { key: '7d', label: '7 days', seconds: 7 * 86400 },
] as const;

export function Throughput() {
  const [params, setParams] = useSearchParams();
  const nodes = useNodes();
  const items = nodes.data?.items ?? [];
  const nodeId = params.get('node') ?? items[0]?.id ?? '';
  const win = WINDOWS.find((w) => w.key === params.get('window')) ?? WINDOWS[0];
  const set = (k: string, v: string) => {
    const p = new URLSearchParams(params);
    p.set(k, v);
    setParams(p, { replace: true });
  };

  return (
    <section aria-labelledby="tp-title">
      <h1 id="tp-title">Throughput</h1>
      {nodes.isPending ? (
        <LoadingState label="Loading nodes" />
      ) : nodes.isError && !nodes.data ? (
        <ErrorState error={nodes.error} />
      ) : items.length === 0 ? (
        <EmptyState>No node has reported yet.</EmptyState>
      ) : (
        <>
          <div className="toolbar">
            <label htmlFor="tp-node">Node</label>
            <select id="tp-node" value={nodeId} onChange={(e) => set('node', e.target.value)}>
              {items.map((n) => (
                <option key={n.id} value={n.id}>
                  {n.id} ({n.state})
                </option>
              ))}
            </select>
            <div role="radiogroup" aria-label="Time window" className="segmented">
              {WINDOWS.map((w) => (
                <button key={w.key} type="button" role="radio" aria-checked={w.key === win.key} onClick={() => set('window', w.key)}>
                  {w.label}
                </button>
              ))}
            </div>
          </div>
          {nodeId && <CountingCaption modes={items.find((n) => n.id === nodeId)?.tiering?.counting} />}
          {nodeId && <NodeCharts nodeId={nodeId} windowSeconds={win.seconds} />}
        </>
      )}
    </section>
  );
}

/** What the node's per-tier byte rates include, in its counting mode. */
function CountingCaption({ modes }: { modes: Record<string, number> | undefined }) {
  const mode = Object.keys(modes ?? {})[0] ?? 'unknown';
  return (
    <p className="muted small" data-testid="throughput-caption">
      Bytes per tier: {COUNTING[mode] ?? COUNTING.unknown}
    </p>
  );
}

/** History from /metrics, extended by the samples the stream brought since. */
export function mergeSamples(history: MetricSample[], live: MetricSample[], cutoff: number): MetricSample[] {
  const lastTs = history.length ? history[history.length - 1]!.ts : 0;
  return [...history, ...live.filter((s) => s.ts > lastTs && s.ts >= cutoff)];
}

function NodeCharts({ nodeId, windowSeconds }: { nodeId: string; windowSeconds: number }) {
  const m = useMetrics(nodeId, windowSeconds);
  const live = useLiveSamples(nodeId);
  const history = m.data?.samples;
  const samples = useMemo(() => {
    const h = history ?? [];
    const first = h.length ? h[0]!.ts : 0;
    return mergeSamples(h, live.data ?? [], first);
  }, [history, live.data]);
  if (m.isPending) return <LoadingState label="Loading metrics" />;
  if (m.isError && !m.data) return <ErrorState error={m.error} title="Cannot load the metrics" />;
  return (
    <div className="charts">
      <ThroughputChart
        title={`Read and write throughput per tier, node ${nodeId}`}
        unit="MB/s"
        scale={1e6}
        windowSeconds={windowSeconds}
        samples={samples}
        series={[
          { key: 'fast_read_bps', label: 'fast read', color: 'var(--c1)' },
          { key: 'fast_write_bps', label: 'fast write', color: 'var(--c2)' },
          { key: 'slow_read_bps', label: 'slow read', color: 'var(--c3)' },
          { key: 'slow_write_bps', label: 'slow write', color: 'var(--c4)' },
          { key: 'remote_read_bps', label: 'remote read', color: 'var(--c5)' },
        ]}
      />
      <ThroughputChart
        title={`Hits and misses, node ${nodeId}`}
        unit="opens"
        windowSeconds={windowSeconds}
        samples={samples}
        series={[
          { key: 'hits', label: 'hits', color: 'var(--c2)' },
          { key: 'misses', label: 'misses', color: 'var(--c4)' },
        ]}
      />
      <ThroughputChart
        title={`Metadata operations and remote fetches, node ${nodeId}`}
        unit="ops/s"
        windowSeconds={windowSeconds}
        samples={samples}
        series={[
          { key: 'metadata_ops_per_s', label: 'metadata ops', color: 'var(--c1)' },
          { key: 'remote_fetches_per_s', label: 'remote fetches', color: 'var(--c5)' },
          { key: 'migrations_per_s', label: 'migrations', color: 'var(--c3)' },
        ]}
      />
    </div>
  );
}

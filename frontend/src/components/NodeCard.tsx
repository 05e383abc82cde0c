import { Link } from 'react-router';
import type { Node, Rates } from '../api/types';
import { formatAgo, formatBytes, formatPercent, formatRate } from '../format';
import { NodeStateBadge } from './NodeStateBadge';
import { TierBar } from './TierBar';
import { MigrationList } from './MigrationList';
import { MoveCounters } from './MoveCounters';

/** One node of the cluster: state, both tiers, hit ratio, throughput now, migrations.
 * `explain`: say under the counters what each includes (the node's own page). */
export function NodeCard({ node, explain = false }: { node: Node; explain?: boolean }) {
  const r: Partial<Rates> = node.rates ?? {};
  return (
    <article className={`card nodecard nodecard-${node.state}`} aria-labelledby={`node-${node.id}`}>
      <header className="nodecard-head">
        <h3 id={`node-${node.id}`}>
          <Link to={`/nodes/${encodeURIComponent(node.id)}`}>Node {node.id}</Link>
        </h3>
        <NodeStateBadge state={node.state} />
      </header>
      <p className="muted small">
        {node.address ?? 'standalone'} · heartbeat {formatAgo(node.last_heartbeat)}
        {node.policy.policy ? ` · policy ${node.policy.policy}` : ''}
      </p>
      <TierBar name="fast" tier={node.tiers.fast} explain={explain} />
      <TierBar name="slow" tier={node.tiers.slow} />
      <dl className="stats">
        <div>
          <dt>Hit ratio</dt>
          <dd>{formatPercent(node.hit_ratio)}</dd>
        </div>
        <div>
          <dt>Fast read / write</dt>
          <dd>
            {formatRate(r.fast_read_bps)} / {formatRate(r.fast_write_bps)}
          </dd>
        </div>
        <div>
          <dt>Slow read / write</dt>
          <dd>
            {formatRate(r.slow_read_bps)} / {formatRate(r.slow_write_bps)}
          </dd>
        </div>
        <div>
          <dt>DHT backlog</dt>
          <dd>
            {node.dht.backlog ?? '—'} ({node.dht.state ?? 'standalone'})
          </dd>
        </div>
        <div>
          <dt>Migrations done</dt>
          <dd>
            {node.migrations.done} ({formatBytes(node.migrations.bytes)})
          </dd>
        </div>
      </dl>
      <MoveCounters node={node} explain={explain} />
      <MigrationList migrations={node.migrations.active} />
    </article>
  );
}

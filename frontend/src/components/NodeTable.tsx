import { Link } from 'react-router';
import type { Node, NodeSort, NodeState, Tier } from '../api/types';
import { formatAgo, formatBytes, formatPercent, formatRate } from '../format';
import { NodeStateBadge } from './NodeStateBadge';

export interface NodeTableProps {
  items: Node[];
  total: number;
  sort: NodeSort;
  desc: boolean;
  state: NodeState | '';
  q: string;
  offset: number;
  pageSize: number;
  onSort: (sort: NodeSort, desc: boolean) => void;
  onFilter: (state: NodeState | '', q: string) => void;
  onPage: (offset: number) => void;
}

const COLUMNS: { key: NodeSort | null; label: string }[] = [
  { key: 'id', label: 'Node' },
  { key: 'state', label: 'State' },
  { key: 'last_heartbeat', label: 'Heartbeat' },
  { key: 'fast_used', label: 'Fast tier used' },
  { key: 'slow_used', label: 'Slow tier used' },
  { key: 'hit_ratio', label: 'Hit ratio' },
  { key: null, label: 'Read now' },
];

/** Every node of a large cluster: sorted, filtered and paged by the server; a node's
 * detail is one click away. */
export function NodeTable(p: NodeTableProps) {
  const last = Math.min(p.offset + p.pageSize, p.total);
  return (
    <div className="card nodetable">
      <form className="nodetable-filters" role="search" aria-label="Filter nodes" onSubmit={(e) => e.preventDefault()}>
        <label>
          State{' '}
          <select value={p.state} onChange={(e) => p.onFilter(e.target.value as NodeState | '', p.q)}>
            <option value="">any</option>
            <option value="up">up</option>
            <option value="degraded">degraded</option>
            <option value="down">down</option>
          </select>
        </label>
        <label>
          Name contains{' '}
          <input type="search" value={p.q} onChange={(e) => p.onFilter(p.state, e.target.value)} />
        </label>
      </form>
      <table aria-label="Nodes">
        <thead>
          <tr>
            {COLUMNS.map((c) => (
              <th
                key={c.label}
                scope="col"
                aria-sort={c.key && c.key === p.sort ? (p.desc ? 'descending' : 'ascending') : undefined}
              >
                {c.key ? (
                  <button type="button" onClick={() => p.onSort(c.key!, c.key === p.sort ? !p.desc : false)}>
                    {c.label}
                  </button>
                ) : (
                  c.label
                )}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {p.items.map((n) => (
            <tr key={n.id}>
              <th scope="row">
                <Link to={`/nodes/${encodeURIComponent(n.id)}`}>{n.id}</Link>
              </th>
              <td><NodeStateBadge state={n.state} /></td>
              <td>{formatAgo(n.last_heartbeat)}</td>
              <td>
                {formatBytes(n.tiers.fast?.used)}
                <SlackNote tier={n.tiers.fast} />
              </td>
              <td>{formatBytes(n.tiers.slow?.used)}</td>
              <td>{formatPercent(n.hit_ratio)}</td>
              <td>{formatRate((n.rates?.fast_read_bps ?? 0) + (n.rates?.slow_read_bps ?? 0))}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <nav className="pager" aria-label="Node pages">
        <button type="button" disabled={p.offset === 0} onClick={() => p.onPage(Math.max(0, p.offset - p.pageSize))}>
          Previous
        </button>
        <span role="status">
          {p.total === 0 ? 'no node matches' : `${(p.offset + 1).toLocaleString()}–${last.toLocaleString()} of ${p.total.toLocaleString()}`}
        </span>
        <button type="button" disabled={last >= p.total} onClick={() => p.onPage(p.offset + p.pageSize)}>
          Next
        </button>
      </nav>
    </div>
  );
}

/** ", N in slack" when the fast tier's used bytes are above its capacity (writes went on up
 * to its write ceiling while the evictor catches up). */
function SlackNote({ tier }: { tier: Tier | undefined }) {
  const over = tier?.capacity && tier.used != null ? tier.used - tier.capacity : 0;
  if (over <= 0) return null;
  return <span className="muted small">, {formatBytes(over)} in the write slack</span>;
}

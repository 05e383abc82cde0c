import { useSearchParams } from 'react-router';
import { useEvents } from '../api/hooks';
import type { EventKind } from '../api/types';
import { EventList } from '../components/EventList';
import { EmptyState, ErrorState, LoadingState } from '../components/States';

const KINDS: EventKind[] = ['audit', 'node', 'action', 'policy', 'cluster'];

export function Events() {
  const [params, setParams] = useSearchParams();
  const kindParam = params.get('kind') ?? '';
  const kind = KINDS.find((k) => k === kindParam) ?? '';
  const node = params.get('node') ?? '';
  const q = useEvents(kind, node);
  const set = (k: string, v: string) => {
    const p = new URLSearchParams(params);
    if (v) p.set(k, v);
    else p.delete(k);
    setParams(p, { replace: true });
  };
  return (
    <section aria-labelledby="ev-title">
      <h1 id="ev-title">Events</h1>
      <div className="toolbar">
        <label htmlFor="ev-kind">Kind</label>
        <select id="ev-kind" value={kind} onChange={(e) => set('kind', e.target.value)}>
          <option value="">all</option>
          {KINDS.map((k) => (
            <option key={k} value={k}>
              {k}
            </option>
          ))}
        </select>
        <label htmlFor="ev-node">Node</label>
        <input id="ev-node" type="search" value={node} onChange={(e) => set('node', e.target.value)} />
      </div>
      {q.isPending ? (
        <LoadingState label="Loading events" />
      ) : q.isError && !q.data ? (
        <ErrorState error={q.error} />
      ) : q.data.items.length === 0 ? (
        <EmptyState>No event matches.</EmptyState>
      ) : (
        <EventList events={q.data.items} />
      )}
    </section>
  );
}

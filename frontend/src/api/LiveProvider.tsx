// Feeds the stream into the query cache: `nodes` replaces the node list, `event` and
// `action` refresh the events and the action they name.
import { useEffect, useState, type ReactNode } from 'react';
import { useQueryClient, type QueryClient } from '@tanstack/react-query';
import { keys } from './hooks';
import { openStream, type StreamMessage, type StreamState } from './stream';
import { LiveContext } from './live';
import type { Action, MetricSample, Node } from './types';

/** samples kept from the stream per node (1 s apart: about an hour) */
const LIVE_KEEP = 3600;

type NodeList = { items: Node[]; total: number; limit: number; offset: number };

export function applyMessage(qc: QueryClient, m: StreamMessage): void {
  let data: unknown;
  try {
    data = JSON.parse(m.data);
  } catch {
    return;
  }
  if (m.event === 'nodes') {
    const items = (Array.isArray(data) ? data : (data as { items?: Node[] }).items ?? []) as Node[];
    qc.setQueryData<NodeList>(keys.nodes, { items, total: items.length, limit: items.length, offset: 0 });
    for (const n of items) {
      qc.setQueryData(keys.node(n.id), n);
      const r = n.rates as MetricSample | null | undefined;
      if (r && typeof r.ts === 'number') {
        qc.setQueryData<MetricSample[]>(keys.liveSamples(n.id), (old = []) =>
          old.length && old[old.length - 1]!.ts >= r.ts ? old : [...old.slice(-(LIVE_KEEP - 1)), r],
        );
      }
    }
  } else if (m.event === 'event') {
    void qc.invalidateQueries({ queryKey: ['events'] });
  } else if (m.event === 'action') {
    const a = data as Partial<Action> & { action_id?: number };
    const id = a.action_id ?? a.id;
    if (typeof id === 'number') {
      if (Array.isArray(a.items) && a.action_id === undefined) qc.setQueryData(keys.action(id), a);
      else void qc.invalidateQueries({ queryKey: keys.action(id) });
    }
    void qc.invalidateQueries({ queryKey: ['files'] });
    void qc.invalidateQueries({ queryKey: ['file-info'] });
  }
}

export function LiveProvider({ token, children }: { token: string; children: ReactNode }) {
  const qc = useQueryClient();
  const [state, setState] = useState<StreamState>('connecting');
  useEffect(
    () => openStream({ url: '/api/v1/stream', token, onMessage: (m) => applyMessage(qc, m), onState: setState }),
    [qc, token],
  );
  return <LiveContext.Provider value={state}>{children}</LiveContext.Provider>;
}

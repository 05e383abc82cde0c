// Feeds the stream into the query cache: `summary` replaces the cluster summary, `nodes` the node list, `event` and
// `action` refresh the events and the action they name.
import { useEffect, useState, type ReactNode } from 'react';
import { useQueryClient, type QueryClient } from '@tanstack/react-query';
import { keys } from './hooks';
import { openStream, type StreamMessage, type StreamState } from './stream';
import { LiveContext } from './live';
import type { Action, ActionItem, MetricSample, Node, NodeList } from './types';

/** samples kept from the stream per node (1 s apart: about an hour) */
const LIVE_KEEP = 3600;


export function applyMessage(qc: QueryClient, m: StreamMessage): void {
  let data: unknown;
  try {
    data = JSON.parse(m.data);
  } catch {
    return;
  }
  if (m.event === 'summary') {
    qc.setQueryData(keys.summary, data);
  } else if (m.event === 'nodes') {
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
    // one action item changed: patch it into the cached action that holds it
    const item = data as ActionItem;
    // a plan step of a manifest: its view (step counts, job states) is re-read
    const manifestId = (data as { manifest_id?: number | null }).manifest_id;
    if (typeof manifestId === 'number') {
      void qc.invalidateQueries({ queryKey: keys.manifest(manifestId) });
      void qc.invalidateQueries({ queryKey: keys.manifests, exact: true });
      return;
    }
    let found = false;
    for (const [key, action] of qc.getQueriesData<Action>({ queryKey: ['actions'] })) {
      if (!action || !Array.isArray(action.items) || !action.items.some((i) => i.id === item.id)) continue;
      found = true;
      const items = action.items.map((i) => (i.id === item.id ? { ...i, ...item } : i));
      qc.setQueryData<Action>(key, { ...action, items, state: overall(items) });
    }
    if (!found) void qc.invalidateQueries({ queryKey: ['actions'] });
    if (item.state === 'done' || item.state === 'failed') {
      void qc.invalidateQueries({ queryKey: ['files'] });
      void qc.invalidateQueries({ queryKey: ['file-info'] });
    }
  }
}

/** the action's state from its items (as the control plane computes it) */
function overall(items: ActionItem[]): Action['state'] {
  const final = (i: ActionItem) => i.state === 'done' || i.state === 'failed';
  if (items.every((i) => i.state === 'done')) return 'done';
  if (items.every(final)) return 'failed';
  if (items.every((i) => i.state === 'pending')) return 'pending';
  return 'running';
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

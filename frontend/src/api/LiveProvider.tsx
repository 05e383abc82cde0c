// Feeds the stream into the query cache: `summary` replaces the cluster summary, `nodes` the node list (then
// `nodes-delta` patches the nodes that changed), `event` and
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
    // every node (on connect, or after falling behind the deltas)
    const items = (Array.isArray(data) ? data : (data as { items?: Node[] }).items ?? []) as Node[];
    qc.setQueryData<NodeList>(keys.nodes, { items, total: items.length, limit: items.length, offset: 0 });
    for (const n of items) putNode(qc, n);
  } else if (m.event === 'nodes-delta') {
    // per changed node its id and the fields that changed; a new node comes whole
    const d = data as { changed?: Partial<Node>[]; removed?: string[] };
    const changed = Array.isArray(d.changed) ? d.changed.filter((c) => typeof c?.id === 'string') : [];
    const removed = new Set(Array.isArray(d.removed) ? d.removed : []);
    const byId = new Map<string, Node>();
    // a node's last view: its own cache entry, else the node list's (either may have been
    // garbage-collected by the query cache while nothing showed it)
    const inList = new Map((qc.getQueryData<NodeList>(keys.nodes)?.items ?? []).map((n) => [n.id, n]));
    for (const c of changed) {
      const old = qc.getQueryData<Node>(keys.node(c.id!)) ?? inList.get(c.id!);
      if (!old && !('state' in c && 'tiers' in c)) continue; // a part of a node we never saw whole
      const n = { ...(old ?? {}), ...c } as Node;
      byId.set(n.id, n);
      putNode(qc, n);
    }
    for (const id of removed) qc.removeQueries({ queryKey: keys.node(id), exact: true });
    qc.setQueryData<NodeList>(keys.nodes, (list) => {
      if (!list) return list;
      const items = list.items.filter((n) => !removed.has(n.id)).map((n) => byId.get(n.id) ?? n);
      const known = new Set(items.map((n) => n.id));
      const added = [...byId.values()].filter((n) => !known.has(n.id));
      if (added.length) {
        items.push(...added);
        items.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
      }
      return { ...list, items, total: items.length, limit: items.length };
    });
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

/** one node's view into the cache, and its rates as the next live sample */
function putNode(qc: QueryClient, n: Node): void {
  qc.setQueryData(keys.node(n.id), n);
  const r = n.rates as MetricSample | null | undefined;
  if (r && typeof r.ts === 'number') {
    qc.setQueryData<MetricSample[]>(keys.liveSamples(n.id), (old = []) =>
      old.length && old[old.length - 1]!.ts >= r.ts ? old : [...old.slice(-(LIVE_KEEP - 1)), r],
    );
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

import { QueryClient } from '@tanstack/react-query';
import { keys } from './hooks';
import { applyMessage } from './LiveProvider';
import type { Action, MetricSample, Node, NodeList } from './types';

const sample = (ts: number) => ({ ts, fast_read_bps: 1e6, fast_write_bps: 0, slow_read_bps: 0, slow_write_bps: 0, remote_read_bps: 0, hits: 1, misses: 0, metadata_ops_per_s: 0, remote_fetches_per_s: 0, migrations_per_s: 0, migration_bps: 0, migrations_in_flight: 0, dht_backlog: 0, fast_used: 0, slow_used: 0 });
const node = (id: string, ts: number) => ({ id, state: 'up', rates: sample(ts), tiers: {}, dht: {}, migrations: { active: [], done: 0, bytes: 0 }, policy: { version: 0, applied_version: 0 } });

test('a nodes message replaces the node list and appends each new sample once', () => {
  const qc = new QueryClient();
  applyMessage(qc, { event: 'nodes', data: JSON.stringify([node('a', 100), node('b', 100)]) });
  applyMessage(qc, { event: 'nodes', data: JSON.stringify([node('a', 100)]) }); // same sample again
  applyMessage(qc, { event: 'nodes', data: JSON.stringify([node('a', 101)]) });
  expect(qc.getQueryData<NodeList>(keys.nodes)?.items.map((n) => n.id)).toEqual(['a']);
  expect(qc.getQueryData<MetricSample[]>(keys.liveSamples('a'))?.map((s) => s.ts)).toEqual([100, 101]);
  expect(qc.getQueryData<MetricSample[]>(keys.liveSamples('b'))?.map((s) => s.ts)).toEqual([100]);
});

test('a nodes-delta message patches the changed fields, adds new nodes in order and drops removed ones', () => {
  const qc = new QueryClient();
  applyMessage(qc, { event: 'nodes', data: JSON.stringify([node('a', 100), node('c', 100)]) });
  applyMessage(qc, {
    event: 'nodes-delta',
    data: JSON.stringify({ seq: 2, changed: [{ id: 'a', state: 'degraded', rates: sample(101) }, node('b', 101)], removed: ['c'] }),
  });
  const list = qc.getQueryData<NodeList>(keys.nodes)!;
  expect(list.items.map((n) => [n.id, n.state])).toEqual([['a', 'degraded'], ['b', 'up']]);
  expect(list.total).toBe(2);
  expect(qc.getQueryData<Node>(keys.node('a'))).toMatchObject({ state: 'degraded', policy: { version: 0 } });
  expect(qc.getQueryData<MetricSample[]>(keys.liveSamples('a'))?.map((s) => s.ts)).toEqual([100, 101]);
  expect(qc.getQueryData(keys.node('c'))).toBeUndefined();
  // a node whose own cache entry is gone (nothing showed it) is patched from the list
  qc.removeQueries({ queryKey: keys.node('b'), exact: true });
  applyMessage(qc, { event: 'nodes-delta', data: JSON.stringify({ seq: 3, changed: [{ id: 'b', state: 'down' }], removed: [] }) });
  expect(qc.getQueryData<Node>(keys.node('b'))).toMatchObject({ state: 'down', policy: { version: 0 } });
  // a part of a node never seen whole is not made into a node
  applyMessage(qc, { event: 'nodes-delta', data: JSON.stringify({ seq: 4, changed: [{ id: 'z', state: 'up' }], removed: [] }) });
  expect(qc.getQueryData<NodeList>(keys.nodes)!.items.map((n) => n.id)).toEqual(['a', 'b']);
});

test('an action message patches the item into the cached action and recomputes its state', () => {
  const qc = new QueryClient();
  const action: Action = {
    id: 7, action: 'pin', state: 'pending', created_at: 1, updated_at: 1, actor: 'admin',
    items: [
      { id: 70, path: '/x', node: 'a', state: 'pending', detail: null },
      { id: 71, path: '/y', node: 'b', state: 'done', detail: null },
    ],
  };
  qc.setQueryData(keys.action(7), action);
  applyMessage(qc, { event: 'action', data: JSON.stringify({ id: 70, path: '/x', node: 'a', state: 'done', detail: 'pinned', tier: 'fast' }) });
  const a = qc.getQueryData<Action>(keys.action(7))!;
  expect(a.items[0]).toMatchObject({ state: 'done', detail: 'pinned' });
  expect(a.state).toBe('done');
});

test('a malformed message is ignored', () => {
  const qc = new QueryClient();
  expect(() => applyMessage(qc, { event: 'nodes', data: '{not json' })).not.toThrow();
  expect(qc.getQueryData(keys.nodes)).toBeUndefined();
});

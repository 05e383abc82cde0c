import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { MemoryRouter } from 'react-router';
import type { Node } from '../api/types';
import { NodeTable, type NodeTableProps } from './NodeTable';

const node = (i: number): Node =>
  ({
    id: `n${i}`, address: null, state: i % 7 === 0 ? 'down' : 'up', state_since: 0, version: '0.1.0', boot_id: 'b',
    last_heartbeat: Date.now() / 1000, heartbeats: 3,
    dht: { state: 'ok', backlog: 0, registry_alive: null, registry_age: null },
    policy: { policy: 'lru', high_watermark: 0.9, low_watermark: 0.7, version: 0, applied_version: 0 },
    tiers: { fast: { capacity: 1 << 30, used: i << 20, files: 1, device_capacity: null, device_free: null, high_watermark_bytes: null, low_watermark_bytes: null } },
    hit_ratio: 0.5, rates: null, counters: null, hccache: null, passthrough: null,
    migrations: { active: [], done: 0, bytes: 0, evictions: 0, promotions: 0, evictions_taken_back: 0, promotions_declined: 0, spills: 0, failed: 0, abandoned: 0 }, updated_at: 0,
  }) as Node;

function setup(over: Partial<NodeTableProps> = {}) {
  const props: NodeTableProps = {
    items: Array.from({ length: 50 }, (_, i) => node(i)), total: 1000, sort: 'id', desc: false, state: '', q: '',
    offset: 0, pageSize: 50, onSort: vi.fn(), onFilter: vi.fn(), onPage: vi.fn(), ...over,
  };
  render(<MemoryRouter><NodeTable {...props} /></MemoryRouter>);
  return props;
}

test('one page of a 1,000-node cluster: rows link to the node, the pager says where we are', async () => {
  const p = setup();
  const table = screen.getByRole('table', { name: 'Nodes' });
  expect(within(table).getAllByRole('row')).toHaveLength(51); // the header and 50 nodes
  expect(within(table).getByRole('link', { name: 'n7' })).toHaveAttribute('href', '/nodes/n7');
  expect(screen.getByRole('status')).toHaveTextContent('1–50 of 1,000');
  expect(screen.getByRole('button', { name: 'Previous' })).toBeDisabled();
  await userEvent.click(screen.getByRole('button', { name: 'Next' }));
  expect(p.onPage).toHaveBeenCalledWith(50);
});

test('sorting by a column, then again reverses it; the sorted column says so', async () => {
  const p = setup({ sort: 'hit_ratio', desc: false });
  expect(screen.getByRole('columnheader', { name: 'Hit ratio' })).toHaveAttribute('aria-sort', 'ascending');
  await userEvent.click(screen.getByRole('button', { name: 'Hit ratio' }));
  expect(p.onSort).toHaveBeenLastCalledWith('hit_ratio', true);
  await userEvent.click(screen.getByRole('button', { name: 'Fast tier used' }));
  expect(p.onSort).toHaveBeenLastCalledWith('fast_used', false);
});

test('filters by state and by name go to the server', async () => {
  const p = setup();
  await userEvent.selectOptions(screen.getByRole('combobox', { name: 'State' }), 'down');
  expect(p.onFilter).toHaveBeenLastCalledWith('down', '');
  await userEvent.type(screen.getByRole('searchbox', { name: 'Name contains' }), 'x');
  expect(p.onFilter).toHaveBeenLastCalledWith('', 'x');
});

test('the last page and an empty match', () => {
  setup({ offset: 950, total: 1000 });
  expect(screen.getByRole('status')).toHaveTextContent('951–1,000 of 1,000');
  expect(screen.getByRole('button', { name: 'Next' })).toBeDisabled();
});

test('a node whose fast tier is above its capacity says how much is in the write slack', () => {
  const over = node(3);
  over.tiers.fast = { ...over.tiers.fast!, capacity: 8 << 20, used: 12 << 20, write_ceiling: 16 << 20 };
  setup({ items: [over, node(4)], total: 2 });
  const rows = within(screen.getByRole('table', { name: 'Nodes' })).getAllByRole('row');
  expect(rows[1]).toHaveTextContent('12.0 MiB, 4.00 MiB in the write slack');
  expect(rows[2]).not.toHaveTextContent('in the write slack');
});

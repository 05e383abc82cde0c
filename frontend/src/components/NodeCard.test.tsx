import { render, screen, within } from '@testing-library/react';
import { MemoryRouter } from 'react-router';
import type { Node } from '../api/types';
import { ApiError } from '../api/client';
import { NodeCard } from './NodeCard';
import { ErrorState } from './States';

const MiB = 1024 * 1024;
const node: Node = {
  id: 'b',
  address: '127.0.0.1:7071',
  state: 'down',
  state_since: 1763900000,
  version: '0.1.0',
  last_heartbeat: null,
  heartbeats: 10,
  dht: { state: 'ok', backlog: 4 },
  policy: { policy: 'lru', high_watermark: 0.9, low_watermark: 0.7, version: 1, applied_version: 1 },
  tiers: {
    fast: { capacity: 8 * MiB, used: 2 * MiB, files: 2, high_watermark_bytes: 7.2 * MiB, low_watermark_bytes: 5.6 * MiB },
    slow: { capacity: 100 * MiB, used: 50 * MiB, files: 9 },
  },
  hit_ratio: 0.25,
  rates: null,
  migrations: { active: [{ path: '/big', from: 'fast', to: 'slow', copied: MiB, total: 4 * MiB }], done: 3, bytes: 3 * MiB,
    evictions: 2, promotions: 1, evictions_taken_back: 1, promotions_declined: 4, spills: 0, failed: 0, abandoned: 0 },
  copies_kept: { files: 2, bytes: 3 * MiB, adopted: 5 },
  updated_at: 1763900000,
};

test('a down node shows its state, tiers, hit ratio, backlog and migration progress', () => {
  render(
    <MemoryRouter>
      <NodeCard node={node} />
    </MemoryRouter>,
  );
  const card = screen.getByRole('article', { name: 'Node b' });
  expect(within(card).getByText('down', { exact: true })).toBeInTheDocument();
  expect(within(card).getByRole('meter', { name: 'fast tier' })).toHaveAttribute('aria-valuetext', '2.00 MiB of 8.00 MiB used (25.0%), 2 files');
  expect(within(card).getByRole('meter', { name: 'slow tier' })).toHaveAttribute('aria-valuenow', String(50 * MiB));
  expect(within(card).getByText('25.0%')).toBeInTheDocument();
  expect(within(card).getByText('4 (ok)')).toBeInTheDocument();
  const progress = within(card).getByRole('progressbar', { name: 'migration of /big' });
  expect(progress).toHaveAttribute('value', String(MiB));
  expect(progress).toHaveAttribute('max', String(4 * MiB));
  expect(within(card).getByText(/heartbeat never/)).toBeInTheDocument();
  const moves = within(card);
  expect(moves.getByText('Evictions taken back').nextElementSibling).toHaveTextContent('1');
  expect(moves.getByText('Promotions', { exact: true }).nextElementSibling).toHaveTextContent('1 (—), 4 declined');
  expect(moves.getByText('Kept remote copies').nextElementSibling).toHaveTextContent('2 (3.00 MiB), 5 reused');
  expect(screen.queryByTestId('moves-caption')).toBeNull();
});

test('on the node page the counters say what they include', () => {
  render(
    <MemoryRouter>
      <NodeCard node={node} explain />
    </MemoryRouter>,
  );
  expect(screen.getByTestId('moves-caption')).toHaveTextContent('evictions a passthrough open cancelled before their switch');
  expect(screen.getByTestId('moves-caption')).toHaveTextContent('Kept remote copies: copies of other nodes');
});

test('error states say what happened: unreachable, 401, 403', () => {
  const { rerender } = render(<ErrorState error={new ApiError(0, 'TypeError: Failed to fetch')} />);
  expect(screen.getByRole('alert')).toHaveTextContent('The control plane cannot be reached');
  rerender(<ErrorState error={new ApiError(401, 'bad token')} />);
  expect(screen.getByRole('alert')).toHaveTextContent('Sign in again');
  rerender(<ErrorState error={new ApiError(403, 'forbidden')} />);
  expect(screen.getByRole('alert')).toHaveTextContent('(403)');
});

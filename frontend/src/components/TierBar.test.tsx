import { render, screen } from '@testing-library/react';
import { TierBar } from './TierBar';

const tier = { capacity: 8 * 1024 * 1024, used: 6 * 1024 * 1024, files: 3, high_watermark_bytes: 7.2 * 1024 * 1024, low_watermark_bytes: 5.6 * 1024 * 1024 };

test('the meter carries the usage and the watermarks are drawn', () => {
  const { container } = render(<TierBar name="fast" tier={tier} />);
  const meter = screen.getByRole('meter', { name: 'fast tier' });
  expect(meter).toHaveAttribute('aria-valuenow', String(6 * 1024 * 1024));
  expect(meter).toHaveAttribute('aria-valuetext', expect.stringContaining('6.00 MiB of 8.00 MiB used (75.0%), 3 files'));
  const high = container.querySelector('.tierbar-high') as HTMLElement;
  const low = container.querySelector('.tierbar-low') as HTMLElement;
  expect(high.style.left).toBe('90%');
  expect(low.style.left).toBe('70%');
  expect(screen.getByText(/watermarks: low 5.60 MiB · high 7.20 MiB/)).toBeInTheDocument();
});

test('a tier above its high watermark is marked', () => {
  const { container } = render(<TierBar name="fast" tier={{ ...tier, used: 7.5 * 1024 * 1024 }} />);
  expect(container.querySelector('.tierbar-fill')).toHaveClass('tierbar-over');
});

test('with a write slack the bar runs to the ceiling: capacity is a mark, used above it is in the slack', () => {
  const MiB = 1024 * 1024;
  const slack = { ...tier, used: 10 * MiB, write_ceiling: 16 * MiB, remote_cache_bytes: MiB };
  const { container } = render(<TierBar name="fast" tier={slack} />);
  const meter = screen.getByRole('meter', { name: 'fast tier' });
  expect(meter).toHaveAttribute('aria-valuemax', String(16 * MiB));
  expect(meter).toHaveAttribute('aria-valuetext', '10.0 MiB of 8.00 MiB used (125%), 2.00 MiB in the write slack (ceiling 16.0 MiB), 3 files');
  expect(screen.getByTestId('tierbar-capacity').style.left).toBe('50%');
  expect(screen.getByTestId('tierbar-ceiling')).toHaveAttribute('title', 'write ceiling 16.0 MiB');
  expect(screen.getByTestId('tierbar-slack').style.left).toBe('50%');
  expect(screen.getByTestId('tierbar-slack').style.width).toBe('12.5%');
  expect((container.querySelector('.tierbar-high') as HTMLElement).style.left).toBe('45%');
  expect(screen.getByTestId('tierbar-legend')).toHaveTextContent('1.00 MiB of the used bytes are copies of other nodes');
});

test('under the capacity nothing is in the slack, but the ceiling is still drawn', () => {
  render(<TierBar name="fast" tier={{ ...tier, write_ceiling: 12 * 1024 * 1024 }} />);
  expect(screen.queryByTestId('tierbar-slack')).toBeNull();
  expect(screen.getByTestId('tierbar-ceiling')).toBeInTheDocument();
  expect(screen.getByRole('meter', { name: 'fast tier' })).toHaveAttribute('aria-valuetext', '6.00 MiB of 8.00 MiB used (75.0%), 3 files');
  // a card keeps its legend short while nothing is in the slack; the node's page explains it
  expect(screen.getByTestId('tierbar-legend')).toHaveTextContent(/capacity 8.00 MiB · write ceiling 12.0 MiB$/);
});

test('the node page says what the slack is even while nothing is in it', () => {
  render(<TierBar name="fast" tier={{ ...tier, write_ceiling: 12 * 1024 * 1024 }} explain />);
  expect(screen.getByTestId('tierbar-legend')).toHaveTextContent('writes go on above the capacity up to the ceiling while the evictor catches up');
});

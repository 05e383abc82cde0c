import { render, screen } from '@testing-library/react';
import { TieringPanel } from './TieringPanel';

const MiB = 1024 * 1024;
const base = {
  hits: 3, misses: 1, hit_ratio: 0.75, fast_read_bytes: 600 * MiB, slow_read_bytes: 7 * MiB, remote_read_bytes: 0,
  fast_write_bytes: 200 * MiB, slow_write_bytes: 0, fast_kernel_read_bytes: 600 * MiB, slow_kernel_read_bytes: 0,
  fast_grown_bytes: 200 * MiB, slow_grown_bytes: 0, promoted_bytes: MiB, evicted_bytes: 2 * MiB,
  kernel_read_events_lost: 0, counting: { traced: 1 },
};

function value(term: string): string | null {
  return screen.getByText(term, { exact: true }).parentElement!.querySelector('dd')!.textContent;
}

test('the figures and what they include with passthrough on', () => {
  render(<TieringPanel tiering={base} label="What the tiering bought, node a" />);
  const panel = screen.getByRole('region', { name: 'What the tiering bought, node a' });
  expect(panel).toBeInTheDocument();
  expect(value('Hit ratio (opens)')).toBe('75.0%');
  expect(value('Read from fast tier')).toBe('600 MiB');
  expect(value('Written to fast tier')).toBe('200 MiB');
  expect(value('Evicted')).toBe('2.00 MiB');
  const caption = screen.getByTestId('tiering-caption');
  expect(caption).toHaveTextContent('Passthrough on');
  expect(caption).toHaveTextContent('overwrites in place are not counted');
  expect(caption).not.toHaveTextContent('missed');
});

test('mixed modes are listed per node count, and missed kernel reads are said', () => {
  render(<TieringPanel tiering={{ ...base, kernel_read_events_lost: 12, counting: { agent: 2, untraced: 1 } }} label="c" />);
  const caption = screen.getByTestId('tiering-caption');
  expect(caption).toHaveTextContent('2 nodes: Passthrough off');
  expect(caption).toHaveTextContent('1 node: Passthrough on, without the kernel');
  expect(caption).toHaveTextContent('12 kernel reads were missed');
});

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

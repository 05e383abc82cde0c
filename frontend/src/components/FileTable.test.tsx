import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { MemoryRouter } from 'react-router';
import type { FileEntry } from '../api/types';
import { FileTable } from './FileTable';

// jsdom lays nothing out: give the scroll box the size a browser would (the real-browser
// tests in e2e/ cover the real layout)
beforeAll(() => {
  const size = (dim: 'clientWidth' | 'clientHeight', px: number) => {
    const orig = Object.getOwnPropertyDescriptor(Element.prototype, dim)!;
    Object.defineProperty(Element.prototype, dim, {
      configurable: true,
      get(this: Element) {
        return this.classList.contains('ft-scroll') ? px : orig.get!.call(this);
      },
    });
  };
  size('clientWidth', 900);
  size('clientHeight', 400);
});

const entry = (i: number, over: Partial<FileEntry> = {}): FileEntry => ({
  name: `f${i}.bin`, path: `/d/f${i}.bin`, kind: 'file', size: 1024 * i, mtime: 1763900000, primary: 'a', tier: 'fast', replicas: [], pinned: false, version: 1, ...over,
});

test('only the visible rows of a big directory are rendered, and the end asks for more', () => {
  const entries = Array.from({ length: 60 }, (_, i) => entry(i));
  const onLoadMore = vi.fn();
  render(
    <MemoryRouter>
      <FileTable entries={entries} hasMore loadingMore={false} onLoadMore={onLoadMore} onAction={null} />
    </MemoryRouter>,
  );
  const rows = screen.getAllByRole('row');
  // header + the rows of a 400 px box (40 px each) + overscan, not 60
  expect(rows.length).toBeGreaterThan(5);
  expect(rows.length).toBeLessThan(40);
  expect(screen.getByRole('row', { name: /f0\.bin/ })).toBeInTheDocument();
  expect(screen.queryByRole('row', { name: /f59\.bin/ })).toBeNull();
  expect(onLoadMore).toHaveBeenCalled(); // 60 loaded, the visible end is within 50 of it
});

test('a row shows tier, node and pinned; actions call back; read-only has no buttons', async () => {
  const onAction = vi.fn();
  const { rerender } = render(
    <MemoryRouter>
      <FileTable entries={[entry(1, { pinned: true, tier: 'slow', primary: 'b' })]} hasMore={false} loadingMore={false} onLoadMore={() => {}} onAction={onAction} />
    </MemoryRouter>,
  );
  const row = screen.getByRole('row', { name: /f1\.bin/ });
  expect(within(row).getByText('slow')).toBeInTheDocument();
  expect(within(row).getByText('pinned')).toBeInTheDocument();
  await userEvent.click(within(row).getByRole('button', { name: 'Unpin f1.bin' }));
  expect(onAction).toHaveBeenCalledWith('unpin', expect.objectContaining({ path: '/d/f1.bin' }));
  rerender(
    <MemoryRouter>
      <FileTable entries={[entry(1)]} hasMore={false} loadingMore={false} onLoadMore={() => {}} onAction={null} />
    </MemoryRouter>,
  );
  expect(screen.queryByRole('button')).toBeNull();
});

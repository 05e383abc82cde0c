// What the tiering bought, after real traffic through a passthrough mount (the default):
// the kernel moves those bytes, and the page still shows them per tier and says how they
// were counted. Needs a stack whose agents run with passthrough: tests/web/test_tiering_web.py.
import { expect, test, type Locator } from '@playwright/test';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { signIn, stack } from './stack';

const MiB = 1024 * 1024;
test.skip(!process.env.HYCACHE_TIERING_E2E, 'run through tests/web/test_tiering_web.py (agents with passthrough)');
const UNITS: Record<string, number> = { B: 1, KiB: 1024, MiB, GiB: 1024 * MiB, TiB: 1024 * 1024 * MiB };

/** the value (bytes) of a `dt`/`dd` pair of a panel, as shown */
async function shownBytes(panel: Locator, term: string): Promise<number> {
  const text = (await panel.locator('div', { has: panel.page().getByText(term, { exact: true }) }).locator('dd').textContent()) ?? '';
  const m = /^([\d.]+) (B|KiB|MiB|GiB|TiB)$/.exec(text.trim());
  return m ? Number(m[1]) * UNITS[m[2]!]! : 0;
}

async function expectTraffic(panel: Locator, read: number, written: number): Promise<void> {
  await expect.poll(() => shownBytes(panel, 'Read from fast tier'), { timeout: 60_000 }).toBeGreaterThanOrEqual(read);
  await expect.poll(() => shownBytes(panel, 'Written to fast tier'), { timeout: 60_000 }).toBeGreaterThanOrEqual(written);
  await expect(panel.getByText('Hit ratio (opens)')).toBeVisible();
  await expect(panel.getByText('Promoted', { exact: true })).toBeVisible();
  await expect(panel.getByText('Evicted', { exact: true })).toBeVisible();
  // the caption says what the figures include in the agents' mode
  await expect(panel.getByTestId('tiering-caption')).toContainText('Passthrough on');
  await expect(panel.getByTestId('tiering-caption')).toContainText('filemap trace point');
  await expect(panel.getByTestId('tiering-caption')).toContainText('overwrites in place are not counted');
}

test('bytes read and written through a passthrough mount show per tier, and what they include', async ({ page }) => {
  const [node, agent] = Object.entries(stack().agents)[0]!;
  const dir = join(agent.mountpoint, `tiering-${Date.now().toString(36)}`);
  mkdirSync(dir);
  const file = join(dir, 'data.bin');
  writeFileSync(file, Buffer.alloc(4 * MiB, 7));
  for (let i = 0; i < 3; i++) expect(readFileSync(file).length).toBe(4 * MiB);

  await signIn(page, stack().admin_token);
  const cluster = page.getByRole('region', { name: 'What the tiering bought, cluster' });
  await expectTraffic(cluster, 12 * MiB, 4 * MiB);

  await page.goto(`/nodes/${encodeURIComponent(node)}`);
  const mine = page.getByRole('region', { name: `What the tiering bought, node ${node}` });
  await expectTraffic(mine, 12 * MiB, 4 * MiB);
  // the per-tier throughput of the node says what its rates include
  await page.goto(`/throughput?node=${encodeURIComponent(node)}`);
  await expect(page.getByTestId('throughput-caption')).toContainText('Passthrough on');
  await page.goto(`/nodes/${encodeURIComponent(node)}`);
  await page.screenshot({ path: join(process.env.HYCACHE_SCREENSHOTS_DIR ?? 'test-results', 'tiering-node.png'), fullPage: true });
});

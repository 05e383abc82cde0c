// The dashboard at 1,000 simulated nodes (tests/web/test_dashboard_scale.py starts a real
// control plane and the nodes, and passes HYCACHE_SCALE_STATE): the counts come from the
// server over every node, the cluster-wide capacity and throughput charts draw, the node
// table sorts, filters and pages, a node is one click away, axe stays clean; the time to render the overview and the bytes per second the
// browser receives are measured and printed (no timed assertion).
import { expect, test } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { readFileSync } from 'node:fs';
import { signIn } from './stack';

interface ScaleState {
  base_url: string;
  admin_token: string;
  nodes: number;
  up: number;
  degraded: number;
  down: number;
}
const stateFile = process.env.HYCACHE_SCALE_STATE;
test.skip(!stateFile, 'run through tests/web/test_dashboard_scale.py');
const scale = (): ScaleState => JSON.parse(readFileSync(stateFile ?? '', 'utf8')) as ScaleState;

function summaryValue(page: import('@playwright/test').Page, term: string) {
  return page.getByLabel('Cluster summary').locator('div').filter({ has: page.locator('dt', { hasText: new RegExp(`^${term}$`) }) }).locator('dd');
}

test('1,000 nodes: counts from the server, the node table, a node one click away', async ({ page }) => {
  const s = scale();
  const t0 = Date.now();
  await signIn(page, s.admin_token);
  const table = page.getByRole('table', { name: 'Nodes' });
  await expect(table.getByRole('row')).toHaveCount(51);
  console.log(`scale: overview rendered (sign-in to a 50-row table of ${s.nodes} nodes) in ${Date.now() - t0} ms`);
  await expect(summaryValue(page, 'Nodes up')).toHaveText(String(s.up));
  await expect(summaryValue(page, 'Degraded')).toHaveText(String(s.degraded));
  await expect(summaryValue(page, 'Down')).toHaveText(String(s.down));
  await expect(page.getByRole('navigation', { name: 'Node pages' }).getByRole('status')).toHaveText(`1–50 of ${s.nodes.toLocaleString('en-US')}`);

  // the bytes per second this browser receives on the overview (the stream and the polls)
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  let bytes = 0;
  cdp.on('Network.dataReceived', (e: { encodedDataLength: number; dataLength: number }) => {
    bytes += e.encodedDataLength || e.dataLength;
  });
  const w0 = Date.now();
  await page.waitForTimeout(10_000);
  console.log(`scale: the overview received ${Math.round(bytes / ((Date.now() - w0) / 1000)).toLocaleString('en-US')} bytes/s over 10 s`);

  // the cluster-wide charts, from points the server sums over every node (GET /summary/history)
  for (const title of ['Cluster capacity used per tier', 'Cluster throughput']) {
    const chart = page.getByRole('figure', { name: title });
    await expect(chart).toBeVisible();
    // a drawn line of at least two points (a constant series is a flat path: Playwright
    // calls its zero-height box hidden, so the check is on the path itself)
    await expect(chart.locator('.recharts-line-curve').first()).toHaveAttribute('d', /^M[^MLC]+[LC]/, { timeout: 30_000 });
  }
  // the legend's entry (a tooltip under the pointer may name the tier too)
  await expect(page.getByRole('figure', { name: 'Cluster capacity used per tier' })
    .locator('.recharts-legend-item-text', { hasText: 'fast tier' })).toBeVisible();

  // filter by state and by name, sort, page
  await page.getByRole('combobox', { name: 'State' }).selectOption('degraded');
  await expect(page.getByRole('navigation', { name: 'Node pages' }).getByRole('status')).toHaveText(`1–${Math.min(50, s.degraded)} of ${s.degraded}`);
  await page.getByRole('combobox', { name: 'State' }).selectOption('');
  await page.getByRole('searchbox', { name: 'Name contains' }).fill('n099');
  await expect(table.getByRole('row')).toHaveCount(11); // n0990 … n0999
  await page.getByRole('searchbox', { name: 'Name contains' }).fill('');
  await table.getByRole('button', { name: 'Node' }).click(); // id, descending
  await expect(table.getByRole('row').nth(1).getByRole('link')).toHaveText(`n${String(s.nodes - 1).padStart(4, '0')}`);
  await page.getByRole('button', { name: 'Next' }).click();
  await expect(page.getByRole('navigation', { name: 'Node pages' }).getByRole('status')).toHaveText(`51–100 of ${s.nodes.toLocaleString('en-US')}`);
  const axe = await new AxeBuilder({ page }).analyze();
  expect(axe.violations.map((v) => `${v.id}: ${v.help}`)).toEqual([]);
  const first = table.getByRole('row').nth(1).getByRole('link');
  const id = await first.textContent();
  await first.click();
  await expect(page.getByRole('heading', { name: `Node ${id}`, level: 1 })).toBeVisible();
});

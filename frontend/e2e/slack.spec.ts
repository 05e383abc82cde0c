// The write slack and the move counters on a node's page, after real writes through a mount:
// an agent with an 8 MiB fast tier and a write slack of 1 (writes may go on up to 16 MiB while
// the evictor catches up) gets a 12 MiB file held open (the evictor never moves an open
// file), so its fast tier stays in the slack; then the file is closed and evicted. Needs the
// stack of tests/web/test_slack_web.py.
import AxeBuilder from '@axe-core/playwright';
import { expect, test, type Locator, type Page } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { closeSync, fsyncSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { formatBytes } from '../src/format';
import { signIn, stack, type AgentState } from './stack';

const MiB = 1024 * 1024;
test.skip(!process.env.HYCACHE_SLACK_E2E, 'run through tests/web/test_slack_web.py (an agent with a write slack)');

interface AgentStatus {
  tiers: { fast: { capacity: number; used: number; write_ceiling: number } };
  migrations: { evictions: number; evictions_taken_back: number; promotions: number; promotions_declined: number; spills: number };
  cluster: { copies_kept: { files: number; bytes: number; adopted: number } } | null;
}

/** `hycache-agent status ROOT --json`: the agent's own answer, which the page must show. */
function agentStatus(agent: AgentState): AgentStatus {
  return JSON.parse(execFileSync(agent.argv[0]!, ['status', '--json', agent.root], { encoding: 'utf8', timeout: 60_000 })) as AgentStatus;
}

/** the `dd` of a term in the node's move counters */
function shown(page: Page, node: string, term: string): Locator {
  const moves = page.locator(`dl[aria-label="Moves between the tiers, node ${node}"]`);
  return moves.locator('div', { has: page.getByText(term, { exact: true }) }).locator('dd');
}

test('used above capacity shows as in the write slack, between the capacity and ceiling marks; evictions counted', async ({ page }) => {
  const [node, agent] = Object.entries(stack().agents)[0]!;
  const dir = join(agent.mountpoint, `slack-${Date.now().toString(36)}`);
  mkdirSync(dir);
  const fd = openSync(join(dir, 'held.bin'), 'w');
  try {
    const chunk = Buffer.alloc(MiB, 5);
    for (let i = 0; i < 12; i++) writeSync(fd, chunk);
    fsyncSync(fd);
    const st = agentStatus(agent);
    const fast = st.tiers.fast;
    expect(fast.capacity).toBe(8 * MiB);
    expect(fast.write_ceiling).toBe(16 * MiB);
    expect(fast.used).toBeGreaterThanOrEqual(12 * MiB);

    await signIn(page, stack().admin_token);
    await page.goto(`/nodes/${encodeURIComponent(node)}`);
    const meter = page.getByRole('meter', { name: 'fast tier' });
    await expect(meter).toHaveAttribute('aria-valuenow', String(fast.used), { timeout: 60_000 });
    await expect(meter).toHaveAttribute('aria-valuemax', String(16 * MiB));
    const over = fast.used - fast.capacity;
    await expect(meter).toHaveAttribute('aria-valuetext', new RegExp(`of 8\\.00 MiB used \\(\\d+%\\), ${formatBytes(over).replace('.', '\\.')} in the write slack \\(ceiling 16\\.0 MiB\\)`));
    // the capacity is a mark halfway along a bar that runs to the ceiling; the slack segment starts there
    await expect(page.getByTestId('tierbar-capacity')).toHaveAttribute('title', 'capacity 8.00 MiB');
    await expect(page.getByTestId('tierbar-capacity')).toHaveAttribute('style', /left: 50%/);
    await expect(page.getByTestId('tierbar-ceiling')).toHaveAttribute('title', 'write ceiling 16.0 MiB');
    await expect(page.getByTestId('tierbar-slack')).toHaveAttribute('style', new RegExp(`left: 50%; width: ${(over / (16 * MiB)) * 100}%`));
    await expect(page.getByTestId('tierbar-legend')).toContainText('used bytes past the capacity mark are in the write slack');
    await expect(page.getByTestId('moves-caption')).toContainText('evictions a passthrough open cancelled before their switch');
    const axe = await new AxeBuilder({ page }).analyze();
    const bad = axe.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(bad.map((v) => `${v.id}: ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)).toEqual([]);
    const shots = process.env.HYCACHE_SCREENSHOTS_DIR ?? 'test-results';
    await page.locator('article.nodecard').screenshot({ path: join(shots, 'node-slack-light.png') });
  } finally {
    closeSync(fd);
  }

  // closed, the file is evictable: the evictor takes the tier back under its watermarks
  await expect.poll(() => agentStatus(agent).migrations.evictions, { timeout: 60_000 }).toBeGreaterThanOrEqual(1);
  await expect(page.getByTestId('tierbar-slack')).toHaveCount(0, { timeout: 60_000 });
  const after = agentStatus(agent);
  await expect(shown(page, node, 'Evictions')).toHaveText(new RegExp(`^${after.migrations.evictions} \\(\\d`));
  await expect(shown(page, node, 'Evictions taken back')).toHaveText(String(after.migrations.evictions_taken_back));
  await expect(shown(page, node, 'Spills')).toHaveText(String(after.migrations.spills));
  await expect(shown(page, node, 'Promotions')).toHaveText(
    new RegExp(`^${after.migrations.promotions} \\(.*\\), ${after.migrations.promotions_declined} declined$`),
  );
  const kept = after.cluster!.copies_kept;
  await expect(shown(page, node, 'Kept remote copies')).toHaveText(`${kept.files} (${formatBytes(kept.bytes)}), ${kept.adopted} reused`);
  // the evicted bytes beside the count are the 12 MiB file's at least
  await expect.poll(async () => (await shown(page, node, 'Evictions').textContent()) ?? '', { timeout: 60_000 }).toMatch(/\((1[2-9]|[2-9]\d)\.\d+ MiB\)$/);
});

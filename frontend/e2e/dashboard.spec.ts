// The dashboard against the real stack: two agents with FUSE mounts, Redis Cluster, the
// control plane. Serial: later scenarios use the files the earlier ones wrote.
import { expect, test, type Page } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { agentWhere, signIn, stack, stackCommand } from './stack';

test.describe.configure({ mode: 'serial' });

const MiB = 1024 * 1024;
const dir = `e2e-${Date.now().toString(36)}`;
const fileName = (i: number) => `f${String(i).padStart(2, '0')}.bin`;

function writeThroughMount(node: string, name: string, bytes: number): void {
  const mnt = stack().agents[node]!.mountpoint;
  mkdirSync(join(mnt, dir), { recursive: true });
  writeFileSync(join(mnt, dir, name), Buffer.alloc(bytes, name.charCodeAt(2)));
}

function nodeCard(page: Page, node: string) {
  return page.getByRole('article', { name: `Node ${node}` });
}

function fileRow(page: Page, name: string) {
  return page.getByRole('row', { name: new RegExp(`^${name.replace('.', '\\.')}`) });
}

/** the cell of a row by its column header (the table's columns, in order) */
const COLS = ['Name', 'Size', 'Node', 'Tier', 'Replicas', 'Pinned', 'Modified', 'Actions'];
function cell(page: Page, name: string, col: string) {
  return fileRow(page, name).getByRole('cell').nth(COLS.indexOf(col));
}

test('a bad token is refused', async ({ page }) => {
  await page.goto('/');
  await expect(page).toHaveURL(/\/signin$/);
  await page.getByLabel('API token').fill('not-a-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('alert')).toContainText('401');
  await expect(page.getByRole('heading', { name: 'Cluster overview' })).toHaveCount(0);
});

test('sign in with the admin token and see both nodes up', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await expect(page.getByLabel('Signed in as')).toContainText('admin');
  for (const node of ['a', 'b']) {
    await expect(nodeCard(page, node)).toBeVisible();
    await expect(nodeCard(page, node).getByText('up', { exact: true })).toBeVisible();
    await expect(nodeCard(page, node).getByRole('meter', { name: 'fast tier' })).toBeVisible();
  }
  await expect(page.getByRole('status', { name: /Live stream live/ })).toBeVisible();
});

test('files written through a mount appear with their node and the fast tier', async ({ page }) => {
  for (let i = 0; i < 3; i++) writeThroughMount('a', fileName(i), MiB);
  await signIn(page, stack().admin_token);
  await page.goto(`/files/${dir}`);
  await expect(page.getByRole('navigation', { name: 'Breadcrumb' })).toContainText(dir);
  for (let i = 0; i < 3; i++) {
    await expect(cell(page, fileName(i), 'Tier')).toHaveText('fast');
    await expect(cell(page, fileName(i), 'Node')).toHaveText('a');
    await expect(cell(page, fileName(i), 'Size')).toHaveText('1.00 MiB');
  }
});

test('a full fast tier (8 MiB) evicts the oldest files to the slow tier', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await page.goto(`/files/${dir}`);
  await expect(cell(page, fileName(0), 'Tier')).toHaveText('fast');
  for (let i = 3; i < 12; i++) writeThroughMount('a', fileName(i), MiB);
  // 12 MiB written into an 8 MiB fast tier: the least recently used go to slow
  await expect(cell(page, fileName(0), 'Tier')).toHaveText('slow', { timeout: 120_000 });
  await expect(cell(page, fileName(11), 'Tier')).toHaveText('fast');
  await page.goto('/');
  await expect(nodeCard(page, 'a').getByRole('meter', { name: 'slow tier' })).toHaveAttribute('aria-valuetext', /[1-9]\S* MiB of/);
});

test('a read-only token sees no mutating controls', async ({ page }) => {
  await signIn(page, stack().read_token);
  await expect(page.getByLabel('Signed in as')).toContainText('read-only');
  await page.goto(`/files/${dir}`);
  await expect(fileRow(page, fileName(1))).toBeVisible();
  await expect(page.getByRole('button', { name: /^(Pin|Unpin|Promote|Demote) / })).toHaveCount(0);
  await page.goto('/policies/a');
  await expect(page.getByLabel('Eviction policy')).toBeVisible();
  await expect(page.getByRole('button', { name: 'Apply policy' })).toHaveCount(0);
});

test('pin a file in the UI and the agent honours it', async ({ page }) => {
  const name = fileName(11);
  const path = join(stack().agents.a!.mountpoint, dir, name);
  await signIn(page, stack().admin_token);
  await page.goto(`/files/${dir}`);
  await page.getByRole('button', { name: `Pin ${name}` }).click();
  const dialog = page.getByRole('dialog', { name: `Pin: /${dir}/${name}` });
  await expect(dialog).toBeVisible();
  await dialog.getByRole('button', { name: 'Confirm pin' }).click();
  const result = dialog.getByRole('region', { name: /Action \d+ result/ });
  await expect(result.getByRole('row', { name: new RegExp(name) })).toContainText('done', { timeout: 60_000 });
  await dialog.getByRole('button', { name: 'Close' }).click();
  await expect(cell(page, name, 'Pinned')).toHaveText('pinned');
  await expect.poll(() => agentWhere(path).pinned, { timeout: 30_000 }).toBe(true);
});

test('the policy form validates and applies a policy live', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await page.goto('/policies/a');
  const form = page.getByRole('form', { name: 'Policy of node a' });
  await form.getByLabel(/High watermark/).fill('0.8');
  await form.getByLabel(/Low watermark/).fill('0.85');
  await form.getByRole('button', { name: 'Apply policy' }).click();
  await expect(form.getByLabel(/Low watermark/)).toHaveAccessibleDescription('Low watermark must be below the high watermark.');
  await form.getByLabel(/Low watermark/).fill('0.6');
  await form.getByLabel('Eviction policy').selectOption('lfu');
  await form.getByRole('button', { name: 'Apply policy' }).click();
  await expect(page.getByRole('status').filter({ hasText: /Saved as version \d+/ })).toBeVisible();
  // the agent picks it up at its next heartbeat
  await expect(form).toContainText('(in effect)', { timeout: 60_000 });
  await page.goto('/events?kind=policy');
  await expect(page.getByRole('table')).toContainText('policy');
});

/** the manifest the WfCommons scenario submitted (its view is photographed below) */
let manifestUrl = '/jobs';

test('submit a WfCommons instance and see its placement and the bytes moved', async ({ page }, info) => {
  // the tiny instance's files are 1–96 MiB; the stack's fast tiers are 8 MiB: sizes scaled
  // by 1/64, as `hycache-control run --scale` does, so every job fits
  const tiny = JSON.parse(readFileSync(join(process.cwd(), '..', 'tests', 'core', 'data', 'wfformat-1.5-tiny.json'), 'utf8')) as {
    workflow: { specification: { files: { sizeInBytes: number }[] } };
  };
  for (const f of tiny.workflow.specification.files) f.sizeInBytes = Math.ceil(f.sizeInBytes / 64);
  const upload = info.outputPath('wfformat-1.5-tiny-scaled.json');
  writeFileSync(upload, JSON.stringify(tiny, null, 1));
  await signIn(page, stack().admin_token);
  await page.getByRole('link', { name: 'Jobs' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'Jobs' })).toBeVisible();
  await page.getByLabel('Manifest file').setInputFiles(upload);
  await expect(page.getByLabel(/^Manifest \(JSON/)).toHaveValue(/tiny-chunks/);
  await page.getByLabel('Solver').selectOption('greedy');
  await page.getByRole('button', { name: 'Place manifest' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'tiny-chunks' })).toBeVisible({ timeout: 60_000 });
  manifestUrl = new URL(page.url()).pathname;
  expect(manifestUrl).toMatch(/^\/jobs\/\d+$/);
  // the placement table: every job on one of the two nodes
  const placement = page.getByRole('table', { name: 'Placement' });
  for (const id of ['ID01', 'ID02', 'ID03', 'ID04', 'ID05']) {
    await expect(placement.getByRole('row', { name: new RegExp(`^${id}`) }).getByRole('cell').first()).toHaveText(/^\s*(a|b)\s*$/);
  }
  // the graph: a box per job, edges from the parents
  await expect(page.getByRole('img', { name: /^Workflow graph: \d+ jobs in \d+ layers/ })).toBeVisible();
  await expect(page.locator('g.wf-job[data-job="ID05"]')).toHaveCount(1);
  expect(await page.locator('line.wf-edge').count()).toBeGreaterThanOrEqual(6);
  // the bytes chart: bars for placed and round-robin, with their unit
  const chart = page.getByRole('figure', { name: 'Bytes moved' });
  await expect(chart.getByText(/^\((B|KiB|MiB|GiB)\)$/)).toBeVisible();
  await expect(chart.getByText(/placed: .* · round-robin: /)).toBeVisible();
  expect(await chart.locator('.recharts-bar-rectangle').count()).toBeGreaterThanOrEqual(2);
  // each node's plan
  await expect(page.getByRole('group', { name: /^Plan of node (a|b)$/ }).first()).toBeVisible();
  // the deep link works on its own, and the list shows the manifest
  await page.goto(manifestUrl);
  await expect(page.getByRole('heading', { level: 1, name: 'tiny-chunks' })).toBeVisible();
  await page.goto('/jobs');
  await expect(page.getByRole('table', { name: 'Manifests' }).getByRole('link', { name: 'tiny-chunks' }).first()).toBeVisible();
});

test('a malformed manifest shows the field error inline', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await page.goto('/jobs');
  const bad = { schemaVersion: '1.5', name: 'bad', workflow: { specification: { tasks: [{ name: 'no-id', parents: [], children: [] }] } } };
  const text = page.getByLabel(/^Manifest \(JSON/);
  await text.fill(JSON.stringify(bad));
  await page.getByRole('button', { name: 'Place manifest' }).click();
  await expect(text).toHaveAttribute('aria-invalid', 'true');
  await expect(text).toHaveAccessibleDescription(/workflow\.specification\.tasks\[0\]\.id/);
  await expect(page.getByRole('alert').filter({ hasText: 'The manifest was not accepted' })).toBeVisible();
  await expect(page).toHaveURL(/\/jobs$/);
});

test('a read-only token sees the manifests but no submit form or cancel', async ({ page }) => {
  await signIn(page, stack().read_token);
  await page.goto('/jobs');
  await expect(page.getByRole('table', { name: 'Manifests' })).toBeVisible();
  await expect(page.getByRole('button', { name: 'Place manifest' })).toHaveCount(0);
  await page.goto(manifestUrl);
  await expect(page.getByRole('table', { name: 'Placement' })).toBeVisible();
  await expect(page.getByRole('button', { name: 'Cancel manifest' })).toHaveCount(0);
});

test('a killed agent goes down, and comes back up when restarted', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await expect(nodeCard(page, 'b').getByText('up', { exact: true })).toBeVisible();
  stackCommand('kill-agent', 'b');
  await expect(nodeCard(page, 'b').getByText('down', { exact: true })).toBeVisible({ timeout: 120_000 });
  await expect(nodeCard(page, 'a').getByText('up', { exact: true })).toBeVisible();
  stackCommand('restart-agent', 'b');
  await expect(nodeCard(page, 'b').getByText('up', { exact: true })).toBeVisible({ timeout: 120_000 });
});

test('the control plane goes away: the last known state stays, with the error; it comes back live', async ({ page }) => {
  await signIn(page, stack().admin_token);
  await expect(page.getByRole('status', { name: 'Live stream live' })).toBeVisible();
  stackCommand('stop-control');
  try {
    await expect(page.getByRole('status', { name: /Live stream (reconnecting|connecting)/ })).toBeVisible();
    await expect(page.getByRole('alert')).toContainText('cannot be reached', { timeout: 120_000 });
    await expect(nodeCard(page, 'a')).toBeVisible(); // the last known state is still shown
  } finally {
    stackCommand('start-control');
  }
  await expect(page.getByRole('status', { name: 'Live stream live' })).toBeVisible({ timeout: 60_000 });
  await expect(page.getByRole('alert')).toHaveCount(0, { timeout: 60_000 });
  await expect(nodeCard(page, 'a').getByText('up', { exact: true })).toBeVisible({ timeout: 60_000 });
});

const VIEWS: { name: string; url: () => string; heading: RegExp }[] = [
  { name: 'overview', url: () => '/', heading: /^Cluster overview$/ },
  { name: 'node', url: () => '/nodes/a', heading: /^Node a$/ },
  { name: 'throughput', url: () => '/throughput?node=a&window=5m', heading: /^Throughput$/ },
  { name: 'files', url: () => `/files/${dir}`, heading: /^Files$/ },
  { name: 'file', url: () => `/file/${dir}/${fileName(11)}`, heading: new RegExp(`${fileName(11).replace('.', '\\.')}$`) },
  { name: 'policies', url: () => '/policies', heading: /^Policies$/ },
  { name: 'events', url: () => '/events', heading: /^Events$/ },
  { name: 'actions', url: () => '/actions', heading: /^Actions$/ },
  { name: 'jobs', url: () => '/jobs', heading: /^Jobs$/ },
  { name: 'job', url: () => manifestUrl, heading: /^tiny-chunks$/ },
];

async function axeAndShoot(page: Page, name: string, outputPath: (n: string) => string) {
  const axe = await new AxeBuilder({ page }).analyze();
  const bad = axe.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  expect(bad.map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`), `axe on ${name}`).toEqual([]);
  const file = outputPath(`${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  const docs = process.env.HYCACHE_SCREENSHOTS_DIR;
  if (docs) {
    mkdirSync(docs, { recursive: true });
    copyFileSync(file, join(docs, `${name}.png`));
  }
}

for (const theme of ['light', 'dark'] as const) {
  test(`every view passes axe and is photographed (${theme} theme)`, async ({ page }, info) => {
    await page.addInitScript((t) => localStorage.setItem('hycache.theme', t), theme);
    await page.goto('/signin');
    await axeAndShoot(page, `signin-${theme}`, (n) => info.outputPath(n));
    await signIn(page, stack().admin_token);
    for (const v of VIEWS) {
      await page.goto(v.url());
      await expect(page.getByRole('heading', { level: 1, name: v.heading })).toBeVisible();
      await expect(page.getByRole('status').filter({ hasText: /Loading|…$/ })).toHaveCount(0);
      if (v.name === 'throughput') await expect(page.locator('path.recharts-line-curve').first()).toHaveAttribute('d', /^M/);
      await axeAndShoot(page, `${v.name}-${theme}`, (n) => info.outputPath(n));
    }
  });
}

// Browser tests against the REAL stack (Redis Cluster, control plane, two agents with
// FUSE mounts) that tests/web/test_dashboard.py starts; it passes the stack's state file
// in HYCACHE_STACK_STATE. Debian's Chromium: Playwright's own download does not work here.
import { defineConfig } from '@playwright/test';
import { readFileSync } from 'node:fs';

const stateFile = process.env.HYCACHE_STACK_STATE;
const baseURL = stateFile ? (JSON.parse(readFileSync(stateFile, 'utf8')) as { base_url: string }).base_url : undefined;

export default defineConfig({
  testDir: './e2e',
  outputDir: process.env.HYCACHE_E2E_ARTIFACTS ?? 'test-results',
  fullyParallel: false,
  workers: 1,
  retries: 0,
  timeout: 180_000,
  expect: { timeout: 30_000 },
  reporter: [['list']],
  use: {
    baseURL,
    screenshot: 'only-on-failure',
    trace: 'retain-on-failure',
    viewport: { width: 1400, height: 900 },
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
        '--disable-quic',
      ],
    },
  },
});

// The running stack (tests/web/test_dashboard.py starts it; see hycache_control.stack).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Page } from '@playwright/test';
import { expect } from '@playwright/test';

export interface AgentState {
  node_id: string;
  root: string;
  mountpoint: string;
  pid: number;
  argv: string[];
  log: string;
}
export interface StackState {
  base_url: string;
  admin_token: string;
  read_token: string;
  agents: Record<string, AgentState>;
}

const stateFile = process.env.HYCACHE_STACK_STATE;

export function stack(): StackState {
  if (!stateFile) throw new Error('HYCACHE_STACK_STATE is not set: run the browser tests through tests/web/test_dashboard.py');
  return JSON.parse(readFileSync(stateFile, 'utf8')) as StackState;
}

const python = process.env.HYCACHE_PYTHON ?? 'python3';

/** kill-agent / restart-agent through the stack's own CLI (it keeps the state file right). */
export function stackCommand(cmd: 'kill-agent' | 'restart-agent' | 'stop-control' | 'start-control', node?: string): void {
  execFileSync(python, ['-m', 'hycache_control.stack', cmd, '--state', stateFile ?? '', ...(node ? [node] : [])], { stdio: 'inherit', timeout: 120_000 });
}

/** `hycache-agent where PATH --json` of the agent binary the stack runs. */
export function agentWhere(path: string): Record<string, unknown> {
  const agentBin = Object.values(stack().agents)[0]!.argv[0]!;
  return JSON.parse(execFileSync(agentBin, ['where', '--json', path], { encoding: 'utf8', timeout: 60_000 })) as Record<string, unknown>;
}

export async function signIn(page: Page, token: string): Promise<void> {
  await page.goto('/signin');
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('heading', { name: 'Cluster overview' })).toBeVisible();
}

import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { render, screen, within } from '@testing-library/react';
import type { ManifestJob } from '../api/types';
import { nodeColors } from './nodeColors';
import { PlacementTable } from './PlacementTable';
import { BOX_W, MIN_FIT_ZOOM, WRAP_COLUMNS, WorkflowGraph, dagLayout, fitView, shortLabel } from './WorkflowGraph';

const job = (id: string, node: string, position: number, parents: string[]): ManifestJob => ({
  id,
  node,
  position,
  state: 'pending',
  started_at: null,
  finished_at: null,
  parents,
});
// Seismology's shape: 100 sG1IterDecon jobs side by side, one wrapper_siftSTFByMisfit after them
const fan = [...Array.from({ length: 100 }, (_, i) => job(`sG1IterDecon_${String(i).padStart(8, '0')}`, `n${i % 3}`, Math.floor(i / 3), [])), job('wrapper_siftSTFByMisfit_00000100', 'n0', 40, [])];
fan[100]!.parents = fan.slice(0, 100).map((j) => j.id);
const chain = Array.from({ length: 100 }, (_, i) => job(`step_${i}`, 'n0', i, i ? [`step_${i - 1}`] : []));
// the job view's graph viewport in a 1400 px wide window
const VIEW = { w: 1150, h: 440 };
const boxPx = (jobs: ManifestJob[]) => {
  const l = dagLayout(jobs);
  return BOX_W * fitView(l.width, l.height, VIEW.w, VIEW.h).k;
};
const overlap = (a: { x: number; y: number }, b: { x: number; y: number }, h: number) => Math.abs(a.x - b.x) < BOX_W && Math.abs(a.y - b.y) < h;

test('a 100-wide layer wraps into rows of at most WRAP_COLUMNS: boxes stay ≥ 40 px at the default zoom', () => {
  const l = dagLayout(fan);
  expect(l.grouped).toBe(false);
  const top = l.boxes.filter((b) => b.id.startsWith('sG1'));
  const merge = l.boxes.find((b) => b.id.startsWith('wrapper'))!;
  const rows = new Set(top.map((b) => b.y));
  expect(rows.size).toBe(Math.ceil(100 / WRAP_COLUMNS));
  for (const y of rows) expect(top.filter((b) => b.y === y).length).toBeLessThanOrEqual(WRAP_COLUMNS);
  expect(top.every((b) => b.y < merge.y)).toBe(true);
  for (let i = 0; i < l.boxes.length; i++) for (let j = i + 1; j < l.boxes.length; j++) expect(overlap(l.boxes[i]!, l.boxes[j]!, 34)).toBe(false);
  expect(l.width).toBeLessThan(WRAP_COLUMNS * (BOX_W + 16) + 40);
  expect(boxPx(fan)).toBeGreaterThanOrEqual(40);
});

test('unwrapped (one row of 100), the same graph fits as boxes under 12 px: what wrapping fixes', () => {
  const l = dagLayout(fan, 150, 1000);
  expect(new Set(l.boxes.filter((b) => b.id.startsWith('sG1')).map((b) => b.y)).size).toBe(1);
  expect(BOX_W * Math.min(VIEW.w / l.width, VIEW.h / l.height)).toBeLessThan(12);
});

test('a deep chain opens at its top at MIN_FIT_ZOOM, not shrunk to fit its height', () => {
  const l = dagLayout(chain);
  expect(l.height).toBeGreaterThan(100 * 34);
  const v = fitView(l.width, l.height, VIEW.w, VIEW.h);
  expect(v.k).toBe(MIN_FIT_ZOOM);
  expect(v.y).toBe(0);
  expect(boxPx(chain)).toBeGreaterThanOrEqual(40);
});

test('a graph that fits is shown whole, centred, never above zoom 1', () => {
  const v = fitView(300, 200, VIEW.w, VIEW.h);
  expect(v).toEqual({ k: 1, x: (VIEW.w - 300) / 2, y: (VIEW.h - 200) / 2 });
  expect(fitView(1400, 200, VIEW.w, VIEW.h).k).toBeCloseTo(VIEW.w / 1400);
  expect(fitView(4000, 200, VIEW.w, VIEW.h)).toEqual({ k: MIN_FIT_ZOOM, x: 0, y: (VIEW.h - 200 * MIN_FIT_ZOOM) / 2 });
});

const slurmJobs: ManifestJob[] = [
  { ...job('a', 'n1', 0, []), slurm: { job_id: 41, node: 'n1', state: 'finished', staging: 'staged' } },
  { ...job('b', 'n2', 0, ['a']), slurm: { job_id: 42, node: null, state: 'pending', staging: 'failed' } },
  job('c', 'n1', 1, ['a']),
];

const withStaging = () => {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } });
  const view = (id: number, staging: string, failures: string[]) => ({ id, state: 'pending', staging, failures, ran_on: null });
  qc.setQueryData(['slurm-jobs', 41], view(41, 'staged', []));
  qc.setQueryData(['slurm-jobs', 42], view(42, 'failed', ['/in/b.dat: no node holds it']));
  return qc;
};

test("the graph names each job's Slurm job and node, and marks a failed staging", () => {
  const { container } = render(
    <QueryClientProvider client={withStaging()}>
      <WorkflowGraph jobs={slurmJobs} colors={nodeColors(['n1', 'n2'])} />
    </QueryClientProvider>,
  );
  const a = container.querySelector('g[data-job="a"]')!;
  expect(a.querySelector('text.wf-slurm')).toHaveTextContent('#41 @ n1');
  expect(a.querySelector('title')).toHaveTextContent('Slurm job 41 on n1 (finished, staging staged)');
  const b = container.querySelector('g[data-job="b"]')!;
  expect(b.querySelector('rect.wf-staging-failed')).not.toBeNull();
  expect(a.querySelector('rect.wf-staging-failed')).toBeNull();
  expect(b.querySelector('text.wf-slurm')).toHaveTextContent('⚠ #42');
  expect(container.querySelector('g[data-job="c"] text.wf-slurm')).toBeNull();
});

test('the table shows the Slurm job, its node and its staging, a failure as an alert with the reason', async () => {
  render(
    <QueryClientProvider client={withStaging()}>
      <PlacementTable jobs={slurmJobs} colors={nodeColors(['n1', 'n2'])} />
    </QueryClientProvider>,
  );
  const table = screen.getByRole('table', { name: 'Placement' });
  const cell = (id: string) => within(within(table).getByRole('row', { name: new RegExp(`^${id}`) })).getAllByRole('cell')[7]!;
  expect(cell('a')).toHaveTextContent('#41 on n1 (finished) · staging staged');
  expect(cell('c')).toHaveTextContent('—');
  expect(within(cell('b')).getByRole('alert')).toHaveTextContent('staging failed: /in/b.dat: no node holds it');
  expect(cell('b')).toHaveTextContent('#42 on no node yet (pending) · staging failed');
});

test('a long label keeps its distinguishing end', () => {
  expect(shortLabel('sG1IterDecon_00000012')).toBe('sG1Ite…_00000012');
  expect(shortLabel('sG1IterDecon_00000012')).toHaveLength(16);
  expect(shortLabel('mProject')).toBe('mProject');
});

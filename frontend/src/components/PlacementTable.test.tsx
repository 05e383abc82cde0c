import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import type { ManifestJob } from '../api/types';
import { nodeColors } from './nodeColors';
import { PlacementTable } from './PlacementTable';
import { WorkflowGraph, dagLayout, layoutWorkflow } from './WorkflowGraph';

const job = (id: string, node: string, position: number, parents: string[], state: ManifestJob['state'] = 'pending'): ManifestJob => ({
  id,
  node,
  position,
  state,
  started_at: state === 'pending' ? null : 1763900000,
  finished_at: state === 'done' ? 1763900060 : null,
  parents,
});
// split → 3 × process → merge
const jobs = [
  job('split', 'a', 0, [], 'done'),
  job('p1', 'a', 1, ['split'], 'running'),
  job('p2', 'b', 0, ['split']),
  job('p3', 'b', 1, ['split']),
  job('merge', 'a', 2, ['p1', 'p2', 'p3']),
];
const colors = nodeColors(['a', 'b']);

test('the placement table has a row per job with its node and state', () => {
  render(<PlacementTable jobs={jobs} colors={colors} />);
  const table = screen.getByRole('table', { name: 'Placement' });
  const rows = within(table).getAllByRole('row').slice(1);
  expect(rows).toHaveLength(5);
  const p2 = within(table).getByRole('row', { name: /^p2/ });
  expect(within(p2).getAllByRole('cell').map((c) => c.textContent?.trim())).toEqual(['b', 'p', '1', 'pending', '—', '—', '—', '—', '—']);
  const split = within(table).getByRole('row', { name: /^split/ });
  expect(within(split).getAllByRole('cell')[3]).toHaveTextContent('done');
  expect(within(split).getAllByRole('cell')[5]).not.toHaveTextContent('—');
  expect(within(split).getAllByRole('cell')[6]).toHaveTextContent('1 min 0 s');
});

// a Montage-like manifest: 120 jobs of three task types on three nodes, runtimes 1..120 s
const many: ManifestJob[] = Array.from({ length: 120 }, (_, i) => ({
  id: `${['mProject', 'mDiff', 'mBackground'][i % 3]}_${String(i).padStart(5, '0')}`,
  node: `n${i % 3}`,
  position: Math.floor(i / 3),
  state: 'done' as const,
  started_at: 1763900000,
  finished_at: 1763900000 + ((i * 37) % 120) + 1,
  parents: [],
}));
const bodyRows = () => within(screen.getByRole('table', { name: 'Placement' })).getAllByRole('row').slice(1);
const firstIds = () => bodyRows().slice(0, 3).map((r) => within(r).getByRole('rowheader').textContent);

test('the job table pages by 50, sorts by name/node/runtime and filters by name and task type', async () => {
  const user = userEvent.setup();
  render(<PlacementTable jobs={many} colors={nodeColors(['n0', 'n1', 'n2'])} />);
  const status = within(screen.getByRole('navigation', { name: 'Job pages' })).getByRole('status');
  expect(bodyRows()).toHaveLength(50);
  expect(status).toHaveTextContent('1–50 of 120');
  expect(screen.getByRole('button', { name: 'Previous' })).toBeDisabled();
  await user.click(screen.getByRole('button', { name: 'Next' }));
  await user.click(screen.getByRole('button', { name: 'Next' }));
  expect(status).toHaveTextContent('101–120 of 120');
  expect(bodyRows()).toHaveLength(20);
  expect(screen.getByRole('button', { name: 'Next' })).toBeDisabled();
  // sorting goes back to the first page; runtime sorts numerically, twice = descending
  await user.click(screen.getByRole('button', { name: 'Runtime' }));
  expect(status).toHaveTextContent('1–50 of 120');
  const runtimeOf = (r: HTMLElement) => within(r).getAllByRole('cell')[6]!.textContent;
  expect(runtimeOf(bodyRows()[0]!)).toBe('1.0 s');
  await user.click(screen.getByRole('button', { name: 'Runtime' }));
  expect(screen.getByRole('columnheader', { name: 'Runtime' })).toHaveAttribute('aria-sort', 'descending');
  expect(runtimeOf(bodyRows()[0]!)).toBe('2 min 0 s');
  await user.click(screen.getByRole('button', { name: 'Node' }));
  expect(bodyRows().slice(0, 40).every((r) => within(r).getAllByRole('cell')[0]!.textContent?.trim() === 'n0')).toBe(true);
  await user.click(screen.getByRole('button', { name: 'Job' }));
  expect(firstIds()).toEqual(['mBackground_00002', 'mBackground_00005', 'mBackground_00008']);
  // filters
  await user.selectOptions(screen.getByLabelText('Task type'), 'mDiff');
  expect(status).toHaveTextContent('1–40 of 40');
  expect(bodyRows().every((r) => within(r).getAllByRole('cell')[1]!.textContent === 'mDiff')).toBe(true);
  await user.type(screen.getByLabelText('Job name contains'), '0001');
  expect(firstIds()).toEqual(['mDiff_00001', 'mDiff_00010', 'mDiff_00013']);
  await user.clear(screen.getByLabelText('Job name contains'));
  await user.type(screen.getByLabelText('Job name contains'), 'nothing');
  expect(status).toHaveTextContent('no job matches');
});

test('the graph is layered by dependency depth, with an edge per parent', () => {
  const l = layoutWorkflow(jobs);
  expect(l.layers).toEqual([['split'], ['p1', 'p2', 'p3'], ['merge']]);
  expect(l.edges).toHaveLength(6);
  expect(l.edges).toContainEqual(['p2', 'merge']);
});

test('without parents the layers are the plan order on each node', () => {
  const l = layoutWorkflow(jobs.map((j) => ({ ...j, parents: undefined })));
  expect(l.layers).toEqual([['split', 'p2'], ['p1', 'p3'], ['merge']]);
  expect(l.edges).toEqual([]);
});

test('a cycle does not hang the layout', () => {
  const l = layoutWorkflow([job('x', 'a', 0, ['y']), job('y', 'a', 1, ['x'])]);
  expect(l.layers.flat().sort()).toEqual(['x', 'y']);
});

test('the picture colours each job by its node and has a legend', () => {
  const { container } = render(<WorkflowGraph jobs={jobs} colors={colors} />);
  expect(screen.getByRole('img', { name: 'Workflow graph: 5 jobs in 3 layers on 2 nodes' })).toBeInTheDocument();
  const rect = (id: string) => container.querySelector(`g[data-job="${id}"] rect`)!;
  expect(rect('split').getAttribute('fill')).toBe(colors.a);
  expect(rect('p2').getAttribute('fill')).toBe(colors.b);
  expect(colors.a).not.toBe(colors.b);
  expect(container.querySelectorAll('line.wf-edge')).toHaveLength(6);
  expect(within(screen.getByRole('list', { name: 'Nodes' })).getAllByRole('listitem').map((li) => li.textContent?.trim())).toEqual(['a', 'b']);
});

test('dagre places a job below its parents', () => {
  const l = dagLayout(jobs);
  const y = (id: string) => l.boxes.find((b) => b.id === id)!.y;
  expect(l.grouped).toBe(false);
  expect(y('split')).toBeLessThan(y('p1'));
  expect(y('p1')).toBe(y('p3'));
  expect(y('p2')).toBeLessThan(y('merge'));
});

test('above the threshold jobs are grouped by (task type, node) with counts and aggregated edges', () => {
  // mProject_i → mDiff_i → one mAdd, on two nodes
  const big: ManifestJob[] = [];
  for (let i = 0; i < 100; i++) big.push(job(`mProject_${i}`, i % 2 ? 'b' : 'a', i, []));
  for (let i = 0; i < 100; i++) big.push(job(`mDiff_${i}`, 'a', 100 + i, [`mProject_${i}`]));
  big.push(job('mAdd_1', 'b', 300, big.filter((j) => j.id.startsWith('mDiff')).map((j) => j.id)));
  const l = dagLayout(big, 150);
  expect(l.grouped).toBe(true);
  expect(l.boxes.map((b) => [b.id, b.count]).sort()).toEqual([['mAdd @ b', 1], ['mDiff @ a', 100], ['mProject @ a', 50], ['mProject @ b', 50]]);
  expect(l.edges.map((e) => [e.from, e.to, e.count]).sort()).toEqual([['mDiff @ a', 'mAdd @ b', 100], ['mProject @ a', 'mDiff @ a', 50], ['mProject @ b', 'mDiff @ a', 50]]);
  const { container } = render(<WorkflowGraph jobs={big} colors={colors} />);
  expect(screen.getByRole('img', { name: 'Workflow graph: 201 jobs in 4 groups (task type on node) on 2 nodes' })).toBeInTheDocument();
  expect(container.querySelectorAll('g.wf-group')).toHaveLength(4);
  expect(container.querySelector('g[data-group="mDiff @ a"] rect')!.getAttribute('fill')).toBe(colors.a);
  expect(container.querySelector('g[data-group="mDiff @ a"]')).toHaveTextContent('× 100');
});

test('zoom buttons, keys and fit change the view transform', async () => {
  const user = userEvent.setup();
  const { container } = render(<WorkflowGraph jobs={jobs} colors={colors} />);
  const view = () => container.querySelector('g.wf-view')!.getAttribute('transform');
  const fitted = view();
  await user.click(screen.getByRole('button', { name: 'Zoom in' }));
  const zoomed = view();
  expect(zoomed).not.toBe(fitted);
  screen.getByRole('group', { name: /^Workflow graph/ }).focus();
  await user.keyboard('{ArrowLeft}');
  expect(view()).not.toBe(zoomed);
  await user.click(screen.getByRole('button', { name: 'Fit' }));
  expect(view()).toBe(fitted);
});

test("a job's task type is the one the instance states, else read from its id", () => {
  const typed: ManifestJob[] = [{ ...job('ID00001', 'a', 0, []), task: 'mProject' }, job('mDiffFit_00002', 'b', 0, []), { ...job('ID00003', 'a', 1, []), task: null }];
  render(<PlacementTable jobs={typed} colors={colors} />);
  const rows = within(screen.getByRole('table', { name: 'Placement' })).getAllByRole('row').slice(1);
  expect(rows.map((r) => within(r).getAllByRole('cell')[1]!.textContent)).toEqual(['mProject', 'ID00003', 'mDiffFit']);
  expect(within(screen.getByLabelText('Task type')).getAllByRole('option').map((o) => o.textContent)).toEqual(['any', 'ID00003', 'mDiffFit', 'mProject']);
});

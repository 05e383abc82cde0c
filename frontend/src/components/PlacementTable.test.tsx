import { render, screen, within } from '@testing-library/react';
import type { ManifestJob } from '../api/types';
import { nodeColors } from './nodeColors';
import { PlacementTable } from './PlacementTable';
import { WorkflowGraph, layoutWorkflow } from './WorkflowGraph';

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
  expect(within(p2).getAllByRole('cell').map((c) => c.textContent?.trim())).toEqual(['b', '1', 'pending', '—', '—']);
  const split = within(table).getByRole('row', { name: /^split/ });
  expect(within(split).getAllByRole('cell')[2]).toHaveTextContent('done');
  expect(within(split).getAllByRole('cell')[4]).not.toHaveTextContent('—');
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

// The workflow as a picture: jobs layered by dependency depth (a job sits one layer below
// its deepest parent), edges from the jobs' parents, each job coloured by its node. Without
// parents (an older control plane) the layers are each node's plan order.
import type { ManifestJob } from '../api/types';

export interface Layout {
  layers: string[][];
  edges: [string, string][];
}

/** Layers by dependency depth; cycles or unknown parents do not loop (depth is bounded). */
export function layoutWorkflow(jobs: ManifestJob[]): Layout {
  const byId = new Map(jobs.map((j) => [j.id, j]));
  const hasParents = jobs.some((j) => j.parents !== undefined);
  const depth = new Map<string, number>();
  const edges: [string, string][] = [];
  if (hasParents) {
    const visit = (id: string, seen: Set<string>): number => {
      const known = depth.get(id);
      if (known !== undefined) return known;
      if (seen.has(id)) return 0;
      seen.add(id);
      const parents = (byId.get(id)?.parents ?? []).filter((p) => byId.has(p));
      const d = parents.length ? 1 + Math.max(...parents.map((p) => visit(p, seen))) : 0;
      depth.set(id, d);
      return d;
    };
    for (const j of jobs) visit(j.id, new Set());
    for (const j of jobs) for (const p of j.parents ?? []) if (byId.has(p)) edges.push([p, j.id]);
  } else {
    for (const j of jobs) depth.set(j.id, j.position);
  }
  const layers: string[][] = [];
  for (const j of jobs) (layers[depth.get(j.id) ?? 0] ??= []).push(j.id);
  return { layers: layers.filter(Boolean), edges };
}

const W = 120;
const H = 34;
const GAP_X = 24;
const GAP_Y = 46;

export function WorkflowGraph({ jobs, colors }: { jobs: ManifestJob[]; colors: Record<string, string> }) {
  const { layers, edges } = layoutWorkflow(jobs);
  const node = new Map(jobs.map((j) => [j.id, j.node]));
  const widest = Math.max(1, ...layers.map((l) => l.length));
  const width = widest * (W + GAP_X) + GAP_X;
  const height = layers.length * (H + GAP_Y) + GAP_Y - H / 2;
  const pos = new Map<string, { x: number; y: number }>();
  layers.forEach((layer, li) => {
    const offset = (width - layer.length * (W + GAP_X) + GAP_X) / 2;
    layer.forEach((id, i) => pos.set(id, { x: offset + i * (W + GAP_X), y: GAP_Y / 2 + li * (H + GAP_Y) }));
  });
  const nodes = [...new Set(jobs.map((j) => j.node))].sort();
  return (
    <figure className="workflow card">
      <figcaption>Workflow graph, jobs coloured by node</figcaption>
      <ul className="legend" aria-label="Nodes">
        {nodes.map((n) => (
          <li key={n}>
            <span className="swatch" style={{ background: colors[n] }} aria-hidden="true" /> {n}
          </li>
        ))}
      </ul>
      {/* focusable: a wide graph scrolls sideways, also from the keyboard */}
      <div className="workflow-scroll" tabIndex={0} role="group" aria-label="Workflow graph (scrolls sideways when wide)">
        <svg role="img" aria-label={`Workflow graph: ${jobs.length} jobs in ${layers.length} layers on ${nodes.length} nodes`} width={width} height={height} viewBox={`0 0 ${width} ${height}`} style={{ maxWidth: '100%', height: 'auto' }}>
          <defs>
            <marker id="wf-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse">
              <path d="M 0 0 L 10 5 L 0 10 z" fill="var(--fg-muted)" />
            </marker>
          </defs>
          {edges.map(([a, b]) => {
            const p = pos.get(a)!;
            const q = pos.get(b)!;
            return <line key={`${a}->${b}`} className="wf-edge" x1={p.x + W / 2} y1={p.y + H} x2={q.x + W / 2} y2={q.y} stroke="var(--fg-muted)" markerEnd="url(#wf-arrow)" />;
          })}
          {jobs.map((j) => {
            const p = pos.get(j.id)!;
            return (
              <g key={j.id} className="wf-job" data-job={j.id} data-node={node.get(j.id)}>
                <title>{`${j.id} on ${j.node} (${j.state})`}</title>
                <rect x={p.x} y={p.y} width={W} height={H} rx={6} fill={colors[j.node]} stroke={j.state === 'running' ? 'var(--fg)' : 'none'} strokeWidth={2} />
                <text x={p.x + W / 2} y={p.y + H / 2} textAnchor="middle" dominantBaseline="central" fill="#000" fontSize={12}>
                  {j.id.length > 16 ? `${j.id.slice(0, 15)}…` : j.id}
                </text>
              </g>
            );
          })}
        </svg>
      </div>
    </figure>
  );
}

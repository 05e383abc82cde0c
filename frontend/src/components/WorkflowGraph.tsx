// The workflow as a picture: a layered DAG laid out by dagre, edges from the jobs' parents,
// each job coloured by its node, drawn as SVG with zoom (wheel, buttons, +/-), pan (drag,
// arrow keys) and "fit". Above GROUP_ABOVE jobs (Montage: 1,738) one box stands for the
// jobs of one task type placed on one node, with their count, and edges are aggregated.
// Without parents (an older control plane) the layers are each node's plan order.
// Readable whatever the shape: a layer wider than WRAP_COLUMNS boxes is packed into rows
// (a Seismology fan of 100 jobs is a 12-wide grid, not a 13,000 px line), and the default
// zoom never goes below MIN_FIT_ZOOM (a deep chain opens at its top, to be panned).
import dagre from '@dagrejs/dagre';
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'react';
import type { ManifestJob } from '../api/types';
import { SlurmMark, slurmText } from './SlurmCell';
import { jobTask } from './taskType';

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

export const GROUP_ABOVE = 150;
/** the widest row of boxes one layer keeps; wider layers wrap into more rows */
export const WRAP_COLUMNS = 12;
/** the smallest zoom "fit" uses: a box stays BOX_W × MIN_FIT_ZOOM = 90 px wide, its label 9 px */
export const MIN_FIT_ZOOM = 0.75;
export const BOX_W = 120;
const W = BOX_W;
const H = 34;
const GAP_X = 16;
const GAP_Y = 16;
const MARGIN = 12;

export interface GraphBox {
  id: string;
  label: string;
  node: string;
  count: number;
  /** the job's state (one job) or the state of its first running/pending job (a group) */
  state: ManifestJob['state'];
  /** the Slurm job that ran it (one job, when Slurm ran it) */
  slurm: ManifestJob['slurm'];
  x: number;
  y: number;
}
export interface GraphEdge {
  from: string;
  to: string;
  count: number;
}
export interface DagLayout {
  boxes: GraphBox[];
  edges: GraphEdge[];
  grouped: boolean;
  layers: number;
  width: number;
  height: number;
}

/** Packs each rank (boxes of one y) wider than `columns` into balanced rows under one
 * another, centred where the rank was, moves the ranks below down by the rows added, and
 * puts the leftmost box at MARGIN. Returns the boxes' extent (with margins). */
export function wrapRanks(boxes: GraphBox[], boxH: number, columns: number): { width: number; height: number } {
  if (boxes.length === 0) return { width: W + 2 * MARGIN, height: boxH + 2 * MARGIN };
  const ranks = new Map<number, GraphBox[]>();
  for (const b of boxes) (ranks.get(b.y) ?? ranks.set(b.y, []).get(b.y)!).push(b);
  let shift = 0;
  for (const y of [...ranks.keys()].sort((a, b) => a - b)) {
    const rank = ranks.get(y)!.sort((a, b) => a.x - b.x);
    const rows = Math.ceil(rank.length / Math.max(1, columns));
    const cols = Math.ceil(rank.length / rows);
    const centre = (rank[0]!.x + rank[rank.length - 1]!.x + W) / 2;
    const left = rows > 1 ? centre - (cols * (W + GAP_X) - GAP_X) / 2 : 0;
    rank.forEach((b, i) => {
      if (rows > 1) b.x = left + (i % cols) * (W + GAP_X);
      b.y = y + shift + Math.floor(i / cols) * (boxH + GAP_Y);
    });
    shift += (rows - 1) * (boxH + GAP_Y);
  }
  const minX = Math.min(...boxes.map((b) => b.x));
  const minY = Math.min(...boxes.map((b) => b.y));
  for (const b of boxes) {
    b.x += MARGIN - minX;
    b.y += MARGIN - minY;
  }
  return { width: Math.max(...boxes.map((b) => b.x)) + W + MARGIN, height: Math.max(...boxes.map((b) => b.y)) + boxH + MARGIN };
}

/** The boxes (jobs, or (task type, node) groups) and their edges, placed by dagre, wide
 * ranks wrapped into rows of at most `columns`. */
export function dagLayout(jobs: ManifestJob[], groupAbove = GROUP_ABOVE, columns = WRAP_COLUMNS): DagLayout {
  const grouped = jobs.length > groupAbove;
  const { layers, edges: jobEdges } = layoutWorkflow(jobs);
  const depth = new Map<string, number>();
  layers.forEach((l, i) => l.forEach((id) => depth.set(id, i)));
  const boxOf = new Map<string, string>();
  const boxes = new Map<string, GraphBox>();
  const rank = { running: 0, pending: 1, done: 2 } as const;
  for (const j of jobs) {
    const id = grouped ? `${jobTask(j)} @ ${j.node}` : j.id;
    boxOf.set(j.id, id);
    const b = boxes.get(id);
    if (b) {
      b.count++;
      if (rank[j.state] < rank[b.state]) b.state = j.state;
    } else boxes.set(id, { id, label: grouped ? jobTask(j) : j.id, node: j.node, count: 1, state: j.state, slurm: grouped ? null : j.slurm, x: 0, y: 0 });
  }
  const edgeCount = new Map<string, GraphEdge>();
  for (const [a, b] of jobEdges) {
    const from = boxOf.get(a)!;
    const to = boxOf.get(b)!;
    if (from === to) continue;
    const k = `${from}\u0000${to}`;
    const e = edgeCount.get(k);
    if (e) e.count++;
    else edgeCount.set(k, { from, to, count: 1 });
  }
  const g = new dagre.graphlib.Graph();
  g.setGraph({ rankdir: 'TB', nodesep: GAP_X, ranksep: 46, marginx: MARGIN, marginy: MARGIN });
  g.setDefaultEdgeLabel(() => ({}));
  for (const b of boxes.values()) g.setNode(b.id, { width: W, height: grouped ? H + 12 : H });
  // without parents: keep each node's plan order as the layers
  if (jobEdges.length === 0 && !grouped) {
    const byNode = new Map<string, ManifestJob[]>();
    for (const j of jobs) (byNode.get(j.node) ?? byNode.set(j.node, []).get(j.node)!).push(j);
    for (const list of byNode.values()) {
      list.sort((a, b) => a.position - b.position);
      for (let i = 1; i < list.length; i++) g.setEdge(list[i - 1]!.id, list[i]!.id, { weight: 0, minlen: 1 });
    }
  }
  const edges = [...edgeCount.values()];
  for (const e of edges) g.setEdge(e.from, e.to, { weight: e.count });
  dagre.layout(g);
  for (const b of boxes.values()) {
    const n = g.node(b.id);
    b.x = n.x - W / 2;
    b.y = n.y - n.height / 2;
  }
  const ranks = new Set([...boxes.values()].map((b) => b.y));
  const list = [...boxes.values()];
  const { width, height } = wrapRanks(list, grouped ? H + 12 : H, columns);
  return { boxes: list, edges, grouped, layers: grouped ? ranks.size : layers.length, width, height };
}

/** A label that fits a box: at most 16 characters, cut in the middle so that the end that
 * tells sibling jobs apart ("…_00000012") stays. */
export function shortLabel(label: string): string {
  return label.length > 16 ? `${label.slice(0, 6)}…${label.slice(-9)}` : label;
}

export interface View {
  k: number;
  x: number;
  y: number;
}

/** The default view of a `width` × `height` layout in a `w` × `h` viewport: all of it when
 * that keeps boxes at MIN_FIT_ZOOM or more (never above 1), else MIN_FIT_ZOOM with the
 * layout's top (and its left, when wider) in view. */
export function fitView(width: number, height: number, w: number, h: number): View {
  const k = Math.max(MIN_FIT_ZOOM, Math.min(1, w / width, h / height));
  const x = width * k <= w ? (w - width * k) / 2 : 0;
  const y = height * k <= h ? (h - height * k) / 2 : 0;
  return { k, x, y };
}

const VIEW_H = 440;
const clampK = (k: number) => Math.min(4, Math.max(0.02, k));

export function WorkflowGraph({ jobs, colors, groupAbove = GROUP_ABOVE }: { jobs: ManifestJob[]; colors: Record<string, string>; groupAbove?: number }) {
  const l = useMemo(() => dagLayout(jobs, groupAbove), [jobs, groupAbove]);
  const boxH = l.grouped ? H + 12 : H;
  const pos = new Map(l.boxes.map((b) => [b.id, b]));
  const nodes = [...new Set(jobs.map((j) => j.node))].sort();
  const svgRef = useRef<SVGSVGElement>(null);
  // the viewport's size, followed by a ResizeObserver (jsdom has none: a default size)
  const [box, setBox] = useState({ w: 640, h: VIEW_H });
  useEffect(() => {
    const el = svgRef.current;
    if (!el || typeof ResizeObserver === 'undefined') return;
    const ro = new ResizeObserver(([e]) => {
      if (e && e.contentRect.width > 0) setBox({ w: e.contentRect.width, h: e.contentRect.height || VIEW_H });
    });
    ro.observe(el);
    return () => ro.disconnect();
  }, []);
  const fitted = useMemo<View>(() => fitView(l.width, l.height, box.w, box.h), [box, l]);
  // the user's zoom/pan, for this layout; none (or another layout's) = fitted
  const [moved, setMoved] = useState<{ for: DagLayout; v: View } | null>(null);
  const view = moved && moved.for === l ? moved.v : fitted;
  const setView = (f: (v: View) => View) => setMoved({ for: l, v: f(view) });
  const fit = () => setMoved(null);
  const drag = useRef<{ px: number; py: number; x: number; y: number } | null>(null);
  const zoomAt = (factor: number, cx = box.w / 2, cy = box.h / 2) =>
    setView((v) => {
      const k = clampK(v.k * factor);
      return { k, x: cx - ((cx - v.x) * k) / v.k, y: cy - ((cy - v.y) * k) / v.k };
    });
  const zoomRef = useRef(zoomAt);
  useLayoutEffect(() => {
    zoomRef.current = zoomAt;
  });
  // wheel zoom needs a non-passive listener to keep the page from scrolling
  useEffect(() => {
    const el = svgRef.current;
    if (!el) return;
    const onWheel = (e: WheelEvent) => {
      e.preventDefault();
      const r = el.getBoundingClientRect();
      zoomRef.current(Math.exp(-e.deltaY * 0.0015), e.clientX - r.left, e.clientY - r.top);
    };
    el.addEventListener('wheel', onWheel, { passive: false });
    return () => el.removeEventListener('wheel', onWheel);
  }, []);
  const onKey = (e: React.KeyboardEvent) => {
    const step = 40;
    const moves: Record<string, [number, number]> = { ArrowLeft: [step, 0], ArrowRight: [-step, 0], ArrowUp: [0, step], ArrowDown: [0, -step] };
    if (e.key === '+' || e.key === '=') zoomAt(1.25);
    else if (e.key === '-') zoomAt(0.8);
    else if (e.key === '0') fit();
    else if (moves[e.key]) {
      const [dx, dy] = moves[e.key]!;
      setView((v) => ({ ...v, x: v.x + dx, y: v.y + dy }));
    } else return;
    e.preventDefault();
  };
  const what = l.grouped ? `${l.boxes.length} groups (task type on node)` : `${l.layers} layers`;
  return (
    <figure className="workflow card">
      <figcaption>
        Workflow graph, {l.grouped ? 'jobs grouped by task type and node, ' : 'jobs '}coloured by node
      </figcaption>
      <ul className="legend" aria-label="Nodes">
        {nodes.map((n) => (
          <li key={n}>
            <span className="swatch" style={{ background: colors[n] }} aria-hidden="true" /> {n}
          </li>
        ))}
      </ul>
      <div className="workflow-tools" role="toolbar" aria-label="Graph view">
        <button type="button" onClick={() => zoomAt(1.25)} aria-label="Zoom in">
          +
        </button>
        <button type="button" onClick={() => zoomAt(0.8)} aria-label="Zoom out">
          −
        </button>
        <button type="button" onClick={fit}>
          Fit
        </button>
        <span className="small muted">wheel to zoom, drag or arrow keys to pan</span>
      </div>
      <div className="workflow-scroll" tabIndex={0} role="group" aria-label="Workflow graph (zoom with + and -, pan with the arrow keys, 0 to fit)" onKeyDown={onKey}>
        <svg
          ref={svgRef}
          role="img"
          aria-label={`Workflow graph: ${jobs.length} jobs in ${what} on ${nodes.length} nodes`}
          width="100%"
          height={VIEW_H}
          className="workflow-svg"
          onPointerDown={(e) => {
            drag.current = { px: e.clientX, py: e.clientY, x: view.x, y: view.y };
            e.currentTarget.setPointerCapture?.(e.pointerId);
          }}
          onPointerMove={(e) => {
            const d = drag.current;
            if (d) setView((v) => ({ ...v, x: d.x + e.clientX - d.px, y: d.y + e.clientY - d.py }));
          }}
          onPointerUp={() => (drag.current = null)}
          onPointerCancel={() => (drag.current = null)}
        >
          <defs>
            <marker id="wf-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse">
              <path d="M 0 0 L 10 5 L 0 10 z" fill="var(--fg-muted)" />
            </marker>
          </defs>
          <g className="wf-view" transform={`translate(${view.x.toFixed(1)} ${view.y.toFixed(1)}) scale(${view.k.toFixed(4)})`}>
            {l.edges.map((e) => {
              const p = pos.get(e.from)!;
              const q = pos.get(e.to)!;
              return (
                <line
                  key={`${e.from}->${e.to}`}
                  className="wf-edge"
                  data-count={e.count}
                  x1={p.x + W / 2}
                  y1={p.y + boxH}
                  x2={q.x + W / 2}
                  y2={q.y}
                  stroke="var(--fg-muted)"
                  strokeWidth={l.grouped ? Math.min(6, 1 + Math.log2(e.count)) : 1}
                  markerEnd="url(#wf-arrow)"
                />
              );
            })}
            {l.boxes.map((b) => (
              <g key={b.id} className={l.grouped ? 'wf-job wf-group' : 'wf-job'} data-job={l.grouped ? undefined : b.id} data-group={l.grouped ? b.id : undefined} data-count={b.count} data-node={b.node}>
                <title>{l.grouped ? `${b.count} ${b.label} jobs on ${b.node}` : `${b.id} on ${b.node} (${b.state})${b.slurm ? `, ${slurmText(b.slurm)}` : ''}`}</title>
                <rect x={b.x} y={b.y} width={W} height={boxH} rx={6} fill={colors[b.node]} stroke={b.state === 'running' ? 'var(--fg)' : 'none'} strokeWidth={2} />
                <text x={b.x + W / 2} y={b.y + (l.grouped || b.slurm ? boxH / 2 - 7 : boxH / 2)} textAnchor="middle" dominantBaseline="central" fill="#000" fontSize={12}>
                  {shortLabel(b.label)}
                </text>
                {b.slurm && <SlurmMark slurm={b.slurm} x={b.x} y={b.y} w={W} h={boxH} />}
                {l.grouped && (
                  <text x={b.x + W / 2} y={b.y + boxH / 2 + 9} textAnchor="middle" dominantBaseline="central" fill="#000" fontSize={11}>
                    {`× ${b.count}`}
                  </text>
                )}
              </g>
            ))}
          </g>
        </svg>
      </div>
    </figure>
  );
}

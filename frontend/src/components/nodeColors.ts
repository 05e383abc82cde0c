// One colour per node, the same in the graph, its legend and the placement table; each
// readable on the light and the dark background.
const PALETTE = ['#3b82f6', '#f59e0b', '#10b981', '#ec4899', '#8b5cf6', '#ef4444', '#14b8a6', '#a3a3a3'];

export function nodeColors(nodes: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  [...new Set(nodes)].sort().forEach((n, i) => (out[n] = PALETTE[i % PALETTE.length]!));
  return out;
}

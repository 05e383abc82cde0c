import type { NodeState } from '../api/types';

export function NodeStateBadge({ state }: { state: NodeState }) {
  return <span className={`badge badge-${state}`}>{state}</span>;
}

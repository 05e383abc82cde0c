// Each node's layer-2 plan: done / failed / skipped / cancelled / pending steps as one bar.
import type { StepCounts } from '../api/types';

const PARTS: (keyof Omit<StepCounts, 'total'>)[] = ['done', 'failed', 'skipped', 'cancelled', 'pending'];

export function PlanProgress({ node, counts, color }: { node: string; counts: StepCounts; color?: string }) {
  const total = counts.total || 1;
  const finished = counts.done + counts.failed + counts.skipped + counts.cancelled;
  return (
    <div className="plan-progress" role="group" aria-label={`Plan of node ${node}`}>
      <div className="plan-head">
        <span className="swatch" style={{ background: color }} aria-hidden="true" /> <strong>{node}</strong>{' '}
        <span className="muted small">
          {finished} of {counts.total} steps finished
        </span>
      </div>
      <div className="plan-bar" role="progressbar" aria-label={`Plan steps finished on ${node}`} aria-valuemin={0} aria-valuemax={counts.total} aria-valuenow={finished}>
        {PARTS.map((p) =>
          counts[p] > 0 ? <span key={p} className={`plan-part plan-${p}`} style={{ width: `${(100 * counts[p]) / total}%` }} title={`${p}: ${counts[p]}`} /> : null,
        )}
      </div>
      <p className="small plan-counts">
        {PARTS.map((p) => `${p} ${counts[p]}`).join(' · ')}
      </p>
    </div>
  );
}

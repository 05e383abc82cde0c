// "Where would this job run now?": the control plane's online placement (POST /placements)
// for the files the job reads, against the files' current locations and the live nodes.
import { usePlaceJob } from '../api/hooks';
import { formatBytes } from '../format';
import { errorText } from './States';

export function WhereNow({ job, inputs, colors }: { job: string; inputs: string[]; colors: Record<string, string> }) {
  const place = usePlaceJob();
  if (place.data) {
    const r = place.data;
    const moved = r.bytes_moved[r.node] ?? 0;
    return (
      <span role="status" aria-label={`where ${job} would run now`}>
        <span className="swatch" style={{ background: colors[r.node] }} aria-hidden="true" /> {r.node} · {formatBytes(moved)} to move
        {r.slow_tier_bytes > 0 ? ` · ${formatBytes(r.slow_tier_bytes)} from the slow tier` : ''}
      </span>
    );
  }
  return (
    <>
      <button type="button" disabled={place.isPending} onClick={() => place.mutate(inputs)} aria-label={`Where would ${job} run now?`}>
        {place.isPending ? 'Asking…' : 'Ask'}
      </button>
      {place.isError && (
        <span role="alert" className="error-text">
          {' '}
          {errorText(place.error)}
        </span>
      )}
    </>
  );
}

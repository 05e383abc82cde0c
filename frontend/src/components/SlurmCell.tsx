// A manifest job's Slurm job: its id, the node Slurm ran it on and the staging of its inputs
// (none / staging / staged / failed, from GET /slurm/jobs/{id}); a failed staging is an
// error with the failed paths and their reasons. In the graph: the job box's second line
// and, when the staging failed, a red outline.
import { useSlurmJob } from '../api/hooks';
import type { ManifestJobSlurm, StagingState } from '../api/types';

/** One line: "Slurm job 12 on n2 (running, staging failed)". */
export function slurmText(s: ManifestJobSlurm, staging: StagingState | undefined = s.staging): string {
  return `Slurm job ${s.job_id}${s.node ? ` on ${s.node}` : ''} (${s.state}${staging ? `, staging ${staging}` : ''})`;
}

export function SlurmCell({ slurm }: { slurm: ManifestJobSlurm | null | undefined }) {
  return slurm ? <SlurmStaging slurm={slurm} /> : <>—</>;
}

function SlurmStaging({ slurm }: { slurm: ManifestJobSlurm }) {
  const q = useSlurmJob(slurm.job_id);
  const staging = q.data?.staging ?? slurm.staging;
  const failures = q.data?.failures ?? [];
  return (
    <span className="slurm-cell" data-slurm-job={slurm.job_id} data-staging={staging ?? ''}>
      <span>
        #{slurm.job_id} on {slurm.node ?? 'no node yet'} (<span className="state-word">{slurm.state}</span>)
      </span>
      {' · '}
      {staging === undefined ? (
        <span className="muted small">{q.isError ? 'staging unknown' : 'staging …'}</span>
      ) : staging === 'failed' ? (
        <span className="error-text staging-failed" role="alert">
          staging failed{failures.length > 0 ? `: ${failures.join('; ')}` : ''}
        </span>
      ) : (
        <span className={`staging staging-${staging}`}>staging {staging}</span>
      )}
    </span>
  );
}

/** The job box's Slurm line ("#12 @ n2") in the graph; a failed staging outlines the box in red. */
export function SlurmMark({ slurm, x, y, w, h }: { slurm: ManifestJobSlurm; x: number; y: number; w: number; h: number }) {
  const q = useSlurmJob(slurm.job_id);
  const staging = q.data?.staging ?? slurm.staging;
  const failed = staging === 'failed';
  return (
    <>
      {failed && <rect className="wf-staging-failed" x={x} y={y} width={w} height={h} rx={6} fill="none" stroke="var(--danger)" strokeWidth={3} />}
      <text className="wf-slurm" data-staging={staging ?? ''} x={x + w / 2} y={y + h / 2 + 8} textAnchor="middle" dominantBaseline="central" fill="#000" fontSize={10}>
        {`${failed ? '⚠ ' : ''}#${slurm.job_id}${slurm.node ? ` @ ${slurm.node}` : ''}`}
      </text>
    </>
  );
}

// A manifest job's Slurm job: its id, the node Slurm ran it on and the staging of its inputs
// (none / staging / staged / failed, from GET /slurm/jobs/{id}); a failed staging is an
// error with the failed paths and their reasons.
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
        #{slurm.job_id} on {slurm.node ?? 'no node yet'} · <span className="state-word">{slurm.state}</span>
      </span>{' '}
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

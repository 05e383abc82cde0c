// /jobs/:id: one manifest — placement (table and graph), bytes moved, each node's plan
// progress (live from the stream), cancel for admins.
import { useState } from 'react';
import { Link, useParams } from 'react-router';
import { useCancelManifest, useManifest } from '../api/hooks';
import { useAuth } from '../auth/auth';
import { ManifestStateBadge } from '../components/ManifestList';
import { nodeColors } from '../components/nodeColors';
import { PlacementTable } from '../components/PlacementTable';
import { PlanProgress } from '../components/PlanProgress';
import { ErrorState, EmptyState, LoadingState, errorText } from '../components/States';
import { TransferChart } from '../components/TransferChart';
import { WorkflowGraph } from '../components/WorkflowGraph';
import { formatTime } from '../format';

function CancelManifest({ id, name }: { id: number; name: string }) {
  const cancel = useCancelManifest(id);
  const [asking, setAsking] = useState(false);
  if (!asking)
    return (
      <button type="button" className="danger" onClick={() => setAsking(true)}>
        Cancel manifest
      </button>
    );
  return (
    <div className="backdrop">
      <div className="dialog card" role="dialog" aria-modal="true" aria-labelledby="cancel-title">
        <h2 id="cancel-title">Cancel {name}?</h2>
        <p>Plan steps not yet delivered to the nodes are cancelled; jobs already running are not stopped.</p>
        {cancel.isError && (
          <p role="alert" className="error-text">
            {errorText(cancel.error)}
          </p>
        )}
        <div className="buttons">
          <button type="button" onClick={() => setAsking(false)}>
            Keep it
          </button>
          <button type="button" className="primary" autoFocus disabled={cancel.isPending} onClick={() => cancel.mutate(undefined, { onSuccess: () => setAsking(false) })}>
            {cancel.isPending ? 'Cancelling…' : 'Yes, cancel'}
          </button>
        </div>
      </div>
    </div>
  );
}

export function JobView() {
  const { manifestId } = useParams();
  const id = Number(manifestId);
  const { canWrite } = useAuth();
  const q = useManifest(Number.isInteger(id) ? id : -1);
  if (!Number.isInteger(id) || id < 0) return <ErrorState error={new Error(`"${manifestId}" is not a manifest id.`)} title="No such manifest" />;
  if (q.isPending) return <LoadingState label="Loading the manifest" />;
  if (q.isError && !q.data) return <ErrorState error={q.error} title={`Could not load manifest ${id}`} />;
  const m = q.data;
  const colors = nodeColors([...m.jobs.map((j) => j.node), ...Object.keys(m.steps)]);
  const planNodes = Object.keys(m.steps).sort();
  return (
    <section aria-labelledby="job-title">
      <p className="small">
        <Link to="/jobs">Jobs</Link> / manifest {m.id}
      </p>
      <h1 id="job-title">{m.name || `Manifest ${m.id}`}</h1>
      {q.isError && <ErrorState error={q.error} title="Showing the last known state" />}
      <p>
        <ManifestStateBadge state={m.state} /> · {m.format} · {m.jobs.length} jobs · solver {m.solver ?? '—'} · submitted {formatTime(m.created_at)}
      </p>
      {canWrite && (m.state === 'planned' || m.state === 'running') && <CancelManifest id={m.id} name={m.name || `manifest ${m.id}`} />}
      <h2>Placement</h2>
      {m.jobs.length === 0 ? (
        <EmptyState>This manifest has no jobs.</EmptyState>
      ) : (
        <div className="grid">
          <WorkflowGraph jobs={m.jobs} colors={colors} />
          <TransferChart bytes={m.transfer_bytes} />
        </div>
      )}
      {m.jobs.length > 0 && <PlacementTable jobs={m.jobs} colors={colors} />}
      <h2>Plans</h2>
      {planNodes.length === 0 ? (
        <EmptyState>No plan steps: every node already has what its jobs read.</EmptyState>
      ) : (
        <div className="plans card">
          {planNodes.map((n) => (
            <PlanProgress key={n} node={n} counts={m.steps[n]!} color={colors[n]} />
          ))}
        </div>
      )}
    </section>
  );
}

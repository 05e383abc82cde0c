import { Link, useParams } from 'react-router';
import { useNodes, usePolicy, useSavePolicy } from '../api/hooks';
import type { Node } from '../api/types';
import { useAuth } from '../auth/auth';
import { PolicyForm } from '../components/PolicyForm';
import { EmptyState, ErrorState, LoadingState } from '../components/States';
import { NodeStateBadge } from '../components/NodeStateBadge';

export function Policies() {
  const { nodeId } = useParams();
  const nodes = useNodes();
  const items = nodes.data?.items ?? [];
  const shown = nodeId ? items.filter((n) => n.id === nodeId) : items;
  return (
    <section aria-labelledby="pol-title">
      <h1 id="pol-title">Policies</h1>
      {nodeId && <p><Link to="/policies">All nodes</Link></p>}
      {nodes.isPending ? (
        <LoadingState label="Loading nodes" />
      ) : nodes.isError && !nodes.data ? (
        <ErrorState error={nodes.error} />
      ) : shown.length === 0 ? (
        <EmptyState>{nodeId ? `No node ${nodeId}.` : 'No node has reported yet.'}</EmptyState>
      ) : (
        <div className="grid">
          {shown.map((n) => (
            <article key={n.id} className="card" aria-labelledby={`pol-${n.id}`}>
              <h2 id={`pol-${n.id}`}>
                <Link to={`/policies/${encodeURIComponent(n.id)}`}>Node {n.id}</Link> <NodeStateBadge state={n.state} />
              </h2>
              <NodePolicy nodeId={n.id} current={n.policy} />
            </article>
          ))}
        </div>
      )}
    </section>
  );
}

function NodePolicy({ nodeId, current }: { nodeId: string; current: Node['policy'] }) {
  const { canWrite } = useAuth();
  const q = usePolicy(nodeId);
  const save = useSavePolicy(nodeId);
  if (q.isPending) return <LoadingState label="Loading the policy" />;
  if (q.isError) return <ErrorState error={q.error} title="Cannot load the policy" />;
  return (
    <>
      <PolicyForm
        key={`${q.data.version}`}
        nodeId={nodeId}
        policy={q.data}
        current={current}
        readOnly={!canWrite}
        saving={save.isPending}
        serverError={save.error}
        onSubmit={(p) => save.mutate(p)}
      />
      {save.isSuccess && (
        <p role="status" className="small">
          Saved as version {save.data.version}.
        </p>
      )}
    </>
  );
}

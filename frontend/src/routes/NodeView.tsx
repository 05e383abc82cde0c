import { Link, useParams } from 'react-router';
import { useNode } from '../api/hooks';
import { NodeCard } from '../components/NodeCard';
import { TieringPanel } from '../components/TieringPanel';
import { ErrorState, LoadingState } from '../components/States';

export function NodeView() {
  const { nodeId = '' } = useParams();
  const q = useNode(nodeId);
  return (
    <section aria-labelledby="node-title">
      <h1 id="node-title">Node {nodeId}</h1>
      {q.isPending ? (
        <LoadingState label="Loading the node" />
      ) : q.isError && !q.data ? (
        <ErrorState error={q.error} title={`Cannot load node ${nodeId}`} />
      ) : (
        <>
          <NodeCard node={q.data} explain />
          {q.data.tiering && <TieringPanel tiering={q.data.tiering} label={`What the tiering bought, node ${nodeId}`} />}
          <p>
            <Link to={`/throughput?node=${encodeURIComponent(nodeId)}`}>Throughput of this node</Link> ·{' '}
            <Link to={`/policies/${encodeURIComponent(nodeId)}`}>Its policy</Link> ·{' '}
            <Link to={`/events?node=${encodeURIComponent(nodeId)}`}>Its events</Link>
          </p>
        </>
      )}
    </section>
  );
}

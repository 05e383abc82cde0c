import { Link, useParams } from 'react-router';
import { useActions } from '../api/hooks';
import { ActionResult } from '../components/ActionResult';
import { EmptyState, ErrorState, LoadingState } from '../components/States';
import { formatTime } from '../format';

/** /actions/:id — one action's per-path result; /actions — the recent ones. */
export function ActionView() {
  const { actionId } = useParams();
  const id = Number(actionId);
  return (
    <section aria-labelledby="action-title">
      <h1 id="action-title">Action #{actionId}</h1>
      {Number.isInteger(id) ? <ActionResult id={id} /> : <ErrorState error={new Error('Not an action number.')} />}
    </section>
  );
}

export function ActionsView() {
  const q = useActions();
  return (
    <section aria-labelledby="actions-title">
      <h1 id="actions-title">Actions</h1>
      {q.isPending ? (
        <LoadingState />
      ) : q.isError ? (
        <ErrorState error={q.error} />
      ) : q.data.items.length === 0 ? (
        <EmptyState>No action yet.</EmptyState>
      ) : (
        <ul>
          {q.data.items.map((a) => (
            <li key={a.id}>
              <Link to={`/actions/${a.id}`}>#{a.id}</Link> {a.action} {a.items.map((i) => i.path).join(', ')} — {a.state} ({formatTime(a.created_at)})
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

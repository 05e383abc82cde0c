import { Link } from 'react-router';
import { useAction } from '../api/hooks';
import { ErrorState, LoadingState } from './States';

/** The per-path result of an action, kept fresh by the stream (and polling as a fallback). */
export function ActionResult({ id }: { id: number }) {
  const q = useAction(id);
  if (q.isPending) return <LoadingState label="Sending the action" />;
  if (q.isError) return <ErrorState error={q.error} title="Cannot read the action" />;
  const a = q.data;
  return (
    <section className="action-result" aria-label={`Action ${a.id} result`}>
      <p>
        <Link to={`/actions/${a.id}`}>Action #{a.id}</Link>: {a.action} — <span className={`state-word state-${a.state}`}>{a.state}</span>
      </p>
      <table>
        <thead>
          <tr>
            <th scope="col">Path</th>
            <th scope="col">Node</th>
            <th scope="col">Result</th>
            <th scope="col">Detail</th>
          </tr>
        </thead>
        <tbody>
          {a.items.map((it) => (
            <tr key={it.path}>
              <td>{it.path}</td>
              <td>{it.node ?? '—'}</td>
              <td>
                <span className={`state-word state-${it.state}`}>{it.state}</span>
              </td>
              <td>{it.detail ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

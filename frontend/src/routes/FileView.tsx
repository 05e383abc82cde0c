import { useState } from 'react';
import { useParams } from 'react-router';
import { useFileInfo } from '../api/hooks';
import type { ActionKind } from '../api/types';
import { useAuth } from '../auth/auth';
import { ActionDialog } from '../components/ActionDialog';
import { Breadcrumbs } from '../components/Breadcrumbs';
import { ErrorState, LoadingState } from '../components/States';
import { formatBytes, formatTime } from '../format';
import { pathFromSplat } from './Files';

/** One file's deep link: /file/<path>. */
export function FileView() {
  const path = pathFromSplat(useParams()['*']);
  const q = useFileInfo(path);
  const { canWrite } = useAuth();
  const [action, setAction] = useState<ActionKind | null>(null);
  return (
    <section aria-labelledby="file-title">
      <h1 id="file-title">{path}</h1>
      <Breadcrumbs path={path} />
      {q.isPending ? (
        <LoadingState label="Loading the file" />
      ) : q.isError && !q.data ? (
        <ErrorState error={q.error} title={`Cannot read ${path}`} />
      ) : (
        <>
          <dl className="stats card" aria-label="File details">
            <div><dt>Kind</dt><dd>{q.data.kind}</dd></div>
            <div><dt>Size</dt><dd>{formatBytes(q.data.size)}</dd></div>
            <div><dt>Node</dt><dd>{q.data.primary ?? '—'}</dd></div>
            <div><dt>Tier</dt><dd>{q.data.tier ?? '—'}</dd></div>
            <div><dt>Replicas</dt><dd>{q.data.replicas.length ? q.data.replicas.join(', ') : 'none'}</dd></div>
            <div><dt>Pinned</dt><dd>{q.data.pinned ? 'pinned' : 'no'}</dd></div>
            <div><dt>Modified</dt><dd>{formatTime(q.data.mtime)}</dd></div>
          </dl>
          {canWrite && (
            <div className="buttons">
              <button type="button" onClick={() => setAction(q.data.pinned ? 'unpin' : 'pin')}>{q.data.pinned ? 'Unpin' : 'Pin'}</button>
              <button type="button" onClick={() => setAction('promote')}>Promote</button>
              <button type="button" onClick={() => setAction('demote')}>Demote</button>
            </div>
          )}
        </>
      )}
      {action && <ActionDialog action={action} paths={[path]} onClose={() => setAction(null)} />}
    </section>
  );
}

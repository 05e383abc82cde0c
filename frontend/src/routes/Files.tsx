import { useCallback, useMemo, useState } from 'react';
import { useParams, useSearchParams } from 'react-router';
import { useFiles } from '../api/hooks';
import type { ActionKind, FileEntry } from '../api/types';
import { useAuth } from '../auth/auth';
import { ActionDialog } from '../components/ActionDialog';
import { Breadcrumbs } from '../components/Breadcrumbs';
import { FileTable } from '../components/FileTable';
import { EmptyState, ErrorState, LoadingState } from '../components/States';

export function pathFromSplat(splat: string | undefined): string {
  return '/' + (splat ?? '').split('/').filter(Boolean).map(decodeURIComponent).join('/');
}

export function Files() {
  const path = pathFromSplat(useParams()['*']);
  const [params, setParams] = useSearchParams();
  const prefix = params.get('prefix') ?? '';
  const { canWrite } = useAuth();
  const q = useFiles(path, '');
  const [pending, setPending] = useState<{ action: ActionKind; entry: FileEntry } | null>(null);

  const all = useMemo(() => q.data?.pages.flatMap((p) => p.items) ?? [], [q.data]);
  const entries = useMemo(() => (prefix ? all.filter((e) => e.name.startsWith(prefix)) : all), [all, prefix]);
  const { hasNextPage, isFetchingNextPage, fetchNextPage } = q;
  const loadMore = useCallback(() => void fetchNextPage(), [fetchNextPage]);

  return (
    <section aria-labelledby="files-title">
      <h1 id="files-title">Files</h1>
      <Breadcrumbs path={path} />
      <div className="toolbar">
        <label htmlFor="prefix">Filter by name prefix</label>
        <input
          id="prefix"
          type="search"
          value={prefix}
          onChange={(e) => {
            const p = new URLSearchParams(params);
            if (e.target.value) p.set('prefix', e.target.value);
            else p.delete('prefix');
            setParams(p, { replace: true });
          }}
        />
        <span className="small muted" role="status">
          {q.data ? `${entries.length}${hasNextPage ? '+' : ''} entries` : ''}
        </span>
      </div>
      {q.isPending ? (
        <LoadingState label="Listing the directory" />
      ) : q.isError && !q.data ? (
        <ErrorState error={q.error} title={`Cannot list ${path}`} />
      ) : entries.length === 0 && !hasNextPage ? (
        <EmptyState>{prefix ? `No entry in ${path} starts with “${prefix}”.` : `${path} is empty.`}</EmptyState>
      ) : (
        <FileTable
          entries={entries}
          hasMore={!!hasNextPage}
          loadingMore={isFetchingNextPage}
          onLoadMore={loadMore}
          onAction={canWrite ? (action, entry) => setPending({ action, entry }) : null}
        />
      )}
      {pending && <ActionDialog action={pending.action} paths={[pending.entry.path]} onClose={() => setPending(null)} />}
    </section>
  );
}

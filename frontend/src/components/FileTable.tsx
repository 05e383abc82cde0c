// The entries of one directory, virtualised (a directory may hold 100,000 names): only
// the visible rows are in the DOM, and the next page is fetched as the end comes near.
import { useEffect, useRef } from 'react';
import { Link } from 'react-router';
import { useVirtualizer } from '@tanstack/react-virtual';
import type { ActionKind, FileEntry } from '../api/types';
import { formatBytes, formatTime } from '../format';
import { filesHref } from './Breadcrumbs';

const ROW = 40;

export interface FileTableProps {
  entries: FileEntry[];
  hasMore: boolean;
  loadingMore: boolean;
  onLoadMore: () => void;
  /** null: read-only token, no action buttons */
  onAction: ((action: ActionKind, entry: FileEntry) => void) | null;
}

export function fileHref(path: string): string {
  return `/file/${path.replace(/^\/+/, '').split('/').map(encodeURIComponent).join('/')}`;
}

export function FileTable({ entries, hasMore, loadingMore, onLoadMore, onAction }: FileTableProps) {
  const scrollRef = useRef<HTMLDivElement>(null);
  // eslint-disable-next-line react-hooks/incompatible-library
  const v = useVirtualizer({
    count: entries.length,
    getScrollElement: () => scrollRef.current,
    estimateSize: () => ROW,
    overscan: 12,
    initialRect: { width: 900, height: 600 },
  });
  const items = v.getVirtualItems();
  const last = items[items.length - 1];
  useEffect(() => {
    if (last && last.index >= entries.length - 50 && hasMore && !loadingMore) onLoadMore();
  }, [last, entries.length, hasMore, loadingMore, onLoadMore]);

  return (
    <div className="filetable" role="table" aria-label="Files" aria-rowcount={entries.length + 1}>
      <div className="ft-row ft-head" role="row" aria-rowindex={1}>
        <span role="columnheader">Name</span>
        <span role="columnheader">Size</span>
        <span role="columnheader">Node</span>
        <span role="columnheader">Tier</span>
        <span role="columnheader">Replicas</span>
        <span role="columnheader">Pinned</span>
        <span role="columnheader">Modified</span>
        <span role="columnheader">{onAction ? 'Actions' : ''}</span>
      </div>
      <div className="ft-scroll" ref={scrollRef} role="rowgroup" tabIndex={0} aria-label="File entries">
        <div style={{ height: v.getTotalSize(), position: 'relative' }}>
          {items.map((vi) => {
            const e = entries[vi.index];
            if (!e) return null;
            const isDir = e.kind === 'dir';
            return (
              <div
                key={e.path}
                className="ft-row"
                role="row"
                aria-rowindex={vi.index + 2}
                style={{ position: 'absolute', top: 0, left: 0, right: 0, height: ROW, transform: `translateY(${vi.start}px)` }}
              >
                <span role="cell" className="ft-name">
                  <Link to={isDir ? filesHref(e.path) : fileHref(e.path)}>
                    {isDir ? '📁 ' : ''}
                    {e.name}
                  </Link>
                </span>
                <span role="cell">{isDir ? '' : formatBytes(e.size)}</span>
                <span role="cell">{e.primary ?? '—'}</span>
                <span role="cell" className={e.tier ? `tier tier-${e.tier}` : undefined}>
                  {isDir ? '' : (e.tier ?? '—')}
                </span>
                <span role="cell">{e.replicas.length ? e.replicas.join(', ') : isDir ? '' : 'none'}</span>
                <span role="cell">{isDir ? '' : e.pinned ? 'pinned' : 'no'}</span>
                <span role="cell" className="small">{formatTime(e.mtime)}</span>
                <span role="cell" className="ft-actions">
                  {onAction && !isDir && (
                    <>
                      <button type="button" onClick={() => onAction(e.pinned ? 'unpin' : 'pin', e)} aria-label={`${e.pinned ? 'Unpin' : 'Pin'} ${e.name}`}>
                        {e.pinned ? 'Unpin' : 'Pin'}
                      </button>
                      <button type="button" onClick={() => onAction('promote', e)} aria-label={`Promote ${e.name}`} disabled={e.tier === 'fast'}>
                        Promote
                      </button>
                      <button type="button" onClick={() => onAction('demote', e)} aria-label={`Demote ${e.name}`} disabled={e.tier === 'slow'}>
                        Demote
                      </button>
                    </>
                  )}
                </span>
              </div>
            );
          })}
        </div>
      </div>
      {loadingMore && (
        <p role="status" className="small muted">
          Loading more entries…
        </p>
      )}
    </div>
  );
}

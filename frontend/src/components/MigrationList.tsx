import type { Migration } from '../api/types';
import { formatBytes } from '../format';

export function MigrationList({ migrations }: { migrations: Migration[] }) {
  if (!migrations.length) return <p className="muted small">No migration under way.</p>;
  return (
    <ul className="migrations" aria-label="Migrations under way">
      {migrations.map((m, i) => (
        <li key={`${m.path ?? ''}-${i}`}>
          <span>
            {m.path ?? '(file)'}: {m.from ?? '?'} → {m.to ?? '?'}
          </span>
          <progress max={m.total || 1} value={m.copied ?? 0} aria-label={`migration of ${m.path ?? 'a file'}`}>
            {formatBytes(m.copied)}
          </progress>
          <span className="small muted">
            {formatBytes(m.copied)} / {formatBytes(m.total)}
          </span>
        </li>
      ))}
    </ul>
  );
}

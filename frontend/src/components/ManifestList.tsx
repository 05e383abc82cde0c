// The submitted manifests: name, format, state, jobs, bytes moved, created.
import { Link } from 'react-router';
import type { Manifest } from '../api/types';
import { formatBytes, formatTime } from '../format';

export function ManifestStateBadge({ state }: { state: Manifest['state'] }) {
  return <span className={`state-word manifest-${state}`}>{state}</span>;
}

export function ManifestList({ manifests }: { manifests: Manifest[] }) {
  return (
    <table className="table" aria-label="Manifests">
      <thead>
        <tr>
          <th scope="col">Name</th>
          <th scope="col">Format</th>
          <th scope="col">State</th>
          <th scope="col">Jobs</th>
          <th scope="col">Bytes moved</th>
          <th scope="col">Created</th>
        </tr>
      </thead>
      <tbody>
        {manifests.map((m) => (
          <tr key={m.id}>
            <td>
              <Link to={`/jobs/${m.id}`}>{m.name || `manifest ${m.id}`}</Link>
            </td>
            <td>{m.format}</td>
            <td>
              <ManifestStateBadge state={m.state} />
            </td>
            <td>{m.jobs.length}</td>
            <td>{formatBytes(m.transfer_bytes.placed)}</td>
            <td>{formatTime(m.created_at)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

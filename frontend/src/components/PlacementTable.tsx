// The placement as a table: job → node, its state, when it started and finished.
import type { ManifestJob } from '../api/types';
import { formatTime } from '../format';

export function PlacementTable({ jobs, colors }: { jobs: ManifestJob[]; colors: Record<string, string> }) {
  return (
    <table className="table" aria-label="Placement">
      <thead>
        <tr>
          <th scope="col">Job</th>
          <th scope="col">Node</th>
          <th scope="col">Order on node</th>
          <th scope="col">State</th>
          <th scope="col">Started</th>
          <th scope="col">Finished</th>
        </tr>
      </thead>
      <tbody>
        {jobs.map((j) => (
          <tr key={j.id}>
            <th scope="row">{j.id}</th>
            <td>
              <span className="swatch" style={{ background: colors[j.node] }} aria-hidden="true" /> {j.node}
            </td>
            <td>{j.position + 1}</td>
            <td>
              <span className={`state-word job-${j.state}`}>{j.state}</span>
            </td>
            <td>{j.started_at ? formatTime(j.started_at) : '—'}</td>
            <td>{j.finished_at ? formatTime(j.finished_at) : '—'}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

// The placement as a table: job → node, its task type, state, when it started and finished,
// the Slurm job that ran it (id, node, staging);
// for a pending job, "where would it run now" (POST /placements with the files it reads).
// Paged (50 a page), sorted and filtered here: the manifest's jobs are all in hand.
import { useMemo, useState } from 'react';
import type { ManifestJob } from '../api/types';
import { formatTime } from '../format';
import { SlurmCell } from './SlurmCell';
import { jobTask } from './taskType';
import { WhereNow } from './WhereNow';

export const JOB_PAGE_SIZE = 50;
type Sort = 'name' | 'node' | 'runtime';

const runtime = (j: ManifestJob) => (j.started_at !== null && j.finished_at !== null ? j.finished_at - j.started_at : null);

function formatRuntime(s: number | null): string {
  if (s === null) return '—';
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

export function PlacementTable({ jobs, colors, pageSize = JOB_PAGE_SIZE }: { jobs: ManifestJob[]; colors: Record<string, string>; pageSize?: number }) {
  const [sort, setSort] = useState<Sort>('name');
  const [desc, setDesc] = useState(false);
  const [name, setName] = useState('');
  const [type, setType] = useState('');
  const [offset, setOffset] = useState(0);
  const types = useMemo(() => [...new Set(jobs.map((j) => jobTask(j)))].sort(), [jobs]);
  const rows = useMemo(() => {
    const q = name.trim().toLowerCase();
    const kept = jobs.filter((j) => (q === '' || j.id.toLowerCase().includes(q)) && (type === '' || jobTask(j) === type));
    const key = (j: ManifestJob): string | number => (sort === 'name' ? j.id : sort === 'node' ? j.node : (runtime(j) ?? -1));
    const cmp = (a: ManifestJob, b: ManifestJob) => {
      const ka = key(a);
      const kb = key(b);
      const c = typeof ka === 'number' && typeof kb === 'number' ? ka - kb : String(ka).localeCompare(String(kb), undefined, { numeric: true });
      return c !== 0 ? c : a.id.localeCompare(b.id, undefined, { numeric: true }) || a.position - b.position;
    };
    const sorted = kept.sort(cmp);
    return desc ? sorted.reverse() : sorted;
  }, [jobs, name, type, sort, desc]);
  const start = Math.min(offset, Math.max(0, Math.floor((rows.length - 1) / pageSize) * pageSize));
  const page = rows.slice(start, start + pageSize);
  const last = start + page.length;
  const onSort = (s: Sort) => {
    setDesc(s === sort ? !desc : false);
    setSort(s);
    setOffset(0);
  };
  const header = (s: Sort | null, label: string) => (
    <th scope="col" aria-sort={s && s === sort ? (desc ? 'descending' : 'ascending') : undefined}>
      {s ? (
        <button type="button" onClick={() => onSort(s)}>
          {label}
        </button>
      ) : (
        label
      )}
    </th>
  );
  return (
    <div className="card nodetable">
      <form className="nodetable-filters" role="search" aria-label="Filter jobs" onSubmit={(e) => e.preventDefault()}>
        <label>
          Task type{' '}
          <select
            value={type}
            onChange={(e) => {
              setType(e.target.value);
              setOffset(0);
            }}
          >
            <option value="">any</option>
            {types.map((t) => (
              <option key={t} value={t}>
                {t}
              </option>
            ))}
          </select>
        </label>
        <label>
          Job name contains{' '}
          <input
            type="search"
            value={name}
            onChange={(e) => {
              setName(e.target.value);
              setOffset(0);
            }}
          />
        </label>
      </form>
      <table className="table" aria-label="Placement">
        <thead>
          <tr>
            {header('name', 'Job')}
            {header('node', 'Node')}
            {header(null, 'Task type')}
            {header(null, 'Order on node')}
            {header(null, 'State')}
            {header(null, 'Started')}
            {header(null, 'Finished')}
            {header('runtime', 'Runtime')}
            {header(null, 'Slurm')}
            {header(null, 'Where now')}
          </tr>
        </thead>
        <tbody>
          {page.map((j) => (
            <tr key={j.id}>
              <th scope="row">{j.id}</th>
              <td>
                <span className="swatch" style={{ background: colors[j.node] }} aria-hidden="true" /> {j.node}
              </td>
              <td>{jobTask(j)}</td>
              <td>{j.position + 1}</td>
              <td>
                <span className={`state-word job-${j.state}`}>{j.state}</span>
              </td>
              <td>{j.started_at ? formatTime(j.started_at) : '—'}</td>
              <td>{j.finished_at ? formatTime(j.finished_at) : '—'}</td>
              <td>{formatRuntime(runtime(j))}</td>
              <td>
                <SlurmCell slurm={j.slurm} />
              </td>
              <td>{j.state === 'pending' && j.inputs && j.inputs.length > 0 ? <WhereNow job={j.id} inputs={j.inputs} colors={colors} /> : '—'}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <nav className="pager" aria-label="Job pages">
        <button type="button" disabled={start === 0} onClick={() => setOffset(Math.max(0, start - pageSize))}>
          Previous
        </button>
        <span role="status">{rows.length === 0 ? 'no job matches' : `${(start + 1).toLocaleString()}–${last.toLocaleString()} of ${rows.length.toLocaleString()}`}</span>
        <button type="button" disabled={last >= rows.length} onClick={() => setOffset(start + pageSize)}>
          Next
        </button>
      </nav>
    </div>
  );
}

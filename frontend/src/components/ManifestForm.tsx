// Upload or paste a manifest (the project's schema or a WfCommons instance) with the
// placement options; the control plane's 422 shown inline, each message naming its field.
import { useState, type ChangeEvent, type FormEvent } from 'react';
import { ApiError } from '../api/client';
import type { ManifestOptions, Solver, ValidationError } from '../api/types';
import { errorText } from './States';

export const SOLVERS: Solver[] = ['local', 'hypergraph', 'greedy', 'exact', 'round-robin'];

export interface FieldError {
  /** the field as the control plane names it: the `loc` path without its "body"/"query" head */
  field: string;
  msg: string;
}
export interface ManifestErrors {
  manifest: FieldError[];
  nodes: FieldError[];
  solver: FieldError[];
  slack: FieldError[];
  form: string[];
}

const empty = (): ManifestErrors => ({ manifest: [], nodes: [], solver: [], slack: [], form: [] });

/** `["workflow", "specification", "tasks", 0, "id"]` → `workflow.specification.tasks[0].id` */
export function locPath(loc: (string | number)[]): string {
  return loc.reduce<string>((s, p) => (typeof p === 'number' ? `${s}[${p}]` : s ? `${s}.${p}` : p), '');
}

/** A failure of POST /manifests → messages per form field (422 details by their `loc`). */
export function manifestErrors(error: unknown): ManifestErrors {
  const out = empty();
  if (error instanceof ApiError && error.status === 422 && Array.isArray(error.detail)) {
    for (const d of error.detail as ValidationError[]) {
      const [head, ...rest] = d.loc;
      if (head === 'query' && (rest[0] === 'nodes' || rest[0] === 'solver' || rest[0] === 'slack')) {
        out[rest[0]].push({ field: String(rest[0]), msg: d.msg });
      } else if (head === 'body') {
        out.manifest.push({ field: rest.length ? locPath(rest) : '(document)', msg: d.msg });
      } else {
        out.form.push(`${locPath(d.loc)}: ${d.msg}`);
      }
    }
    return out;
  }
  if (error instanceof ApiError && error.status === 400) out.manifest.push({ field: '(document)', msg: 'not JSON' });
  else if (error) out.form.push(errorText(error));
  return out;
}

/** A file's text (FileReader: also where Blob.text is missing, as in jsdom). */
function readText(f: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error ?? new Error('could not read the file'));
    r.readAsText(f);
  });
}

export interface ManifestFormProps {
  submitting: boolean;
  serverError: unknown;
  onSubmit: (v: { document: unknown; options: ManifestOptions }) => void;
}

function FieldErrors({ id, errors }: { id: string; errors: FieldError[] }) {
  if (!errors.length) return null;
  return (
    <ul id={id} className="error-text field-errors">
      {errors.map((e, i) => (
        <li key={i}>
          <code>{e.field}</code>: {e.msg}
        </li>
      ))}
    </ul>
  );
}

export function ManifestForm({ submitting, serverError, onSubmit }: ManifestFormProps) {
  const [text, setText] = useState('');
  const [nodes, setNodes] = useState('');
  const [solver, setSolver] = useState<Solver>('local');
  const [slack, setSlack] = useState('0.1');
  const [clientErrs, setClientErrs] = useState<ManifestErrors>(empty());
  const [fileName, setFileName] = useState<string | null>(null);
  const server = serverError ? manifestErrors(serverError) : empty();
  const errs: ManifestErrors = {
    manifest: clientErrs.manifest.length ? clientErrs.manifest : server.manifest,
    nodes: clientErrs.nodes.length ? clientErrs.nodes : server.nodes,
    solver: server.solver,
    slack: clientErrs.slack.length ? clientErrs.slack : server.slack,
    form: server.form,
  };

  const onFile = async (e: ChangeEvent<HTMLInputElement>) => {
    const f = e.target.files?.[0];
    if (!f) return;
    setFileName(f.name);
    setText(await readText(f));
  };

  const submit = (e: FormEvent) => {
    e.preventDefault();
    const ce = empty();
    let document: unknown = undefined;
    if (!text.trim()) ce.manifest.push({ field: '(document)', msg: 'Paste a manifest or choose a file.' });
    else {
      try {
        document = JSON.parse(text);
      } catch (err) {
        ce.manifest.push({ field: '(document)', msg: `not JSON: ${err instanceof Error ? err.message : String(err)}` });
      }
    }
    const sl = Number(slack);
    if (slack.trim() === '' || !Number.isFinite(sl) || sl < 0 || sl > 100) ce.slack.push({ field: 'slack', msg: 'a number from 0 to 100' });
    setClientErrs(ce);
    if (!ce.manifest.length && !ce.slack.length) onSubmit({ document, options: { nodes, solver, slack: sl } });
  };

  return (
    <form className="manifestform card" onSubmit={submit} noValidate aria-label="Submit a manifest">
      <h2>Submit a manifest</h2>
      <div className="field field-wide">
        <label htmlFor="manifest-file">Manifest file</label>
        <input id="manifest-file" type="file" accept=".json,application/json" onChange={(e) => void onFile(e)} />
        {fileName && <span className="small muted">Loaded {fileName}</span>}
      </div>
      <div className="field field-wide">
        <label htmlFor="manifest-text">Manifest (JSON: the HyCache schema or a WfCommons instance)</label>
        <textarea
          id="manifest-text"
          rows={10}
          spellCheck={false}
          value={text}
          onChange={(e) => setText(e.target.value)}
          aria-invalid={errs.manifest.length > 0}
          aria-describedby={errs.manifest.length ? 'manifest-text-err' : undefined}
        />
        <FieldErrors id="manifest-text-err" errors={errs.manifest} />
      </div>
      <div className="form-row">
        <div className="field">
          <label htmlFor="manifest-nodes">Nodes (comma-separated; empty: every live node)</label>
          <input id="manifest-nodes" value={nodes} onChange={(e) => setNodes(e.target.value)} aria-invalid={errs.nodes.length > 0} aria-describedby={errs.nodes.length ? 'manifest-nodes-err' : undefined} />
          <FieldErrors id="manifest-nodes-err" errors={errs.nodes} />
        </div>
        <div className="field">
          <label htmlFor="manifest-solver">Solver</label>
          <select id="manifest-solver" value={solver} onChange={(e) => setSolver(e.target.value as Solver)} aria-invalid={errs.solver.length > 0}>
            {SOLVERS.map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
          <FieldErrors id="manifest-solver-err" errors={errs.solver} />
        </div>
        <div className="field">
          <label htmlFor="manifest-slack">Load slack (fraction over the balanced load)</label>
          <input id="manifest-slack" inputMode="decimal" value={slack} onChange={(e) => setSlack(e.target.value)} aria-invalid={errs.slack.length > 0} aria-describedby={errs.slack.length ? 'manifest-slack-err' : undefined} />
          <FieldErrors id="manifest-slack-err" errors={errs.slack} />
        </div>
      </div>
      {errs.form.map((f, i) => (
        <p key={i} role="alert" className="error-text">
          {f}
        </p>
      ))}
      {(errs.manifest.length > 0 || errs.nodes.length > 0 || errs.slack.length > 0 || errs.solver.length > 0) && (
        <p role="alert" className="error-text">
          The manifest was not accepted: see the fields above.
        </p>
      )}
      <div className="buttons">
        <button type="submit" className="primary" disabled={submitting}>
          {submitting ? 'Placing…' : 'Place manifest'}
        </button>
      </div>
    </form>
  );
}

import { useState, type FormEvent } from 'react';
import { ApiError } from '../api/client';
import type { Node, Policy, PolicyUpdate, ValidationError } from '../api/types';
import { errorText } from './States';

export const POLICIES = ['lru', 'lfu', 'gdsf', 'arc'];

type Field = 'policy' | 'high_watermark' | 'low_watermark';
export type FieldErrors = Partial<Record<Field | 'form', string>>;

/** Client-side checks, the same rules the control plane applies. */
export function validatePolicy(v: { policy: string; high: string; low: string }): FieldErrors {
  const errs: FieldErrors = {};
  const hi = Number(v.high);
  const lo = Number(v.low);
  if (!v.policy.trim()) errs.policy = 'Choose a policy.';
  if (v.high.trim() === '' || !Number.isFinite(hi) || hi <= 0 || hi > 1) errs.high_watermark = 'High watermark must be a number in (0, 1].';
  if (v.low.trim() === '' || !Number.isFinite(lo) || lo < 0 || lo >= 1) errs.low_watermark = 'Low watermark must be a number in [0, 1).';
  if (!errs.high_watermark && !errs.low_watermark && lo >= hi) errs.low_watermark = 'Low watermark must be below the high watermark.';
  return errs;
}

/** A 422's detail list → messages per form field (loc ["body", field, …]). */
export function serverErrors(error: unknown): FieldErrors {
  if (!(error instanceof ApiError)) return { form: errorText(error) };
  if (error.status === 422 && Array.isArray(error.detail)) {
    const errs: FieldErrors = {};
    for (const d of error.detail as ValidationError[]) {
      const field = d.loc.find((l) => l === 'policy' || l === 'high_watermark' || l === 'low_watermark') as Field | undefined;
      const key = field ?? 'form';
      errs[key] = errs[key] ? `${errs[key]} ${d.msg}` : d.msg;
    }
    return errs;
  }
  return { form: errorText(error) };
}

export interface PolicyFormProps {
  nodeId: string;
  policy: Policy;
  /** what the node reports it runs (its view in GET /nodes) */
  current?: Node['policy'];
  readOnly: boolean;
  saving: boolean;
  serverError: unknown;
  onSubmit: (p: PolicyUpdate) => void;
}

export function PolicyForm({ nodeId, policy, current, readOnly, saving, serverError, onSubmit }: PolicyFormProps) {
  // a node without a control-plane policy shows what it runs now (its own options)
  const [name, setName] = useState(policy.policy ?? current?.policy ?? 'lru');
  const [high, setHigh] = useState(String(policy.high_watermark ?? current?.high_watermark ?? 0.9));
  const [low, setLow] = useState(String(policy.low_watermark ?? current?.low_watermark ?? 0.7));
  const [clientErrs, setClientErrs] = useState<FieldErrors>({});
  const errs: FieldErrors = { ...(serverError ? serverErrors(serverError) : {}), ...clientErrs };
  const id = (f: string) => `policy-${nodeId}-${f}`;

  const submit = (e: FormEvent) => {
    e.preventDefault();
    const ce = validatePolicy({ policy: name, high, low });
    setClientErrs(ce);
    if (Object.keys(ce).length === 0) onSubmit({ policy: name, high_watermark: Number(high), low_watermark: Number(low) });
  };
  const options = POLICIES.includes(name) ? POLICIES : [name, ...POLICIES];

  return (
    <form className="policyform" onSubmit={submit} noValidate aria-label={`Policy of node ${nodeId}`}>
      <div className="field">
        <label htmlFor={id('policy')}>Eviction policy</label>
        <select id={id('policy')} value={name} disabled={readOnly} onChange={(e) => setName(e.target.value)} aria-invalid={!!errs.policy} aria-describedby={errs.policy ? id('policy-err') : undefined}>
          {options.map((p) => (
            <option key={p} value={p}>
              {p}
            </option>
          ))}
        </select>
        {errs.policy && <p id={id('policy-err')} className="error-text">{errs.policy}</p>}
      </div>
      <div className="field">
        <label htmlFor={id('high')}>High watermark (fraction of the fast tier)</label>
        <input id={id('high')} inputMode="decimal" value={high} readOnly={readOnly} onChange={(e) => setHigh(e.target.value)} aria-invalid={!!errs.high_watermark} aria-describedby={errs.high_watermark ? id('high-err') : undefined} />
        {errs.high_watermark && <p id={id('high-err')} className="error-text">{errs.high_watermark}</p>}
      </div>
      <div className="field">
        <label htmlFor={id('low')}>Low watermark (fraction of the fast tier)</label>
        <input id={id('low')} inputMode="decimal" value={low} readOnly={readOnly} onChange={(e) => setLow(e.target.value)} aria-invalid={!!errs.low_watermark} aria-describedby={errs.low_watermark ? id('low-err') : undefined} />
        {errs.low_watermark && <p id={id('low-err')} className="error-text">{errs.low_watermark}</p>}
      </div>
      <p className="small muted">
        {policy.version === 0
          ? 'No policy set from the control plane: the node runs its own options.'
          : `Version ${policy.version}; the node applies version ${policy.applied_version}${policy.applied_version === policy.version ? ' (in effect).' : ' (on its way).'}`}
      </p>
      {errs.form && (
        <p role="alert" className="error-text">
          {errs.form}
        </p>
      )}
      {!readOnly && (
        <button type="submit" className="primary" disabled={saving}>
          {saving ? 'Saving…' : 'Apply policy'}
        </button>
      )}
    </form>
  );
}

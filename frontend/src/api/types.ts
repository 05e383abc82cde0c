// Domain names for the generated OpenAPI schema (src/api/schema.d.ts, `npm run gen:api`).
import type { components } from './schema';

type S = components['schemas'];
export type WhoAmI = S['WhoAmI'];
export type Node = S['NodeOut'];
export type NodeList = S['NodePage'];
export type Summary = S['NodeSummary'];
export type NodeSort = NonNullable<NonNullable<import('./schema').operations['listNodes']['parameters']['query']>['sort']>;
export type Tier = S['TierView'];
export type Migration = S['MigrationActive'];
export type MetricSample = S['Sample'];
export type Rates = S['Rates'];
export type Metrics = S['MetricsOut'];
export type FileEntry = S['FileEntry'];
export type FileListing = S['FileListing'];
export type ActionKind = S['ActionRequest']['action'];
export type Action = S['ActionOut'];
export type ActionItem = S['ActionItemOut'];
export type Policy = S['PolicyOut'];
export type PolicyUpdate = S['PolicyIn'];
export type Event = S['EventOut'];
export type EventKind = Event['kind'];
export type NodeState = Node['state'];
export type Scope = WhoAmI['scope'];

/** FastAPI's 422 detail entries (`{"detail": [{loc, msg, type}]}`). */
export interface ValidationError {
  loc: (string | number)[];
  msg: string;
  type: string;
}

// Manifests (2-Layer Scheduling): the control plane answers these as free-form objects in
// the OpenAPI document, so their shapes are written here, after docs/control-plane.md.
export type ManifestState = 'planned' | 'running' | 'done' | 'cancelled';
export type JobState = 'pending' | 'running' | 'done';
export type Solver = 'greedy' | 'local' | 'hypergraph' | 'exact' | 'round-robin';
export type SlurmJob = S['SlurmJobOut'];
export type StagingState = SlurmJob['staging'];
/** A manifest job's Slurm job: its id, the node it ran on (null until pre-run), its state;
 * `staging` when the control plane states it (else GET /slurm/jobs/{id} has it). */
export interface ManifestJobSlurm {
  job_id: number;
  node: string | null;
  state: SlurmJob['state'];
  staging?: StagingState;
}
export interface ManifestJob {
  id: string;
  node: string;
  position: number;
  state: JobState;
  started_at: number | null;
  finished_at: number | null;
  /** the jobs this one waits for (older control planes leave it out) */
  parents?: string[];
  /** the task type the instance states (WfFormat `category` or the command's `program`); null when it states none */
  task?: string | null;
  /** the latest Slurm job that ran it (docs/slurm.md); null or absent when Slurm did not */
  slurm?: ManifestJobSlurm | null;
  /** the namespace paths it reads (GET /manifests/{id} only) */
  inputs?: string[];
}
export interface StepCounts {
  total: number;
  done: number;
  failed: number;
  skipped: number;
  cancelled: number;
  pending: number;
}
export interface TransferBytes {
  placed: number;
  round_robin: number;
  recorded: number | null;
}
export interface StepItem {
  id: number;
  node: string;
  job: string;
  step: number;
  plan_action: string;
  path: string;
  size: number | null;
  state: string;
  detail: string | null;
}
export interface Manifest {
  id: number;
  name: string;
  format: string;
  state: ManifestState;
  placement: Record<string, string>;
  transfer_bytes: TransferBytes;
  slow_tier_bytes?: TransferBytes;
  solver?: string | null;
  jobs: ManifestJob[];
  steps: Record<string, StepCounts>;
  step_items?: StepItem[];
  created_at: number;
  updated_at: number;
}
export interface ManifestPage {
  items: Manifest[];
  total: number;
  limit: number;
  offset: number;
}
export interface ManifestOptions {
  nodes: string;
  solver: Solver;
  slack: number;
}

// Domain names for the generated OpenAPI schema (src/api/schema.d.ts, `npm run gen:api`).
import type { components } from './schema';

type S = components['schemas'];
export type WhoAmI = S['WhoAmI'];
export type Node = S['NodeOut'];
export type NodeList = S['NodePage'];
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

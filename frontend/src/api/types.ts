// Domain names for the generated OpenAPI schema (src/api/schema.d.ts, `npm run gen:api`).
import type { components } from './schema';

type S = components['schemas'];
export type WhoAmI = S['WhoAmI'];
export type Node = S['Node'];
export type Tier = S['Tier'];
export type Migration = S['Migration'];
export type MetricSample = S['MetricSample'];
export type Metrics = S['Metrics'];
export type FileEntry = S['FileEntry'];
export type FileListing = S['FileListing'];
export type ActionKind = S['ActionRequest']['action'];
export type Action = S['Action'];
export type ActionItem = S['ActionItem'];
export type Policy = S['Policy'];
export type PolicyUpdate = S['PolicyUpdate'];
export type Event = S['Event'];
export type ValidationError = S['ValidationError'];
export type NodeState = Node['state'];
export type Scope = WhoAmI['scope'];

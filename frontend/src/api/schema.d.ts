// PROVISIONAL: written from docs/control-plane.md until the control plane's OpenAPI
// document exists; `npm run gen:api` replaces this file with the generated one.
/* eslint-disable */
type JSON200<T> = { responses: { 200: { content: { 'application/json': T } }; 401: { content: { 'application/json': components['schemas']['Error'] } } } };
export interface paths {
  '/api/v1/whoami': { get: JSON200<components['schemas']['WhoAmI']> };
  '/api/v1/nodes': { get: JSON200<components['schemas']['NodeList']> };
  '/api/v1/nodes/{node_id}': { get: { parameters: { path: { node_id: string } } } & JSON200<components['schemas']['Node']> };
  '/api/v1/nodes/{node_id}/metrics': {
    get: { parameters: { path: { node_id: string }; query?: { since?: string; until?: string; step?: number } } } & JSON200<components['schemas']['Metrics']>;
  };
  '/api/v1/nodes/{node_id}/policy': {
    get: { parameters: { path: { node_id: string } } } & JSON200<components['schemas']['Policy']>;
    put: { parameters: { path: { node_id: string } }; requestBody: { content: { 'application/json': components['schemas']['PolicyUpdate'] } }; responses: { 200: { content: { 'application/json': components['schemas']['Policy'] } }; 422: { content: { 'application/json': components['schemas']['HTTPValidationError'] } } } };
  };
  '/api/v1/files': { get: { parameters: { query: { path?: string; cursor?: string | null; limit?: number; prefix?: string } } } & JSON200<components['schemas']['FileListing']> };
  '/api/v1/files/info': { get: { parameters: { query: { path: string } } } & JSON200<components['schemas']['FileEntry']> };
  '/api/v1/files/actions': {
    post: { requestBody: { content: { 'application/json': components['schemas']['ActionRequest'] } }; responses: { 202: { content: { 'application/json': components['schemas']['Action'] } }; 422: { content: { 'application/json': components['schemas']['HTTPValidationError'] } } } };
  };
  '/api/v1/actions': { get: { parameters: { query?: { limit?: number; offset?: number } } } & JSON200<components['schemas']['ActionList']> };
  '/api/v1/actions/{action_id}': { get: { parameters: { path: { action_id: number } } } & JSON200<components['schemas']['Action']> };
  '/api/v1/events': { get: { parameters: { query?: { kind?: string; node?: string; since_id?: number; limit?: number; offset?: number } } } & JSON200<components['schemas']['EventList']> };
}
export interface components {
  schemas: {
    Error: { detail: unknown };
    ValidationError: { loc: (string | number)[]; msg: string; type: string };
    HTTPValidationError: { detail?: components['schemas']['ValidationError'][] };
    WhoAmI: { name: string; scope: 'read' | 'admin' | 'node'; node_id?: string | null };
    Tier: { capacity: number; device_capacity?: number | null; device_free?: number | null; used: number; files: number; high_watermark_bytes: number; low_watermark_bytes: number };
    Migration: { path?: string | null; from: string; to: string; copied: number; total: number };
    Node: {
      id: string; address?: string | null; state: 'up' | 'degraded' | 'down'; state_since?: number | null; version?: string | null; last_heartbeat?: number | null;
      dht: { state: string; backlog: number };
      policy?: { policy: string; high_watermark: number; low_watermark: number; version: number; applied_version: number } | null;
      tiers: { fast: components['schemas']['Tier']; slow: components['schemas']['Tier'] };
      hit_ratio?: number | null;
      rates?: Partial<components['schemas']['MetricSample']> | null;
      migrations: { active: components['schemas']['Migration'][]; done: number; bytes: number };
      updated_at?: number | null;
    };
    NodeList: { items: components['schemas']['Node'][]; total: number; limit: number; offset: number };
    MetricSample: { ts: number; fast_read_bps: number; fast_write_bps: number; slow_read_bps: number; slow_write_bps: number; remote_read_bps: number; hits: number; misses: number; hit_ratio?: number | null; metadata_ops_per_s: number; remote_fetches_per_s: number; migrations_per_s: number; migration_bps: number; migrations_in_flight: number; dht_backlog: number; fast_used: number; slow_used: number };
    Metrics: { node_id: string; step: number; samples: components['schemas']['MetricSample'][] };
    FileEntry: { name: string; path: string; kind: 'file' | 'dir' | 'symlink'; size: number; mtime: number; primary?: string | null; tier?: string | null; replicas: string[]; pinned: boolean; version?: number | null };
    FileListing: { path: string; items: components['schemas']['FileEntry'][]; next_cursor?: string | null };
    ActionRequest: { action: 'pin' | 'unpin' | 'promote' | 'demote'; paths: string[] };
    ActionItem: { path: string; node?: string | null; state: 'pending' | 'delivered' | 'done' | 'failed'; detail?: string | null };
    Action: { id: number; action: string; state: string; items: components['schemas']['ActionItem'][]; created_at: number; updated_at: number };
    ActionList: { items: components['schemas']['Action'][]; total: number; limit: number; offset: number };
    Policy: { policy: string; high_watermark: number; low_watermark: number; version: number; applied_version: number; updated_at?: number | null };
    PolicyUpdate: { policy: string; high_watermark: number; low_watermark: number };
    Event: { id: number; ts: number; kind: string; node?: string | null; actor?: string | null; action?: string | null; result?: string | null; detail?: unknown };
    EventList: { items: components['schemas']['Event'][]; total: number; limit: number; offset: number };
  };
}

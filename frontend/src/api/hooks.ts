// TanStack Query hooks: one per REST resource; the stream (LiveProvider) keeps them fresh.
import { keepPreviousData, useInfiniteQuery, useMutation, useQuery, useQueryClient } from '@tanstack/react-query';
import { api, call } from './client';
import type { ActionKind, EventKind, Manifest, ManifestOptions, ManifestPage, MetricSample, NodeSort, NodeState, PolicyUpdate } from './types';

export const keys = {
  whoami: (token: string | null) => ['whoami', token] as const,
  nodes: ['nodes'] as const,
  summary: ['summary'] as const,
  summaryHistory: (seconds: number) => ['summary-history', seconds] as const,
  nodeTable: (q: NodeTableQuery) => ['node-table', q] as const,
  node: (id: string) => ['nodes', id] as const,
  metrics: (id: string, windowSeconds: number) => ['metrics', id, windowSeconds] as const,
  liveSamples: (id: string) => ['live-samples', id] as const,
  files: (path: string, prefix: string) => ['files', path, prefix] as const,
  fileInfo: (path: string) => ['file-info', path] as const,
  action: (id: number) => ['actions', id] as const,
  actions: ['actions'] as const,
  policy: (id: string) => ['policy', id] as const,
  events: (kind: string, node: string) => ['events', kind, node] as const,
  manifests: ['manifests'] as const,
  manifest: (id: number) => ['manifests', id] as const,
  slurmJob: (id: number) => ['slurm-jobs', id] as const,
};

export function useNodes() {
  return useQuery({
    queryKey: keys.nodes,
    queryFn: () => call(api.GET('/api/v1/nodes', {})),
    refetchInterval: 15_000,
  });
}

/** Every node summed by the server (GET /summary; the stream's `summary` keeps it fresh). */
export function useSummary() {
  return useQuery({ queryKey: keys.summary, queryFn: () => call(api.GET('/api/v1/summary', {})), refetchInterval: 15_000 });
}

/** The cluster's summary over the last `seconds` (server-computed points, GET /summary/history). */
export function useSummaryHistory(seconds: number) {
  return useQuery({
    queryKey: keys.summaryHistory(seconds),
    queryFn: () => call(api.GET('/api/v1/summary/history', { params: { query: { seconds } } })),
    placeholderData: keepPreviousData,
    refetchInterval: 10_000,
  });
}

export interface NodeTableQuery {
  state?: NodeState;
  q?: string;
  sort: NodeSort;
  desc: boolean;
  offset: number;
  limit: number;
}

/** One page of the node table, sorted and filtered by the server. */
export function useNodeTable(query: NodeTableQuery) {
  return useQuery({
    queryKey: keys.nodeTable(query),
    queryFn: () =>
      call(api.GET('/api/v1/nodes', { params: { query: { ...query, q: query.q || undefined, state: query.state || undefined } } })),
    placeholderData: keepPreviousData,
    refetchInterval: 5000,
  });
}

export function useNode(id: string) {
  return useQuery({ queryKey: keys.node(id), queryFn: () => call(api.GET('/api/v1/nodes/{node_id}', { params: { path: { node_id: id } } })) });
}

/** Metric history of one node over the last `windowSeconds`. */
export function useMetrics(id: string, windowSeconds: number) {
  const step = Math.max(1, Math.round(windowSeconds / 300));
  return useQuery({
    queryKey: keys.metrics(id, windowSeconds),
    queryFn: () => {
      const since = Math.floor(Date.now() / 1000 - windowSeconds);
      return call(api.GET('/api/v1/nodes/{node_id}/metrics', { params: { path: { node_id: id }, query: { since: String(since), step } } }));
    },
    placeholderData: keepPreviousData,
    refetchInterval: Math.max(10_000, step * 10_000),
  });
}

export const FILES_PAGE = 500;

export function useFiles(path: string, prefix: string) {
  return useInfiniteQuery({
    queryKey: keys.files(path, prefix),
    initialPageParam: null as string | null,
    queryFn: ({ pageParam }) =>
      call(api.GET('/api/v1/files', { params: { query: { path, cursor: pageParam ?? undefined, limit: FILES_PAGE, ...(prefix ? { prefix } : {}) } } })),
    getNextPageParam: (last) => last.next_cursor ?? undefined,
    // tiers change as the agents migrate: re-read small listings (a huge one is re-read
    // when the user comes back to it, not every few seconds)
    refetchInterval: (q) => ((q.state.data?.pages.length ?? 0) <= 2 ? 4000 : false),
  });
}

export function useFileInfo(path: string) {
  return useQuery({ queryKey: keys.fileInfo(path), refetchInterval: 4000, queryFn: () => call(api.GET('/api/v1/files/info', { params: { query: { path } } })) });
}

export function useAction(id: number | null) {
  return useQuery({
    queryKey: keys.action(id ?? -1),
    enabled: id !== null,
    queryFn: () => call(api.GET('/api/v1/actions/{action_id}', { params: { path: { action_id: id ?? -1 } } })),
    // the stream pushes item updates; poll as a fallback until every item is final
    refetchInterval: (q) => (q.state.data && q.state.data.items.every((i) => i.state === 'done' || i.state === 'failed') ? false : 2000),
  });
}

export function useStartAction() {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: (v: { action: ActionKind; paths: string[] }) => call(api.POST('/api/v1/files/actions', { body: v })),
    onSuccess: (a) => {
      qc.setQueryData(keys.action(a.id), a);
      void qc.invalidateQueries({ queryKey: keys.actions });
    },
  });
}

export function useActions() {
  return useQuery({ queryKey: keys.actions, queryFn: () => call(api.GET('/api/v1/actions', { params: { query: { limit: 20 } } })) });
}

export function usePolicy(id: string) {
  return useQuery({
    queryKey: keys.policy(id),
    // until the node reports the version it applies, look again every 2 s
    refetchInterval: (q) => (q.state.data && q.state.data.applied_version !== q.state.data.version ? 2000 : 15_000),
    queryFn: () => call(api.GET('/api/v1/nodes/{node_id}/policy', { params: { path: { node_id: id } } })) });
}

export function useSavePolicy(id: string) {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: (body: PolicyUpdate) => call(api.PUT('/api/v1/nodes/{node_id}/policy', { params: { path: { node_id: id } }, body })),
    onSuccess: (p) => {
      qc.setQueryData(keys.policy(id), p);
      void qc.invalidateQueries({ queryKey: keys.nodes });
    },
  });
}

export function useEvents(kind: EventKind | '', node: string) {
  return useQuery({
    queryKey: keys.events(kind, node),
    queryFn: () => call(api.GET('/api/v1/events', { params: { query: { ...(kind ? { kind } : {}), ...(node ? { node } : {}), limit: 200 } } })),
    placeholderData: keepPreviousData,
  });
}

/** The latest samples the stream brought for a node (LiveProvider appends them). */
export function useLiveSamples(id: string) {
  return useQuery<MetricSample[]>({ queryKey: keys.liveSamples(id), queryFn: () => [], staleTime: Infinity, gcTime: Infinity });
}

export function useManifests() {
  return useQuery({
    queryKey: keys.manifests,
    queryFn: async () => (await call(api.GET('/api/v1/manifests', { params: { query: { limit: 50 } } }))) as unknown as ManifestPage,
    refetchInterval: 15_000,
  });
}

/** One manifest; the stream's plan-step updates invalidate it (LiveProvider). */
export function useManifest(id: number) {
  return useQuery({
    queryKey: keys.manifest(id),
    queryFn: async () => (await call(api.GET('/api/v1/manifests/{manifest_id}', { params: { path: { manifest_id: id } } }))) as unknown as Manifest,
    // a fallback while the manifest is under way (the stream is the live path)
    refetchInterval: (q) => (q.state.data && (q.state.data.state === 'done' || q.state.data.state === 'cancelled') ? false : 10_000),
  });
}

export function useSubmitManifest() {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: async (v: { document: unknown; options: ManifestOptions }) => {
      const nodes = v.options.nodes.trim();
      const query = { solver: v.options.solver, slack: v.options.slack, ...(nodes ? { nodes } : {}) };
      return (await call(api.POST('/api/v1/manifests', { params: { query }, body: v.document }))) as unknown as Manifest;
    },
    onSuccess: (m) => {
      qc.setQueryData(keys.manifest(m.id), m);
      void qc.invalidateQueries({ queryKey: keys.manifests, exact: true });
    },
  });
}

export function useCancelManifest(id: number) {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: async () =>
      (await call(api.DELETE('/api/v1/manifests/{manifest_id}', { params: { path: { manifest_id: id } } }))) as unknown as Manifest,
    onSuccess: (m) => {
      qc.setQueryData(keys.manifest(id), (old: Manifest | undefined) => ({ ...old, ...m }));
      void qc.invalidateQueries({ queryKey: keys.manifests });
    },
  });
}

/** POST /placements: where a ready job that reads `inputs` should run now (online placement). */
export function usePlaceJob() {
  return useMutation({
    mutationFn: (inputs: string[]) => call(api.POST('/api/v1/placements', { body: { inputs } })),
  });
}

/** One Slurm job's staging (GET /slurm/jobs/{id}); polled while its inputs are staging. */
export function useSlurmJob(id: number | null) {
  return useQuery({
    queryKey: keys.slurmJob(id ?? -1),
    queryFn: () => call(api.GET('/api/v1/slurm/jobs/{slurm_job_id}', { params: { path: { slurm_job_id: id ?? -1 } } })),
    enabled: id !== null,
    refetchInterval: (q) => (q.state.data && (q.state.data.staging === 'staging' || q.state.data.state === 'pending') ? 5_000 : false),
  });
}

// The typed REST client (openapi-fetch over the generated `paths`), with the session's
// bearer token and one error type for every failure the views show.
import createClient, { type Middleware } from 'openapi-fetch';
import type { paths } from './schema';

const TOKEN_KEY = 'hycache.token';

export function getToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}
export function setToken(token: string | null): void {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An API failure: `status` 0 means the control plane could not be reached. */
export class ApiError extends Error {
  readonly status: number;
  readonly detail: unknown;
  constructor(status: number, detail: unknown, message?: string) {
    super(message ?? describe(status, detail));
    this.status = status;
    this.detail = detail;
  }
}

function describe(status: number, detail: unknown): string {
  if (status === 0) return 'The control plane cannot be reached.';
  if (status === 401) return 'Not signed in, or the token was refused (401).';
  if (status === 403) return 'This token is not allowed to do that (403).';
  if (typeof detail === 'string') return `${detail} (${status})`;
  return `The control plane answered ${status}.`;
}

const auth: Middleware = {
  onRequest({ request }) {
    const token = getToken();
    if (token && !request.headers.has('Authorization')) request.headers.set('Authorization', `Bearer ${token}`);
    return request;
  },
};

export const api = createClient<paths>({ baseUrl: '/', fetch: (req) => globalThis.fetch(req) });
api.use(auth);

/** Unwrap an openapi-fetch answer: data, or throw ApiError (network failures included). */
export async function call<T>(p: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  let res;
  try {
    res = await p;
  } catch (e) {
    throw new ApiError(0, String(e));
  }
  if (res.error !== undefined || !res.response.ok) {
    const err = res.error as { detail?: unknown } | undefined;
    throw new ApiError(res.response.status, err?.detail ?? res.response.statusText);
  }
  return res.data as T;
}

// Loading, empty and error states shared by every view.
import { ApiError } from '../api/client';

export function LoadingState({ label = 'Loading' }: { label?: string }) {
  return (
    <div className="state state-loading" role="status" aria-live="polite">
      <span className="spinner" aria-hidden="true" /> {label}…
    </div>
  );
}

export function EmptyState({ children }: { children: React.ReactNode }) {
  return <div className="state state-empty">{children}</div>;
}

export function errorText(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.status === 0) return 'The control plane cannot be reached. Retrying…';
    if (error.status === 401) return 'Your token was refused (401). Sign in again.';
    if (error.status === 403) return 'This token may not see this (403).';
    if (error.status === 404) return 'Not found (404).';
    return error.message;
  }
  return error instanceof Error ? error.message : String(error);
}

export function ErrorState({ error, title = 'Something went wrong' }: { error: unknown; title?: string }) {
  return (
    <div className="state state-error" role="alert">
      <strong>{title}</strong>
      <p>{errorText(error)}</p>
    </div>
  );
}

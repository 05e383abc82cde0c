import { useEffect, useRef, useState } from 'react';
import { useStartAction } from '../api/hooks';
import type { ActionKind } from '../api/types';
import { ActionResult } from './ActionResult';
import { errorText } from './States';

const VERB: Record<ActionKind, string> = {
  pin: 'Pin',
  unpin: 'Unpin',
  promote: 'Promote to the fast tier',
  demote: 'Demote to the slow tier',
};

const EXPLAIN: Record<ActionKind, string> = {
  pin: 'A pinned file is never evicted from the fast tier.',
  unpin: 'The file can be evicted again when the fast tier fills.',
  promote: 'The file is copied to the fast tier now.',
  demote: 'The file is moved to the slow tier now.',
};

/** Confirms an action on some paths, sends it and shows its per-path result. */
export function ActionDialog({ action, paths, onClose }: { action: ActionKind; paths: string[]; onClose: () => void }) {
  const start = useStartAction();
  const [actionId, setActionId] = useState<number | null>(null);
  const confirmRef = useRef<HTMLButtonElement>(null);
  useEffect(() => confirmRef.current?.focus(), []);
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => e.key === 'Escape' && onClose();
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, [onClose]);

  const title = `${VERB[action]}: ${paths.length === 1 ? paths[0] : `${paths.length} files`}`;
  return (
    <div className="backdrop">
      <div className="dialog card" role="dialog" aria-modal="true" aria-labelledby="action-dialog-title">
        <h2 id="action-dialog-title">{title}</h2>
        {actionId === null ? (
          <>
            <p>{EXPLAIN[action]}</p>
            {paths.length > 1 && (
              <ul className="small">
                {paths.slice(0, 10).map((p) => (
                  <li key={p}>{p}</li>
                ))}
                {paths.length > 10 && <li>… and {paths.length - 10} more</li>}
              </ul>
            )}
            {start.isError && (
              <p role="alert" className="error-text">
                {errorText(start.error)}
              </p>
            )}
            <div className="buttons">
              <button type="button" onClick={onClose}>
                Cancel
              </button>
              <button
                type="button"
                className="primary"
                ref={confirmRef}
                disabled={start.isPending}
                onClick={() => start.mutate({ action, paths }, { onSuccess: (a) => setActionId(a.id) })}
              >
                Confirm {action}
              </button>
            </div>
          </>
        ) : (
          <>
            <ActionResult id={actionId} />
            <div className="buttons">
              <button type="button" className="primary" onClick={onClose}>
                Close
              </button>
            </div>
          </>
        )}
      </div>
    </div>
  );
}

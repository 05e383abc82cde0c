import type { Node } from '../api/types';
import { formatBytes } from '../format';

/** What each figure of {@link MoveCounters} includes (its caption, and each term's title). */
export const MOVES: Record<string, string> = {
  evictions: 'Evictions: files the evictor moved to the slow tier, and every byte moved to the slow tier (evictions, spills and demotions).',
  takenBack:
    'Taken back: evictions a passthrough open cancelled before their switch; the file stayed on the fast tier and its slow copy was dropped.',
  promotions:
    'Promotions: files moved to the fast tier (on open, by a plan or an operator), and the bytes moved to the fast tier; declined: on-open promotions the admission rule turned down.',
  spills: 'Spills: files a write moved to the slow tier because the fast tier had no room for them, even with the write slack.',
  kept:
    'Kept remote copies: copies of other nodes\u2019 files kept on the fast tier after the kernel forgot them, for the next open of the same bytes (counted in the fast tier\u2019s used bytes); reused: opens that took one over instead of fetching again.',
};

/** A node's eviction and promotion counts (since its agent started) and its kept remote copies. */
export function MoveCounters({ node, explain }: { node: Node; explain: boolean }) {
  const m = node.migrations;
  const kept = node.copies_kept;
  return (
    <>
      <dl className="stats" aria-label={`Moves between the tiers, node ${node.id}`}>
        <div title={MOVES.evictions}>
          <dt>Evictions</dt>
          <dd>
            {m.evictions} ({formatBytes(node.tiering?.evicted_bytes)})
          </dd>
        </div>
        <div title={MOVES.takenBack}>
          <dt>Evictions taken back</dt>
          <dd>{m.evictions_taken_back}</dd>
        </div>
        <div title={MOVES.promotions}>
          <dt>Promotions</dt>
          <dd>
            {m.promotions} ({formatBytes(node.tiering?.promoted_bytes)}), {m.promotions_declined} declined
          </dd>
        </div>
        <div title={MOVES.spills}>
          <dt>Spills</dt>
          <dd>{m.spills}</dd>
        </div>
        {kept && (
          <div title={MOVES.kept}>
            <dt>Kept remote copies</dt>
            <dd>
              {kept.files} ({formatBytes(kept.bytes)}), {kept.adopted} reused
            </dd>
          </div>
        )}
      </dl>
      {explain && (
        <p className="muted small" data-testid="moves-caption">
          Counts since the agent started. {MOVES.evictions} {MOVES.takenBack} {MOVES.promotions} {MOVES.spills}
          {kept ? ` ${MOVES.kept}` : ''} Migrations done counts every finished move, the operator&apos;s and plans&apos;
          demotions included.
        </p>
      )}
    </>
  );
}

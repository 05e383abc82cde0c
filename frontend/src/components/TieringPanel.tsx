import type { components } from '../api/schema';
import { formatBytes, formatPercent } from '../format';

type Tiering = components['schemas']['TieringView'];

/** What each counting mode (the control plane's `tiering.counting`) puts in the byte counts. */
export const COUNTING: Record<string, string> = {
  traced:
    'Passthrough on: the kernel moves the bytes. Reads are the bytes the kernel read from each tier\u2019s files for ' +
    'the mount\u2019s readers (page-cache hits and device reads alike, in whole pages; O_DIRECT and mmap reads are not ' +
    'counted), from its filemap trace point. Writes are how much files grew, counted when the agent next looks ' +
    '(an attribute request or the last close); overwrites in place are not counted.',
  untraced:
    'Passthrough on, without the kernel\u2019s trace points (e.g. an unprivileged container): reads the kernel serves ' +
    'are not counted, only those the agent serves; writes are how much files grew, counted at attribute requests and ' +
    'the last close.',
  agent: 'Passthrough off: every byte read or written through the mount, counted by the agent that served it.',
  unknown: 'An agent that does not say how it counts bytes (an older version).',
};

/** Hit ratio, bytes per tier, bytes moved by promotion and eviction, and what they include. */
export function TieringPanel({ tiering, label }: { tiering: Tiering; label: string }) {
  const t = tiering;
  const modes = Object.entries(t.counting ?? {});
  return (
    <section className="card tiering" aria-label={label}>
      <h2>What the tiering bought</h2>
      <dl className="stats">
        <div><dt>Hit ratio (opens)</dt><dd>{formatPercent(t.hit_ratio)}</dd></div>
        <div><dt>Read from fast tier</dt><dd>{formatBytes(t.fast_read_bytes)}</dd></div>
        <div><dt>Read from slow tier</dt><dd>{formatBytes(t.slow_read_bytes)}</dd></div>
        <div><dt>Read from other nodes</dt><dd>{formatBytes(t.remote_read_bytes)}</dd></div>
        <div><dt>Written to fast tier</dt><dd>{formatBytes(t.fast_write_bytes)}</dd></div>
        <div><dt>Written to slow tier</dt><dd>{formatBytes(t.slow_write_bytes)}</dd></div>
        <div><dt>Promoted</dt><dd>{formatBytes(t.promoted_bytes)}</dd></div>
        <div><dt>Evicted</dt><dd>{formatBytes(t.evicted_bytes)}</dd></div>
      </dl>
      <p className="muted small" data-testid="tiering-caption">
        Totals since each agent started. Hit ratio: opens for reading whose bytes were on the fast tier, of all opens
        for reading. Promoted and evicted: bytes of the files moved between the tiers.
        {t.kernel_read_events_lost > 0 && (
          <strong>
            {' '}
            {t.kernel_read_events_lost} kernel reads were missed (the trace&apos;s buffer overflowed): the read bytes are
            short by those reads.
          </strong>
        )}
        {modes.map(([mode, n]) => (
          <span key={mode}>
            {' '}
            {modes.length > 1 ? `${n} node${n === 1 ? '' : 's'}: ` : ''}
            {COUNTING[mode] ?? COUNTING.unknown}
          </span>
        ))}
      </p>
    </section>
  );
}

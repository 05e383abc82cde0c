import type { Tier } from '../api/types';
import { formatBytes, formatPercent } from '../format';

/** A tier's capacity bar: used bytes filled, the high and low watermarks drawn on it. With a
 * write slack (the fast tier's `write_ceiling` above its `capacity`) the bar runs to the
 * ceiling: the capacity is a mark on it, and bytes used above the capacity (writes that went
 * on while the evictor catches up) are drawn past that mark as "in the write slack". */
export function TierBar({ name, tier, explain = false }: { name: 'fast' | 'slow'; tier: Tier | undefined; explain?: boolean }) {
  if (!tier) return <p className="muted small">{name === 'fast' ? 'Fast' : 'Slow'} tier: not reported yet.</p>;
  return <TierBarInner name={name} tier={tier} explain={explain} />;
}

/** The bar's geometry: fractions of the bar's full length (its `scale` in bytes). */
function geometry(tier: Tier) {
  const cap = tier.capacity || tier.device_capacity || 0;
  const used = tier.used ?? 0;
  const ceiling = cap > 0 && tier.write_ceiling != null && tier.write_ceiling > cap ? tier.write_ceiling : null;
  const scale = ceiling !== null ? Math.max(ceiling, used) : cap;
  const at = (bytes: number | null | undefined) => (scale > 0 && bytes != null ? bytes / scale : null);
  return {
    cap,
    used,
    ceiling,
    slack: cap > 0 ? Math.max(0, used - cap) : 0,
    scale,
    fill: scale > 0 ? Math.min(used, ceiling !== null ? cap : scale) / scale : 0,
    slackFill: ceiling !== null ? Math.max(0, used - cap) / scale : 0,
    capAt: ceiling !== null ? at(cap) : null,
    ceilingAt: at(ceiling),
    hi: at(tier.high_watermark_bytes),
    lo: at(tier.low_watermark_bytes),
  };
}

function usageText(tier: Tier, g: ReturnType<typeof geometry>): string {
  const { cap, used, ceiling, slack } = g;
  let text = `${formatBytes(used)} of ${cap ? formatBytes(cap) : 'unknown'} used${cap ? ` (${formatPercent(used / cap)})` : ''}`;
  if (slack > 0) text += `, ${formatBytes(slack)} in the write slack`;
  if (ceiling !== null && slack > 0) text += ` (ceiling ${formatBytes(ceiling)})`;
  if (tier.files != null) text += `, ${tier.files} files`;
  return text;
}

function TierBarInner({ name, tier, explain }: { name: 'fast' | 'slow'; tier: Tier; explain: boolean }) {
  const g = geometry(tier);
  const over = g.cap > 0 && tier.high_watermark_bytes != null && g.used >= tier.high_watermark_bytes;
  const text = usageText(tier, g);
  return (
    <div className="tierbar">
      <div className="tierbar-head">
        <span className="tierbar-name">{name === 'fast' ? 'Fast tier' : 'Slow tier'}</span>
        <span className="tierbar-text">{text}</span>
      </div>
      <div
        className="tierbar-track"
        role="meter"
        aria-label={`${name} tier`}
        aria-valuemin={0}
        aria-valuemax={g.scale}
        aria-valuenow={g.used}
        aria-valuetext={text}
      >
        <div className={`tierbar-fill tierbar-${name}${over ? ' tierbar-over' : ''}`} style={{ width: `${g.fill * 100}%` }} />
        {g.slackFill > 0 && g.capAt !== null && (
          <div
            className="tierbar-slack"
            data-testid="tierbar-slack"
            style={{ left: `${g.capAt * 100}%`, width: `${g.slackFill * 100}%` }}
            title={`${formatBytes(g.slack)} above the capacity, in the write slack`}
          />
        )}
        {g.hi !== null && g.hi <= 1 && (
          <div className="tierbar-mark tierbar-high" style={{ left: `${g.hi * 100}%` }} title={`high watermark ${formatBytes(tier.high_watermark_bytes)}`} />
        )}
        {g.lo !== null && g.lo <= 1 && (
          <div className="tierbar-mark tierbar-low" style={{ left: `${g.lo * 100}%` }} title={`low watermark ${formatBytes(tier.low_watermark_bytes)}`} />
        )}
        {g.capAt !== null && (
          <div className="tierbar-mark tierbar-capacity" data-testid="tierbar-capacity" style={{ left: `${g.capAt * 100}%` }} title={`capacity ${formatBytes(g.cap)}`} />
        )}
        {g.ceilingAt !== null && (
          <div
            className="tierbar-mark tierbar-ceiling"
            data-testid="tierbar-ceiling"
            style={{ left: `calc(${g.ceilingAt * 100}% - 3px)` }}
            title={`write ceiling ${formatBytes(g.ceiling)}`}
          />
        )}
      </div>
      <TierLegend tier={tier} g={g} explain={explain || g.slack > 0} />
    </div>
  );
}

/** The marks' values; `explain`: what the write slack is, and what the used bytes include
 * (on the node's page, and on any card whose tier is in the slack). */
function TierLegend({ tier, g, explain }: { tier: Tier; g: ReturnType<typeof geometry>; explain: boolean }) {
  const watermarks = tier.high_watermark_bytes != null && tier.low_watermark_bytes != null;
  if (!watermarks && g.ceiling === null) return null;
  return (
    <div className="tierbar-legend" data-testid="tierbar-legend">
      {watermarks && (
        <>
          watermarks: low {formatBytes(tier.low_watermark_bytes)} · high {formatBytes(tier.high_watermark_bytes)}
        </>
      )}
      {g.ceiling !== null && (
        <>
          {watermarks ? ' · ' : ''}capacity {formatBytes(g.cap)} · write ceiling {formatBytes(g.ceiling)}
          {explain && (
            <>
              : writes go on above the capacity up to the ceiling while the evictor catches up; used bytes past the
              capacity mark are in the write slack
              {tier.remote_cache_bytes
                ? ` · ${formatBytes(tier.remote_cache_bytes)} of the used bytes are copies of other nodes\u2019 files`
                : ''}
            </>
          )}
        </>
      )}
    </div>
  );
}

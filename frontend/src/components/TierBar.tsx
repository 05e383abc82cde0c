import type { Tier } from '../api/types';
import { formatBytes, formatPercent } from '../format';

/** A tier's capacity bar: used bytes filled, the high and low watermarks drawn on it. */
export function TierBar({ name, tier }: { name: 'fast' | 'slow'; tier: Tier | undefined }) {
  if (!tier) return <p className="muted small">{name === 'fast' ? 'Fast' : 'Slow'} tier: not reported yet.</p>;
  return <TierBarInner name={name} tier={tier} />;
}

function TierBarInner({ name, tier }: { name: 'fast' | 'slow'; tier: Tier }) {
  const cap = tier.capacity || tier.device_capacity || 0;
  const used = tier.used ?? 0;
  const frac = cap > 0 ? Math.min(1, used / cap) : 0;
  const hi = cap > 0 && tier.high_watermark_bytes != null ? tier.high_watermark_bytes / cap : null;
  const lo = cap > 0 && tier.low_watermark_bytes != null ? tier.low_watermark_bytes / cap : null;
  const over = hi !== null && frac >= hi;
  const label = `${name} tier`;
  const text = `${formatBytes(used)} of ${cap ? formatBytes(cap) : 'unknown'} used${cap ? ` (${formatPercent(frac)})` : ''}${tier.files != null ? `, ${tier.files} files` : ''}`;
  return (
    <div className="tierbar">
      <div className="tierbar-head">
        <span className="tierbar-name">{name === 'fast' ? 'Fast tier' : 'Slow tier'}</span>
        <span className="tierbar-text">{text}</span>
      </div>
      <div
        className="tierbar-track"
        role="meter"
        aria-label={label}
        aria-valuemin={0}
        aria-valuemax={cap}
        aria-valuenow={used}
        aria-valuetext={text}
      >
        <div className={`tierbar-fill tierbar-${name}${over ? ' tierbar-over' : ''}`} style={{ width: `${frac * 100}%` }} />
        {hi !== null && hi <= 1 && (
          <div className="tierbar-mark tierbar-high" style={{ left: `${hi * 100}%` }} title={`high watermark ${formatBytes(tier.high_watermark_bytes)}`} />
        )}
        {lo !== null && lo <= 1 && (
          <div className="tierbar-mark tierbar-low" style={{ left: `${lo * 100}%` }} title={`low watermark ${formatBytes(tier.low_watermark_bytes)}`} />
        )}
      </div>
      {hi !== null && lo !== null && (
        <div className="tierbar-legend">
          watermarks: low {formatBytes(tier.low_watermark_bytes)} · high {formatBytes(tier.high_watermark_bytes)}
        </div>
      )}
    </div>
  );
}

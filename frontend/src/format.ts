const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return '—';
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  const s = i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
  return `${n < 0 ? '-' : ''}${s} ${UNITS[i]}`;
}

/** Bytes per second as MB/s (10^6, as throughput is usually quoted). */
export function formatRate(bps: number | null | undefined): string {
  if (bps === null || bps === undefined || !Number.isFinite(bps)) return '—';
  const mb = bps / 1e6;
  return `${mb < 10 ? mb.toFixed(2) : mb.toFixed(1)} MB/s`;
}

export function formatPercent(r: number | null | undefined): string {
  if (r === null || r === undefined || !Number.isFinite(r)) return '—';
  return `${(r * 100).toFixed(r >= 0.995 || r === 0 ? 0 : 1)}%`;
}

/** unix seconds (or ISO string) → Date */
export function toDate(t: number | string | null | undefined): Date | null {
  if (t === null || t === undefined) return null;
  const d = typeof t === 'number' ? new Date(t * 1000) : new Date(t);
  return Number.isNaN(d.getTime()) ? null : d;
}

export function formatTime(t: number | string | null | undefined): string {
  const d = toDate(t);
  return d ? d.toLocaleString() : '—';
}

export function formatAgo(t: number | string | null | undefined, now = Date.now()): string {
  const d = toDate(t);
  if (!d) return 'never';
  const s = Math.max(0, Math.round((now - d.getTime()) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** The binary unit (B/KiB/MiB/GiB/…) for an axis whose largest value is `max` bytes. */
export function bytesUnit(max: number): { unit: string; div: number } {
  let v = Number.isFinite(max) ? Math.abs(max) : 0;
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  return { unit: UNITS[i]!, div: 1024 ** i };
}

/**
 * One formatter for every bytes axis: the unit is chosen once from the data's largest value
 * (so a chart of KiB values reads KiB, not 0.0 MiB at every tick), each tick is raw bytes.
 */
export function bytesAxis(values: number[]): { unit: string; tick: (bytes: number) => string } {
  const max = values.reduce((m, v) => (Number.isFinite(v) ? Math.max(m, Math.abs(v)) : m), 0);
  const { unit, div } = bytesUnit(max);
  const top = max / div;
  const tick = (bytes: number) => {
    const v = bytes / div;
    if (div === 1) return String(Math.round(v));
    return top < 10 ? Number(v.toFixed(2)).toString() : top < 100 ? Number(v.toFixed(1)).toString() : v.toFixed(0);
  };
  return { unit, tick };
}

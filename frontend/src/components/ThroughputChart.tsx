// A time-series chart of metric samples (Recharts); colours come from CSS variables so
// both themes stay readable.
import { CartesianGrid, Legend, Line, LineChart, ResponsiveContainer, Tooltip, XAxis, YAxis } from 'recharts';
import type { MetricSample } from '../api/types';

/** a line of the chart: a numeric field of the samples */
export interface Series<T extends { ts: number } = MetricSample> {
  key: keyof T & string;
  label: string;
  color: string;
}

export interface ThroughputChartProps<T extends { ts: number } = MetricSample> {
  title: string;
  samples: T[];
  series: Series<T>[];
  /** unit shown on the y axis and in the tooltip */
  unit: string;
  /** divide raw values by this (1e6 turns bytes/s into MB/s) */
  scale?: number;
  windowSeconds: number;
}

function tickFormat(windowSeconds: number) {
  return (ts: number) => {
    const d = new Date(ts * 1000);
    return windowSeconds > 86400
      ? d.toLocaleDateString(undefined, { month: 'short', day: 'numeric', hour: '2-digit' })
      : d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', ...(windowSeconds <= 900 ? { second: '2-digit' } : {}) });
  };
}

export function ThroughputChart<T extends { ts: number } = MetricSample>({ title, samples, series, unit, scale = 1, windowSeconds }: ThroughputChartProps<T>) {
  const data = samples.map((s) => {
    const row: Record<string, number | null> = { ts: s.ts };
    for (const se of series) {
      const v = s[se.key];
      row[se.key] = typeof v === 'number' ? v / scale : null;
    }
    return row;
  });
  const fmt = tickFormat(windowSeconds);
  return (
    <figure className="chart card" aria-label={title}>
      <figcaption>
        {title} <span className="muted">({unit})</span>
      </figcaption>
      {data.length === 0 ? (
        <p className="muted">No samples in this window yet.</p>
      ) : (
        <div className="chart-box">
          <ResponsiveContainer width="100%" height={240}>
            <LineChart data={data} margin={{ top: 8, right: 16, bottom: 24, left: 8 }}>
              <CartesianGrid stroke="var(--grid)" strokeDasharray="3 3" />
              <XAxis
                dataKey="ts"
                type="number"
                scale="time"
                domain={['dataMin', 'dataMax']}
                tickFormatter={fmt}
                stroke="var(--fg-muted)"
                label={{ value: 'time', position: 'insideBottom', offset: -12, fill: 'var(--fg-muted)' }}
              />
              <YAxis
                stroke="var(--fg-muted)"
                width={64}
                tickFormatter={(v: number) => (Math.abs(v) >= 100 ? v.toFixed(0) : Number(v.toFixed(2)).toString())}
                label={{ value: unit, angle: -90, position: 'insideLeft', fill: 'var(--fg-muted)' }}
              />
              <Tooltip
                labelFormatter={(ts) => new Date(Number(ts) * 1000).toLocaleString()}
                formatter={(v) => `${typeof v === 'number' ? v.toFixed(2) : String(v)} ${unit}`}
                contentStyle={{ background: 'var(--bg-raised)', color: 'var(--fg)', border: '1px solid var(--border)' }}
              />
              <Legend verticalAlign="top" height={30} />
              {series.map((se) => (
                <Line key={se.key} type="monotone" dataKey={se.key} name={se.label} stroke={se.color} dot={false} isAnimationActive={false} connectNulls />
              ))}
            </LineChart>
          </ResponsiveContainer>
        </div>
      )}
    </figure>
  );
}

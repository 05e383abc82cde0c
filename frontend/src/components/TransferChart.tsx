// Bytes moved between nodes: this placement vs round-robin vs the recorded one (Recharts).
import { Bar, BarChart, CartesianGrid, Cell, LabelList, ResponsiveContainer, Tooltip, XAxis, YAxis } from 'recharts';
import type { TransferBytes } from '../api/types';
import { bytesAxis, formatBytes } from '../format';

export function TransferChart({ bytes }: { bytes: TransferBytes }) {
  const rows = [
    { name: 'placed', value: bytes.placed, color: 'var(--ok)' },
    { name: 'round-robin', value: bytes.round_robin, color: 'var(--warn)' },
    ...(bytes.recorded !== null && bytes.recorded !== undefined ? [{ name: 'recorded', value: bytes.recorded, color: 'var(--accent)' }] : []),
  ];
  const axis = bytesAxis(rows.map((r) => r.value));
  const saved = bytes.round_robin - bytes.placed;
  return (
    <figure className="chart card" aria-label="Bytes moved">
      <figcaption>
        Bytes moved between nodes <span className="muted">({axis.unit})</span>
      </figcaption>
      <p className="small">
        {rows.map((r) => `${r.name}: ${formatBytes(r.value)}`).join(' · ')}
        {saved > 0 ? ` — ${formatBytes(saved)} less than round-robin` : ''}
      </p>
      <div className="chart-box">
        <ResponsiveContainer width="100%" height={220}>
          <BarChart data={rows} margin={{ top: 16, right: 16, bottom: 24, left: 8 }}>
            <CartesianGrid stroke="var(--grid)" strokeDasharray="3 3" />
            <XAxis dataKey="name" stroke="var(--fg-muted)" label={{ value: 'placement', position: 'insideBottom', offset: -12, fill: 'var(--fg-muted)' }} />
            <YAxis stroke="var(--fg-muted)" width={56} tickFormatter={axis.tick} label={{ value: axis.unit, angle: -90, position: 'insideLeft', fill: 'var(--fg-muted)' }} />
            <Tooltip formatter={(v) => formatBytes(Number(v))} contentStyle={{ background: 'var(--bg-raised)', border: '1px solid var(--border)' }} />
            <Bar dataKey="value" name="bytes moved" isAnimationActive={false}>
              {rows.map((r) => (
                <Cell key={r.name} fill={r.color} />
              ))}
              <LabelList dataKey="value" position="top" formatter={(v) => formatBytes(Number(v))} fill="var(--fg)" />
            </Bar>
          </BarChart>
        </ResponsiveContainer>
      </div>
    </figure>
  );
}

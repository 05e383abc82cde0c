import type { Event } from '../api/types';
import { formatTime } from '../format';

function detailText(d: unknown): string {
  if (d === null || d === undefined) return '';
  return typeof d === 'string' ? d : JSON.stringify(d);
}

export function EventList({ events }: { events: Event[] }) {
  return (
    <table className="eventlist">
      <caption className="visually-hidden">Events, newest first</caption>
      <thead>
        <tr>
          <th scope="col">Time</th>
          <th scope="col">Kind</th>
          <th scope="col">Node</th>
          <th scope="col">Actor</th>
          <th scope="col">Action</th>
          <th scope="col">Result</th>
          <th scope="col">Detail</th>
        </tr>
      </thead>
      <tbody>
        {events.map((e) => (
          <tr key={e.id}>
            <td className="small">{formatTime(e.ts)}</td>
            <td>
              <span className={`badge badge-kind`}>{e.kind}</span>
            </td>
            <td>{e.node ?? ''}</td>
            <td>{e.actor ?? ''}</td>
            <td>{e.action ?? ''}</td>
            <td>{e.result ?? ''}</td>
            <td className="small">{detailText(e.detail)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

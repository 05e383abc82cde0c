import { SseParser } from './stream';

test('messages split across chunks, with ids, comments and multi-line data', () => {
  const p = new SseParser();
  expect(p.push(': keepalive\n\nevent: nodes\nda')).toEqual([]);
  expect(p.push('ta: {"items":[]}\n\nid: 7\nevent: event\ndata: a\r\ndata: b\r\n\r\n')).toEqual([
    { event: 'nodes', data: '{"items":[]}', id: undefined },
    { event: 'event', data: 'a\nb', id: '7' },
  ]);
});

// The live stream (GET /api/v1/stream, Server-Sent Events) read with fetch so that the
// token travels in the Authorization header; reconnects with Last-Event-ID after a drop.
export interface StreamMessage {
  event: string;
  data: string;
  id?: string;
}

/** Split an SSE byte stream into messages (the WHATWG event-stream format). */
export class SseParser {
  private buf = '';
  private event = '';
  private data: string[] = [];
  private id: string | undefined;

  push(chunk: string): StreamMessage[] {
    this.buf += chunk;
    const out: StreamMessage[] = [];
    let nl: number;
    while ((nl = this.buf.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buf.slice(0, nl);
      const sep = this.buf.startsWith('\r\n', nl) ? 2 : 1;
      this.buf = this.buf.slice(nl + sep);
      if (line === '') {
        if (this.data.length) out.push({ event: this.event || 'message', data: this.data.join('\n'), id: this.id });
        this.event = '';
        this.data = [];
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') this.event = value;
      else if (field === 'data') this.data.push(value);
      else if (field === 'id') this.id = value;
    }
    return out;
  }
}

export type StreamState = 'connecting' | 'open' | 'reconnecting' | 'unauthorized';

export interface StreamOptions {
  url: string;
  token: string;
  onMessage: (m: StreamMessage) => void;
  onState: (s: StreamState) => void;
}

/** Start reading; returns a function that stops it. */
export function openStream({ url, token, onMessage, onState }: StreamOptions): () => void {
  const ctl = new AbortController();
  let lastId: string | undefined;
  let delay = 500;

  const run = async () => {
    onState('connecting');
    while (!ctl.signal.aborted) {
      try {
        const headers: Record<string, string> = { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' };
        if (lastId) headers['Last-Event-ID'] = lastId;
        const res = await fetch(url, { headers, signal: ctl.signal, cache: 'no-store' });
        if (res.status === 401 || res.status === 403) {
          onState('unauthorized');
          return;
        }
        if (!res.ok || !res.body) throw new Error(`stream answered ${res.status}`);
        onState('open');
        delay = 500;
        const parser = new SseParser();
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          for (const m of parser.push(value)) {
            if (m.id) lastId = m.id;
            onMessage(m);
          }
        }
      } catch {
        if (ctl.signal.aborted) return;
      }
      onState('reconnecting');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10_000);
    }
  };
  void run();
  return () => ctl.abort();
}

import { describe, expect, it } from 'vitest';
import { parseChunk, sseData, streamChat } from '../src/lib/chat/stream';
import { ApiClient, type TokenStorage } from '../src/lib/api/client';

function body(parts: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const p of parts) controller.enqueue(encoder.encode(p));
      controller.close();
    },
  });
}

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of iterable) out.push(x);
  return out;
}

const report = {
  prompt_tokens: 31,
  generated_tokens: 2,
  time_to_first_token_ms: 524.1,
  prefill_tokens_per_second: 59.1,
  decode_tokens_per_second: 8.2,
  hop_p50_us: 3595,
};

const noStorage: TokenStorage = { load: () => null, save: () => {} };

describe('chat stream', () => {
  it('splits server-sent events across arbitrary chunk boundaries', async () => {
    const events = await collect(sseData(body(['data: {"a"', ':1}\n', '\ndata: [DO', 'NE]\n\n'])));
    expect(events).toEqual(['{"a":1}', '[DONE]']);
  });

  it('reads text, the final report and errors', () => {
    expect(parseChunk('{"choices":[{"delta":{"role":"assistant","content":""}}]}')).toEqual([]);
    expect(parseChunk('{"choices":[{"delta":{"content":"Hi"}}]}')).toEqual([{ kind: 'text', text: 'Hi' }]);
    expect(parseChunk('{"choices":[{"delta":{"reasoning_content":"Greet back."}}]}')).toEqual([
      { kind: 'reasoning', text: 'Greet back.' },
    ]);
    expect(parseChunk(JSON.stringify({ choices: [{ delta: {}, finish_reason: 'stop' }], shoal: report }))).toEqual([
      { kind: 'report', report, finishReason: 'stop' },
    ]);
    expect(parseChunk('{"error":{"message":"stage 1 failed"}}')).toEqual([{ kind: 'error', message: 'stage 1 failed' }]);
    expect(parseChunk('[DONE]')).toEqual([]);
  });

  it('streams a reply from the node', async () => {
    const sse = [
      'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
      'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n',
      'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n',
      `data: ${JSON.stringify({ choices: [{ delta: {}, finish_reason: 'length' }], shoal: report })}\n\n`,
      'data: [DONE]\n\n',
    ];
    let sent: unknown = null;
    const client = new ApiClient(async (_path, init) => {
      sent = JSON.parse(String(init?.body));
      return new Response(body(sse), { status: 200, headers: { 'Content-Type': 'text/event-stream' } });
    }, noStorage);
    const pieces = await collect(streamChat(client, { model: 'm', messages: [{ role: 'user', content: 'Hi' }] }, new AbortController().signal));
    expect(sent).toMatchObject({ model: 'm', stream: true });
    expect(pieces.filter((p) => p.kind === 'text').map((p) => (p.kind === 'text' ? p.text : '')).join('')).toBe('Hello');
    expect(pieces.at(-1)).toEqual({ kind: 'report', report, finishReason: 'length' });
  });

  it('reports a refused request with the node’s message', async () => {
    const client = new ApiClient(
      async () => new Response('{"error":{"message":"no model named x is running"}}', { status: 404 }),
      noStorage,
    );
    await expect(collect(streamChat(client, { model: 'x', messages: [] }, new AbortController().signal))).rejects.toThrow(
      'no model named x is running',
    );
  });
});

/**
 * Streaming chat against the node's OpenAI-compatible `/v1/chat/completions`: reads the server-sent
 * events of the response body, yields the answer's text and the model's reasoning (`reasoning_content`:
 * gpt-oss's analysis channel, Qwen3's `<think>` block) as they arrive, and the final chunk's `shoal` report
 * (time to first token, prefill and decode tokens/s). An `error` chunk mid-stream ends the reply with its
 * message.
 */
import type { ApiClient } from '../api/client';
import { ApiError } from '../api/client';
import type { GenerationReport } from '../api/types';

export interface ChatTurn {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export type ChatPiece =
  | { kind: 'text'; text: string }
  | { kind: 'reasoning'; text: string }
  | { kind: 'report'; report: GenerationReport; finishReason: string | null }
  | { kind: 'error'; message: string };

/** The `data:` payloads of an SSE body, one per event. */
export async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.search(/\r\n|\n|\r/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith('\r\n', newline) ? 2 : 1));
        if (line === '') {
          if (data.length > 0) yield data.join('\n');
          data = [];
        } else if (line.startsWith('data:')) {
          data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
        }
      }
      if (done) {
        if (buffer.startsWith('data:')) data.push(buffer.slice(buffer.startsWith('data: ') ? 6 : 5));
        if (data.length > 0) yield data.join('\n');
        return;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

interface Chunk {
  choices?: { delta?: { content?: string | null; reasoning_content?: string | null }; finish_reason?: string | null }[];
  shoal?: GenerationReport;
  error?: { message?: string };
}

/** What one chunk of the stream says (nothing for the role-only first chunk and `[DONE]`). */
export function parseChunk(data: string): ChatPiece[] {
  if (data.trim() === '[DONE]') return [];
  let chunk: Chunk;
  try {
    chunk = JSON.parse(data) as Chunk;
  } catch {
    return [{ kind: 'error', message: 'the node sent a chunk that is not JSON' }];
  }
  if (chunk.error !== undefined) return [{ kind: 'error', message: chunk.error.message ?? 'the request failed' }];
  const pieces: ChatPiece[] = [];
  const choice = chunk.choices?.[0];
  const reasoning = choice?.delta?.reasoning_content;
  if (typeof reasoning === 'string' && reasoning !== '') pieces.push({ kind: 'reasoning', text: reasoning });
  const text = choice?.delta?.content;
  if (typeof text === 'string' && text !== '') pieces.push({ kind: 'text', text });
  if (chunk.shoal !== undefined) pieces.push({ kind: 'report', report: chunk.shoal, finishReason: choice?.finish_reason ?? null });
  return pieces;
}

export interface ChatOptions {
  model: string;
  messages: ChatTurn[];
  maxTokens?: number;
  temperature?: number;
}

/** Streams one reply; throws ApiError when the node refuses the request up front. */
export async function* streamChat(client: ApiClient, options: ChatOptions, signal: AbortSignal): AsyncGenerator<ChatPiece> {
  const body = {
    model: options.model,
    messages: options.messages,
    stream: true,
    ...(options.maxTokens === undefined ? {} : { max_tokens: options.maxTokens }),
    ...(options.temperature === undefined ? {} : { temperature: options.temperature }),
  };
  const response = await client.send('POST', '/v1/chat/completions', body, signal);
  if (!response.ok) {
    const text = await response.text();
    let message = text.trim() || `${response.status} ${response.statusText}`;
    try {
      message = (JSON.parse(text) as Chunk).error?.message ?? message;
    } catch {
      // Not JSON: keep the text.
    }
    throw new ApiError(response.status, message);
  }
  if (response.body === null) throw new ApiError(response.status, 'the node sent no reply body');
  for await (const data of sseData(response.body)) {
    for (const piece of parseChunk(data)) yield piece;
  }
}

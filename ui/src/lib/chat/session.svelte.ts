/**
 * The chat conversation, kept for the life of the page so that switching views does not lose it.
 */
import type { GenerationReport } from '../api/types';

export interface ChatEntry {
  id: number;
  role: 'user' | 'assistant';
  content: string;
  /** The model's reasoning before its answer (empty for models that answer at once). */
  reasoning: string;
  model: string;
  /** The reply is still streaming. */
  streaming: boolean;
  report: GenerationReport | null;
  error: string | null;
}

/** The chosen model, the reply length cap, and the messages so far. */
export const session = $state({ model: '', maxTokens: 256, entries: [] as ChatEntry[], nextId: 1 });

export function addEntry(entry: Omit<ChatEntry, 'id'>): ChatEntry {
  session.entries.push({ ...entry, id: session.nextId++ });
  return session.entries[session.entries.length - 1] as ChatEntry;
}

export function clearSession(): void {
  session.entries.splice(0, session.entries.length);
}

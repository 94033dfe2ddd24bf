/**
 * A value the dashboard asks the node for and keeps fresh: asked at once, again shortly after what it
 * depends on changes (a burst of changes is asked about once), every little while for what changes
 * without an event, and on demand (Refresh, Try again). An answer that arrives after a newer question
 * was asked is dropped; a failed question keeps the last value and says why.
 */
import { errorMessage } from '../api/client';

export interface PollOptions {
  /** Asked again this often, for changes no event announces. */
  refreshMs: number;
  /** After `key` changes, asked again once this long passes without another change. */
  settleMs: number;
  /** What the value depends on: when what it returns changes (by `===`), the value is asked again. */
  key?: () => unknown;
}

export class Poll<T> {
  /** The latest answer; null until the first one. */
  value = $state<T | null>(null);
  /** Why the latest question failed; null once one succeeds. */
  error = $state<string | null>(null);
  /** A question is out. */
  loading = $state(false);
  #asked = 0;
  readonly #ask: () => Promise<T>;

  constructor(ask: () => Promise<T>) {
    this.#ask = ask;
  }

  /** Asks now; an older question's answer that arrives later is ignored. */
  async refresh(): Promise<void> {
    const mine = ++this.#asked;
    this.loading = true;
    try {
      const answer = await this.#ask();
      if (mine !== this.#asked) return;
      this.value = answer;
      this.error = null;
    } catch (e) {
      if (mine === this.#asked) this.error = errorMessage(e);
    } finally {
      if (mine === this.#asked) this.loading = false;
    }
  }
}

/**
 * A {@link Poll} that lives as long as the component (or `$effect.root`) that calls this during its
 * set-up: its timers stop with it.
 */
export function usePoll<T>(ask: () => Promise<T>, options: PollOptions): Poll<T> {
  const poll = new Poll(ask);
  // Derived, so that a change elsewhere that leaves the key as it was asks nothing.
  const key = $derived(options.key?.());
  let first = true;
  $effect(() => {
    void key;
    const timer = setTimeout(() => void poll.refresh(), first ? 0 : options.settleMs);
    first = false;
    return () => clearTimeout(timer);
  });
  $effect(() => {
    const timer = setInterval(() => void poll.refresh(), options.refreshMs);
    return () => clearInterval(timer);
  });
  return poll;
}

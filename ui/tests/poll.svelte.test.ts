import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { flushSync } from 'svelte';
import { Poll, usePoll } from '../src/lib/state/poll.svelte';

/** Questions whose answers the test gives, in any order. */
function answers<T>() {
  const out: { resolve: (v: T) => void; reject: (e: Error) => void }[] = [];
  const ask = () => new Promise<T>((resolve, reject) => out.push({ resolve, reject }));
  return { ask, out };
}

describe('Poll', () => {
  it('drops an answer that arrives after a newer question was asked', async () => {
    const { ask, out } = answers<string>();
    const poll = new Poll(ask);
    const first = poll.refresh();
    const second = poll.refresh();
    out[1]?.resolve('new');
    await second;
    out[0]?.resolve('old');
    await first;
    expect(poll.value).toBe('new');
    expect(poll.loading).toBe(false);
  });

  it('keeps the last value when a question fails, and forgets the error once one succeeds', async () => {
    const { ask, out } = answers<number>();
    const poll = new Poll(ask);
    let done = poll.refresh();
    out[0]?.resolve(1);
    await done;
    done = poll.refresh();
    expect(poll.loading).toBe(true);
    out[1]?.reject(new Error('connection refused'));
    await done;
    expect(poll.value).toBe(1);
    expect(poll.error).toContain('connection refused');
    done = poll.refresh();
    out[2]?.resolve(2);
    await done;
    expect(poll.value).toBe(2);
    expect(poll.error).toBeNull();
  });
});

describe('usePoll', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('asks at once, once per burst of changes, every refresh period, and never after its owner ends', async () => {
    let asked = 0;
    const dependsOn = $state({ nodes: 1 });
    let poll: Poll<number> | null = null;
    const destroy = $effect.root(() => {
      poll = usePoll(() => Promise.resolve(++asked), { refreshMs: 10_000, settleMs: 300, key: () => dependsOn.nodes });
    });
    flushSync();
    await vi.advanceTimersByTimeAsync(0);
    expect(asked).toBe(1);
    expect(poll!.value).toBe(1);

    // Three changes in a burst: one question, once they settle.
    for (const nodes of [2, 3, 4]) {
      dependsOn.nodes = nodes;
      flushSync();
      await vi.advanceTimersByTimeAsync(100);
    }
    expect(asked).toBe(1);
    await vi.advanceTimersByTimeAsync(300);
    expect(asked).toBe(2);

    await vi.advanceTimersByTimeAsync(10_000);
    expect(asked).toBe(3);

    destroy();
    await vi.advanceTimersByTimeAsync(60_000);
    expect(asked).toBe(3);
  });
});

import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ClusterStore, FIRST_RETRY_MS, retryDelay } from '../src/lib/state/store';
import type { ClusterModel } from '../src/lib/state/model';
import { FakeApi, FakeEventSource, instancesFixture, nodeNamed, settle, snapshotFixture } from './fakes';

function setup() {
  const api = new FakeApi();
  const streams: FakeEventSource[] = [];
  const store = new ClusterStore({
    getJson: api.getJson,
    openEvents: () => {
      const stream = new FakeEventSource();
      streams.push(stream);
      return stream;
    },
    now: () => Date.now(),
  });
  const seen: ClusterModel[] = [];
  store.subscribe((m) => seen.push(m));
  const latest = () => streams[streams.length - 1] as FakeEventSource;
  return { api, streams, store, seen, latest };
}

describe('ClusterStore', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('applies the snapshot, then events in the order they arrive', async () => {
    const { api, store, latest } = setup();
    store.start();
    const snapshot = snapshotFixture();
    const gamma = nodeNamed(snapshot, 'gamma');
    api.answerSnapshot(snapshot, instancesFixture());
    await settle();
    expect(store.current.loaded).toBe(true);
    expect(store.current.connection).toBe('live');
    expect(store.current.nodes.map((n) => n.name)).toEqual(['alpha', 'beta', 'gamma']);
    expect(store.current.links).toHaveLength(3);

    latest().send('node_status', { node: gamma.id, status: 'suspect' });
    latest().send('node_status', { node: gamma.id, status: 'down' });
    expect(store.current.nodes.find((n) => n.id === gamma.id)?.status).toBe('down');

    latest().send('node_status', { node: gamma.id, status: 'alive' });
    expect(store.current.nodes.find((n) => n.id === gamma.id)?.status).toBe('alive');
    store.stop();
  });

  it('holds events that arrive during the snapshot fetch and applies them after it', async () => {
    const { api, store, latest } = setup();
    store.start();
    const snapshot = snapshotFixture();
    const beta = nodeNamed(snapshot, 'beta');
    const telemetry = { ...beta.telemetry!, memory_total: 1_000, memory_available: 500, memory_offer: 100 };
    latest().send('telemetry', { node: beta.id, telemetry });
    latest().send('node_status', { node: beta.id, status: 'suspect' });
    expect(store.current.loaded).toBe(false);

    api.answerSnapshot(snapshot);
    await settle();
    const node = store.current.nodes.find((n) => n.id === beta.id);
    expect(node?.status).toBe('suspect');
    expect(node?.telemetry?.memory_total).toBe(1_000);
    store.stop();
  });

  it('sums the pool over the members that are up, following telemetry and status events', async () => {
    const { api, store, latest } = setup();
    store.start();
    const snapshot = snapshotFixture();
    api.answerSnapshot(snapshot);
    await settle();
    const totals = snapshot.nodes.map((n) => n.telemetry!.memory_total);
    expect(store.current.pool.total).toBe(totals.reduce((a, b) => a + b, 0));
    expect(store.current.pool.total).toBe(snapshot.pool.memory_total);

    const gamma = nodeNamed(snapshot, 'gamma');
    latest().send('node_status', { node: gamma.id, status: 'down' });
    expect(store.current.pool.nodesUp).toBe(2);
    expect(store.current.pool.total).toBe(snapshot.pool.memory_total - gamma.telemetry!.memory_total);
    store.stop();
  });

  it('fetches the snapshot again on `lagged`, keeping the stream', async () => {
    const { api, store, streams, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    expect(api.calls).toEqual(['/api/cluster', '/api/instances']);

    latest().send('lagged', '{}');
    expect(api.calls).toHaveLength(4);
    const fresh = snapshotFixture();
    fresh.nodes = fresh.nodes.filter((n) => n.name !== 'gamma');
    fresh.links = [];
    api.answerSnapshot(fresh);
    await settle();
    expect(store.current.nodes.map((n) => n.name)).toEqual(['alpha', 'beta']);
    expect(streams).toHaveLength(1);
    expect(latest().closed).toBe(false);
    store.stop();
  });

  it('reconnects after the stream drops, with a growing delay, and refetches the snapshot', async () => {
    const { api, store, streams, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();

    latest().fail();
    expect(streams[0]?.closed).toBe(true);
    expect(store.current.connection).toBe('reconnecting');
    expect(store.current.loaded).toBe(true); // the last picture stays while reconnecting

    vi.advanceTimersByTime(FIRST_RETRY_MS - 1);
    expect(streams).toHaveLength(1);
    vi.advanceTimersByTime(1);
    expect(streams).toHaveLength(2);
    expect(api.calls.filter((c) => c === '/api/cluster')).toHaveLength(2);

    // The node is still away: the snapshot fails, and the next attempt waits twice as long.
    api.failAll(new TypeError('Failed to fetch'));
    await settle();
    expect(store.current.error).toMatch(/cannot fetch the cluster/);
    vi.advanceTimersByTime(retryDelay(1) - 1);
    expect(streams).toHaveLength(2);
    vi.advanceTimersByTime(1);
    expect(streams).toHaveLength(3);

    const back = snapshotFixture();
    api.answerSnapshot(back);
    await settle();
    expect(store.current.connection).toBe('live');
    expect(store.current.error).toBeNull();

    // Events flow on the new stream; the old ones are ignored.
    const gamma = nodeNamed(back, 'gamma');
    streams[0]?.send('node_left', { node: gamma.id });
    expect(store.current.nodes).toHaveLength(3);
    latest().send('node_left', { node: gamma.id });
    expect(store.current.nodes).toHaveLength(2);
    expect(store.current.links.every((l) => l.a !== gamma.id && l.b !== gamma.id)).toBe(true);

    // After a success the delay starts small again.
    latest().fail();
    vi.advanceTimersByTime(FIRST_RETRY_MS);
    expect(streams).toHaveLength(4);
    store.stop();
  });

  it('fetches the details of a new member shortly after it joins', async () => {
    const { api, store, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    latest().send('node_joined', { node: '00000000-0000-4000-8000-000000000001', name: 'delta' });
    expect(store.current.nodes.map((n) => n.name)).toContain('delta');
    expect(store.current.nodes.find((n) => n.name === 'delta')?.status).toBe('connecting');
    vi.advanceTimersByTime(400);
    expect(api.calls.filter((c) => c === '/api/cluster')).toHaveLength(2);
    store.stop();
  });

  it('keeps rates for the chart, finished requests and instance updates', async () => {
    const { api, store, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture(), instancesFixture());
    await settle();
    const rates = { prefill_tokens_per_second: 50, decode_tokens_per_second: 8, requests_per_minute: 6, window_seconds: 10 };
    latest().send('rates', { rates });
    vi.advanceTimersByTime(1000);
    latest().send('rates', { rates: { ...rates, decode_tokens_per_second: 9 } });
    expect(store.current.rates.map((s) => s.decode)).toEqual([8, 9]);
    expect(store.current.latestRates?.decode_tokens_per_second).toBe(9);

    vi.advanceTimersByTime(6 * 60_000);
    latest().send('rates', { rates });
    expect(store.current.rates).toHaveLength(1);

    const report = {
      prompt_tokens: 31,
      generated_tokens: 20,
      time_to_first_token_ms: 524,
      prefill_tokens_per_second: 59,
      decode_tokens_per_second: 8.2,
      hop_p50_us: 3595,
    };
    latest().send('request_finished', { model: 'SmolLM2-135M-Instruct.Q4_1', report });
    expect(store.current.requests[0]?.report.decode_tokens_per_second).toBe(8.2);

    const instance = instancesFixture()[0]!;
    latest().send('instance', { info: { ...instance, state: 'stopped' } });
    expect(store.current.instances.find((i) => i.id === instance.id)?.state).toBe('stopped');
    store.stop();
  });

  it('ignores malformed events and events about unknown nodes', async () => {
    const { api, store, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    const before = store.current;
    latest().send('node_status', 'not json');
    latest().send('node_status', { node: 'nobody', status: 'down' });
    expect(store.current.nodes).toEqual(before.nodes);
    store.stop();
  });

  it('stops cleanly: no reconnection after stop()', async () => {
    const { api, store, streams, latest } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    latest().fail();
    store.stop();
    vi.advanceTimersByTime(60_000);
    expect(streams).toHaveLength(1);
  });
});

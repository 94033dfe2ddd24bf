// Requests that wait for a free slot: the instance card says how many run and how many wait (stage 0's
// stats), and a reply's rates and the latest-requests table say how long each one waited.
import { describe, expect, it } from 'vitest';
import { render, screen } from '@testing-library/svelte';
import InstanceCard from '../src/components/models/InstanceCard.svelte';
import ChatMessage from '../src/components/chat/ChatMessage.svelte';
import RequestTable from '../src/components/rates/RequestTable.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import type { GenerationReport, InstanceInfo, StageStats } from '../src/lib/api/types';
import { ClusterStore } from '../src/lib/state/store';
import { FakeApi, FakeEventSource, instancesFixture } from './fakes';

function appContext() {
  const client = new ApiClient(async () => new Response('{}'), { load: () => null, save: () => {} });
  const store = new ClusterStore({ getJson: new FakeApi().getJson, openEvents: () => new FakeEventSource() });
  return new Map([[APP_CONTEXT, { client, store }]]);
}

/** The fixture instance with stage 0 reporting `active` requests running and `queued` waiting. */
function busy(active: number, queued: number): InstanceInfo {
  const instance = instancesFixture()[0]!;
  const stages = instance.stages.map((s, i) =>
    i === 0 ? { ...s, stats: { ...(s.stats as StageStats), active_requests: active, queued_requests: queued } } : s,
  );
  return { ...instance, state: 'ready', stages };
}

function report(queueMs: number): GenerationReport {
  return {
    prompt_tokens: 12,
    cached_tokens: 0,
    generated_tokens: 30,
    queue_ms: queueMs,
    time_to_first_token_ms: 80,
    prefill_tokens_per_second: 150,
    decode_tokens_per_second: 40,
    hop_p50_us: null,
    drafted_tokens: 0,
    accepted_tokens: 0,
    stop_sequence: null,
  };
}

describe('requests waiting for a slot', () => {
  it('the instance card says how many run and how many wait', () => {
    const card = render(InstanceCard, { props: { instance: busy(4, 3), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-load').textContent).toMatch(/4 requests running/);
    expect(screen.getByTestId('instance-queued').textContent?.trim()).toBe('3 waiting for a slot');
    card.unmount();
    render(InstanceCard, { props: { instance: busy(1, 0), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-load').textContent).toMatch(/1 request running/);
    expect(screen.queryByTestId('instance-queued')).toBeNull();
  });

  it('an idle instance shows no load line', () => {
    render(InstanceCard, { props: { instance: busy(0, 0), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.queryByTestId('instance-load')).toBeNull();
  });

  it('a reply that waited says how long, one that did not says nothing of it', () => {
    const entry = { id: 1, role: 'assistant' as const, model: 'm', content: 'Hi', reasoning: '', streaming: false, error: null };
    const waited = render(ChatMessage, { entry: { ...entry, report: report(1250) } });
    expect(waited.getByTestId('queued').textContent).toBe('1.25 s');
    waited.unmount();
    const straight = render(ChatMessage, { entry: { ...entry, report: report(0) } });
    expect(straight.queryByTestId('queued')).toBeNull();
  });

  it('the latest requests show each one’s queue time', () => {
    render(RequestTable, { requests: [{ at: 1_700_000_000_000, model: 'm', report: report(420) }] });
    expect(screen.getByTestId('request-queued').textContent).toBe('420 ms');
  });
});

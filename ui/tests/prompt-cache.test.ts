// The prompt cache as the dashboard shows it: the instance card's share of prompt tokens given back and
// the conversations it keeps (stage 0's stats), the placement preview's tokens kept beyond the slots, and
// each reply's and request's cached tokens.
import { describe, expect, it } from 'vitest';
import { render, screen } from '@testing-library/svelte';
import InstanceCard from '../src/components/models/InstanceCard.svelte';
import ChatMessage from '../src/components/chat/ChatMessage.svelte';
import RequestTable from '../src/components/rates/RequestTable.svelte';
import PlacementPreview from '../src/components/models/PlacementPreview.svelte';
import type { GenerationReport } from '../src/lib/api/types';
import { appContext, instancesFixture, withHeadStats as withCache } from './fakes';

function report(cached: number): GenerationReport {
  return {
    prompt_tokens: 1600,
    cached_tokens: cached,
    generated_tokens: 32,
    queue_ms: 0,
    time_to_first_token_ms: 180,
    prefill_tokens_per_second: 300,
    decode_tokens_per_second: 40,
    hop_p50_us: null,
    drafted_tokens: 0,
    accepted_tokens: 0,
    stop_sequence: null,
  };
}

describe('the prompt cache', () => {
  it('the instance card shows the share of prompt tokens given back and what is kept', () => {
    const stats = { prompt_tokens: 4000, cached_tokens: 3000, saved_prefix_positions: 1700, saved_prefix_positions_on_disk: 5100 };
    const card = render(InstanceCard, { props: { instance: withCache(stats), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-cache-hit').textContent).toBe('75%');
    expect(screen.getByTestId('instance-prompt-cache').textContent).toMatch(/1,700 tokens of conversations saved in memory, 5,100 on disk/);
    card.unmount();
    render(InstanceCard, { props: { instance: withCache({ prompt_tokens: 0 }), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.queryByTestId('instance-prompt-cache')).toBeNull();
  });

  it('a reply and the latest requests show the cached tokens', () => {
    const entry = { id: 1, role: 'assistant' as const, model: 'm', content: 'Hi', reasoning: '', streaming: false, error: null };
    const cached = render(ChatMessage, { entry: { ...entry, report: report(1540) } });
    expect(cached.getByTestId('cached').textContent).toBe('1540');
    cached.unmount();
    const fresh = render(ChatMessage, { entry: { ...entry, report: report(0) } });
    expect(fresh.queryByTestId('cached')).toBeNull();
    fresh.unmount();
    render(RequestTable, { requests: [{ at: 1_700_000_000_000, model: 'm', report: report(1540) }] });
    expect(screen.getByTestId('request-cached').textContent).toBe('1540');
  });

  it('the placement preview says how many tokens of conversations it keeps beyond the slots', () => {
    const instance = instancesFixture()[0]!;
    render(PlacementPreview, { name: instance.model, plan: { ...instance.plan, saved_prefix_tokens: 8192 } });
    expect(screen.getByTestId('preview-prompt-cache').textContent).toBe('8,192');
  });
});

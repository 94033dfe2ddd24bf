// Speculative decoding as the dashboard shows it: the instance card's share of drafted tokens kept and
// of the reply they made (stage 0's stats), hidden until a request drafted. (The launch form's choice
// travels with the launch request: models-view.test.ts.)
import { describe, expect, it } from 'vitest';
import { render, screen } from '@testing-library/svelte';
import InstanceCard from '../src/components/models/InstanceCard.svelte';
import { appContext, withHeadStats as withStats } from './fakes';

describe('speculative decoding', () => {
  it('the instance card shows the drafts kept and the share of the reply they made', () => {
    const stats = { drafted_tokens: 400, accepted_tokens: 300, generated_tokens: 600, draft_row_cost: null };
    let card = render(InstanceCard, { props: { instance: withStats(stats), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-drafts-kept').textContent).toBe('75%');
    expect(screen.getByTestId('instance-speculation').textContent).toMatch(/50% of generated tokens came from drafts/);
    expect(screen.queryByTestId('instance-speedup')).toBeNull();
    card.unmount();
    // Once stage 0 measured a drafted row's cost: 300 steps and 400 rows at a quarter of one.
    const measured = { ...stats, draft_row_cost: 0.25 };
    card = render(InstanceCard, { props: { instance: withStats(measured), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-speedup').textContent).toBe('1.50×');
    card.unmount();
    render(InstanceCard, { props: { instance: withStats({ drafted_tokens: 0 }), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.queryByTestId('instance-speculation')).toBeNull();
  });
});

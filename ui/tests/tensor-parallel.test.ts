// A tensor-parallel instance in the dashboard: the instance card and the node cards say what each node
// holds of every layer (heads, feed-forward columns, experts) instead of a layer range, the card shows
// each rank's sum time, and the placement preview names the mode with the other one it weighed and
// each node's share of the model.
import { describe, expect, it } from 'vitest';
import { render, screen } from '@testing-library/svelte';
import InstanceCard from '../src/components/models/InstanceCard.svelte';
import PlacementPreview from '../src/components/models/PlacementPreview.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import type { InstanceInfo, Plan, StageStats, TensorSlice } from '../src/lib/api/types';
import { ClusterStore } from '../src/lib/state/store';
import { layersOn } from '../src/lib/state/nodes';
import { formatSlice } from '../src/lib/format';
import { FakeApi, FakeEventSource, instancesFixture } from './fakes';

function appContext() {
  const client = new ApiClient(async () => new Response('{}'), { load: () => null, save: () => {} });
  const store = new ClusterStore({ getJson: new FakeApi().getJson, openEvents: () => new FakeEventSource() });
  return new Map([[APP_CONTEXT, { client, store }]]);
}

const totals: TensorSlice['totals'] = [9, 3, 1536, 0, 0, 49152];
const slices: TensorSlice[] = [
  { rank: 0, ranks: 2, query_heads: { start: 0, end: 6 }, kv_heads: { start: 0, end: 2 }, feed_forward: { start: 0, end: 768 }, shared_feed_forward: { start: 0, end: 0 }, experts: { start: 0, end: 0 }, vocabulary: { start: 0, end: 24576 }, totals },
  { rank: 1, ranks: 2, query_heads: { start: 6, end: 9 }, kv_heads: { start: 2, end: 3 }, feed_forward: { start: 768, end: 1536 }, shared_feed_forward: { start: 0, end: 0 }, experts: { start: 0, end: 0 }, vocabulary: { start: 24576, end: 49152 }, totals },
];

/** The fixture instance as a tensor-parallel group over its first two nodes. */
function group(): InstanceInfo {
  const instance = instancesFixture()[0]!;
  const stages = instance.stages.slice(0, 2).map((s, i) => ({
    ...s,
    layers: { start: 0, end: 30 },
    slice: slices[i]!,
    stats: { ...(s.stats as StageStats), allreduce_p50_us: i === 0 ? 38 : 41 },
  }));
  const plan: Plan = {
    ...instance.plan,
    parallel: 'tensor',
    stages: instance.plan.stages.slice(0, 2).map((s, i) => ({ ...s, layers: { start: 0, end: 30 }, slice: slices[i]! })),
    alternatives: [{ parallel: 'pipeline', nodes: ['gamma'], expected_decode_tokens_per_second: 53, reason: 'tensor parallel over 2 nodes is predicted 1.30x as fast' }],
  };
  return { ...instance, plan, stages };
}

describe('a tensor-parallel instance', () => {
  it('says what each node holds of every layer', () => {
    expect(formatSlice(slices[0]!)).toBe('heads 0–5 · ffn 0–767');
    expect(formatSlice({ ...slices[1]!, experts: { start: 40, end: 64 } })).toBe('heads 6–8 · ffn 768–1535 · experts 40–63');
    render(InstanceCard, { props: { instance: group(), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-parallel').textContent).toBe('tensor parallel over 2 nodes');
    expect(screen.getAllByTestId('stage-holds').map((c) => c.textContent)).toEqual(['heads 0–5 · ffn 0–767', 'heads 6–8 · ffn 768–1535']);
    expect(screen.getByText('Sum p50')).toBeTruthy();
    // Every rank times its own sums (a pipeline shows its hop time on stage 0 only).
    expect(screen.getAllByTestId('stage-link-time').map((c) => c.textContent)).toEqual(['38 µs', '41 µs']);
  });

  it('shows on the node cards as slices, a pipeline as layer ranges', () => {
    const instance = group();
    const held = layersOn(instance.stages[1]!.node, [{ ...instance, state: 'ready' }]);
    expect(held.map((h) => h.slice)).toEqual(['heads 6–8 · ffn 768–1535']);
    const pipeline = instancesFixture()[0]!;
    expect(layersOn(pipeline.stages[0]!.node, [pipeline]).map((h) => h.slice)).toEqual([null]);
  });

  it('its placement preview names the mode and the one it weighed against', () => {
    const instance = group();
    render(PlacementPreview, { name: instance.model, plan: instance.plan });
    expect(screen.getByTestId('preview-parallel').textContent).toContain('tensor parallel');
    const other = screen.getByTestId('preview-alternative');
    expect(other.dataset['parallel']).toBe('pipeline');
    expect(other.textContent).toContain('predicted 1.30x as fast');
    expect(other.textContent).toContain('53.0 tok/s');
  });

  it('its placement preview gives each node its share of the model', () => {
    const instance = group();
    render(PlacementPreview, { name: instance.model, plan: instance.plan });
    expect(screen.getAllByTestId('preview-share').map((c) => c.textContent)).toEqual(['50%', '50%']);
  });

  it('a node short of memory holds a smaller share, and the preview says how much', () => {
    const instance = group();
    const shares = [0.8, 0.2];
    const plan: Plan = { ...instance.plan, stages: instance.plan.stages.map((s, i) => ({ ...s, share: shares[i]! })) };
    render(PlacementPreview, { name: instance.model, plan });
    expect(screen.getAllByTestId('preview-share').map((c) => c.textContent)).toEqual(['80%', '20%']);
  });
});

/** The fixture instance as a chain: its first two nodes a group over layers 0–17, the third a whole stage. */
function chain(): InstanceInfo {
  const instance = instancesFixture()[0]!;
  const layers = [
    { start: 0, end: 18 },
    { start: 0, end: 18 },
    { start: 18, end: 30 },
  ];
  const slice = (i: number) => (i < 2 ? slices[i]! : null);
  const stages = instance.stages.map((s, i) => ({
    ...s,
    layers: layers[i]!,
    slice: slice(i),
    stats: { ...(s.stats as StageStats), allreduce_p50_us: i < 2 ? 30 + i : null, hop_p50_us: i === 0 ? 900 : null },
  }));
  const plan: Plan = {
    ...instance.plan,
    parallel: 'chain',
    stages: instance.plan.stages.map((s, i) => ({ ...s, layers: layers[i]!, slice: slice(i), ring_stage: i < 2 ? 0 : 1, ...(i < 2 ? { share: 1 } : {}) })),
    alternatives: [{ parallel: 'tensor', nodes: ['gamma', 'beta', 'alpha'], expected_decode_tokens_per_second: 20, reason: 'a chain of groups over 3 nodes is predicted 1.50x as fast' }],
  };
  return { ...instance, plan, stages };
}

describe('a chain of groups', () => {
  it('says which layers each group holds and each rank its slice of them', () => {
    render(InstanceCard, { props: { instance: chain(), ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getByTestId('instance-parallel').textContent).toBe('a chain of 2 groups and stages over 3 nodes');
    expect(screen.getAllByTestId('stage-holds').map((c) => c.textContent)).toEqual([
      '0–17 · heads 0–5 · ffn 0–767',
      '0–17 · heads 6–8 · ffn 768–1535',
      '18–29',
    ]);
    // A rank times its sums; the whole stage, not the first, has no link time of its own.
    expect(screen.getAllByTestId('stage-link-time').map((c) => c.textContent)).toEqual(['30 µs', '31 µs', '']);
    const instance = chain();
    expect(layersOn(instance.stages[1]!.node, [{ ...instance, state: 'ready' }]).map((h) => h.slice)).toEqual(['0–17 · heads 6–8 · ffn 768–1535']);
  });

  it('its placement preview names the mode, each rank its share of its group, and what it was weighed against', () => {
    const instance = chain();
    render(PlacementPreview, { name: instance.model, plan: instance.plan });
    expect(screen.getByTestId('preview-parallel').textContent).toContain('a chain of groups');
    expect(screen.getAllByTestId('preview-share').map((c) => c.textContent)).toEqual(['50%', '50%', '—']);
    const other = screen.getByTestId('preview-alternative');
    expect(other.textContent).toContain('Not tensor parallel');
    expect(other.textContent).toContain('gamma, beta, alpha');
    expect(other.textContent).toContain('predicted 1.50x as fast');
  });
});

import { describe, expect, it } from 'vitest';
import { render, screen, within } from '@testing-library/svelte';
import { tick } from 'svelte';
import NodeCard from '../src/components/mesh/NodeCard.svelte';
import MeshGraph from '../src/components/mesh/MeshGraph.svelte';
import PoolSummary from '../src/components/pool/PoolSummary.svelte';
import CheckRow from '../src/components/setup/CheckRow.svelte';
import ChatMessage from '../src/components/chat/ChatMessage.svelte';
import App from '../src/App.svelte';
import { nodeMemory, poolTotals } from '../src/lib/state/pool';
import { layersOn } from '../src/lib/state/nodes';
import { ClusterStore } from '../src/lib/state/store';
import { ApiClient } from '../src/lib/api/client';
import { FakeApi, FakeEventSource, instancesFixture, nodeNamed, settle, snapshotFixture } from './fakes';

describe('NodeCard', () => {
  it('shows the node, its memory, its layers and its status', () => {
    const snapshot = snapshotFixture();
    const gamma = nodeNamed(snapshot, 'gamma');
    const layers = layersOn(gamma.id, instancesFixture());
    render(NodeCard, { node: gamma, memory: nodeMemory(gamma), layers });
    const card = screen.getByTestId('node-card');
    expect(card.dataset['nodeId']).toBe(gamma.id);
    expect(card.dataset['status']).toBe('alive');
    expect(card.dataset['health']).toBe('up');
    expect(within(card).getByText('gamma')).toBeTruthy();
    expect(within(card).getByText(/AMD EPYC/)).toBeTruthy();
    expect(within(card).getByTestId('node-device').textContent?.trim()).toBe('computes on the CPU');
    expect(layers.length).toBeGreaterThan(0);
    expect(within(card).getAllByTestId('node-layers')).toHaveLength(layers.length);
  });

  it('turns red when the node is down', () => {
    const gamma = { ...nodeNamed(snapshotFixture(), 'gamma'), status: 'down' as const };
    render(NodeCard, { node: gamma, memory: nodeMemory(gamma), layers: [] });
    const card = screen.getByTestId('node-card');
    expect(card.dataset['status']).toBe('down');
    expect(card.classList.contains('down')).toBe(true);
    expect(within(card).getByText(/Not answering heartbeats/)).toBeTruthy();
  });
});

describe('MeshGraph', () => {
  it('draws every node and every link, coloured by health', () => {
    const snapshot = snapshotFixture();
    const nodes = snapshot.nodes.map((n) => (n.name === 'gamma' ? { ...n, status: 'down' as const } : n));
    render(MeshGraph, { nodes, links: snapshot.links });
    expect(screen.getAllByTestId('mesh-node')).toHaveLength(3);
    const links = screen.getAllByTestId('link');
    expect(links).toHaveLength(3);
    const gamma = nodeNamed(snapshot, 'gamma').id;
    for (const link of links) {
      const touchesGamma = link.dataset['a'] === gamma || link.dataset['b'] === gamma;
      expect(link.dataset['health']).toBe(touchesGamma ? 'down' : 'ok');
      expect(link.dataset['transport']).toBe('tcp');
    }
  });
});

describe('PoolSummary', () => {
  it('gives the pool total in bytes, the sum of the members that are up', () => {
    const snapshot = snapshotFixture();
    render(PoolSummary, { pool: poolTotals(snapshot.nodes.map(nodeMemory)), memberCount: 3 });
    expect(Number(screen.getByTestId('pool-total').dataset['bytes'])).toBe(snapshot.pool.memory_total);
    expect(screen.queryByTestId('pressure-warning')).toBeNull();
  });

  it('warns of memory pressure', () => {
    const snapshot = snapshotFixture();
    const tight = snapshot.nodes.map((n) => ({ ...n, telemetry: { ...n.telemetry!, memory_available: n.telemetry!.memory_total * 0.05 } }));
    render(PoolSummary, { pool: poolTotals(tight.map(nodeMemory)), memberCount: 3 });
    expect(screen.getByTestId('pressure-warning').textContent).toMatch(/under 10 %/);
  });
});

describe('CheckRow', () => {
  it('shows the fix of a failing check', () => {
    render(CheckRow, {
      check: { id: 'rdma_ctl', title: 'RDMA enabled (rdma_ctl)', verdict: 'fail', reason: 'rdma_ctl status: disabled', fix: 'enable it from Recovery' },
    });
    const row = screen.getByTestId('check');
    expect(row.dataset['verdict']).toBe('fail');
    expect(row.textContent).toMatch(/Fix: enable it from Recovery/);
  });
});

describe('ChatMessage', () => {
  const reply = { id: 1, role: 'assistant' as const, model: 'm', report: null, error: null };

  it('shows the reasoning open while the model thinks, and folded under the answer', () => {
    const thinking = render(ChatMessage, { entry: { ...reply, content: '', reasoning: 'The user greets me.', streaming: true } });
    const open = thinking.getByTestId('chat-reasoning') as HTMLDetailsElement;
    expect(open.open).toBe(true);
    expect(open.textContent).toContain('Thinking…');
    expect(open.textContent).toContain('The user greets me.');
    thinking.unmount();
    const done = render(ChatMessage, { entry: { ...reply, content: 'Hello!', reasoning: 'The user greets me.', streaming: false } });
    const folded = done.getByTestId('chat-reasoning') as HTMLDetailsElement;
    expect(folded.open).toBe(false);
    expect(folded.textContent).toContain('Thought');
    expect(done.getByText('Hello!')).toBeTruthy();
    done.unmount();
    const plain = render(ChatMessage, { entry: { ...reply, content: 'Hello!', reasoning: '', streaming: false } });
    expect(plain.queryByTestId('chat-reasoning')).toBeNull();
  });
});

describe('App', () => {
  it('shows loading, then the live mesh, and follows events', async () => {
    const api = new FakeApi();
    const stream = new FakeEventSource();
    const store = new ClusterStore({ getJson: api.getJson, openEvents: () => stream });
    const client = new ApiClient(async () => new Response('{}'), { load: () => null, save: () => {} });
    render(App, { client, store });
    expect(screen.getByTestId('status-loading')).toBeTruthy();

    const snapshot = snapshotFixture();
    api.answerSnapshot(snapshot, instancesFixture());
    await settle();
    await tick();
    expect(screen.getAllByTestId('node-card')).toHaveLength(3);
    expect(screen.getAllByTestId('link')).toHaveLength(3);
    // The link list gives the echo round trip where an end measured one (two of the three links).
    expect(screen.getAllByTestId('link-echo').map((e) => e.textContent?.trim())).toEqual(['echo 31 µs', 'echo 44 µs']);
    expect(Number(screen.getByTestId('pool-total').dataset['bytes'])).toBe(snapshot.pool.memory_total);

    const gamma = nodeNamed(snapshot, 'gamma');
    stream.send('node_status', { node: gamma.id, status: 'down' });
    await tick();
    const card = screen.getAllByTestId('node-card').find((c) => c.dataset['nodeId'] === gamma.id);
    expect(card?.dataset['status']).toBe('down');
    expect(Number(screen.getByTestId('pool-total').dataset['bytes'])).toBe(snapshot.pool.memory_total - gamma.telemetry!.memory_total);

    stream.fail();
    await tick();
    expect(screen.getByTestId('reconnecting')).toBeTruthy();
    store.stop();
  });
});

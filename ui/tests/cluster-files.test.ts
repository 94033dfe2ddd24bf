// The Models view's "Across the cluster" panel, its copy rows and copies on the mesh, over a node whose
// answers each test gives (GET /api/models/cluster with the fixture cluster's members, POST
// /api/models/copy) and `model_copy` events applied to the model the way the store applies them.
import { describe, expect, it } from 'vitest';
import { fireEvent, render, screen, waitFor, within } from '@testing-library/svelte';
import ClusterFilesPanel from '../src/components/models/ClusterFilesPanel.svelte';
import CopyRow from '../src/components/models/CopyRow.svelte';
import MeshGraph from '../src/components/mesh/MeshGraph.svelte';
import MeshView from '../src/components/mesh/MeshView.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import type { CopyProgress } from '../src/lib/api/types';
import { ClusterStore } from '../src/lib/state/store';
import { applyEvent, applySnapshot, emptyModel, type ClusterModel } from '../src/lib/state/model';
import { applyCopy, edgeCopies, EDGE_LINGER_MS, type CopyEvent, type CopyView } from '../src/lib/state/copies';
import { clusterFilesFixture, FakeApi, FakeEventSource, nodeNamed, snapshotFixture } from './fakes';

type Answer = { status: number; json: unknown };
type Route = (body: unknown) => Answer;

const ok = (json: unknown): Route => () => ({ status: 200, json });
const SMOL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const SIZE = 98_362_432;
const snapshot = snapshotFixture();
const alpha = nodeNamed(snapshot, 'alpha').id;
const beta = nodeNamed(snapshot, 'beta').id;
const gamma = nodeNamed(snapshot, 'gamma').id;

function context(routes: Record<string, Route>) {
  const calls: { key: string; body: unknown }[] = [];
  const client = new ApiClient(
    async (path, init) => {
      const key = `${init?.method ?? 'GET'} ${path}`;
      const body = init?.body ? JSON.parse(String(init.body)) : undefined;
      calls.push({ key, body });
      const route = routes[key];
      const answer = route ? route(body) : { status: 404, json: { error: { message: `no such endpoint ${key}` } } };
      return new Response(JSON.stringify(answer.json), { status: answer.status });
    },
    { load: () => null, save: () => {} },
  );
  const store = new ClusterStore({ getJson: new FakeApi().getJson, openEvents: () => new FakeEventSource() });
  return { calls, context: new Map([[APP_CONTEXT, { client, store }]]), count: (key: string) => calls.filter((c) => c.key === key).length };
}

/** Mounts the panel over a node that answers `routes` ("METHOD /path"). */
function mount(routes: Record<string, Route>, options: { readOnly?: boolean; model?: ClusterModel } = {}) {
  const { calls, context: ctx, count } = context(routes);
  const model = options.model ?? applySnapshot(emptyModel(), snapshotFixture(), []);
  const view = render(ClusterFilesPanel, { props: { model, readOnly: options.readOnly ?? false }, context: ctx });
  return { calls, count, view, model };
}

function progress(done: number, rate = 0): CopyProgress {
  return { bytes_done: done, bytes_total: SIZE, bytes_per_second: rate };
}

function copyEvent(id: string, extra: Partial<CopyEvent> = {}): CopyEvent {
  return { type: 'model_copy', id, from: gamma, to: alpha, file: SMOL, progress: progress(0), done: null, error: null, ...extra };
}

function report(rate = 280_000_000) {
  return { path: `/data/models/HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/${SMOL}`, bytes: SIZE, seconds: 0.351, bytes_per_second: rate, sha256: 'b179' };
}

const fileRow = (name: string) => screen.getAllByTestId('cluster-file').find((r) => r.dataset['name'] === name)!;

describe('across the cluster', () => {
  it('lists each file with the nodes that have it, its size and repository, and where to copy it from', async () => {
    mount({ 'GET /api/models/cluster': ok(clusterFilesFixture()) });
    expect(screen.getByText('Asking the nodes for their files…')).toBeTruthy();
    const rows = await screen.findAllByTestId('cluster-file');
    expect(rows.map((r) => r.dataset['name'])).toEqual(['qwen2.5-0.5b-instruct-q4_k_m.gguf', SMOL]);
    const qwen = fileRow('qwen2.5-0.5b-instruct-q4_k_m.gguf');
    expect(qwen.dataset['here']).toBe('true');
    expect(within(qwen).getAllByTestId('file-holder').map((c) => c.textContent?.trim())).toEqual(['alpha', 'beta']);
    expect(within(qwen).getByText('here')).toBeTruthy();
    expect(within(qwen).queryByTestId('copy-here')).toBeNull();

    const smol = fileRow(SMOL);
    expect(smol.dataset['here']).toBe('false');
    expect(smol.textContent).toContain('98.4 MB');
    expect(smol.textContent).toContain('HuggingFaceTB/SmolLM2-135M-Instruct-GGUF');
    expect(within(smol).getAllByTestId('file-holder').map((c) => c.dataset['nodeId'])).toEqual([beta, gamma]);
    const button = within(smol).getByTestId('copy-here') as HTMLButtonElement;
    expect(button.textContent?.trim()).toBe('Copy here from beta');
    expect(button.disabled).toBe(false);
    const source = within(smol).getByTestId('copy-source') as HTMLSelectElement;
    expect([...source.options].map((o) => o.value)).toEqual([beta, gamma]);
  });

  it('shows a member’s shard with its layers and offers no copy from it', async () => {
    const lists = clusterFilesFixture();
    // gamma holds only layers 10-19 of SmolLM2; beta has it whole.
    lists[0]!.files[0]!.layers = '10-19';
    mount({ 'GET /api/models/cluster': ok(lists) });
    await screen.findAllByTestId('cluster-file');
    const smol = fileRow(SMOL);
    expect(smol.dataset['complete']).toBe('true');
    const chips = within(smol).getAllByTestId('file-holder');
    expect(chips.map((c) => c.textContent?.trim())).toEqual(['beta', 'gamma: layers 10-19 (shard)']);
    expect(chips[1]?.dataset['layers']).toBe('10-19');
    expect(chips[1]?.title).toMatch(/never copied/);
    // The only source is beta: no choice of node, and never gamma.
    expect(within(smol).queryByTestId('copy-source')).toBeNull();
    const button = within(smol).getByTestId('copy-here');
    expect(button.textContent?.trim()).toBe('Copy here from beta');
    expect(button.dataset['source']).toBe(beta);
    expect(within(smol).queryByTestId('no-whole-copy')).toBeNull();
  });

  it('says no member can copy a file only shards of which are around', async () => {
    const lists = clusterFilesFixture();
    lists[0]!.files[0]!.layers = '0-9, 20-29';
    lists[2]!.files[0]!.layers = '10-19';
    // This node holds a shard of qwen that beta has whole: it can still be copied here whole.
    lists[1]!.files[0]!.layers = '0-11';
    const { count } = mount({ 'GET /api/models/cluster': ok(lists) });
    await screen.findAllByTestId('cluster-file');
    const smol = fileRow(SMOL);
    expect(smol.dataset['complete']).toBe('false');
    expect(within(smol).getAllByTestId('file-holder').map((c) => c.textContent?.trim())).toEqual([
      'beta: layers 10-19 (shard)',
      'gamma: layers 0-9, 20-29 (shard)',
    ]);
    expect(within(smol).queryByTestId('copy-here')).toBeNull();
    expect(within(smol).getByTestId('no-whole-copy').textContent).toMatch(/no member has the whole file/);

    const qwen = fileRow('qwen2.5-0.5b-instruct-q4_k_m.gguf');
    expect(qwen.dataset['here']).toBe('false');
    expect(within(qwen).getByText('shard here')).toBeTruthy();
    expect(within(qwen).getAllByTestId('file-holder').map((c) => c.textContent?.trim())).toEqual(['alpha: layers 0-11 (shard)', 'beta']);
    expect(within(qwen).getByTestId('copy-here').textContent?.trim()).toBe('Copy here from beta');
    expect(count('POST /api/models/copy')).toBe(0);
  });

  it('copies from the chosen node, shows the copy until its events arrive, then its progress and rate', async () => {
    const { calls, count, view, model } = mount({
      'GET /api/models/cluster': ok(clusterFilesFixture()),
      'POST /api/models/copy': ok({ id: 'c1', path: `/data/models/${SMOL}` }),
    });
    await screen.findAllByTestId('cluster-file');
    await fireEvent.change(within(fileRow(SMOL)).getByTestId('copy-source'), { target: { value: gamma } });
    expect(within(fileRow(SMOL)).getByTestId('copy-here').textContent?.trim()).toBe('Copy here from gamma');
    await fireEvent.click(within(fileRow(SMOL)).getByTestId('copy-here'));
    const row = await screen.findByTestId('copy-row');
    expect(calls.find((c) => c.key === 'POST /api/models/copy')?.body).toEqual({ from: gamma, file: SMOL, size: SIZE });
    expect(row.dataset['copyId']).toBe('c1');
    expect(row.dataset['state']).toBe('copying');
    expect(within(row).getByTestId('copy-route').textContent?.replace(/\s+/g, ' ').trim()).toBe('gamma → alpha');
    expect(within(row).getByTestId('copy-stats').textContent).toContain('starting…');
    expect((within(fileRow(SMOL)).getByTestId('copy-here') as HTMLButtonElement).disabled).toBe(true);
    expect(within(fileRow(SMOL)).getByTestId('copy-here').textContent?.trim()).toBe('Copying…');

    const running = applyEvent(model, copyEvent('c1', { progress: progress(44_262_094, 120_000_000) }), 1);
    await view.rerender({ model: running, readOnly: false });
    expect(screen.getAllByTestId('copy-row')).toHaveLength(1);
    const stats = screen.getByTestId('copy-stats').textContent ?? '';
    expect(stats).toContain('44.3 MB of 98.4 MB (45 %)');
    expect(stats).toContain('120 MB/s');
    expect(stats).toContain('under a second left');

    expect(count('GET /api/models/cluster')).toBe(1);
    const done = applyEvent(running, copyEvent('c1', { progress: progress(SIZE, 280_000_000), done: report() }), 2);
    await view.rerender({ model: done, readOnly: false });
    const finished = screen.getByTestId('copy-row');
    expect(finished.dataset['state']).toBe('done');
    expect(within(finished).getByTestId('copy-done').textContent?.replace(/\s+/g, ' ')).toContain('Copied at 280 MB/s: 98.4 MB in 0.35 s');
    // The list is asked for again: the file is here now.
    await waitFor(() => expect(count('GET /api/models/cluster')).toBe(2), { timeout: 2000 });
    await fireEvent.click(within(finished).getByText('Dismiss'));
    expect(screen.queryByTestId('copy-row')).toBeNull();
  });

  it('shows the node’s 400 under the file', async () => {
    mount({
      'GET /api/models/cluster': ok(clusterFilesFixture()),
      'POST /api/models/copy': () => ({ status: 400, json: { error: { message: `/data/models/${SMOL} is already here`, param: 'file' } } }),
    });
    await screen.findAllByTestId('cluster-file');
    await fireEvent.click(within(fileRow(SMOL)).getByTestId('copy-here'));
    expect((await within(fileRow(SMOL)).findByTestId('copy-error')).textContent).toBe(`/data/models/${SMOL} is already here`);
    expect(screen.queryByTestId('copy-row')).toBeNull();
  });

  it('is read-only without the token', async () => {
    mount({ 'GET /api/models/cluster': ok(clusterFilesFixture()) }, { readOnly: true });
    await screen.findAllByTestId('cluster-file');
    const button = within(fileRow(SMOL)).getByTestId('copy-here') as HTMLButtonElement;
    expect(button.disabled).toBe(true);
    expect(button.title).toMatch(/Read-only/);
  });

  it('says why a node’s files are missing', async () => {
    const lists = clusterFilesFixture();
    lists[0] = { ...lists[0]!, files: [], error: 'it did not answer within 5s' };
    mount({ 'GET /api/models/cluster': ok(lists) });
    const missing = await screen.findByTestId('node-files-error');
    expect(missing.textContent).toBe("gamma's files are not listed: it did not answer within 5s");
    expect(within(fileRow(SMOL)).getAllByTestId('file-holder').map((c) => c.textContent?.trim())).toEqual(['beta']);
  });

  it('says when no node has a file, and when this node is alone', async () => {
    mount({ 'GET /api/models/cluster': ok([{ node: alpha, name: 'alpha', files: [], error: null }]) });
    expect(await screen.findByText('No node has a model file yet')).toBeTruthy();
    const alone = applySnapshot(emptyModel(), { ...snapshotFixture(), nodes: snapshotFixture().nodes.filter((n) => n.is_self), links: [] }, []);
    await render(ClusterFilesPanel, {
      props: { model: alone, readOnly: false },
      context: context({ 'GET /api/models/cluster': ok([]) }).context,
    });
    expect(await screen.findByText('No model files, and no other node yet')).toBeTruthy();
  });

  it('shows an error with a retry, then the list', async () => {
    let fail = true;
    mount({
      'GET /api/models/cluster': () => (fail ? { status: 502, json: { error: { message: 'boom' } } } : { status: 200, json: clusterFilesFixture() }),
    });
    const error = await screen.findByText('Cannot ask the nodes for their files');
    expect(error.parentElement?.textContent).toMatch(/boom/);
    fail = false;
    await fireEvent.click(screen.getByText('Try again'));
    expect(await screen.findAllByTestId('cluster-file')).toHaveLength(2);
  });

  it('asks again when a member comes or goes', async () => {
    const { count, view, model } = mount({ 'GET /api/models/cluster': ok(clusterFilesFixture()) });
    await screen.findAllByTestId('cluster-file');
    await view.rerender({ model: applyEvent(model, { type: 'node_status', node: gamma, status: 'down' }, 1), readOnly: false });
    await waitFor(() => expect(count('GET /api/models/cluster')).toBe(2), { timeout: 2000 });
  });
});

describe('CopyRow', () => {
  const names = new Map([
    [gamma, 'gamma'],
    [alpha, 'alpha'],
  ]);
  const nameOf = (id: string) => names.get(id) ?? id;
  const view = (event: CopyEvent): CopyView => applyCopy([], event, 0)[0]!;

  it('shows bytes done of the total, the rate and the time left', () => {
    render(CopyRow, { copy: view(copyEvent('a', { progress: progress(18_362_432, 20_000_000) })), nameOf });
    const stats = screen.getByTestId('copy-stats').textContent ?? '';
    expect(stats).toContain('18.4 MB of 98.4 MB (19 %)');
    expect(stats).toContain('20.0 MB/s');
    expect(stats).toContain('4 s left');
    expect(screen.getByRole('progressbar').getAttribute('value')).toBe(String(18_362_432 / SIZE));
  });

  it('shows the error of a failed copy', () => {
    render(CopyRow, { copy: view(copyEvent('b', { error: 'the copy arrived damaged: hashes differ; nothing was kept' })), nameOf });
    expect(screen.getByTestId('copy-row').dataset['state']).toBe('failed');
    expect(screen.getByTestId('copy-failure').textContent).toMatch(/arrived damaged/);
  });
});

describe('copies on the mesh', () => {
  it('draws a running copy on its edge with its progress and rate', () => {
    const copies = applyCopy([], copyEvent('c1', { progress: progress(44_262_094, 120_000_000) }), 0);
    const names = new Map(snapshot.nodes.map((n) => [n.id, n.name]));
    render(MeshGraph, { nodes: snapshot.nodes, links: snapshot.links, copies: edgeCopies(copies, 0, (id) => names.get(id) ?? id) });
    const edge = screen.getByTestId('copy-edge');
    expect(edge.dataset['from']).toBe(gamma);
    expect(edge.dataset['to']).toBe(alpha);
    expect(edge.dataset['state']).toBe('copying');
    expect(edge.querySelector('text')?.textContent).toBe('copying SmolLM2… 45 % · 120 MB/s');
    expect(edge.querySelector('title')?.textContent).toBe(`Copying ${SMOL} from gamma to alpha: 44.3 MB of 98.4 MB at 120 MB/s`);
    expect(screen.getAllByTestId('copy-line')).toHaveLength(1);
    expect(screen.getAllByTestId('link')).toHaveLength(3);
  });

  it('keeps an ended copy on the mesh and in the link list for a while, then lets it go', () => {
    const { context: ctx } = context({});
    const base = applySnapshot(emptyModel(), snapshotFixture(), []);
    const ended = applyEvent(base, copyEvent('c1', { progress: progress(SIZE, 134_000_000), done: report(134_000_000) }), Date.now());
    const view = render(MeshView, { props: { model: ended, readOnly: false }, context: ctx });
    expect(screen.getByTestId('copy-edge').dataset['state']).toBe('done');
    expect(screen.getByTestId('copy-edge').textContent).toContain('copied SmolLM2… at 134 MB/s');
    expect(screen.getByTestId('link-copy').textContent).toBe(`Copied ${SMOL} from gamma to alpha at 134 MB/s`);
    view.unmount();

    const old = applyEvent(base, copyEvent('c2', { done: report() }), Date.now() - EDGE_LINGER_MS - 1);
    render(MeshView, { props: { model: old, readOnly: false }, context: ctx });
    expect(screen.queryByTestId('copy-edge')).toBeNull();
    expect(screen.queryByTestId('link-copy')).toBeNull();
  });
});

// A stage's fetch of its share of the model before its worker starts: what the instance card says of it,
// the transfer the mesh draws on the link from the member it comes from (the fixture instance, launching
// again with gamma fetching its share from beta and alpha's share fetched already), through the store
// as `instance` events bring it, and beside copies on the same links.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { render, screen, within } from '@testing-library/svelte';
import InstanceCard from '../src/components/models/InstanceCard.svelte';
import MeshView from '../src/components/mesh/MeshView.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import type { InstanceInfo, StageFetch, StageStatus } from '../src/lib/api/types';
import { ClusterStore } from '../src/lib/state/store';
import { applySnapshot, emptyModel } from '../src/lib/state/model';
import { applyCopy, edgeCopies, type CopyEvent } from '../src/lib/state/copies';
import { fetchEdges, fetchFraction, fetchProgress, stageFetchText } from '../src/lib/state/shares';
import { FakeApi, FakeEventSource, instancesFixture, nodeNamed, settle, snapshotFixture } from './fakes';

const MODEL = 'SmolLM2-135M-Instruct.Q4_1';
const snapshot = snapshotFixture();
const beta = nodeNamed(snapshot, 'beta').id;
const gamma = nodeNamed(snapshot, 'gamma').id;
const names = new Map(snapshot.nodes.map((n) => [n.id, n.name]));
const nameOf = (id: string) => names.get(id) ?? id;

function fetch(extra: Partial<StageFetch> = {}): StageFetch {
  return { from_node: beta, from: 'beta', bytes_done: 27_000_000, bytes_total: 60_000_000, bytes_fetched: 0, bytes_per_second: 120_000_000, done: false, ...extra };
}

function fetching(extra: Partial<StageFetch> = {}): Partial<StageStatus> {
  const f = fetch(extra);
  return { state: 'fetching', progress: f.bytes_done / f.bytes_total, memory: null, stats: null, data_port: null, fetch: f };
}

const fetched: Partial<StageStatus> = {
  state: 'loading',
  progress: 0.3,
  fetch: fetch({ bytes_done: 60_000_000, bytes_fetched: 54_000_000, done: true }),
};

/** The fixture instance launching again: gamma (stage 0) fetching from beta, alpha (stage 2) done fetching. */
function launching(stages: Partial<StageStatus>[] = [fetching(), {}, fetched]): InstanceInfo {
  const instance = instancesFixture()[0]!;
  return { ...instance, state: 'launching', stages: instance.stages.map((s, i) => ({ ...s, ...stages[i] })) };
}

function appContext() {
  const client = new ApiClient(async () => new Response('{}'), { load: () => null, save: () => {} });
  const store = new ClusterStore({ getJson: new FakeApi().getJson, openEvents: () => new FakeEventSource() });
  return new Map([[APP_CONTEXT, { client, store }]]);
}

describe('a stage fetch in words', () => {
  it('says where the share comes from, how far and how fast, then what came', () => {
    const [gammaStage, betaStage, alphaStage] = launching().stages as [StageStatus, StageStatus, StageStatus];
    expect(stageFetchText(gammaStage)).toBe('fetching its share from beta · 45 % · 120 MB/s');
    expect(stageFetchText(alphaStage)).toBe('share fetched from beta (54.0 MB)');
    expect(stageFetchText(betaStage)).toBeNull();
    const hub = { ...gammaStage, fetch: fetch({ from_node: null, from: 'Hugging Face (HuggingFaceTB/SmolLM2-135M-Instruct-GGUF)', bytes_per_second: 0 }) };
    expect(stageFetchText(hub)).toBe('fetching its share from Hugging Face (HuggingFaceTB/SmolLM2-135M-Instruct-GGUF) · 45 %');
    // A fetch that broke off stays undone on a failed stage: its error tells why.
    expect(stageFetchText({ ...gammaStage, state: 'failed', error: 'could not fetch it' })).toBeNull();
  });

  it('measures how far a fetch is', () => {
    expect(fetchFraction(fetch())).toBe(0.45);
    expect(fetchFraction(fetch({ bytes_total: 0 }))).toBeNull();
    expect(fetchFraction(fetch({ done: true, bytes_done: 0 }))).toBe(1);
    expect(fetchProgress(fetch({ bytes_total: 0, bytes_per_second: 0 }))).toBe('');
    expect(fetchProgress(fetch({ bytes_total: 0 }))).toBe('120 MB/s');
  });
});

describe('InstanceCard', () => {
  it('shows a fetching stage with its progress bar, and where a fetched share came from', () => {
    render(InstanceCard, { props: { instance: launching(), ownerName: 'alpha', readOnly: false }, context: appContext() });
    const rows = screen.getAllByTestId('stage');
    const [gammaRow, betaRow, alphaRow] = rows as [HTMLElement, HTMLElement, HTMLElement];
    expect(gammaRow.dataset['state']).toBe('fetching');
    const running = within(gammaRow).getByTestId('stage-fetch');
    expect(running.dataset['done']).toBe('false');
    expect(running.dataset['fromNode']).toBe(beta);
    expect(running.textContent?.trim()).toBe('fetching its share from beta · 45 % · 120 MB/s');
    expect(running.getAttribute('title')).toBe('27.0 MB of 60.0 MB');
    expect(within(gammaRow).getByRole('progressbar').getAttribute('value')).toBe('0.45');

    expect(within(betaRow).queryByTestId('stage-fetch')).toBeNull();

    const done = within(alphaRow).getByTestId('stage-fetch');
    expect(done.dataset['done']).toBe('true');
    expect(done.textContent?.trim()).toBe('share fetched from beta (54.0 MB)');
    expect(done.getAttribute('title')).toBe('54.0 MB came over the network; the share is 60.0 MB');
  });

  it('says nothing of a fetch on a stage that never needed one', () => {
    render(InstanceCard, { props: { instance: instancesFixture()[0]!, ownerName: 'alpha', readOnly: false }, context: appContext() });
    expect(screen.getAllByTestId('stage')).toHaveLength(3);
    expect(screen.queryByTestId('stage-fetch')).toBeNull();
  });
});

describe('stage fetches on the mesh', () => {
  it('turns a stage fetching from a member into a transfer on their link, not one from the hub or done', () => {
    expect(fetchEdges([launching()])).toEqual([
      {
        id: `fetch:${instancesFixture()[0]!.id}:0`,
        kind: 'fetch',
        from: beta,
        to: gamma,
        state: 'copying',
        fraction: 0.45,
        label: 'fetching share of SmolLM2… 45 % · 120 MB/s',
        title: `gamma fetching its share of ${MODEL} from beta · 45 % · 120 MB/s`,
      },
    ]);
    expect(fetchEdges([launching([fetching({ from_node: null, from: 'Hugging Face (org/name)' }), {}, fetched])])).toEqual([]);
    expect(fetchEdges([launching([{ ...fetching(), state: 'failed' }])])).toEqual([]);
    expect(fetchEdges(instancesFixture())).toEqual([]);
  });

  it('shares a link with copies: a running copy first, then the fetch, then a copy that ended', () => {
    const copy = (id: string, extra: Partial<CopyEvent> = {}): CopyEvent => ({
      type: 'model_copy',
      id,
      from: gamma,
      to: beta,
      file: `${MODEL}.gguf`,
      progress: { bytes_done: 10, bytes_total: 100, bytes_per_second: 5 },
      done: null,
      error: null,
      ...extra,
    });
    const fetches = fetchEdges([launching()]);
    const running = applyCopy([], copy('c1'), 0);
    expect(edgeCopies(running, 0, nameOf, fetches).map((e) => [e.kind, e.id])).toEqual([['copy', 'c1']]);
    const ended = applyCopy([], copy('c2', { from: beta, to: gamma, error: 'refused' }), 0);
    expect(edgeCopies(ended, 1, nameOf, fetches).map((e) => e.kind)).toEqual(['fetch']);
    expect(edgeCopies(ended, 1, nameOf).map((e) => e.kind)).toEqual(['copy']);
  });

  it('draws the fetch on the edge and in the link list', () => {
    const model = applySnapshot(emptyModel(), snapshotFixture(), [launching()]);
    render(MeshView, { props: { model, readOnly: false }, context: appContext() });
    const edge = screen.getByTestId('copy-edge');
    expect(edge.dataset['kind']).toBe('fetch');
    expect(edge.dataset['from']).toBe(beta);
    expect(edge.dataset['to']).toBe(gamma);
    expect(edge.dataset['state']).toBe('copying');
    expect(edge.querySelector('text')?.textContent).toBe('fetching share of SmolLM2… 45 % · 120 MB/s');
    expect(edge.querySelector('title')?.textContent).toBe(`gamma fetching its share of ${MODEL} from beta · 45 % · 120 MB/s`);
    expect(screen.getByTestId('copy-line').dataset['kind']).toBe('fetch');
    const link = screen.getByTestId('link-copy');
    expect(link.dataset['kind']).toBe('fetch');
    expect(link.textContent).toBe(`gamma fetching its share of ${MODEL} from beta · 45 % · 120 MB/s`);
    expect(link.closest('li')?.dataset['a']).toBe(gamma);
    expect(link.closest('li')?.dataset['b']).toBe(beta);
  });
});

describe('the store and stage fetches', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('follows a fetch from `instance` events to its end, and the mesh with it', async () => {
    const api = new FakeApi();
    const stream = new FakeEventSource();
    const store = new ClusterStore({ getJson: api.getJson, openEvents: () => stream });
    store.start();
    api.answerSnapshot(snapshotFixture(), [launching([{ state: 'starting', progress: 0, fetch: null }])]);
    await settle();
    expect(fetchEdges(store.current.instances)).toEqual([]);

    stream.send('instance', { info: launching([fetching({ bytes_done: 6_000_000, bytes_per_second: 0 })]) });
    expect(store.current.instances[0]?.stages[0]?.fetch?.bytes_done).toBe(6_000_000);
    expect(fetchEdges(store.current.instances).map((e) => e.label)).toEqual(['fetching share of SmolLM2… 10 %']);

    stream.send('instance', { info: launching([fetching()]) });
    expect(fetchEdges(store.current.instances).map((e) => e.label)).toEqual(['fetching share of SmolLM2… 45 % · 120 MB/s']);

    const done = { state: 'starting' as const, progress: 0, fetch: fetch({ bytes_done: 60_000_000, bytes_fetched: 60_000_000, done: true }) };
    stream.send('instance', { info: launching([done]) });
    expect(fetchEdges(store.current.instances)).toEqual([]);
    expect(stageFetchText(store.current.instances[0]!.stages[0]!)).toBe('share fetched from beta (60.0 MB)');
    store.stop();
  });
});

// Model files across the cluster and copies between nodes, as pure state: `model_copy` events through
// the store (in order, malformed ones ignored, held during a snapshot fetch), the files grouped with
// their holders and best source, what the list depends on, and what the mesh writes on a link.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { CopyProgress } from '../src/lib/api/types';
import {
  applyCopy,
  clusterFiles,
  clusterFilesKey,
  copyEdgeLabel,
  copyEta,
  copyFraction,
  EDGE_LINGER_MS,
  edgeCopies,
  holderLabel,
  isCopyEvent,
  MAX_FINISHED_COPIES,
  shortFileName,
  type CopyEvent,
  type CopyView,
} from '../src/lib/state/copies';
import { libraryKey } from '../src/lib/state/library';
import { applyEvent, applySnapshot, emptyModel } from '../src/lib/state/model';
import { ClusterStore } from '../src/lib/state/store';
import { formatSeconds } from '../src/lib/format';
import { clusterFilesFixture, FakeApi, FakeEventSource, nodeNamed, settle, snapshotFixture } from './fakes';

const SMOL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const SIZE = 98_362_432;

function progress(done: number, rate = 0, total = SIZE): CopyProgress {
  return { bytes_done: done, bytes_total: total, bytes_per_second: rate };
}

function copyEvent(id: string, extra: Partial<CopyEvent> = {}): CopyEvent {
  return { type: 'model_copy', id, from: 'gamma-id', to: 'alpha-id', file: SMOL, progress: progress(0), done: null, error: null, ...extra };
}

function report(rate = 280_000_000) {
  return { path: `/data/models/HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/${SMOL}`, bytes: SIZE, seconds: 0.35, bytes_per_second: rate, sha256: 'b179c952' };
}

function setup() {
  const api = new FakeApi();
  const streams: FakeEventSource[] = [];
  let clock = 1_000;
  const store = new ClusterStore({
    getJson: api.getJson,
    openEvents: () => {
      const stream = new FakeEventSource();
      streams.push(stream);
      return stream;
    },
    now: () => clock,
  });
  const tick = (ms: number) => (clock += ms);
  return { api, store, stream: () => streams[streams.length - 1] as FakeEventSource, tick };
}

/** The event's data as the node sends it (the store adds `type` from the SSE event name). */
function data(event: CopyEvent): object {
  const { type: _type, ...rest } = event;
  return rest;
}

describe('the store and model_copy events', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('follows a copy from its events in order, to its report', async () => {
    const { api, store, stream, tick } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    stream().send('model_copy', data(copyEvent('c1')));
    tick(250);
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(40_000_000, 160_000_000) })));
    expect(store.current.copies).toHaveLength(1);
    expect(store.current.copies[0]).toMatchObject({ id: 'c1', file: SMOL, progress: progress(40_000_000, 160_000_000), done: null, startedAt: 1_000, endedAt: null });
    tick(250);
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(SIZE, 280_000_000), done: report() })));
    expect(store.current.copies[0]).toMatchObject({ done: report(), startedAt: 1_000, endedAt: 1_500 });
    store.stop();
  });

  it('ignores malformed events: not JSON, or without the fields of a copy', async () => {
    const { api, store, stream } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(10, 5) })));
    const before = store.current;
    stream().send('model_copy', '{not json');
    stream().send('model_copy', '{}');
    stream().send('model_copy', 'null');
    stream().send('model_copy', { ...data(copyEvent('c1')), progress: { bytes_done: '20', bytes_total: SIZE, bytes_per_second: 0 } });
    stream().send('model_copy', { ...data(copyEvent('c1')), progress: null });
    stream().send('model_copy', { ...data(copyEvent('c2')), file: '' });
    stream().send('model_copy', { ...data(copyEvent('c1')), done: { path: 1 } });
    stream().send('model_copy', { ...data(copyEvent('c1')), error: 42 });
    expect(store.current).toBe(before);
    expect(store.current.copies.map((c) => [c.id, c.progress.bytes_done])).toEqual([['c1', 10]]);
    store.stop();
  });

  it('keeps an ended copy as it ended, even if a late progress event arrives', async () => {
    const { api, store, stream } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(SIZE, 9), error: 'the copy broke off: connection reset' })));
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(10, 5) })));
    expect(store.current.copies[0]).toMatchObject({ error: 'the copy broke off: connection reset', progress: progress(SIZE, 9) });
    store.stop();
  });

  it('holds copy events that arrive during a snapshot fetch, applies them after it, and keeps copies across snapshots', async () => {
    const { api, store, stream } = setup();
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    stream().send('cluster_changed', { cluster_id: 'other' });
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(1, 1) })));
    stream().send('model_copy', data(copyEvent('c1', { progress: progress(2, 1) })));
    expect(store.current.copies).toEqual([]);
    api.answerSnapshot(snapshotFixture());
    await settle();
    expect(store.current.copies.map((c) => c.progress.bytes_done)).toEqual([2]);
    stream().send('lagged', '{}');
    api.answerSnapshot(snapshotFixture());
    await settle();
    expect(store.current.copies).toHaveLength(1);
    store.stop();
  });
});

describe('copies', () => {
  it('lists the newest copy first and drops the oldest finished ones past the limit, never a running one', () => {
    let copies = applyCopy([], copyEvent('running'), 0);
    for (let i = 1; i <= MAX_FINISHED_COPIES + 3; i++) {
      copies = applyCopy(copies, copyEvent(`f${i}`, i % 2 ? { done: report() } : { error: 'refused' }), i);
    }
    expect(copies).toHaveLength(MAX_FINISHED_COPIES + 1);
    expect(copies[0]?.id).toBe(`f${MAX_FINISHED_COPIES + 3}`);
    expect(copies.some((c) => c.id === 'running')).toBe(true);
    expect(copies.some((c) => c.id === 'f1')).toBe(false);
  });

  it('accepts what the node sends and nothing less', () => {
    expect(isCopyEvent(copyEvent('c'))).toBe(true);
    expect(isCopyEvent({ ...copyEvent('c'), done: report() })).toBe(true);
    expect(isCopyEvent({ ...copyEvent('c'), from: undefined })).toBe(false);
    expect(isCopyEvent({ ...copyEvent('c'), progress: progress(-1) })).toBe(false);
    expect(isCopyEvent([])).toBe(false);
  });

  it('measures how far a copy is and how long it has left', () => {
    expect(copyFraction({ progress: progress(SIZE / 4), done: null })).toBe(0.25);
    expect(copyFraction({ progress: progress(0, 0, 0), done: null })).toBeNull();
    expect(copyFraction({ progress: progress(0), done: report() })).toBe(1);
    expect(copyEta(progress(38_362_432, 20_000_000))).toBe(3);
    expect(copyEta(progress(10, 0))).toBeNull();
    expect(copyEta(progress(SIZE, 5))).toBeNull();
    expect(formatSeconds(0.351)).toBe('0.35 s');
    expect(formatSeconds(4.24)).toBe('4.2 s');
    expect(formatSeconds(65)).toBe('1 min 5 s');
    expect(formatSeconds(null)).toBe('—');
  });
});

describe('clusterFiles', () => {
  const snapshot = snapshotFixture();
  const alpha = nodeNamed(snapshot, 'alpha').id;
  const beta = nodeNamed(snapshot, 'beta').id;
  const gamma = nodeNamed(snapshot, 'gamma').id;

  it('groups the files by name and size, with who holds them, this node first', () => {
    const files = clusterFiles(clusterFilesFixture(), alpha, snapshot.links);
    expect(files.map((f) => [f.name, f.here, f.holders.map((h) => h.name)])).toEqual([
      ['qwen2.5-0.5b-instruct-q4_k_m.gguf', true, ['alpha', 'beta']],
      [SMOL, false, ['beta', 'gamma']],
    ]);
    const smol = files[1]!;
    expect(smol.size).toBe(SIZE);
    expect(smol.repo).toBe('HuggingFaceTB/SmolLM2-135M-Instruct-GGUF');
    expect(files[0]?.sources).toEqual([]);
  });

  it('copies from a node that knows the repository first, then over the fastest link', () => {
    expect(clusterFiles(clusterFilesFixture(), alpha, snapshot.links)[1]?.sources.map((s) => s.name)).toEqual(['beta', 'gamma']);
    const lists = clusterFilesFixture();
    for (const list of lists) for (const file of list.files) file.repo = null;
    // gamma → alpha measured 17.4 Gb/s, beta → alpha 15.3 Gb/s.
    expect(clusterFiles(lists, alpha, snapshot.links)[1]?.sources.map((s) => s.name)).toEqual(['gamma', 'beta']);
    expect(clusterFiles(lists, alpha, [])[1]?.sources.map((s) => s.name)).toEqual(['beta', 'gamma']);
  });

  it('keeps files of the same name but another size apart', () => {
    const lists = clusterFilesFixture();
    lists[0]!.files[0]!.size = 1234;
    const smol = clusterFiles(lists, beta).filter((f) => f.name === SMOL);
    expect(smol.map((f) => [f.size, f.here, f.holders.map((h) => h.node)])).toEqual([
      [1234, false, [gamma]],
      [SIZE, true, [beta]],
    ]);
  });

  it('lists a member’s shard with its layers, and never copies from it', () => {
    const lists = clusterFilesFixture();
    // gamma holds only layers 10-19 of SmolLM2 (its record gives the whole file's size), alpha 0-9.
    lists[0]!.files[0]!.layers = '10-19';
    lists[1]!.files.push({ name: SMOL, size: SIZE, repo: null, sha256: null, layers: '0-9' });
    const smol = clusterFiles(lists, alpha, snapshot.links).find((f) => f.name === SMOL)!;
    expect(smol.holders.map((h) => [h.name, h.layers])).toEqual([
      ['alpha', '0-9'],
      ['beta', null],
      ['gamma', '10-19'],
    ]);
    expect(smol.holders.map(holderLabel)).toEqual(['alpha: layers 0-9 (shard)', 'beta', 'gamma: layers 10-19 (shard)']);
    // A shard here is not the file: it can still be copied whole, from beta only (gamma's link is faster).
    expect([smol.here, smol.complete]).toEqual([false, true]);
    expect(smol.sources.map((s) => s.name)).toEqual(['beta']);
  });

  it('says when only shards of a file are around: nobody can copy it whole', () => {
    const lists = clusterFilesFixture();
    lists[0]!.files[0]!.layers = '0-9, 20-29';
    lists[2]!.files[0]!.layers = '10-19';
    const smol = clusterFiles(lists, alpha, snapshot.links).find((f) => f.name === SMOL)!;
    expect(smol.holders.map(holderLabel)).toEqual(['beta: layers 10-19 (shard)', 'gamma: layers 0-9, 20-29 (shard)']);
    expect([smol.here, smol.complete, smol.sources]).toEqual([false, false, []]);
  });

  it('puts a member’s shards together, and a member with the whole file has it whole', () => {
    const lists = clusterFilesFixture();
    const gammaFiles = lists[0]!.files;
    gammaFiles[0]!.layers = '0-9';
    gammaFiles.push({ ...gammaFiles[0]!, layers: '20-29' });
    // beta lists a shard besides its whole file, in either order.
    const betaSmol = lists[2]!.files[0]!;
    lists[2]!.files.unshift({ ...betaSmol, layers: '10-19' });
    const smol = clusterFiles(lists, alpha).find((f) => f.name === SMOL)!;
    expect(smol.holders.map(holderLabel)).toEqual(['beta', 'gamma: layers 0-9, 20-29 (shard)']);
    expect(smol.holders[0]?.repo).toBe('HuggingFaceTB/SmolLM2-135M-Instruct-GGUF');
    expect(smol.sources.map((s) => s.name)).toEqual(['beta']);
    // Grouping stays by name and size: a shard of another size is another file.
    lists[0]!.files[1]!.size = 1234;
    expect(clusterFiles(lists, alpha).filter((f) => f.name === SMOL).map((f) => [f.size, f.holders.map(holderLabel)])).toEqual([
      [1234, ['gamma: layers 20-29 (shard)']],
      [SIZE, ['beta', 'gamma: layers 0-9 (shard)']],
    ]);
  });

  it('is asked for again when members come or go and when a copy or download here finishes', () => {
    const model = applySnapshot(emptyModel(), snapshot, []);
    const key = clusterFilesKey(model);
    expect(clusterFilesKey(applyEvent(model, { type: 'node_status', node: gamma, status: 'suspect' }, 1))).toBe(key);
    expect(clusterFilesKey(applyEvent(model, { type: 'node_status', node: gamma, status: 'down' }, 1))).not.toBe(key);
    const running = applyEvent(model, copyEvent('c1', { from: gamma, to: alpha }), 1);
    expect(clusterFilesKey(running)).toBe(key);
    expect(libraryKey(running)).toBe(libraryKey(model));
    const done = applyEvent(running, copyEvent('c1', { from: gamma, to: alpha, done: report() }), 2);
    expect(clusterFilesKey(done)).not.toBe(key);
    expect(libraryKey(done)).not.toBe(libraryKey(model));
  });
});

describe('copies on the mesh', () => {
  const names = (id: string) => ({ 'gamma-id': 'gamma', 'alpha-id': 'alpha' })[id] ?? id;
  const view = (event: CopyEvent, now: number): CopyView => applyCopy([], event, now)[0]!;

  it('says what crosses the link in a few words', () => {
    expect(shortFileName(SMOL)).toBe('SmolLM2…');
    expect(shortFileName('tiny.gguf')).toBe('tiny');
    expect(shortFileName('averyveryverylongmodelname.gguf')).toBe('averyveryvery…');
    expect(copyEdgeLabel(view(copyEvent('c', { progress: progress(44_262_094, 120_000_000) }), 0))).toBe('copying SmolLM2… 45 % · 120 MB/s');
    expect(copyEdgeLabel(view(copyEvent('c'), 0))).toBe('copying SmolLM2… 0 %');
    expect(copyEdgeLabel(view(copyEvent('c', { done: report(134_000_000) }), 0))).toBe('copied SmolLM2… at 134 MB/s');
    expect(copyEdgeLabel(view(copyEvent('c', { error: 'refused' }), 0))).toBe('copying SmolLM2… failed');
  });

  it('shows a running copy, and an ended one for a while, one per pair of nodes', () => {
    let copies = applyCopy([], copyEvent('old', { done: report() }), 0);
    copies = applyCopy(copies, copyEvent('new', { progress: progress(10, 5) }), 1_000);
    copies = applyCopy(copies, copyEvent('other', { from: 'beta-id', error: 'refused' }), 2_000);
    const shown = edgeCopies(copies, 3_000, names);
    expect(shown.map((c) => [c.id, c.state])).toEqual([
      ['new', 'copying'],
      ['other', 'failed'],
    ]);
    expect(shown[0]?.title).toBe(`Copying ${SMOL} from gamma to alpha: 10 B of 98.4 MB at 5 B/s`);
    const later = applyCopy(copies, copyEvent('new', { done: report() }), 4_000);
    expect(edgeCopies(later, 5_000, names).map((c) => [c.id, c.state, c.label])).toEqual([
      ['new', 'done', 'copied SmolLM2… at 280 MB/s'],
      ['other', 'failed', 'copying SmolLM2… failed'],
    ]);
    expect(edgeCopies(later, 4_000 + EDGE_LINGER_MS, names)).toEqual([]);
  });
});

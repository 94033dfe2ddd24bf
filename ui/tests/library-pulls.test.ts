// The library's and downloads' pure state: fit sentences from the node's numbers, model facts, what the
// fit depends on, `model_pull` events through the store, the repository check, and the new formats.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { ModelWithFit, PullProgress } from '../src/lib/api/types';
import { fitSummary, libraryKey, modelFacts } from '../src/lib/state/library';
import { applyPull, MAX_FINISHED_PULLS, pullFraction, pullLabel, repoProblem, type PullEvent } from '../src/lib/state/pulls';
import { applyEvent, applySnapshot, emptyModel } from '../src/lib/state/model';
import { ClusterStore } from '../src/lib/state/store';
import { formatByteRate, formatCount, formatDuration } from '../src/lib/format';
import { FakeApi, FakeEventSource, instancesFixture, libraryFixture, nodeNamed, settle, snapshotFixture } from './fakes';

function smol(): ModelWithFit {
  const model = libraryFixture().find((m) => m.runnable);
  if (model === undefined) throw new Error('no runnable model in the fixture');
  return model;
}

function progress(state: PullProgress['state'], done = 0, total = 0): PullProgress {
  return { file: 'm.gguf', bytes_done: done, bytes_total: total, rate_bytes_per_second: 0, eta_seconds: null, state };
}

function pullEvent(id: string, state: PullProgress['state'], extra: Partial<PullEvent> = {}): PullEvent {
  return { type: 'model_pull', id, repo: 'org/model:Q4_K_M', layers: null, rank: null, progress: progress(state), paths: [], error: null, ...extra };
}

describe('fitSummary', () => {
  it('says on how many nodes a model fits, with the node’s numbers', () => {
    const summary = fitSummary(smol());
    expect(summary.tone).toBe('ok');
    expect(summary.text).toBe('Fits on 1 node: needs 301 MB of the 400 MB the pool offers.');
  });

  it('says how much more than the pool has a model needs', () => {
    const model = smol();
    model.fit = { ...model.fit!, fits: false, pool_bytes: 200_000_000, missing_bytes: 101_245_696, reason: 'does not fit' };
    const summary = fitSummary(model);
    expect(summary.tone).toBe('bad');
    expect(summary.label).toBe('Does not fit');
    expect(summary.text).toBe('Needs 101 MB more than the pool has: 301 MB needed, 200 MB offered.');
  });

  it('tells a split that fails on layer boundaries from a pool too small', () => {
    const model = smol();
    model.fit = { ...model.fit!, fits: false, nodes: 2, pool_bytes: 320_000_000, missing_bytes: 12_000_000 };
    expect(fitSummary(model).text).toMatch(/cannot be split.*12\.0 MB short.*320 MB/);
  });

  it('gives the reason a model cannot run, and admits an unknown fit', () => {
    const broken = libraryFixture().find((m) => !m.runnable)!;
    expect(fitSummary(broken)).toMatchObject({ tone: 'bad', label: 'Cannot run' });
    expect(fitSummary(broken).text).toMatch(/truncated/);
    expect(fitSummary({ ...smol(), fit: null }).tone).toBe('unknown');
  });

  it('lists the facts the header gives', () => {
    expect(modelFacts(smol())).toEqual(['llama', '135 M parameters', 'Q4_1', '98.4 MB', '30 layers', 'max context 8192']);
    expect(modelFacts(libraryFixture().find((m) => !m.runnable)!)).toEqual(['18 B']);
  });
});

describe('libraryKey', () => {
  it('changes with the nodes up, the instances holding memory and finished downloads, not with every sample', () => {
    const snapshot = snapshotFixture();
    const model = applySnapshot(emptyModel(), snapshot, instancesFixture());
    const key = libraryKey(model);
    const gamma = nodeNamed(snapshot, 'gamma');
    const sample = applyEvent(model, { type: 'telemetry', node: gamma.id, telemetry: { ...gamma.telemetry!, load_1m: 3 } }, 1);
    expect(libraryKey(sample)).toBe(key);
    expect(libraryKey(applyEvent(model, { type: 'node_status', node: gamma.id, status: 'down' }, 1))).not.toBe(key);
    const downloading = applyEvent(model, pullEvent('p1', 'downloading'), 1);
    expect(libraryKey(downloading)).toBe(key);
    expect(libraryKey(applyEvent(downloading, pullEvent('p1', 'done'), 2))).not.toBe(key);
  });
});

describe('pulls', () => {
  it('keeps the latest event of each pull, newest pull first, and when it started', () => {
    let pulls = applyPull([], pullEvent('a', 'resolving'), 10);
    pulls = applyPull(pulls, pullEvent('b', 'resolving'), 20);
    pulls = applyPull(pulls, pullEvent('a', 'downloading'), 30);
    expect(pulls.map((p) => [p.id, p.progress.state, p.startedAt])).toEqual([
      ['b', 'resolving', 20],
      ['a', 'downloading', 10],
    ]);
  });

  it('drops the oldest finished pulls past the limit, never a running one', () => {
    let pulls = applyPull([], pullEvent('running', 'downloading'), 0);
    for (let i = 1; i <= MAX_FINISHED_PULLS + 3; i++) pulls = applyPull(pulls, pullEvent(`f${i}`, i % 2 ? 'done' : 'failed'), i);
    expect(pulls).toHaveLength(MAX_FINISHED_PULLS + 1);
    expect(pulls.some((p) => p.id === 'running')).toBe(true);
    expect(pulls.some((p) => p.id === 'f1')).toBe(false);
  });

  it('keeps the layers of a stage’s shard, and names the pull with them', () => {
    const shard = applyPull([], pullEvent('s', 'downloading', { repo: 'org/m:SmolLM2-135M-Instruct.Q4_1.gguf', layers: '10-19' }), 0)[0]!;
    expect(shard.layers).toBe('10-19');
    expect(pullLabel(shard)).toBe('org/m:SmolLM2-135M-Instruct.Q4_1.gguf · layers 10-19');
    const whole = applyPull([], pullEvent('w', 'downloading'), 0)[0]!;
    expect(whole.layers).toBeNull();
    expect(pullLabel(whole)).toBe('org/model:Q4_K_M');
    // An older node does not send the fields: its pulls are of whole files.
    const { layers: _layers, rank: _rank, ...old } = pullEvent('o', 'downloading');
    const older = applyPull([], old as PullEvent, 0)[0]!;
    expect([older.layers, older.rank, pullLabel(older)]).toEqual([null, null, 'org/model:Q4_K_M']);
  });

  it('keeps the rank of a tensor-parallel node’s slice, and names the pull with it', () => {
    const slice = applyPull([], pullEvent('r', 'downloading', { rank: '1/2' }), 0)[0]!;
    expect(slice.rank).toBe('1/2');
    expect(pullLabel(slice)).toBe('org/model:Q4_K_M · rank 1 of 2');
  });

  it('measures progress when the size is known', () => {
    expect(pullFraction(progress('downloading', 25, 100))).toBe(0.25);
    expect(pullFraction(progress('resolving'))).toBeNull();
    expect(pullFraction(progress('done'))).toBe(1);
  });

  it('catches what is plainly not a repository', () => {
    expect(repoProblem('HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M')).toBeNull();
    expect(repoProblem(' org/name ')).toBeNull();
    expect(repoProblem('org/name:model-Q8_0.gguf')).toBeNull();
    expect(repoProblem('')).toMatch(/Enter a repository/);
    expect(repoProblem('https://huggingface.co/org/name')).toMatch(/not the whole address/);
    expect(repoProblem('org name/x')).toMatch(/no spaces/);
    expect(repoProblem('just-a-name')).toMatch(/not ORG\/NAME/);
    expect(repoProblem('a/b/c')).toMatch(/not ORG\/NAME/);
    expect(repoProblem('org/')).toMatch(/not ORG\/NAME/);
    expect(repoProblem('org/na$me')).toMatch(/letters, digits/);
    expect(repoProblem('org/name:')).toMatch(/after the colon/);
  });
});

describe('the store and model_pull events', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('follows a pull from its events, and a malformed one changes nothing', async () => {
    const api = new FakeApi();
    const streams: FakeEventSource[] = [];
    const store = new ClusterStore({
      getJson: api.getJson,
      openEvents: () => {
        const stream = new FakeEventSource();
        streams.push(stream);
        return stream;
      },
    });
    store.start();
    api.answerSnapshot(snapshotFixture());
    await settle();
    const stream = streams[0]!;
    const { type: _type, ...data } = pullEvent('p1', 'downloading', { progress: { ...progress('downloading', 10, 40), rate_bytes_per_second: 5 } });
    stream.send('model_pull', data);
    expect(store.current.pulls.map((p) => [p.id, p.progress.bytes_done])).toEqual([['p1', 10]]);
    stream.send('model_pull', '{not json');
    expect(store.current.pulls).toHaveLength(1);
    stream.send('model_pull', { ...data, progress: progress('failed', 10, 40), error: 'cannot reach huggingface.co' });
    expect(store.current.pulls[0]?.error).toBe('cannot reach huggingface.co');
    // A new snapshot keeps the downloads (it does not carry them).
    stream.send('cluster_changed', { cluster_id: 'x' });
    api.answerSnapshot(snapshotFixture());
    await settle();
    expect(store.current.pulls).toHaveLength(1);
    store.stop();
  });
});

describe('formats', () => {
  it('says counts, rates and time left as people read them', () => {
    expect(formatCount(134_515_008)).toBe('135 M');
    expect(formatCount(7_615_616_512)).toBe('7.6 B');
    expect(formatCount(70_000_000_000)).toBe('70 B');
    expect(formatCount(512)).toBe('512');
    expect(formatCount(null)).toBe('—');
    expect(formatByteRate(4_200_000)).toBe('4.20 MB/s');
    expect(formatDuration(42)).toBe('42 s');
    expect(formatDuration(185)).toBe('3 min 5 s');
    expect(formatDuration(120)).toBe('2 min');
    expect(formatDuration(4320)).toBe('1 h 12 min');
    expect(formatDuration(null)).toBe('—');
  });
});

// The Models view's library, fit lines, "Launch…", download form and progress rows, over a node whose
// answers each test gives (real /api/models/fit and /api/instances answers as fixtures).
import { describe, expect, it } from 'vitest';
import { fireEvent, render, screen, waitFor, within } from '@testing-library/svelte';
import ModelsView from '../src/components/models/ModelsView.svelte';
import PullRow from '../src/components/models/PullRow.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import { ClusterStore } from '../src/lib/state/store';
import { applyEvent, applySnapshot, emptyModel, type ClusterModel } from '../src/lib/state/model';
import type { PullView } from '../src/lib/state/pulls';
import { FakeApi, FakeEventSource, instancesFixture, libraryFixture, snapshotFixture } from './fakes';

type Answer = { status: number; json: unknown };
type Route = (body: unknown) => Answer;

const ok = (json: unknown): Route => () => ({ status: 200, json });

/** Mounts the Models view over a node that answers `routes` ("METHOD /path"). */
function mount(routes: Record<string, Route>, options: { readOnly?: boolean; model?: ClusterModel } = {}) {
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
  const model = options.model ?? applySnapshot(emptyModel(), snapshotFixture(), []);
  const view = render(ModelsView, {
    props: { model, readOnly: options.readOnly ?? false },
    context: new Map([[APP_CONTEXT, { client, store }]]),
  });
  const count = (key: string) => calls.filter((c) => c.key === key).length;
  return { calls, count, view, model };
}

function pull(id: string, progress: Partial<PullView['progress']>, extra: Partial<PullView> = {}): PullView {
  return {
    id,
    repo: 'HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M',
    layers: null,
    rank: null,
    progress: { file: 'smollm2-135m-instruct-q4_k_m.gguf', bytes_done: 0, bytes_total: 0, rate_bytes_per_second: 0, eta_seconds: null, state: 'resolving', ...progress },
    paths: [],
    error: null,
    startedAt: 0,
    ...extra,
  };
}

describe('the library', () => {
  it('lists every model with its facts and fit, and the reason one cannot run', async () => {
    mount({ 'GET /api/models/fit': ok(libraryFixture()) });
    expect(screen.getByText("Reading this node's models…")).toBeTruthy();
    const rows = await screen.findAllByTestId('library-model');
    expect(rows).toHaveLength(2);
    const [smol, broken] = rows as [HTMLElement, HTMLElement];
    expect(smol.dataset['runnable']).toBe('true');
    // Named as the APIs serve it (the file name), with the file's own title beside it.
    expect(within(smol).getByText('SmolLM2-135M-Instruct.Q4_1')).toBeTruthy();
    expect(within(smol).getByTestId('model-title').textContent).toBe('Smollm2 135M 8k Lc100K Mix1 Ep2');
    expect(smol.textContent).toContain('llama · 135 M parameters · Q4_1 · 98.4 MB · 30 layers');
    const fit = within(smol).getByTestId('fit');
    expect(fit.dataset['fits']).toBe('true');
    expect(fit.dataset['nodes']).toBe('1');
    expect(fit.textContent?.trim()).toBe('Fits on 1 node: needs 301 MB of the 400 MB the pool offers.');
    expect(screen.getByText(/2048-token context, 4 requests at once/)).toBeTruthy();
    expect(broken.dataset['runnable']).toBe('false');
    expect(within(broken).getByTestId('fit-badge').textContent).toBe('Cannot run');
    expect(within(broken).getByTestId('fit').textContent).toMatch(/truncated/);
    expect(within(broken).queryByTestId('library-launch')).toBeNull();
  });

  it('says how much more than the pool has a model needs', async () => {
    const models = libraryFixture();
    models[0]!.fit = { ...models[0]!.fit!, fits: false, pool_bytes: 200_000_000, missing_bytes: 101_245_696, reason: 'the planner says no' };
    mount({ 'GET /api/models/fit': ok(models) });
    const fit = (await screen.findAllByTestId('fit'))[0]!;
    expect(fit.dataset['fits']).toBe('false');
    expect(fit.textContent).toContain('Needs 101 MB more than the pool has');
    expect(fit.getAttribute('title')).toBe('the planner says no');
  });

  it('says how to get a model when there is none', async () => {
    mount({ 'GET /api/models/fit': ok([]) });
    const status = (await screen.findByText('No models on this node yet')).parentElement;
    expect(status?.dataset['testid']).toBe('status-empty');
    expect(status?.textContent).toMatch(/shoal pull ORG\/NAME/);
    expect(status?.textContent).toMatch(/Download one from Hugging Face/);
    expect(screen.queryByTestId('library-model')).toBeNull();
  });

  it('shows an error with a retry, then the list', async () => {
    let fail = true;
    mount({
      'GET /api/models/fit': () =>
        fail ? { status: 502, json: { error: { message: 'listing the models failed: boom' } } } : { status: 200, json: libraryFixture() },
    });
    const error = await screen.findByText("Cannot read this node's models");
    expect(error.parentElement?.textContent).toMatch(/boom/);
    fail = false;
    await fireEvent.click(screen.getByText('Try again'));
    expect(await screen.findAllByTestId('library-model')).toHaveLength(2);
  });

  it('"Launch…" fills the launch form with the path and previews the placement', async () => {
    const plan = instancesFixture()[0]!.plan;
    const { calls } = mount({
      'GET /api/models/fit': ok(libraryFixture()),
      'POST /api/placements/preview': ok({
        model: 'SmolLM2-135M-Instruct.Q4_1',
        plan,
        fetches: plan.stages.map((_, i) => (i === 0 ? null : { bytes: 24_000_000, from: i === 1 ? 'alpha' : null })),
      }),
    });
    await fireEvent.click(await screen.findByTestId('library-launch'));
    const path = libraryFixture()[0]!.path;
    expect((screen.getByTestId('model-path') as HTMLInputElement).value).toBe(path);
    await screen.findByTestId('placement-preview');
    expect(screen.getAllByTestId('preview-stage')).toHaveLength(plan.stages.length);
    expect(screen.getByTestId('preview-kv-per-1k').textContent).toBe('23.6 MB');
    const fetches = screen.getAllByTestId('preview-fetch').map((cell) => cell.textContent?.trim());
    expect(fetches[0]).toBe('—');
    expect(fetches[1]).toBe('24.0 MB from alpha');
    expect(fetches[2]).toBe('lacks it; no source');
    expect(calls.find((c) => c.key === 'POST /api/placements/preview')?.body).toEqual({ model: path });
    expect((screen.getByTestId('launch-button') as HTMLButtonElement).disabled).toBe(false);
  });

  it('previews and launches with the context and the requests at once the form asks for', async () => {
    const plan = instancesFixture()[0]!.plan;
    const { calls } = mount({
      'GET /api/models/fit': ok(libraryFixture()),
      'POST /api/placements/preview': ok({ model: 'SmolLM2-135M-Instruct.Q4_1', plan, fetches: [] }),
      'POST /api/instances': ok(instancesFixture()[0]),
    });
    await fireEvent.click(await screen.findByTestId('library-launch'));
    await screen.findByTestId('placement-preview');
    await fireEvent.input(screen.getByTestId('context'), { target: { value: '8192' } });
    await fireEvent.input(screen.getByTestId('sequences'), { target: { value: '8' } });
    expect((screen.getByTestId('launch-button') as HTMLButtonElement).disabled).toBe(true);
    await fireEvent.click(screen.getByTestId('preview-button'));
    await waitFor(() => expect((screen.getByTestId('launch-button') as HTMLButtonElement).disabled).toBe(false));
    const path = libraryFixture()[0]!.path;
    const previews = calls.filter((c) => c.key === 'POST /api/placements/preview');
    expect(previews.at(-1)?.body).toEqual({ model: path, context: 8192, sequences: 8 });
    // The KV cache's type, the prompt cache's tokens, drafting and the reply limit go with the request too.
    await fireEvent.change(screen.getByTestId('kv-type'), { target: { value: 'q8_0' } });
    await fireEvent.input(screen.getByTestId('prompt-cache'), { target: { value: '0' } });
    await fireEvent.change(screen.getByTestId('speculation'), { target: { value: 'off' } });
    await fireEvent.input(screen.getByTestId('max-reply'), { target: { value: '512' } });
    await fireEvent.click(screen.getByTestId('preview-button'));
    await waitFor(() => expect((screen.getByTestId('launch-button') as HTMLButtonElement).disabled).toBe(false));
    const asked = {
      model: path,
      context: 8192,
      sequences: 8,
      kv_type: 'q8_0',
      prompt_cache: 0,
      speculation: 'off',
      max_reply_tokens: 512,
    };
    expect(calls.filter((c) => c.key === 'POST /api/placements/preview').at(-1)?.body).toEqual(asked);
    await fireEvent.click(screen.getByTestId('launch-button'));
    await waitFor(() => expect(calls.filter((c) => c.key === 'POST /api/instances')).toHaveLength(1));
    expect(calls.find((c) => c.key === 'POST /api/instances')?.body).toEqual(asked);
  });

  it('checks again when a download finishes', async () => {
    const { count, view, model } = mount({ 'GET /api/models/fit': ok(libraryFixture()) });
    await screen.findAllByTestId('library-model');
    expect(count('GET /api/models/fit')).toBe(1);
    const event = { type: 'model_pull' as const, id: 'p1', repo: 'org/m', layers: null, rank: null, paths: ['/m.gguf'], error: null };
    const running = applyEvent(model, { ...event, progress: pull('p1', { state: 'downloading' }).progress }, 1);
    await view.rerender({ model: running, readOnly: false });
    await new Promise((resolve) => setTimeout(resolve, 400));
    expect(count('GET /api/models/fit')).toBe(1);
    const done = applyEvent(running, { ...event, progress: pull('p1', { state: 'done' }).progress }, 2);
    await view.rerender({ model: done, readOnly: false });
    await waitFor(() => expect(count('GET /api/models/fit')).toBe(2), { timeout: 2000 });
  });

  it('is read-only without the token: no launch, no download', async () => {
    mount({ 'GET /api/models/fit': ok(libraryFixture()) }, { readOnly: true });
    expect(((await screen.findByTestId('library-launch')) as HTMLButtonElement).disabled).toBe(true);
    expect((screen.getByTestId('pull-repo') as HTMLInputElement).disabled).toBe(true);
    expect((screen.getByTestId('pull-button') as HTMLButtonElement).disabled).toBe(true);
    expect(screen.getByText(/downloading needs this node's API token/)).toBeTruthy();
  });
});

describe('the download form', () => {
  it('refuses plainly bad input without asking the node', async () => {
    const { count } = mount({ 'GET /api/models/fit': ok([]) });
    await fireEvent.input(screen.getByTestId('pull-repo'), { target: { value: 'https://huggingface.co/org/name' } });
    await fireEvent.submit(screen.getByTestId('pull-form'));
    expect(screen.getByTestId('pull-problem').textContent).toMatch(/not the whole address/);
    expect(count('POST /api/models/pull')).toBe(0);
  });

  it('shows the node’s 400 under the field', async () => {
    mount({
      'GET /api/models/fit': ok([]),
      'POST /api/models/pull': () => ({ status: 400, json: { error: { message: 'org/nothing: no such repository', param: 'repo' } } }),
    });
    await fireEvent.input(screen.getByTestId('pull-repo'), { target: { value: 'org/nothing' } });
    await fireEvent.submit(screen.getByTestId('pull-form'));
    expect((await screen.findByTestId('pull-error')).textContent).toBe('org/nothing: no such repository');
  });

  it('starts a download and shows its row until its events arrive', async () => {
    const { calls, view, model } = mount({ 'GET /api/models/fit': ok([]), 'POST /api/models/pull': ok({ id: 'p9' }) });
    await fireEvent.input(screen.getByTestId('pull-repo'), { target: { value: ' HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M ' } });
    await fireEvent.click(screen.getByTestId('pull-button'));
    const row = await screen.findByTestId('pull-row');
    expect(row.dataset['pullId']).toBe('p9');
    expect(row.dataset['state']).toBe('resolving');
    expect(calls.find((c) => c.key === 'POST /api/models/pull')?.body).toEqual({ repo: 'HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M' });
    expect((screen.getByTestId('pull-repo') as HTMLInputElement).value).toBe('');
    const progress = pull('p9', { state: 'downloading', bytes_done: 12_000_000, bytes_total: 98_362_432 }).progress;
    await view.rerender({ model: applyEvent(model, { type: 'model_pull', id: 'p9', repo: 'x/y', layers: null, rank: null, progress, paths: [], error: null }, 1), readOnly: false });
    const rows = screen.getAllByTestId('pull-row');
    expect(rows).toHaveLength(1);
    expect(rows[0]!.dataset['state']).toBe('downloading');
  });
});

describe('PullRow', () => {
  it('shows the file, bytes done of the total, rate and time left', () => {
    render(PullRow, {
      pull: pull('a', { state: 'downloading', bytes_done: 12_000_000, bytes_total: 98_362_432, rate_bytes_per_second: 4_200_000, eta_seconds: 21 }),
    });
    const stats = screen.getByTestId('pull-stats').textContent ?? '';
    expect(stats).toContain('smollm2-135m-instruct-q4_k_m.gguf');
    expect(stats).toContain('12.0 MB of 98.4 MB (12 %)');
    expect(stats).toContain('4.20 MB/s');
    expect(stats).toContain('21 s left');
    expect(screen.getByRole('progressbar').getAttribute('value')).toBe(String(12_000_000 / 98_362_432));
  });

  it('shows the error of a failed download and can be dismissed', async () => {
    const dismissed: string[] = [];
    render(PullRow, {
      pull: pull('b', { state: 'failed' }, { error: 'cannot reach huggingface.co: timed out. Set HF_ENDPOINT or check the network' }),
      ondismiss: (id: string) => dismissed.push(id),
    });
    expect(screen.getByTestId('pull-failure').textContent).toMatch(/cannot reach huggingface.co/);
    await fireEvent.click(screen.getByText('Dismiss'));
    expect(dismissed).toEqual(['b']);
  });

  it('shows the layers of a stage’s shard next to what was asked for', () => {
    const shard = { repo: 'HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:SmolLM2-135M-Instruct.Q4_1.gguf', layers: '10-19' };
    const view = render(PullRow, { pull: pull('s', { state: 'downloading', bytes_done: 1_000_000, bytes_total: 4_000_000 }, shard) });
    const row = screen.getByTestId('pull-row');
    expect(row.dataset['layers']).toBe('10-19');
    expect(screen.getByTestId('pull-layers').textContent?.trim()).toBe('· layers 10-19');
    expect(row.querySelector('.head')?.textContent?.replace(/\s+/g, ' ')).toContain('SmolLM2-135M-Instruct.Q4_1.gguf · layers 10-19');
    expect(screen.getByRole('progressbar').getAttribute('aria-label')).toBe(`Download progress of ${shard.repo} · layers 10-19`);
    view.unmount();

    render(PullRow, { pull: pull('s', { state: 'done' }, { ...shard, paths: ['/data/models/org--m/SmolLM2-135M-Instruct.Q4_1.gguf'] }) });
    expect(screen.getByTestId('pull-row').textContent).toMatch(/Downloaded SmolLM2-135M-Instruct\.Q4_1\.gguf \(layers 10-19\): it is in the library/);
  });

  it('shows the rank of a tensor-parallel node’s slice next to what was asked for', () => {
    const slice = { repo: 'org/m:SmolLM2-135M-Instruct.Q4_1.gguf', rank: '1/2' };
    const view = render(PullRow, { pull: pull('r', { state: 'downloading' }, slice) });
    expect(screen.getByTestId('pull-layers').textContent?.trim()).toBe('· rank 1 of 2');
    expect(screen.getByTestId('pull-row').dataset['layers']).toBeUndefined();
    view.unmount();
    render(PullRow, { pull: pull('r', { state: 'done' }, { ...slice, paths: ['/data/models/org--m/SmolLM2-135M-Instruct.Q4_1.gguf'] }) });
    expect(screen.getByTestId('pull-row').textContent).toMatch(/Downloaded SmolLM2-135M-Instruct\.Q4_1\.gguf \(rank 1 of 2\): it is in the library/);
  });

  it('shows no layers for a whole file', () => {
    render(PullRow, { pull: pull('w', { state: 'downloading' }) });
    expect(screen.queryByTestId('pull-layers')).toBeNull();
    expect(screen.getByTestId('pull-row').dataset['layers']).toBeUndefined();
  });

  it('names the files of a finished download', () => {
    render(PullRow, { pull: pull('c', { state: 'done' }, { paths: ['/data/models/org--m/m-Q4_K_M.gguf'] }) });
    expect(screen.getByTestId('pull-row').textContent).toMatch(/Downloaded m-Q4_K_M\.gguf: it is in the library/);
  });
});

describe('an instance that lost a node', () => {
  it('stays among the running ones while it is placed again, saying why, with Stop', async () => {
    const [ready] = instancesFixture();
    const lost = { ...ready!, state: 'recovering' as const, error: 'node node2 is down; waiting to place it again: 36.0 MB missing' };
    const model = applySnapshot(emptyModel(), snapshotFixture(), [lost]);
    mount({ 'GET /api/models/fit': ok(libraryFixture()) }, { model });
    const card = await screen.findByTestId('instance');
    expect(card.getAttribute('data-state')).toBe('recovering');
    expect(within(card).getByTestId('instance-error').textContent).toContain('36.0 MB missing');
    expect(within(card).getByRole('button', { name: 'Stop' })).toBeTruthy();
  });

  it('shows the instance that replaced it with the reason; the replaced one is not among the running', async () => {
    const [ready] = instancesFixture();
    const old = { ...ready!, id: 'old00001', state: 'replaced' as const, replaced_by: ready!.id, created_at_ms: ready!.created_at_ms - 1 };
    const recovered = { ...ready!, recovery: { replaces: 'old00001', reason: 'node node2 is down', attempt: 1 } };
    const model = applySnapshot(emptyModel(), snapshotFixture(), [old, recovered]);
    mount({ 'GET /api/models/fit': ok(libraryFixture()) }, { model });
    const cards = await screen.findAllByTestId('instance');
    expect(cards.map((c) => c.getAttribute('data-state'))).toEqual(['ready']);
    expect(within(cards[0]!).getByTestId('instance-recovery').textContent).toContain('after: node node2 is down');
  });
});

describe('an instance that ended', () => {
  /** The fixture's instance, failed after gamma went down: its stages as the node settles them. */
  function failedAfterGammaDied() {
    const [ready] = instancesFixture();
    return {
      ...ready!,
      state: 'failed' as const,
      error: 'node gamma is down',
      stages: ready!.stages.map((s) =>
        s.node_name === 'gamma' ? { ...s, state: 'failed' as const, error: 'node gamma is down' } : { ...s, state: 'stopped' as const },
      ),
    };
  }

  it('shows its stages as they are now, and Relaunch launches it again as it was', async () => {
    const failed = failedAfterGammaDied();
    const [fixture] = instancesFixture();
    const again = { ...fixture!, id: 'again001', state: 'launching' as const, stages: fixture!.stages.filter((s) => s.node_name !== 'gamma') };
    const model = applySnapshot(emptyModel(), snapshotFixture(), [failed]);
    const { calls } = mount(
      { 'GET /api/models/fit': ok(libraryFixture()), [`POST /api/instances/${failed.id}/relaunch`]: ok(again) },
      { model },
    );
    await fireEvent.click(screen.getByRole('button', { name: 'Show 1' }));
    const card = await screen.findByTestId('instance');
    expect(card.getAttribute('data-state')).toBe('failed');
    const stages = within(card).getAllByTestId('stage');
    expect(within(card).getAllByTestId('stage-device').map((cell) => cell.textContent)).toEqual(['CPU', 'CPU', 'CPU']);
    expect(stages.map((s) => s.dataset['state'])).not.toContain('ready');
    const gamma = stages.find((s) => s.textContent?.includes('gamma'));
    expect(gamma?.dataset['state']).toBe('failed');
    expect(gamma?.textContent).toContain('node gamma is down');
    expect(within(card).queryByRole('button', { name: 'Stop' })).toBeNull();

    await fireEvent.click(within(card).getByTestId('relaunch'));
    const said = await within(card).findByTestId('relaunched');
    expect(calls.filter((c) => c.key === `POST /api/instances/${failed.id}/relaunch`)).toHaveLength(1);
    expect(said.textContent).toBe(`Launched again as instance again001, on ${[...new Set(again.stages.map((s) => s.node_name))].join(', ')}.`);
  });

  it("shows the node's refusal when it cannot relaunch", async () => {
    const failed = failedAfterGammaDied();
    const model = applySnapshot(emptyModel(), snapshotFixture(), [failed]);
    const refusal = { error: { message: '`SmolLM2-135M-Instruct.Q4_1` already runs as instance 0000beef (ready)' } };
    mount(
      { 'GET /api/models/fit': ok(libraryFixture()), [`POST /api/instances/${failed.id}/relaunch`]: () => ({ status: 409, json: refusal }) },
      { model },
    );
    await fireEvent.click(screen.getByRole('button', { name: 'Show 1' }));
    await fireEvent.click(await screen.findByTestId('relaunch'));
    expect((await screen.findByTestId('instance-action-error')).textContent).toContain('already runs as instance 0000beef');
  });

  it('is not relaunched from a read-only dashboard', async () => {
    const model = applySnapshot(emptyModel(), snapshotFixture(), [failedAfterGammaDied()]);
    mount({ 'GET /api/models/fit': ok(libraryFixture()) }, { model, readOnly: true });
    await fireEvent.click(screen.getByRole('button', { name: 'Show 1' }));
    expect(((await screen.findByTestId('relaunch')) as HTMLButtonElement).disabled).toBe(true);
  });
});

// Quitting the app from the tray while models run here: the dashboard opens at #/quit, says what
// quitting would stop (the node's GET /api/quit), and quits (POST /api/quit) or goes back to the view.
import { afterEach, describe, expect, it } from 'vitest';
import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { tick } from 'svelte';
import App from '../src/App.svelte';
import { ApiClient } from '../src/lib/api/client';
import { ClusterStore } from '../src/lib/state/store';
import { FakeApi, FakeEventSource, instancesFixture, settle, snapshotFixture } from './fakes';

const IMPACT = {
  stops: [{ id: '21db0d31', model: 'SmolLM2-135M-Instruct.Q4_1', nodes: ['gamma', 'beta', 'this node'], only_owned: false }],
  message: 'Quitting stops SmolLM2-135M-Instruct.Q4_1 on gamma, beta and this node.',
  in_app: true,
};

/** The dashboard at `hash`, over a node that answers GET and POST /api/quit. */
async function mount(hash: string, impact: unknown = IMPACT) {
  location.hash = hash;
  const calls: string[] = [];
  const client = new ApiClient(
    async (path, init) => {
      calls.push(`${init?.method ?? 'GET'} ${path}`);
      if (path === '/api/quit') return new Response(JSON.stringify(init?.method === 'POST' ? { quitting: true } : impact));
      return new Response('{}');
    },
    { load: () => null, save: () => {} },
  );
  const api = new FakeApi();
  const store = new ClusterStore({ getJson: api.getJson, openEvents: () => new FakeEventSource() });
  render(App, { client, store });
  api.answerSnapshot(snapshotFixture(), instancesFixture());
  await settle();
  await tick();
  return { calls, store };
}

afterEach(() => {
  location.hash = '';
});

describe('the question before quitting', () => {
  it('says which models quitting stops, and Quit anyway asks the app to quit', async () => {
    const { calls, store } = await mount('#/quit');
    expect((await screen.findByTestId('quit-message')).textContent).toBe(IMPACT.message);
    expect(screen.getByTestId('quit-dialog').textContent).toMatch(/fail until another node places it\s+again without this one/);
    await fireEvent.click(screen.getByTestId('quit-confirm'));
    await screen.findByTestId('quitting');
    expect(calls).toContain('POST /api/quit');
    store.stop();
  });

  it('opens over the view the person was on, and Cancel goes back to it without quitting', async () => {
    const { calls, store } = await mount('#/models');
    expect(screen.queryByTestId('quit-dialog')).toBeNull();
    location.hash = '#/quit';
    window.dispatchEvent(new HashChangeEvent('hashchange'));
    await screen.findByTestId('quit-message');
    expect(document.querySelector('main')?.dataset['view']).toBe('models');
    await fireEvent.click(screen.getByTestId('quit-cancel'));
    await waitFor(() => expect(screen.queryByTestId('quit-dialog')).toBeNull());
    expect(location.hash).toBe('#/models');
    expect(calls).not.toContain('POST /api/quit');
    store.stop();
  });

  it('says so when nothing would stop, and a node without the app cannot be quit from here', async () => {
    const { store } = await mount('#/quit', { stops: [], message: null, in_app: false });
    expect((await screen.findByTestId('quit-message')).textContent).toBe('Nothing runs on this node: quitting stops only this node.');
    expect(screen.getByTestId('quit-dialog').textContent).toMatch(/runs without the app/);
    expect((screen.getByTestId('quit-confirm') as HTMLButtonElement).disabled).toBe(true);
    store.stop();
  });
});

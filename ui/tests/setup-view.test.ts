import { describe, expect, it } from 'vitest';
import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import SetupView from '../src/components/setup/SetupView.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import { ClusterStore } from '../src/lib/state/store';
import type { WizardView } from '../src/lib/api/wizard';
import { FakeApi, FakeEventSource } from './fakes';
import rdma from './fixtures/rdma.json';
import wizardFixture from './fixtures/wizard.json';

type Route = (body: unknown) => { status: number; json: unknown };

/** Mounts the Setup view over a node that answers `routes` ("METHOD /path"). */
function mount(routes: Record<string, Route>) {
  const posted: unknown[] = [];
  const client = new ApiClient(
    async (path, init) => {
      const key = `${init?.method ?? 'GET'} ${path}`;
      const body = init?.body ? JSON.parse(String(init.body)) : undefined;
      if (body !== undefined) posted.push(body);
      const route = routes[key];
      const answer = route ? route(body) : { status: 404, json: { error: { message: `no such endpoint ${key}` } } };
      return new Response(JSON.stringify(answer.json), { status: answer.status });
    },
    { load: () => null, save: () => {} },
  );
  const api = new FakeApi();
  const store = new ClusterStore({ getJson: api.getJson, openEvents: () => new FakeEventSource() });
  render(SetupView, { props: { readOnly: false }, context: new Map([[APP_CONTEXT, { client, store }]]) });
  return { posted };
}

const wizard = () => structuredClone(wizardFixture) as unknown as WizardView;
/** The wizard as a Mac's node shows it. */
const macWizard = () => {
  const view = wizard();
  view.doctor.platform = 'macos';
  return view;
};

describe('SetupView', () => {
  it('shows the doctor alone when the node has no wizard', async () => {
    mount({ 'GET /api/rdma': () => ({ status: 200, json: rdma }) });
    await waitFor(() => expect(screen.getAllByTestId('doctor-node')).toHaveLength(rdma.nodes.length));
    expect(screen.getAllByTestId('check').length).toBeGreaterThan(0);
    expect(screen.queryByTestId('rdma-wizard')).toBeNull();
  });

  it('on Linux says RDMA needs macOS 26.2 and that the links use TCP, with nothing red and no setup to start', async () => {
    mount({
      'GET /api/rdma': () => ({ status: 200, json: rdma }),
      'GET /api/rdma/wizard': () => ({ status: 200, json: wizard() }),
    });
    const note = await screen.findByTestId('wizard-not-mac');
    expect(note.textContent).toMatch(/macOS 26\.2/);
    expect(note.textContent).toMatch(/TCP/);
    expect(screen.queryByTestId('wizard-start')).toBeNull();
    await waitFor(() => expect(screen.getAllByTestId('doctor-node')).toHaveLength(rdma.nodes.length));
    for (const badge of screen.getAllByTestId('doctor-badge')) {
      expect(badge.classList.contains('bad')).toBe(false);
      expect(badge.textContent).not.toMatch(/to fix/);
    }
    expect(screen.getAllByTestId('not-mac')[0]?.textContent).toMatch(/use TCP/);
  });

  it('starts the wizard and walks to the Recovery steps', async () => {
    let view = macWizard();
    const { posted } = mount({
      'GET /api/rdma': () => ({ status: 200, json: rdma }),
      'GET /api/rdma/wizard': () => ({ status: 200, json: view }),
      'POST /api/rdma/wizard': (body) => {
        const action = (body as { action: string }).action;
        view = macWizard();
        view.state.started = true;
        view.state.step = action === 'start' ? 'why' : 'recovery';
        view.steps = view.steps.map((s, i) => ({ ...s, status: s.id === view.state.step ? 'current' : i < 3 ? 'done' : 'upcoming' }));
        return { status: 200, json: view };
      },
    });
    await fireEvent.click(await screen.findByTestId('wizard-start'));
    await waitFor(() => expect(screen.getByTestId('wizard-current').dataset['step']).toBe('why'));
    await fireEvent.click(screen.getByTestId('wizard-next'));
    await waitFor(() => expect(screen.getByTestId('wizard-current').dataset['step']).toBe('recovery'));
    expect(posted).toEqual([{ action: 'start' }, { action: 'next' }]);
    const current = screen.getByTestId('wizard-current');
    expect(current.querySelectorAll('ol li').length).toBe(7);
    expect(current.textContent).toMatch(/rdma_ctl enable/);
    expect(screen.getAllByTestId('wizard-step').find((s) => s.dataset['status'] === 'current')?.dataset['step']).toBe('recovery');
  });

  it('offers the fixes shoal can make and shows what became of one', async () => {
    const view = wizard();
    view.state.started = true;
    view.state.step = 'prerequisites';
    view.fixes = [
      {
        id: 'thunderbolt_bridge',
        title: 'Make the Thunderbolt Bridge inactive',
        explanation: 'Frames loop between Macs cabled to each other.',
        commands: ['sudo networksetup -setnetworkserviceenabled "Thunderbolt Bridge" off', 'sudo ifconfig bridge0 down'],
        can_apply: true,
      },
    ];
    const { posted } = mount({
      'GET /api/rdma': () => ({ status: 200, json: rdma }),
      'GET /api/rdma/wizard': () => ({ status: 200, json: view }),
      'POST /api/rdma/wizard': () => {
        const after = structuredClone(view);
        after.state.fixes = [{ status: 'cancelled', fix: 'thunderbolt_bridge', commands: view.fixes[0]!.commands }];
        return { status: 200, json: after };
      },
    });
    const fix = await screen.findByTestId('wizard-fix');
    expect(fix.textContent).toMatch(/bridge0 down/);
    await fireEvent.click(screen.getByText(/Apply/));
    await waitFor(() => expect(screen.getByTestId('wizard-fix').textContent).toMatch(/prompt was dismissed/));
    expect(posted).toEqual([{ action: 'apply_fix', fix: 'thunderbolt_bridge' }]);
  });
});

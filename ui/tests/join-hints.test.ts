import { describe, expect, it } from 'vitest';
import { fireEvent, render, screen } from '@testing-library/svelte';
import AddNode from '../src/components/mesh/AddNode.svelte';
import NearbyClusters from '../src/components/mesh/NearbyClusters.svelte';
import { APP_CONTEXT } from '../src/lib/context';
import { ApiClient } from '../src/lib/api/client';
import { ClusterStore } from '../src/lib/state/store';
import { FakeApi, FakeEventSource } from './fakes';

/** The app's context over a node that answers `routes` (path → JSON), and 404 elsewhere. */
function appContext(routes: Record<string, unknown>) {
  const client = new ApiClient(
    async (path) =>
      path in routes
        ? new Response(JSON.stringify(routes[path]), { status: 200 })
        : new Response(JSON.stringify({ error: { message: `no such endpoint ${path}` } }), { status: 404 }),
    { load: () => null, save: () => {} },
  );
  const api = new FakeApi();
  const store = new ClusterStore({ getJson: api.getJson, openEvents: () => new FakeEventSource() });
  return new Map([[APP_CONTEXT, { client, store }]]);
}

/** Mounts the nearby-clusters panel (no cluster found) over a node whose `/api/health` says `health`. */
function mount(health: unknown) {
  render(NearbyClusters, { props: { clusters: [], readOnly: false }, context: appContext({ '/api/health': health }) });
}

/** Makes a code with "Add a node" on a node whose code endpoint answers `code`. */
async function makeCode(code: unknown) {
  const context = appContext({ '/api/cluster/code': code });
  render(AddNode, { props: { activeCodeExpiresAtMs: null, readOnly: false }, context });
  await fireEvent.click(screen.getByTestId('add-node'));
  return screen.findByTestId('join-with-address');
}

const code = (mdns: boolean) => ({
  code: 'K7QX-M2PD',
  expires_at_ms: Date.now() + 600_000,
  expires_in_seconds: 600,
  mdns,
  join_addresses: ['10.0.0.2:52521', '192.168.1.7:52521'],
});

describe('NearbyClusters', () => {
  it('says mDNS is off instead of "none found" when this node does not use it', async () => {
    mount({ ok: true, mdns: false });
    expect((await screen.findByTestId('mdns-off')).textContent).toMatch(/mDNS is off/);
    expect(screen.queryByText(/None found/)).toBeNull();
  });

  it('says none were found when mDNS is on', async () => {
    mount({ ok: true, mdns: true });
    expect(await screen.findByText(/None found on this network/)).toBeTruthy();
    expect(screen.queryByTestId('mdns-off')).toBeNull();
  });
});

describe('AddNode', () => {
  it('gives the command with this node\'s address and port, and says when mDNS is off', async () => {
    const hint = await makeCode(code(false));
    expect(hint.textContent).toBe('shoal node --join K7QX-M2PD@10.0.0.2:52521');
    expect(hint.parentElement?.textContent).toMatch(/mDNS is off/);
    expect(screen.getByText(/other addresses: 192\.168\.1\.7:52521/)).toBeTruthy();
  });

  it('with mDNS on, gives the code alone and the address for where multicast is blocked', async () => {
    const hint = await makeCode(code(true));
    expect(hint.textContent).toBe('shoal node --join K7QX-M2PD@10.0.0.2:52521');
    expect(hint.parentElement?.textContent).toMatch(/shoal node --join K7QX-M2PD;/);
  });
});

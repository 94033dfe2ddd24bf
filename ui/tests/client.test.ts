import { describe, expect, it, vi } from 'vitest';
import { get } from 'svelte/store';
import { ApiClient, ApiError, type TokenStorage } from '../src/lib/api/client';

function memoryStorage(initial: string | null = null): TokenStorage & { value: string | null } {
  return {
    value: initial,
    load() {
      return this.value;
    },
    save(token) {
      this.value = token;
    },
  };
}

/** A node that wants `Bearer secret` on actions. */
function guardedNode() {
  const calls: { path: string; auth: string | null }[] = [];
  const fetcher = vi.fn(async (path: string, init?: RequestInit) => {
    const headers = (init?.headers ?? {}) as Record<string, string>;
    const auth = headers['Authorization'] ?? null;
    calls.push({ path, auth });
    if ((init?.method ?? 'GET') !== 'GET' && auth !== 'Bearer secret') {
      return new Response(JSON.stringify({ error: { message: 'this node requires its API token', type: 'authentication_error', param: null, code: null } }), { status: 401 });
    }
    return new Response(JSON.stringify({ ok: true }), { status: 200 });
  });
  return { fetcher, calls };
}

describe('ApiClient', () => {
  it('reads without a token', async () => {
    const { fetcher, calls } = guardedNode();
    const client = new ApiClient(fetcher, memoryStorage());
    await expect(client.get('/api/cluster')).resolves.toEqual({ ok: true });
    expect(calls[0]?.auth).toBeNull();
  });

  it('marks every action with the client header, which cross-site form posts cannot send', async () => {
    const seen: Record<string, string>[] = [];
    const fetcher = vi.fn(async (_path: string, init?: RequestInit) => {
      seen.push((init?.headers ?? {}) as Record<string, string>);
      return new Response('{}', { status: 200 });
    });
    const client = new ApiClient(fetcher, memoryStorage());
    await client.post('/api/cluster/leave');
    await client.delete('/api/instances/x');
    await client.post('/api/instances', { model: 'm' });
    expect(seen.map((h) => h['X-Shoal-Client'])).toEqual(['dashboard', 'dashboard', 'dashboard']);
    expect(seen[2]?.['Content-Type']).toBe('application/json');
  });

  it('asks for the token on 401, retries with it and remembers it', async () => {
    const { fetcher, calls } = guardedNode();
    const storage = memoryStorage();
    const client = new ApiClient(fetcher, storage);
    const ask = vi.fn(async () => 'secret');
    client.askForToken = ask;
    await expect(client.post('/api/cluster/code')).resolves.toEqual({ ok: true });
    expect(ask).toHaveBeenCalledTimes(1);
    expect(calls.map((c) => c.auth)).toEqual([null, 'Bearer secret']);
    expect(storage.value).toBe('secret');

    await client.post('/api/links/measure');
    expect(ask).toHaveBeenCalledTimes(1);
    expect(calls[2]?.auth).toBe('Bearer secret');
  });

  it('stays read-only after the user declines, without asking again', async () => {
    const { fetcher } = guardedNode();
    const client = new ApiClient(fetcher, memoryStorage());
    const ask = vi.fn(async (): Promise<string | null> => null);
    client.askForToken = ask;
    await expect(client.post('/api/cluster/leave')).rejects.toBeInstanceOf(ApiError);
    expect(get(client.auth).readOnly).toBe(true);
    await expect(client.post('/api/cluster/leave')).rejects.toMatchObject({ status: 401 });
    expect(ask).toHaveBeenCalledTimes(1);

    ask.mockResolvedValueOnce('secret');
    await expect(client.unlock()).resolves.toBe(true);
    expect(get(client.auth)).toEqual({ readOnly: false, hasToken: true });
    await expect(client.post('/api/cluster/leave')).resolves.toEqual({ ok: true });
  });

  it('forgets a token the node refuses', async () => {
    const { fetcher } = guardedNode();
    const storage = memoryStorage('stale');
    const client = new ApiClient(fetcher, storage);
    client.askForToken = async () => 'wrong';
    await expect(client.post('/api/cluster/code')).rejects.toThrow(/refused this token/);
    expect(storage.value).toBeNull();
    expect(get(client.auth).readOnly).toBe(true);
  });

  it('turns error bodies into messages', async () => {
    const client = new ApiClient(
      async () => new Response(JSON.stringify({ error: { message: 'no instance x', type: 'invalid_request_error', param: null, code: 'instance_not_found' } }), { status: 404 }),
      memoryStorage(),
    );
    await expect(client.get('/api/instances/x')).rejects.toMatchObject({ status: 404, message: 'no instance x' });
  });
});

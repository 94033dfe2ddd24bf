/**
 * HTTP calls to the node that serves this page (same origin, relative URLs). A node that listens beyond
 * loopback requires `Authorization: Bearer TOKEN` on every action: the first 401 asks the user for the
 * token once (kept in localStorage); without one the dashboard stays read-only until the user offers a
 * token again. Reads never need the token. Every action carries `X-Shoal-Client` (and a JSON body when it
 * has one): the node refuses actions without either, which a cross-site form post cannot send.
 */
import { get, writable, type Readable } from 'svelte/store';
import type { ApiErrorBody } from './types';

const TOKEN_KEY = 'shoal.apiToken';
/** Sent with every action: a header other sites cannot make a browser send to the node. */
export const CLIENT_HEADER = 'X-Shoal-Client';

/** A failed call, with the node's own message when it sent one. */
export class ApiError extends Error {
  readonly status: number;
  readonly param: string | null;

  constructor(status: number, message: string, param: string | null = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.param = param;
  }
}

/** Where the token lives between visits. */
export interface TokenStorage {
  load(): string | null;
  save(token: string | null): void;
}

export function localTokenStorage(): TokenStorage {
  return {
    load: () => {
      try {
        return globalThis.localStorage?.getItem(TOKEN_KEY) ?? null;
      } catch {
        return null;
      }
    },
    save: (token) => {
      try {
        if (token === null) globalThis.localStorage?.removeItem(TOKEN_KEY);
        else globalThis.localStorage?.setItem(TOKEN_KEY, token);
      } catch {
        // Storage may be unavailable (private windows); the token then lasts for this page only.
      }
    },
  };
}

/** Asks the user for the node's API token; resolves to null when they decline. */
export type TokenAsker = () => Promise<string | null>;

export interface AuthState {
  /** Actions are refused: the node needs a token and none was given. */
  readOnly: boolean;
  hasToken: boolean;
}

export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

export class ApiClient {
  private readonly fetcher: FetchLike;
  private readonly storage: TokenStorage;
  private token: string | null;
  private asking: Promise<string | null> | null = null;
  private readonly authState = writable<AuthState>({ readOnly: false, hasToken: false });
  /** Set by the app: shows the token dialog. */
  askForToken: TokenAsker | null = null;

  constructor(fetcher: FetchLike = (input, init) => fetch(input, init), storage: TokenStorage = localTokenStorage()) {
    this.fetcher = fetcher;
    this.storage = storage;
    this.token = storage.load();
    this.authState.set({ readOnly: false, hasToken: this.token !== null });
  }

  get auth(): Readable<AuthState> {
    return this.authState;
  }

  async get<T>(path: string, signal?: AbortSignal): Promise<T> {
    const response = await this.fetcher(path, { headers: { Accept: 'application/json' }, signal: signal ?? null });
    return parse<T>(response);
  }

  async post<T>(path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    return parse<T>(await this.send('POST', path, body, signal));
  }

  async delete<T>(path: string): Promise<T> {
    return parse<T>(await this.send('DELETE', path));
  }

  /** An action whose response the caller reads itself (streams); errors are thrown as ApiError. */
  async send(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
    let response = await this.fetcher(path, this.init(method, body, signal));
    if (response.status !== 401) return response;
    if (!(await this.obtainToken())) throw unauthorized();
    response = await this.fetcher(path, this.init(method, body, signal));
    if (response.status === 401) {
      this.forgetToken(true);
      throw new ApiError(401, 'the node refused this token; the dashboard is read-only until you enter the right one');
    }
    return response;
  }

  /** Lets the user offer a token again after declining. */
  async unlock(): Promise<boolean> {
    this.authState.update((s) => ({ ...s, readOnly: false }));
    return this.obtainToken();
  }

  private init(method: string, body: unknown, signal?: AbortSignal): RequestInit {
    const headers: Record<string, string> = { Accept: 'application/json', [CLIENT_HEADER]: 'dashboard' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (this.token !== null) headers['Authorization'] = `Bearer ${this.token}`;
    return {
      method,
      headers,
      body: body === undefined ? null : JSON.stringify(body),
      signal: signal ?? null,
    };
  }

  /** The stored token was refused (or none was stored): asks once, shared by concurrent calls. */
  private async obtainToken(): Promise<boolean> {
    if (get(this.authState).readOnly || this.askForToken === null) {
      this.forgetToken(true);
      return false;
    }
    this.asking ??= this.askForToken().finally(() => (this.asking = null));
    const token = (await this.asking)?.trim() ?? '';
    if (token === '') {
      this.forgetToken(true);
      return false;
    }
    this.token = token;
    this.storage.save(token);
    this.authState.set({ readOnly: false, hasToken: true });
    return true;
  }

  private forgetToken(readOnly: boolean): void {
    this.token = null;
    this.storage.save(null);
    this.authState.set({ readOnly, hasToken: false });
  }
}

function unauthorized(): ApiError {
  return new ApiError(401, 'this node needs its API token for actions; the dashboard is read-only');
}

/** The JSON of a successful response, or an ApiError with the node's message. */
async function parse<T>(response: Response): Promise<T> {
  const text = await response.text();
  let json: unknown = null;
  try {
    json = text === '' ? null : JSON.parse(text);
  } catch {
    json = null;
  }
  if (!response.ok) {
    const body = json as Partial<ApiErrorBody> | null;
    const message = body?.error?.message ?? (text.trim() || `${response.status} ${response.statusText}`);
    throw new ApiError(response.status, message, body?.error?.param ?? null);
  }
  if (json === null && text !== '') throw new ApiError(response.status, 'the node answered with something other than JSON');
  return json as T;
}

/** A human sentence for any thrown value. */
export function errorMessage(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) {
    if (error.name === 'AbortError') return 'cancelled';
    if (error instanceof TypeError) return `cannot reach the node (${error.message})`;
    return error.message;
  }
  return String(error);
}

/**
 * What every view shares: the API client and the live cluster store, handed down through Svelte's
 * context so that tests can mount a view with their own.
 */
import { getContext, setContext } from 'svelte';
import type { ApiClient } from './api/client';
import type { ClusterStore } from './state/store';

export interface AppContext {
  client: ApiClient;
  store: ClusterStore;
}

/** The context key (exported for tests that mount a view on its own). */
export const APP_CONTEXT = Symbol('shoal');

export function provideApp(context: AppContext): void {
  setContext(APP_CONTEXT, context);
}

export function useApp(): AppContext {
  const context = getContext<AppContext | undefined>(APP_CONTEXT);
  if (context === undefined) throw new Error('useApp() outside the app: call provideApp() in a parent');
  return context;
}

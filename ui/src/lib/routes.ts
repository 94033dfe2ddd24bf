/** The dashboard's views and the URL hash that selects one (`#/models`), so a reload keeps the view. */

export const VIEWS = [
  { id: 'mesh', label: 'Mesh' },
  { id: 'memory', label: 'Memory' },
  { id: 'models', label: 'Models' },
  { id: 'chat', label: 'Chat' },
  { id: 'rates', label: 'Rates' },
  { id: 'connect', label: 'Connect' },
  { id: 'setup', label: 'Setup' },
] as const;

export type ViewId = (typeof VIEWS)[number]['id'];

export function viewFromHash(hash: string): ViewId {
  const id = hash.replace(/^#\/?/, '').split(/[/?]/)[0] ?? '';
  return VIEWS.find((v) => v.id === id)?.id ?? 'mesh';
}

export function hashOf(view: ViewId): string {
  return `#/${view}`;
}

/** The hash the app's tray Quit opens when quitting would stop models: the question over the view. */
export const QUIT_HASH = '#/quit';

export function isQuitHash(hash: string): boolean {
  return hash === QUIT_HASH;
}

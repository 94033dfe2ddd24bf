/**
 * Model downloads as the dashboard follows them: the latest `model_pull` event of each pull this node
 * runs (newest first, finished ones dropped past a few), what a row calls it (with the layers of a
 * stage's shard or the rank of a tensor-parallel node's slice), and the check of what the user typed as a Hugging Face repository before anything
 * is sent.
 */
import type { ClusterEvent, PullProgress } from '../api/types';

/** Finished pulls kept beyond the ones still running. */
export const MAX_FINISHED_PULLS = 8;

export type PullEvent = Extract<ClusterEvent, { type: 'model_pull' }>;

/** A pull as its latest event tells it (`repo` is what was asked for: ORG/NAME or ORG/NAME:FILE). */
export interface PullView extends Omit<PullEvent, 'type'> {
  /** When the dashboard first heard of it (ms). */
  startedAt: number;
}

export function isFinished(pull: Pick<PullView, 'progress'>): boolean {
  return pull.progress.state === 'done' || pull.progress.state === 'failed';
}

/** The pulls after `event`: the pull's entry replaced (or added), newest first. */
export function applyPull(pulls: PullView[], event: PullEvent, now: number): PullView[] {
  const previous = pulls.find((p) => p.id === event.id);
  const view: PullView = {
    id: event.id,
    repo: event.repo,
    // An older node does not say: it pulls whole files.
    layers: event.layers ?? null,
    rank: event.rank ?? null,
    progress: event.progress,
    paths: event.paths,
    error: event.error,
    startedAt: previous?.startedAt ?? now,
  };
  const all = [view, ...pulls.filter((p) => p.id !== event.id)].sort((a, b) => b.startedAt - a.startedAt || a.id.localeCompare(b.id));
  let finished = 0;
  return all.filter((p) => !isFinished(p) || ++finished <= MAX_FINISHED_PULLS);
}

/** The share of the model a pull fetches: "layers 10-19" (a stage's shard), "rank 1 of 2" (a
 * tensor-parallel node's slice), or null for the whole model. */
export function pullShare(pull: Pick<PullView, 'layers' | 'rank'>): string | null {
  if (pull.layers !== null && pull.layers !== undefined) return `layers ${pull.layers}`;
  if (pull.rank === null || pull.rank === undefined) return null;
  const [rank, nodes] = pull.rank.split('/');
  return `rank ${rank} of ${nodes}`;
}

/** What a pull row calls a pull: "ORG/NAME:FILE", with " · layers 10-19" or " · rank 1 of 2" for a share. */
export function pullLabel(pull: Pick<PullView, 'repo' | 'layers' | 'rank'>): string {
  const share = pullShare(pull);
  return share === null ? pull.repo : `${pull.repo} · ${share}`;
}

/** How far a pull is, 0..1, or null while its size is unknown. */
export function pullFraction(progress: PullProgress): number | null {
  if (progress.state === 'done') return 1;
  return progress.bytes_total > 0 ? Math.min(1, progress.bytes_done / progress.bytes_total) : null;
}

const NAME_PART = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/**
 * Why `spec` cannot name a Hugging Face model (ORG/NAME, ORG/NAME:FILE or ORG/NAME:QUANT), or null when
 * it looks right. The node has the last word; this only catches what is plainly wrong.
 */
export function repoProblem(spec: string): string | null {
  const text = spec.trim();
  if (text === '') return 'Enter a repository, such as ORG/NAME or ORG/NAME:Q4_K_M.';
  if (/^https?:\/\//i.test(text) || text.includes('huggingface.co/')) {
    return 'Write the repository as ORG/NAME (what follows huggingface.co/ in its address), not the whole address.';
  }
  if (/\s/.test(text)) return 'A repository has no spaces: write ORG/NAME or ORG/NAME:FILE.';
  const colon = text.indexOf(':');
  const repo = colon < 0 ? text : text.slice(0, colon);
  const file = colon < 0 ? null : text.slice(colon + 1);
  const parts = repo.split('/');
  if (parts.length !== 2 || parts.some((p) => p === '')) {
    return `"${repo}" is not ORG/NAME: the owner and the model, with one slash between them.`;
  }
  if (!parts.every((p) => NAME_PART.test(p))) return 'ORG and NAME use letters, digits, "-", "_" and "." only.';
  if (file === '') return 'Name a file or quantization after the colon (such as Q4_K_M), or leave the colon out.';
  return null;
}

/**
 * The model library as the Models view shows it: a model's facts in a line, its fit against the
 * cluster's memory pool in words (the node's own placement numbers, from GET /api/models/fit), and what
 * the fit depends on, so the view fetches it again when that changes.
 */
import type { Fit, ModelSource, ModelWithFit } from '../api/types';
import { formatBytes, formatCount } from '../format';
import { activeInstances, type ClusterModel } from './model';

export type FitTone = 'ok' | 'bad' | 'warn' | 'unknown';

export interface FitSummary {
  tone: FitTone;
  /** A word or two for the badge. */
  label: string;
  /** The sentence under the model. */
  text: string;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** Whether `model` fits the pool now, or why it cannot run at all. */
export function fitSummary(model: Pick<ModelWithFit, 'runnable' | 'problem' | 'fit'>): FitSummary {
  if (!model.runnable) {
    return { tone: 'bad', label: 'Cannot run', text: model.problem ?? 'shoal cannot run this file.' };
  }
  const fit = model.fit;
  if (fit === null) return { tone: 'unknown', label: 'Fit unknown', text: 'The node could not check this model against the pool.' };
  if (fit.fits) {
    return {
      tone: 'ok',
      label: 'Fits',
      text: `Fits on ${plural(fit.nodes, 'node')}: needs ${formatBytes(fit.needed_bytes)} of the ${formatBytes(fit.pool_bytes)} the pool offers.`,
    };
  }
  return { tone: fit.pool_bytes === 0 ? 'warn' : 'bad', label: 'Does not fit', text: shortfallText(fit) };
}

function shortfallText(fit: Fit): string {
  if (fit.pool_bytes === 0) return `No node offers memory right now; it needs ${formatBytes(fit.needed_bytes)}.`;
  if (fit.needed_bytes > fit.pool_bytes) {
    return `Needs ${formatBytes(fit.needed_bytes - fit.pool_bytes)} more than the pool has: ${formatBytes(fit.needed_bytes)} needed, ${formatBytes(fit.pool_bytes)} offered.`;
  }
  return `Its layers cannot be split to fit the nodes' offers: ${formatBytes(fit.missing_bytes)} short where they would go, although the pool offers ${formatBytes(fit.pool_bytes)}.`;
}

/** The assumptions of a fit check, said once for the list. */
export function fitAssumptions(fit: Pick<Fit, 'context' | 'sequences'>): string {
  return `a ${fit.context}-token context, ${plural(fit.sequences, 'request')} at once`;
}

/** Architecture, parameters, quantization, size, layers and context, those that are known. */
export function modelFacts(model: ModelWithFit): string[] {
  const facts: string[] = [];
  if (model.architecture !== null) facts.push(model.architecture);
  if (model.parameters !== null) facts.push(`${formatCount(model.parameters)} parameters`);
  if (model.quantization !== null) facts.push(model.quantization);
  facts.push(formatBytes(model.size_bytes));
  if (model.layers !== null) facts.push(plural(model.layers, 'layer'));
  if (model.context_length !== null) facts.push(`max context ${model.context_length}`);
  if (model.parts.length > 1) facts.push(`${model.parts.length} parts`);
  return facts;
}

export function sourceLabel(source: ModelSource): string {
  switch (source.kind) {
    case 'shoal':
      return 'downloaded by shoal';
    case 'hugging_face':
      return `Hugging Face cache · ${source.repo}`;
    case 'added':
      return 'added by path';
  }
}

/**
 * What the library's fits depend on, as a string that changes when they may: the nodes that are up
 * with telemetry, the instances holding memory, and the downloads and copies to this node that finished.
 */
export function libraryKey(model: Pick<ClusterModel, 'nodes' | 'instances' | 'pulls' | 'copies'>): string {
  const nodes = model.nodes
    .filter((n) => (n.status === 'self' || n.status === 'alive') && n.telemetry !== null)
    .map((n) => n.id)
    .sort();
  const instances = activeInstances(model).map((i) => `${i.id}:${i.state}`);
  const pulls = model.pulls.filter((p) => p.progress.state === 'done').map((p) => p.id);
  const copies = model.copies.filter((c) => c.done !== null).map((c) => c.id);
  return [nodes.join(','), instances.join(','), pulls.join(','), copies.join(',')].join('|');
}

/**
 * Model files across the cluster and copies between nodes, as the dashboard follows them: which member
 * offers which file, or holds only a shard of it (GET /api/models/cluster, grouped by file), and which
 * one a copy had best come from (never a shard);
 * the latest `model_copy` event of each copy to this node (newest first, finished ones dropped past a
 * few, events that do not have the copy's shape ignored); and the few words the mesh puts on a link
 * while a copy crosses it (and a little while after), or a stage's fetch of its share (./shares.ts).
 */
import type { ClusterEvent, CopyProgress, CopyReport, LinkView, NodeFiles, NodeId, NodeStatus } from '../api/types';
import { formatByteRate, formatBytes, formatPercent } from '../format';

/** Finished copies kept beyond the ones still running. */
export const MAX_FINISHED_COPIES = 8;
/** How long the mesh keeps showing a copy on its link after it ended. */
export const EDGE_LINGER_MS = 15_000;

export type CopyEvent = Extract<ClusterEvent, { type: 'model_copy' }>;
export type CopyState = 'copying' | 'done' | 'failed';

/** A copy as its last event said, and when the dashboard heard it begin and end. */
export interface CopyView extends Omit<CopyEvent, 'type'> {
  /** When the dashboard first heard of it (ms). */
  startedAt: number;
  /** When the dashboard heard it end (ms); null while it runs. */
  endedAt: number | null;
}

export function copyState(copy: Pick<CopyView, 'done' | 'error'>): CopyState {
  if (copy.error !== null) return 'failed';
  return copy.done === null ? 'copying' : 'done';
}

const isCount = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x) && x >= 0;
const isText = (x: unknown): x is string => typeof x === 'string' && x !== '';
const isObject = (x: unknown): x is Record<string, unknown> => typeof x === 'object' && x !== null && !Array.isArray(x);

function isReport(x: unknown): x is CopyReport {
  return isObject(x) && typeof x['path'] === 'string' && isCount(x['bytes']) && isCount(x['seconds']) && isCount(x['bytes_per_second']);
}

/** Whether a parsed `model_copy` event has the fields the dashboard reads (a malformed one is ignored). */
export function isCopyEvent(event: unknown): event is CopyEvent {
  if (!isObject(event)) return false;
  const progress = event['progress'];
  const done = event['done'] ?? null;
  const error = event['error'] ?? null;
  return (
    isText(event['id']) &&
    isText(event['from']) &&
    isText(event['to']) &&
    isText(event['file']) &&
    isObject(progress) &&
    isCount(progress['bytes_done']) &&
    isCount(progress['bytes_total']) &&
    isCount(progress['bytes_per_second']) &&
    (done === null || isReport(done)) &&
    (error === null || typeof error === 'string')
  );
}

/**
 * The copies after `event`: the copy's entry replaced (or added), newest first. A copy that ended stays
 * as it ended; a malformed event changes nothing.
 */
export function applyCopy(copies: CopyView[], event: CopyEvent, now: number): CopyView[] {
  if (!isCopyEvent(event)) return copies;
  const previous = copies.find((c) => c.id === event.id);
  if (previous !== undefined && previous.endedAt !== null) return copies;
  const done = event.done ?? null;
  const error = event.error ?? null;
  const view: CopyView = {
    id: event.id,
    from: event.from,
    to: event.to,
    file: event.file,
    progress: { bytes_done: event.progress.bytes_done, bytes_total: event.progress.bytes_total, bytes_per_second: event.progress.bytes_per_second },
    done,
    error,
    startedAt: previous?.startedAt ?? now,
    endedAt: done !== null || error !== null ? now : null,
  };
  const all = [view, ...copies.filter((c) => c.id !== event.id)].sort((a, b) => b.startedAt - a.startedAt || a.id.localeCompare(b.id));
  let finished = 0;
  return all.filter((c) => c.endedAt === null || ++finished <= MAX_FINISHED_COPIES);
}

/** How far a copy is, 0..1, or null while its size is unknown. */
export function copyFraction(copy: Pick<CopyView, 'progress' | 'done'>): number | null {
  if (copy.done !== null) return 1;
  const { bytes_done, bytes_total } = copy.progress;
  return bytes_total > 0 ? Math.min(1, bytes_done / bytes_total) : null;
}

/** Seconds left at the measured rate, or null before there is one. */
export function copyEta(progress: CopyProgress): number | null {
  if (progress.bytes_per_second <= 0 || progress.bytes_total <= progress.bytes_done) return null;
  return (progress.bytes_total - progress.bytes_done) / progress.bytes_per_second;
}

/** A member that has a file, whole or as a shard. */
export interface FileHolder {
  node: NodeId;
  name: string;
  isSelf: boolean;
  /** The repository that member knows the file came from. */
  repo: string | null;
  /** The layers it holds when it has only a shard ("10-19", "0-9, 20-29"); null when it has the whole file. */
  layers: string | null;
}

/** A file as the cluster has it: the same name and size on every member that holds it. */
export interface ClusterFile {
  key: string;
  name: string;
  size: number;
  /** The repository, as the first member that knows it says. */
  repo: string | null;
  sha256: string | null;
  /** This node first, then those with the whole file, then those with a shard, each by name. */
  holders: FileHolder[];
  /** This node has the whole file. */
  here: boolean;
  /** Some member has the whole file (else only shards of it are around, and nobody can copy it). */
  complete: boolean;
  /** The members it can be copied from (whole-file holders only), best first: none when it is here already. */
  sources: FileHolder[];
}

/** A holder as its chip says it: "beta", or "beta: layers 10-19 (shard)". */
export function holderLabel(holder: Pick<FileHolder, 'name' | 'layers'>): string {
  return holder.layers === null ? holder.name : `${holder.name}: layers ${holder.layers} (shard)`;
}

/** The measured throughput from `from` to `to`, from the link between them. */
function throughputTo(links: readonly LinkView[], from: NodeId, to: NodeId): number | null {
  const link = links.find((l) => (l.a === from && l.b === to) || (l.a === to && l.b === from));
  if (link === undefined) return null;
  return link.a === from ? link.throughput_a_to_b_bps : link.throughput_b_to_a_bps;
}

/**
 * Every file some member offers or holds a shard of, by name and size: who holds it (a member listing
 * it whole and as a shard has it whole; its shards' layers are put together) and, when this node lacks
 * the whole file, where to copy it from: only a member with the whole file. A source that knows the
 * file's repository comes first (the copy then lands in that repository's folder and the library knows
 * where it came from), then the fastest measured link to this node, then the name.
 */
export function clusterFiles(lists: readonly NodeFiles[], selfId: NodeId, links: readonly LinkView[] = []): ClusterFile[] {
  const byKey = new Map<string, ClusterFile>();
  for (const list of lists) {
    for (const file of list.files) {
      const key = `${file.name}\u0000${file.size}`;
      const entry: ClusterFile = byKey.get(key) ?? {
        key,
        name: file.name,
        size: file.size,
        repo: null,
        sha256: null,
        holders: [],
        here: false,
        complete: false,
        sources: [],
      };
      entry.repo ??= file.repo;
      entry.sha256 ??= file.sha256;
      const layers = file.layers ?? null;
      const index = entry.holders.findIndex((h) => h.node === list.node);
      const held = entry.holders[index];
      if (held === undefined) {
        entry.holders.push({ node: list.node, name: list.name, isSelf: list.node === selfId, repo: file.repo, layers });
      } else if (held.layers !== null) {
        const merged = layers === null ? null : held.layers === layers ? layers : `${held.layers}, ${layers}`;
        entry.holders[index] = { ...held, repo: held.repo ?? file.repo, layers: merged };
      }
      byKey.set(key, entry);
    }
  }
  const files = [...byKey.values()].map((f) => {
    const whole = (h: FileHolder) => h.layers === null;
    const holders = [...f.holders].sort(
      (a, b) => Number(b.isSelf) - Number(a.isSelf) || Number(whole(b)) - Number(whole(a)) || a.name.localeCompare(b.name),
    );
    const here = holders.some((h) => h.isSelf && whole(h));
    const complete = holders.some(whole);
    const rate = (h: FileHolder) => throughputTo(links, h.node, selfId) ?? -1;
    const sources = here
      ? []
      : holders
          .filter((h) => whole(h) && !h.isSelf)
          .sort((a, b) => Number(b.repo !== null) - Number(a.repo !== null) || rate(b) - rate(a) || a.name.localeCompare(b.name));
    return { ...f, holders, here, complete, sources };
  });
  return files.sort((a, b) => a.name.localeCompare(b.name) || a.size - b.size);
}

/**
 * What the list of files across the cluster depends on, as a string that changes when it may: the
 * members that are up, and the copies and downloads to this node that finished.
 */
export function clusterFilesKey(model: {
  nodes: readonly { id: NodeId; status: NodeStatus }[];
  copies: readonly Pick<CopyView, 'id' | 'done'>[];
  pulls: readonly { id: string; progress: { state: string } }[];
}): string {
  const up = model.nodes
    .filter((n) => n.status === 'self' || n.status === 'alive' || n.status === 'suspect')
    .map((n) => n.id)
    .sort();
  const copies = model.copies.filter((c) => c.done !== null).map((c) => c.id);
  const pulls = model.pulls.filter((p) => p.progress.state === 'done').map((p) => p.id);
  return [up.join(','), copies.join(','), pulls.join(',')].join('|');
}

/** A file's name cut to what fits on a link: "SmolLM2-135M-Instruct.Q4_1.gguf" is "SmolLM2…". */
export function shortFileName(file: string): string {
  const stem = file.replace(/\.gguf$/i, '');
  const cut = stem.search(/[-_.]/);
  const head = cut >= 3 ? stem.slice(0, cut) : stem;
  const short = head.length > 14 ? head.slice(0, 13) : head;
  return short.length < stem.length ? `${short}…` : short;
}

/** A copy on a link of the mesh, or a stage fetching its share of a model over it. */
export interface EdgeCopy {
  id: string;
  kind: 'copy' | 'fetch';
  from: NodeId;
  to: NodeId;
  state: CopyState;
  fraction: number | null;
  /** The words on the link: "copying SmolLM2… 45 % · 120 MB/s". */
  label: string;
  /** The whole story, for the tooltip and the link list. */
  title: string;
}

export function copyEdgeLabel(copy: CopyView): string {
  const name = shortFileName(copy.file);
  switch (copyState(copy)) {
    case 'copying': {
      const fraction = copyFraction(copy);
      const head = fraction === null ? `copying ${name}` : `copying ${name} ${formatPercent(fraction)}`;
      return copy.progress.bytes_per_second > 0 ? `${head} · ${formatByteRate(copy.progress.bytes_per_second)}` : head;
    }
    case 'done':
      return `copied ${name} at ${formatByteRate(copy.done?.bytes_per_second ?? copy.progress.bytes_per_second)}`;
    case 'failed':
      return `copying ${name} failed`;
  }
}

export function copyTitle(copy: CopyView, nameOf: (id: NodeId) => string): string {
  const route = `${copy.file} from ${nameOf(copy.from)} to ${nameOf(copy.to)}`;
  switch (copyState(copy)) {
    case 'copying':
      return `Copying ${route}: ${formatBytes(copy.progress.bytes_done)} of ${formatBytes(copy.progress.bytes_total)} at ${formatByteRate(copy.progress.bytes_per_second)}`;
    case 'done':
      return `Copied ${route} at ${formatByteRate(copy.done?.bytes_per_second ?? null)}`;
    case 'failed':
      return `Copying ${route} failed: ${copy.error ?? 'no reason given'}`;
  }
}

/** A copy as the mesh shows it. */
function copyEdge(copy: CopyView, nameOf: (id: NodeId) => string): EdgeCopy {
  return {
    id: copy.id,
    kind: 'copy',
    from: copy.from,
    to: copy.to,
    state: copyState(copy),
    fraction: copyFraction(copy),
    label: copyEdgeLabel(copy),
    title: copyTitle(copy, nameOf),
  };
}

/**
 * What the mesh shows on its links, one per pair of members: the newest running copy between them,
 * else a running stage fetch of `fetches` (./shares.ts), else the newest copy that ended less than
 * {@link EDGE_LINGER_MS} before `now`.
 */
export function edgeCopies(copies: readonly CopyView[], now: number, nameOf: (id: NodeId) => string, fetches: readonly EdgeCopy[] = []): EdgeCopy[] {
  const running = copies.filter((c) => c.endedAt === null);
  const recent = copies.filter((c) => c.endedAt !== null && now - c.endedAt < EDGE_LINGER_MS).sort((a, b) => (b.endedAt ?? 0) - (a.endedAt ?? 0));
  const shown = new Map<string, EdgeCopy>();
  for (const edge of [...running.map((c) => copyEdge(c, nameOf)), ...fetches, ...recent.map((c) => copyEdge(c, nameOf))]) {
    const pair = [edge.from, edge.to].sort().join(' ');
    if (edge.from === edge.to || shown.has(pair)) continue;
    shown.set(pair, edge);
  }
  return [...shown.values()];
}

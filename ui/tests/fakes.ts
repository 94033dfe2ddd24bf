/**
 * Test doubles for the store's outside world: an EventSource whose events the test sends, and JSON
 * fetches the test answers (or fails) one by one. Fixtures are real /api/cluster and /api/instances
 * answers of a three-node cluster (alpha, beta, gamma) with SmolLM2 split over it, and a real
 * /api/models/fit answer (SmolLM2, fitting one node offering 400 MB, and a truncated file). The
 * /api/models/cluster answer has a real answer's shape with that cluster's members: alpha (this node)
 * has a Qwen file, beta has it and SmolLM2 (pulled by shoal, so its repository is known), gamma has
 * SmolLM2 added by path.
 */
import { ClusterStore, type EventStream } from '../src/lib/state/store';
import type { ClusterSnapshot, InstanceInfo, ModelWithFit, NodeFiles, StageStats } from '../src/lib/api/types';
import { ApiClient } from '../src/lib/api/client';
import { APP_CONTEXT } from '../src/lib/context';
import cluster from './fixtures/cluster.json';
import instances from './fixtures/instances.json';
import library from './fixtures/models-fit.json';
import clusterFiles from './fixtures/models-cluster.json';

export function snapshotFixture(): ClusterSnapshot {
  return structuredClone(cluster) as ClusterSnapshot;
}

export function instancesFixture(): InstanceInfo[] {
  return structuredClone(instances) as InstanceInfo[];
}

export function libraryFixture(): ModelWithFit[] {
  return structuredClone(library) as ModelWithFit[];
}

export function clusterFilesFixture(): NodeFiles[] {
  return structuredClone(clusterFiles) as NodeFiles[];
}

export function nodeNamed(snapshot: ClusterSnapshot, name: string) {
  const node = snapshot.nodes.find((n) => n.name === name);
  if (node === undefined) throw new Error(`no node ${name} in the fixture`);
  return node;
}

export class FakeEventSource implements EventStream {
  onopen: ((event: Event) => void) | null = null;
  onerror: ((event: Event) => void) | null = null;
  closed = false;
  private readonly listeners = new Map<string, ((event: MessageEvent<string>) => void)[]>();

  addEventListener(type: string, listener: (event: MessageEvent<string>) => void): void {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), listener]);
  }

  close(): void {
    this.closed = true;
  }

  /** The node sends event `type` with `data` (an object is sent as JSON, like the node does). */
  send(type: string, data: object | string): void {
    const text = typeof data === 'string' ? data : JSON.stringify({ type, ...data });
    for (const listener of this.listeners.get(type) ?? []) listener(new MessageEvent(type, { data: text }));
  }

  /** The connection drops. */
  fail(): void {
    this.onerror?.(new Event('error'));
  }
}

interface Pending {
  path: string;
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
}

/** Every getJson call waits until the test answers it. */
export class FakeApi {
  readonly pending: Pending[] = [];
  readonly calls: string[] = [];

  getJson = <T>(path: string): Promise<T> => {
    this.calls.push(path);
    return new Promise<T>((resolve, reject) => {
      this.pending.push({ path, resolve: resolve as (value: unknown) => void, reject });
    });
  };

  /** Answers the oldest waiting call for `path`. */
  answer(path: string, value: unknown): void {
    const index = this.pending.findIndex((p) => p.path === path);
    if (index < 0) throw new Error(`nothing asked for ${path}; waiting: ${this.pending.map((p) => p.path).join(', ')}`);
    const [call] = this.pending.splice(index, 1);
    call?.resolve(value);
  }

  /** Answers a snapshot request (cluster and instances). */
  answerSnapshot(snapshot: ClusterSnapshot, list: InstanceInfo[] = []): void {
    this.answer('/api/cluster', snapshot);
    this.answer('/api/instances', list);
  }

  failAll(error: unknown): void {
    for (const call of this.pending.splice(0)) call.reject(error);
  }
}

/** Lets promise callbacks run. */
export async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}

/** The app context a component reads (its API client and store), over the fakes. */
export function appContext() {
  const client = new ApiClient(async () => new Response('{}'), { load: () => null, save: () => {} });
  const store = new ClusterStore({ getJson: new FakeApi().getJson, openEvents: () => new FakeEventSource() });
  return new Map([[APP_CONTEXT, { client, store }]]);
}

/** The fixture's first instance, ready, with stage 0's stats changed by `stats`. */
export function withHeadStats(stats: Partial<StageStats>): InstanceInfo {
  const instance = instancesFixture()[0]!;
  const stages = instance.stages.map((s, i) => (i === 0 ? { ...s, stats: { ...(s.stats as StageStats), ...stats } } : s));
  return { ...instance, state: 'ready', stages };
}

/**
 * The live cluster store (plain TypeScript, no DOM needed): opens /api/events, fetches the snapshot
 * (/api/cluster and /api/instances), applies it and then every event in arrival order. Events that arrive
 * while a snapshot is being fetched wait and are applied after it. `lagged` (the node dropped events for
 * this client) and `cluster_changed` fetch the snapshot again; a new member fetches it shortly after.
 * When the stream drops, the store closes it and reconnects with a growing delay (0.5 s doubling to
 * 10 s), fetching the snapshot again on each reconnect. It is a Svelte store (`subscribe`).
 */
import type { Readable, Subscriber, Unsubscriber } from 'svelte/store';
import { CLUSTER_EVENT_TYPES, type ClusterEvent, type ClusterSnapshot, type InstanceInfo } from '../api/types';
import { errorMessage } from '../api/client';
import { applyEvent, applySnapshot, emptyModel, type ClusterModel } from './model';

/** What the store needs of an EventSource (a fake one in the unit tests). */
export interface EventStream {
  onopen: ((event: Event) => void) | null;
  onerror: ((event: Event) => void) | null;
  addEventListener(type: string, listener: (event: MessageEvent<string>) => void): void;
  close(): void;
}

export interface StoreDeps {
  getJson: <T>(path: string) => Promise<T>;
  openEvents: (url: string) => EventStream;
  now?: () => number;
}

export const FIRST_RETRY_MS = 500;
export const MAX_RETRY_MS = 10_000;
/** A new member's details (addresses, telemetry) are fetched this long after it joins. */
export const JOIN_REFETCH_MS = 300;

export function retryDelay(attempt: number): number {
  return Math.min(MAX_RETRY_MS, FIRST_RETRY_MS * 2 ** attempt);
}

export class ClusterStore implements Readable<ClusterModel> {
  private model: ClusterModel = emptyModel();
  private readonly subscribers = new Set<Subscriber<ClusterModel>>();
  private readonly deps: StoreDeps;
  private readonly now: () => number;
  private stream: EventStream | null = null;
  /** Events received while a snapshot is on its way; null when none is. */
  private pending: ClusterEvent[] | null = null;
  /** Increases with every snapshot request, so that only the latest one is applied. */
  private syncGeneration = 0;
  private failures = 0;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  private refetchTimer: ReturnType<typeof setTimeout> | null = null;
  private running = false;

  constructor(deps: StoreDeps) {
    this.deps = deps;
    this.now = deps.now ?? Date.now;
  }

  subscribe(run: Subscriber<ClusterModel>): Unsubscriber {
    this.subscribers.add(run);
    run(this.model);
    return () => this.subscribers.delete(run);
  }

  get current(): ClusterModel {
    return this.model;
  }

  /** Connects and keeps connected until stop(). */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.connect();
  }

  stop(): void {
    this.running = false;
    this.closeStream();
    this.clearTimers();
    this.pending = null;
    this.syncGeneration++;
  }

  /** Fetches the snapshot again (after an action, or when asked to). */
  refresh(): Promise<void> {
    return this.resync();
  }

  private set(model: ClusterModel): void {
    this.model = model;
    for (const run of this.subscribers) run(model);
  }

  private connect(): void {
    this.closeStream();
    const stream = this.deps.openEvents('/api/events');
    this.stream = stream;
    for (const type of CLUSTER_EVENT_TYPES) {
      stream.addEventListener(type, (message) => {
        if (this.stream === stream) this.receive(type, message.data);
      });
    }
    stream.onerror = () => {
      if (this.stream === stream) this.dropped('the event stream from the node was interrupted');
    };
    void this.resync();
  }

  private receive(type: ClusterEvent['type'], data: string): void {
    if (type === 'lagged') {
      void this.resync();
      return;
    }
    let event: ClusterEvent;
    try {
      event = { ...(JSON.parse(data) as object), type } as ClusterEvent;
    } catch {
      return; // A malformed event changes nothing.
    }
    if (this.pending !== null) {
      this.pending.push(event);
      return;
    }
    this.apply(event);
  }

  private apply(event: ClusterEvent): void {
    this.set(applyEvent(this.model, event, this.now()));
    if (event.type === 'cluster_changed') void this.resync();
    if (event.type === 'node_joined') this.scheduleRefetch();
  }

  private async resync(): Promise<void> {
    const generation = ++this.syncGeneration;
    this.pending ??= [];
    try {
      const [snapshot, instances] = await Promise.all([
        this.deps.getJson<ClusterSnapshot>('/api/cluster'),
        this.deps.getJson<InstanceInfo[]>('/api/instances'),
      ]);
      if (generation !== this.syncGeneration || !this.running) return;
      const queued = this.pending ?? [];
      this.pending = null;
      this.failures = 0;
      let model = applySnapshot(this.model, snapshot, instances);
      for (const event of queued) model = applyEvent(model, event, this.now());
      this.set({ ...model, connection: this.stream === null ? 'reconnecting' : 'live', error: null });
    } catch (error) {
      if (generation !== this.syncGeneration || !this.running) return;
      this.dropped(`cannot fetch the cluster from the node: ${errorMessage(error)}`);
    }
  }

  /** The stream or a snapshot failed: closes the stream and reconnects after a delay. */
  private dropped(reason: string): void {
    if (!this.running) return;
    this.closeStream();
    this.pending = null;
    this.syncGeneration++;
    this.set({ ...this.model, connection: 'reconnecting', error: reason });
    if (this.retryTimer !== null) return;
    const delay = retryDelay(this.failures);
    this.failures++;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      if (this.running) this.connect();
    }, delay);
  }

  private scheduleRefetch(): void {
    if (this.refetchTimer !== null) return;
    this.refetchTimer = setTimeout(() => {
      this.refetchTimer = null;
      if (this.running) void this.resync();
    }, JOIN_REFETCH_MS);
  }

  private closeStream(): void {
    if (this.stream === null) return;
    const stream = this.stream;
    this.stream = null;
    stream.onerror = null;
    stream.onopen = null;
    stream.close();
  }

  private clearTimers(): void {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    if (this.refetchTimer !== null) clearTimeout(this.refetchTimer);
    this.retryTimer = null;
    this.refetchTimer = null;
  }
}

/** The store of the page: the browser's EventSource and the app's API client. */
export function browserStore(getJson: <T>(path: string) => Promise<T>): ClusterStore {
  return new ClusterStore({ getJson, openEvents: (url) => new EventSource(url) });
}

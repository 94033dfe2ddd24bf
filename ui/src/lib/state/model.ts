/**
 * The dashboard's picture of the cluster and the pure functions that build it: a snapshot replaces it,
 * each event changes it. Every event sets a value (a status, a telemetry sample, a node's link reports,
 * an instance), so replaying events the snapshot already reflects, in order, ends in the same state.
 */
import type {
  ClusterEvent,
  ClusterRates,
  ClusterSnapshot,
  GenerationReport,
  InstanceInfo,
  LinkView,
  NearbyCluster,
  NodeView,
} from '../api/types';
import { mergeLinks, reportsFromSnapshot, type ReportsByNode } from './links';
import { nodeMemory, poolTotals, type NodeMemory, type PoolTotals } from './pool';
import { applyPull, type PullView } from './pulls';
import { applyCopy, type CopyView } from './copies';

/** How long the rates chart looks back. */
export const RATES_WINDOW_MS = 5 * 60_000;
export const MAX_REQUESTS = 50;
export const MAX_NOTICES = 20;

export interface RateSample {
  at: number;
  prefill: number;
  decode: number;
}

export interface FinishedRequest {
  at: number;
  model: string;
  report: GenerationReport;
}

export interface Notice {
  at: number;
  kind: 'join_attempt' | 'instance_failed' | 'code_revoked';
  good: boolean;
  text: string;
}

export type Connection = 'connecting' | 'live' | 'reconnecting';

export interface ClusterModel {
  /** A snapshot has been applied. */
  loaded: boolean;
  connection: Connection;
  /** Why the last connection attempt failed (null while live). */
  error: string | null;
  clusterId: string;
  selfId: string;
  /** This node first, then by name. */
  nodes: NodeView[];
  reports: ReportsByNode;
  links: LinkView[];
  nearby: NearbyCluster[];
  joinCodeExpiresAtMs: number | null;
  /** Newest first. */
  instances: InstanceInfo[];
  rates: RateSample[];
  latestRates: ClusterRates | null;
  /** Newest first. */
  requests: FinishedRequest[];
  /** Newest first. */
  notices: Notice[];
  /** This node's model downloads, newest first (events only: the snapshot does not carry them). */
  pulls: PullView[];
  /** Copies of model files from other nodes to this one, newest first (events only, like pulls). */
  copies: CopyView[];
  memory: NodeMemory[];
  pool: PoolTotals;
}

export function emptyModel(): ClusterModel {
  return derive({
    loaded: false,
    connection: 'connecting',
    error: null,
    clusterId: '',
    selfId: '',
    nodes: [],
    reports: {},
    links: [],
    nearby: [],
    joinCodeExpiresAtMs: null,
    instances: [],
    rates: [],
    latestRates: null,
    requests: [],
    notices: [],
    pulls: [],
    copies: [],
    memory: [],
    pool: poolTotals([]),
  });
}

function sortNodes(nodes: NodeView[]): NodeView[] {
  return [...nodes].sort((x, y) => Number(y.is_self) - Number(x.is_self) || x.name.localeCompare(y.name) || x.id.localeCompare(y.id));
}

function sortInstances(instances: InstanceInfo[]): InstanceInfo[] {
  return [...instances].sort((x, y) => y.created_at_ms - x.created_at_ms || x.id.localeCompare(y.id));
}

/** Recomputes what follows from nodes and reports: links, per-node memory, pool totals. */
function derive(model: ClusterModel): ClusterModel {
  const memory = model.nodes.map(nodeMemory);
  return {
    ...model,
    links: mergeLinks(
      model.nodes.map((n) => n.id),
      model.reports,
    ),
    memory,
    pool: poolTotals(memory),
  };
}

export function applySnapshot(model: ClusterModel, snapshot: ClusterSnapshot, instances: InstanceInfo[]): ClusterModel {
  return derive({
    ...model,
    loaded: true,
    clusterId: snapshot.cluster_id,
    selfId: snapshot.node_id,
    nodes: sortNodes(snapshot.nodes),
    reports: reportsFromSnapshot(snapshot.links),
    nearby: snapshot.nearby,
    joinCodeExpiresAtMs: snapshot.join_code_expires_at_ms,
    instances: sortInstances(instances),
  });
}

function withNode(model: ClusterModel, id: string, change: (node: NodeView) => NodeView): ClusterModel {
  if (!model.nodes.some((n) => n.id === id)) return model;
  return derive({ ...model, nodes: model.nodes.map((n) => (n.id === id ? change(n) : n)) });
}

function notice(model: ClusterModel, n: Omit<Notice, 'at'>, now: number): ClusterModel {
  return { ...model, notices: [{ ...n, at: now }, ...model.notices].slice(0, MAX_NOTICES) };
}

/** The model after `event`; `now` stamps samples and notices. */
export function applyEvent(model: ClusterModel, event: ClusterEvent, now: number): ClusterModel {
  switch (event.type) {
    case 'node_joined': {
      if (model.nodes.some((n) => n.id === event.node)) return model;
      const node: NodeView = {
        id: event.node,
        name: event.name,
        is_self: false,
        status: 'connecting',
        control: [],
        api_port: 0,
        last_heard_ms_ago: null,
        telemetry: null,
      };
      return derive({ ...model, nodes: sortNodes([...model.nodes, node]) });
    }
    case 'node_status':
      return withNode(model, event.node, (n) => (n.is_self ? n : { ...n, status: event.status }));
    case 'node_left': {
      const reports: ReportsByNode = {};
      for (const [reporter, list] of Object.entries(model.reports)) {
        if (reporter !== event.node) reports[reporter] = list.filter((r) => r.peer !== event.node);
      }
      return derive({ ...model, nodes: model.nodes.filter((n) => n.id !== event.node), reports });
    }
    case 'telemetry':
      return withNode(model, event.node, (n) => ({ ...n, telemetry: event.telemetry }));
    case 'links':
      return derive({ ...model, reports: { ...model.reports, [event.node]: event.links } });
    case 'nearby':
      return { ...model, nearby: event.clusters };
    case 'join_attempt':
      return notice(
        model,
        {
          kind: 'join_attempt',
          good: event.accepted,
          text: event.accepted ? `${event.from} joined with the code` : `${event.from} could not join: ${event.reason}`,
        },
        now,
      );
    case 'code_created':
      return { ...model, joinCodeExpiresAtMs: event.expires_at_ms };
    case 'code_revoked':
      return notice({ ...model, joinCodeExpiresAtMs: null }, { kind: 'code_revoked', good: true, text: `The join code ended: ${event.reason}` }, now);
    case 'cluster_changed':
      return { ...model, clusterId: event.cluster_id };
    case 'instance': {
      const others = model.instances.filter((i) => i.id !== event.info.id);
      return { ...model, instances: sortInstances([...others, event.info]) };
    }
    case 'instance_failed':
      return notice(model, { kind: 'instance_failed', good: false, text: `${event.model} failed: ${event.error}` }, now);
    case 'request_finished':
      return {
        ...model,
        requests: [{ at: now, model: event.model, report: event.report }, ...model.requests].slice(0, MAX_REQUESTS),
      };
    case 'rates': {
      const sample = { at: now, prefill: event.rates.prefill_tokens_per_second, decode: event.rates.decode_tokens_per_second };
      const rates = [...model.rates.filter((s) => s.at > now - RATES_WINDOW_MS), sample];
      return { ...model, rates, latestRates: event.rates };
    }
    case 'model_pull':
      return { ...model, pulls: applyPull(model.pulls, event, now) };
    case 'model_copy': {
      const copies = applyCopy(model.copies, event, now);
      return copies === model.copies ? model : { ...model, copies };
    }
    case 'lagged':
      return model;
  }
}

/** Instances that serve the model or will: launching, ready, or recovering (being placed again). */
export function activeInstances(model: Pick<ClusterModel, 'instances'>): InstanceInfo[] {
  return model.instances.filter((i) => i.state === 'launching' || i.state === 'ready' || i.state === 'recovering');
}

/**
 * The JSON the node's API speaks. The types come from the Rust types that serialise it
 * (./generated.ts, written by src/api/bindings.rs and checked by `cargo test`), so they cannot drift;
 * this file adds only what the Rust types do not say.
 */

import type { ClusterEvent as NodeEvent, StageStatus } from './generated';

export type * from './generated';

/** A Rust `Range<usize>`: `start` included, `end` excluded. */
export type LayerRange = StageStatus['layers'];

/**
 * Every change the node streams on /api/events, by `type` (also the SSE event name), and `lagged`: the
 * stream's own word to a client that fell behind (it should fetch /api/cluster again).
 */
export type ClusterEvent = NodeEvent | { type: 'lagged' };

export type ClusterEventType = ClusterEvent['type'];

/** Every event type, once: an event the Rust types add is a type error here until it is listed. */
const EVENT_TYPES: Record<ClusterEventType, true> = {
  node_joined: true,
  node_status: true,
  node_left: true,
  telemetry: true,
  links: true,
  nearby: true,
  join_attempt: true,
  code_created: true,
  code_revoked: true,
  cluster_changed: true,
  instance: true,
  instance_failed: true,
  request_finished: true,
  rates: true,
  model_pull: true,
  model_copy: true,
  lagged: true,
};

export const CLUSTER_EVENT_TYPES = Object.keys(EVENT_TYPES) as readonly ClusterEventType[];

/** The error body of every failed API call (OpenAI's shape). */
export interface ApiErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

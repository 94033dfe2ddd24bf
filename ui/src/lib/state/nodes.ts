/** What a node card shows besides telemetry: its health colour and the model layers it holds. */
import { formatHolds, formatSlice } from '../format';
import type { InstanceInfo, InstanceState, NodeStatus, WorkerState } from '../api/types';

/** up (this node or alive), suspect, down (red), connecting (not heard from yet). */
export type NodeHealth = 'up' | 'suspect' | 'down' | 'connecting';

export function nodeHealth(status: NodeStatus): NodeHealth {
  switch (status) {
    case 'self':
    case 'alive':
      return 'up';
    case 'suspect':
      return 'suspect';
    case 'down':
      return 'down';
    case 'connecting':
      return 'connecting';
  }
}

export function statusLabel(status: NodeStatus): string {
  return status === 'self' ? 'this node' : status;
}

export interface HeldLayers {
  instance: string;
  model: string;
  instanceState: InstanceState;
  start: number;
  end: number;
  state: WorkerState;
  progress: number;
  /** A tensor-parallel rank: what it holds of every layer ("heads 0–5 · ffn 0–767"). */
  slice: string | null;
}

/** The layer ranges (or tensor-parallel slices) `node` runs for instances that are launching or ready, in ring order. */
export function layersOn(node: string, instances: readonly InstanceInfo[]): HeldLayers[] {
  return instances
    .filter((i) => i.state === 'launching' || i.state === 'ready')
    .flatMap((i) =>
      i.stages
        .filter((s) => s.node === node)
        .map((s) => ({
          instance: i.id,
          model: i.model,
          instanceState: i.state,
          start: s.layers.start,
          end: s.layers.end,
          state: s.state,
          progress: s.progress,
          slice: s.slice ? (i.plan.parallel === 'chain' ? formatHolds(s, 'chain') : formatSlice(s.slice)) : null,
        })),
    );
}

/** Badge colour of a worker or instance state. */
export function stateTone(state: WorkerState | InstanceState): 'ok' | 'warn' | 'bad' | '' {
  switch (state) {
    case 'ready':
    case 'serving':
      return 'ok';
    case 'failed':
      return 'bad';
    case 'stopped':
      return '';
    default:
      return 'warn';
  }
}

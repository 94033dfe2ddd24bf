/**
 * The memory pool: per node and summed over the members that are up (this node, alive and suspect
 * peers — the same members the node sums in /api/cluster's `pool`). Each node's memory splits into
 * used by shoal, used by everything else, and free (available); the offer is what models may still take.
 */
import type { NodeStatus, NodeView } from '../api/types';

/** ok; elevated: under 20 % of the memory is available; high: under 10 %; unknown: no telemetry yet. */
export type Pressure = 'ok' | 'elevated' | 'high' | 'unknown';

export const ELEVATED_BELOW = 0.2;
export const HIGH_BELOW = 0.1;

export interface NodeMemory {
  id: string;
  name: string;
  status: NodeStatus;
  up: boolean;
  known: boolean;
  total: number;
  usedByShoal: number;
  usedByOthers: number;
  free: number;
  offer: number;
  pressure: Pressure;
}

export interface PoolTotals {
  nodesUp: number;
  /** Sum of memory_total of the members that are up: the figure the node reports as pool.memory_total. */
  total: number;
  usedByShoal: number;
  usedByOthers: number;
  free: number;
  /** Sum of memory_offer of the members that are up: what models may still take. */
  offer: number;
  pressure: Pressure;
  /** Names of the nodes under high or elevated pressure. */
  pressured: string[];
}

/** Members counted in the pool. */
export function isUp(status: NodeStatus): boolean {
  return status === 'self' || status === 'alive' || status === 'suspect';
}

export function pressureOf(total: number, available: number): Pressure {
  if (total <= 0) return 'unknown';
  const free = available / total;
  if (free < HIGH_BELOW) return 'high';
  if (free < ELEVATED_BELOW) return 'elevated';
  return 'ok';
}

export function nodeMemory(node: NodeView): NodeMemory {
  const t = node.telemetry;
  const base = { id: node.id, name: node.name, status: node.status, up: isUp(node.status) };
  if (t === null) {
    return { ...base, known: false, total: 0, usedByShoal: 0, usedByOthers: 0, free: 0, offer: 0, pressure: 'unknown' };
  }
  const free = Math.min(t.memory_available, t.memory_total);
  const used = t.memory_total - free;
  const usedByShoal = Math.min(t.memory_used_by_shoal, used);
  return {
    ...base,
    known: true,
    total: t.memory_total,
    usedByShoal,
    usedByOthers: used - usedByShoal,
    free,
    offer: t.memory_offer,
    pressure: pressureOf(t.memory_total, free),
  };
}

const RANK: Record<Pressure, number> = { unknown: 0, ok: 1, elevated: 2, high: 3 };

export function poolTotals(memories: readonly NodeMemory[]): PoolTotals {
  const pool: PoolTotals = {
    nodesUp: 0,
    total: 0,
    usedByShoal: 0,
    usedByOthers: 0,
    free: 0,
    offer: 0,
    pressure: 'unknown',
    pressured: [],
  };
  for (const m of memories) {
    if (!m.up) continue;
    pool.nodesUp += 1;
    if (!m.known) continue;
    pool.total += m.total;
    pool.usedByShoal += m.usedByShoal;
    pool.usedByOthers += m.usedByOthers;
    pool.free += m.free;
    pool.offer += m.offer;
    if (RANK[m.pressure] > RANK[pool.pressure]) pool.pressure = m.pressure;
    if (m.pressure === 'high' || m.pressure === 'elevated') pool.pressured.push(m.name);
  }
  return pool;
}

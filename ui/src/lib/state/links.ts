/**
 * Links between members, rebuilt from each node's own reports the way the node builds them for
 * /api/cluster: one view per pair (a < b), RTT and echo round trip from a's report or else b's, throughput
 * each way from the sender's report. Also a link's health and transport, for colouring edges.
 */
import type { LinkReport, LinkView, NodeId, NodeStatus } from '../api/types';

/** Each reporting node's reports of its links, by reporter. */
export type ReportsByNode = Record<NodeId, LinkReport[]>;

/** The reporters of a snapshot's link views (a report about `b` came from `a`, and the other way). */
export function reportsFromSnapshot(links: readonly LinkView[]): ReportsByNode {
  const byNode: ReportsByNode = {};
  for (const link of links) {
    for (const report of link.reports) {
      const reporter = report.peer === link.b ? link.a : link.b;
      (byNode[reporter] ??= []).push(report);
    }
  }
  return byNode;
}

function reportOf(reports: ReportsByNode, from: NodeId, to: NodeId): LinkReport | undefined {
  return reports[from]?.find((r) => r.peer === to);
}

/** Link views between `members`, ordered by (a, b) like the node orders them. */
export function mergeLinks(members: readonly NodeId[], reports: ReportsByNode): LinkView[] {
  const ids = [...members].sort();
  const links: LinkView[] = [];
  for (let i = 0; i < ids.length; i++) {
    for (let j = i + 1; j < ids.length; j++) {
      const a = ids[i] as NodeId;
      const b = ids[j] as NodeId;
      const ab = reportOf(reports, a, b);
      const ba = reportOf(reports, b, a);
      const first = ab ?? ba;
      if (first === undefined) continue;
      links.push({
        a,
        b,
        kind: first.kind,
        rtt_p50_us: ab?.rtt_p50_us ?? ba?.rtt_p50_us ?? null,
        rtt_p99_us: ab?.rtt_p99_us ?? ba?.rtt_p99_us ?? null,
        echo_rtt_us: ab?.echo_rtt_us ?? ba?.echo_rtt_us,
        throughput_a_to_b_bps: ab?.throughput_bps ?? null,
        throughput_b_to_a_bps: ba?.throughput_bps ?? null,
        errors: (ab?.errors ?? 0) + (ba?.errors ?? 0),
        reports: [ab, ba].filter((r): r is LinkReport => r !== undefined),
      });
    }
  }
  return links;
}

/**
 * ok: both ends up and answering quickly; slow: RTT p50 above 5 ms; degraded: an end is suspect or not
 * connected yet, or no RTT was measured; down: an end is down.
 */
export type LinkHealth = 'ok' | 'slow' | 'degraded' | 'down';

export const SLOW_RTT_US = 5_000;

/** A lookup of each member's status by id, for {@link linkHealth}. */
export function statusLookup(nodes: readonly { id: NodeId; status: NodeStatus }[]): (id: NodeId) => NodeStatus | undefined {
  const byId = new Map(nodes.map((n) => [n.id, n.status]));
  return (id) => byId.get(id);
}

export function linkHealth(link: LinkView, statusOf: (id: NodeId) => NodeStatus | undefined): LinkHealth {
  const ends = [statusOf(link.a), statusOf(link.b)];
  if (ends.some((s) => s === 'down' || s === undefined)) return 'down';
  if (ends.some((s) => s === 'suspect' || s === 'connecting') || link.rtt_p50_us === null) return 'degraded';
  if (link.rtt_p50_us > SLOW_RTT_US) return 'slow';
  return 'ok';
}

/** The badge of a link: RDMA or TCP, and the device or the reason. */
export interface TransportBadge {
  kind: 'rdma' | 'tcp';
  detail: string | null;
}

/**
 * RDMA only where every end that reports a transport uses it; otherwise TCP with the first end's
 * reason. Nodes that do not report transports (older builds) use TCP.
 */
export function linkTransport(link: LinkView): TransportBadge {
  const chosen = link.reports.flatMap((r) => (r.transport == null ? [] : [r.transport]));
  const tcp = chosen.find((t) => t.kind === 'tcp');
  if (tcp !== undefined && tcp.kind === 'tcp') return { kind: 'tcp', detail: tcp.reason };
  const devices = [...new Set(chosen.flatMap((t) => (t.kind === 'rdma' ? [t.device] : [])))];
  if (devices.length > 0) return { kind: 'rdma', detail: devices.join(' ↔ ') };
  return { kind: 'tcp', detail: null };
}

/** The lower of the two directions' measured throughput (what a stage-to-stage hop can count on). */
export function linkThroughput(link: LinkView): number | null {
  const both = [link.throughput_a_to_b_bps, link.throughput_b_to_a_bps].filter((x): x is number => x !== null);
  return both.length === 0 ? null : Math.min(...both);
}

import { describe, expect, it } from 'vitest';
import { linkHealth, linkTransport, mergeLinks, reportsFromSnapshot } from '../src/lib/state/links';
import { nodeMemory, poolTotals, pressureOf } from '../src/lib/state/pool';
import type { LinkReport, LinkView, NodeStatus } from '../src/lib/api/types';
import { snapshotFixture } from './fakes';

describe('links', () => {
  it('rebuilds the node’s own link views from the reports', () => {
    const snapshot = snapshotFixture();
    const rebuilt = mergeLinks(
      snapshot.nodes.map((n) => n.id),
      reportsFromSnapshot(snapshot.links),
    );
    expect(rebuilt).toEqual(snapshot.links);
  });

  it('takes the echo round trip from the first end’s report, else the second’s', () => {
    const snapshot = snapshotFixture();
    const links = mergeLinks(snapshot.nodes.map((n) => n.id), reportsFromSnapshot(snapshot.links));
    // Link 0: both ends timed an echo (a 31 µs, b 29 µs); link 1: only b did; link 2: neither (older nodes).
    expect(links.map((l) => l.echo_rtt_us)).toEqual([31, 44, undefined]);
  });

  it('drops links of nodes that are no longer members', () => {
    const snapshot = snapshotFixture();
    const members = snapshot.nodes.slice(0, 2).map((n) => n.id);
    const links = mergeLinks(members, reportsFromSnapshot(snapshot.links));
    expect(links).toHaveLength(1);
  });

  it('colours a link by its ends and its RTT', () => {
    const link = snapshotFixture().links[0] as LinkView;
    const all = (s: NodeStatus) => () => s;
    expect(linkHealth(link, all('alive'))).toBe('ok');
    expect(linkHealth(link, all('suspect'))).toBe('degraded');
    expect(linkHealth(link, all('down'))).toBe('down');
    expect(linkHealth(link, () => undefined)).toBe('down');
    expect(linkHealth({ ...link, rtt_p50_us: 12_000 }, all('alive'))).toBe('slow');
    expect(linkHealth({ ...link, rtt_p50_us: null }, all('alive'))).toBe('degraded');
  });

  it('shows TCP unless every end that reports a transport uses RDMA', () => {
    const link = snapshotFixture().links[0] as LinkView;
    expect(linkTransport(link)).toEqual({ kind: 'tcp', detail: null });
    const rdma = { kind: 'rdma' as const, device: 'rdma_en3' };
    const tcp = { kind: 'tcp' as const, reason: 'no Thunderbolt cable joins these two nodes' };
    const withTransports = (first: LinkReport['transport'], second: LinkReport['transport']): LinkView => ({
      ...link,
      reports: link.reports.map((r, i) => ({ ...r, transport: i === 0 ? first : second })),
    });
    expect(linkTransport(withTransports(rdma, rdma))).toEqual({ kind: 'rdma', detail: 'rdma_en3' });
    expect(linkTransport(withTransports(rdma, undefined))).toEqual({ kind: 'rdma', detail: 'rdma_en3' });
    expect(linkTransport(withTransports(rdma, tcp))).toEqual({ kind: 'tcp', detail: tcp.reason });
  });
});

describe('memory pool', () => {
  it('splits a node’s memory into shoal, other apps and free', () => {
    const node = snapshotFixture().nodes[0]!;
    const t = { ...node.telemetry!, memory_total: 1000, memory_available: 600, memory_used_by_shoal: 100, memory_offer: 400 };
    const m = nodeMemory({ ...node, telemetry: t });
    expect(m).toMatchObject({ total: 1000, usedByShoal: 100, usedByOthers: 300, free: 600, offer: 400, pressure: 'ok' });
  });

  it('rates pressure by the share that is free', () => {
    expect(pressureOf(1000, 500)).toBe('ok');
    expect(pressureOf(1000, 150)).toBe('elevated');
    expect(pressureOf(1000, 50)).toBe('high');
    expect(pressureOf(0, 0)).toBe('unknown');
  });

  it('sums the members that are up, like the node’s pool', () => {
    const snapshot = snapshotFixture();
    const pool = poolTotals(snapshot.nodes.map(nodeMemory));
    expect(pool.total).toBe(snapshot.pool.memory_total);
    expect(pool.usedByShoal).toBe(snapshot.pool.memory_used_by_shoal);
    expect(pool.offer).toBe(snapshot.nodes.reduce((sum, n) => sum + n.telemetry!.memory_offer, 0));

    const [first, ...rest] = snapshot.nodes;
    const withDown = poolTotals([{ ...first!, status: 'down' as const }, ...rest].map(nodeMemory));
    expect(withDown.nodesUp).toBe(2);
    expect(withDown.total).toBe(snapshot.pool.memory_total - first!.telemetry!.memory_total);
  });

  it('names the nodes under pressure', () => {
    const snapshot = snapshotFixture();
    const nodes = snapshot.nodes.map((n, i) =>
      i === 0 ? { ...n, telemetry: { ...n.telemetry!, memory_available: n.telemetry!.memory_total / 20 } } : n,
    );
    const pool = poolTotals(nodes.map(nodeMemory));
    expect(pool.pressure).toBe('high');
    expect(pool.pressured).toEqual([snapshot.nodes[0]!.name]);
  });
});

//! The links service: what this node knows of its link to every member — its kind and interface, round
//! trips, measured throughput, errors, the peer's own reports of its links, and the ring transport the
//! link selection chose (RDMA or TCP, with the fallbacks of running instances) — and the coordination of
//! throughput measurements (one outgoing and one incoming at a time, one cluster-wide round at a time,
//! the bulk transfers under way). It has its own lock: the membership's lock is never held with it.

use super::state::LinkView;
use crate::links::{kind, LinkKind, LinkReport, RttWindow};
use crate::node::NodeId;
use crate::rdma::NodeRdma;
use crate::transport::ring::{RdmaRoute, RingTransport};
use crate::transport::select::{LinkFacts, LinkSelector, LinkTransport, RdmaBuild};
use crate::util::LockExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// This node's side of its link to one member.
#[derive(Default)]
struct Link {
    /// Whether a control connection to the member is up.
    connected: bool,
    rtt: RttWindow,
    kind: LinkKind,
    interface: Option<String>,
    local_addr: Option<SocketAddr>,
    remote_addr: Option<SocketAddr>,
    throughput_bps: Option<u64>,
    throughput_at_ms: Option<u64>,
    /// The median round trip of small frames between waiting threads (the probe's echo).
    echo_rtt_us: Option<u64>,
    errors: u64,
    /// Probes that failed (also counted in `errors`).
    probe_failures: u64,
    /// The member's own reports of its links.
    reported: Vec<LinkReport>,
    /// The ring transport for this link, and its RDMA fallback state.
    transport: Option<LinkTransport>,
    selector: LinkSelector,
    /// The RDMA devices a ring link to the member would use now (when the selection chose RDMA).
    ring_route: Option<RdmaRoute>,
    /// Running instances whose ring link to the member fell back to TCP, with the reason.
    ring_fallbacks: BTreeMap<String, String>,
}

impl Link {
    /// Whether this node has anything to say about the link.
    fn has_report(&self) -> bool {
        self.connected || !self.rtt.is_empty()
    }

    fn report(&self, peer: NodeId) -> LinkReport {
        LinkReport {
            peer,
            kind: self.kind,
            interface: self.interface.clone(),
            local_addr: self.local_addr.map(|a| a.to_string()),
            remote_addr: self.remote_addr.map(|a| a.to_string()),
            rtt_p50_us: self.rtt.quantile(0.5).map(|d| d.as_micros() as u64),
            rtt_p99_us: self.rtt.quantile(0.99).map(|d| d.as_micros() as u64),
            rtt_samples: self.rtt.len(),
            throughput_bps: self.throughput_bps,
            throughput_measured_at_ms: self.throughput_at_ms,
            echo_rtt_us: self.echo_rtt_us,
            errors: self.errors,
            probe_failures: self.probe_failures,
            transport: self.transport.clone(),
        }
    }
}

/// The links of one node, and its measurements.
pub struct Links {
    me: NodeId,
    links: Mutex<BTreeMap<NodeId, Link>>,
    /// One outgoing measurement at a time.
    pub(super) outgoing: Semaphore,
    /// One incoming measurement at a time.
    pub(super) inbound: tokio::sync::Mutex<()>,
    /// One cluster-wide measurement round at a time.
    pub(super) round: tokio::sync::Mutex<()>,
    /// Measurements asked of other members, by request id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Option<u64>>>>,
    /// Bulk transfers (link measurements, model copies) this node takes part in right now.
    bulk: Arc<AtomicUsize>,
}

impl Links {
    pub fn new(me: NodeId) -> Links {
        Links {
            me,
            links: Mutex::default(),
            outgoing: Semaphore::new(1),
            inbound: tokio::sync::Mutex::new(()),
            round: tokio::sync::Mutex::new(()),
            pending: Mutex::default(),
            bulk: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A control connection to `peer` is up, from `local` to `remote`: its round trips start afresh
    /// (it may take another path). True when the link's throughput was never measured.
    pub fn connected(&self, peer: NodeId, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> bool {
        // Classified before the lock is taken: on macOS this may list the hardware ports (a process).
        let (interface, kind) = local.map_or((None, LinkKind::Unknown), |a| kind::classify(a.ip()));
        let mut links = self.links.locked();
        let link = links.entry(peer).or_default();
        link.connected = true;
        link.rtt = RttWindow::default();
        link.local_addr = local;
        link.remote_addr = remote;
        link.interface = interface;
        link.kind = kind;
        link.throughput_bps.is_none()
    }

    /// The control connection to `peer` ended (`fault`: other than by the member leaving).
    pub fn disconnected(&self, peer: NodeId, fault: bool) {
        if let Some(link) = self.links.locked().get_mut(&peer) {
            link.connected = false;
            if fault {
                link.errors += 1;
            }
        }
    }

    /// A dial of `peer`, or a measurement of the link, failed.
    pub fn failed(&self, peer: NodeId) {
        self.links.locked().entry(peer).or_default().errors += 1;
    }

    pub fn record_rtt(&self, peer: NodeId, rtt: Duration) {
        if let Some(link) = self.links.locked().get_mut(&peer) {
            link.rtt.record(rtt);
        }
    }

    /// `peer` sent its reports of its own links.
    pub fn reported(&self, peer: NodeId, reports: Vec<LinkReport>) {
        self.links.locked().entry(peer).or_default().reported = reports;
    }

    /// Records a probe of the link to `peer` (or its failure).
    pub fn measured(&self, peer: NodeId, measured: Option<crate::links::probe::Measured>) {
        let mut links = self.links.locked();
        let Some(link) = links.get_mut(&peer) else { return };
        match measured {
            Some(m) => {
                link.throughput_bps = Some(m.bps);
                link.throughput_at_ms = Some(crate::util::now_ms());
                link.echo_rtt_us = m.round_trip_us.or(link.echo_rtt_us);
            }
            None => {
                link.errors += 1;
                link.probe_failures += 1;
            }
        }
    }

    /// Keeps only the links to `members`.
    pub fn retain(&self, members: &BTreeSet<NodeId>) {
        self.links.locked().retain(|id, _| members.contains(id));
    }

    pub fn forget(&self, peer: NodeId) {
        self.links.locked().remove(&peer);
    }

    /// This node changed cluster: it has no links yet.
    pub fn clear(&self) {
        self.links.locked().clear();
    }

    /// The addresses members were last connected from.
    pub fn remote_addresses(&self) -> Vec<IpAddr> {
        self.links.locked().values().filter_map(|l| l.remote_addr.map(|a| a.ip())).collect()
    }

    /// Reports of this node's own links.
    pub fn my_reports(&self) -> Vec<LinkReport> {
        self.links.locked().iter().filter(|(_, l)| l.has_report()).map(|(id, l)| l.report(*id)).collect()
    }

    /// The links between every pair of `members` that either end reported on.
    pub fn views(&self, members: &[NodeId]) -> Vec<LinkView> {
        let links = self.links.locked();
        let report_of = |from: NodeId, to: NodeId| -> Option<LinkReport> {
            if from == self.me {
                return links.get(&to).filter(|l| l.has_report()).map(|l| l.report(to));
            }
            links.get(&from)?.reported.iter().find(|r| r.peer == to).cloned()
        };
        let mut views = Vec::new();
        for (i, &a) in members.iter().enumerate() {
            for &b in &members[i + 1..] {
                let (ab, ba) = (report_of(a, b), report_of(b, a));
                let Some(first) = ab.as_ref().or(ba.as_ref()) else { continue };
                let either = |f: fn(&LinkReport) -> Option<u64>| ab.as_ref().and_then(f).or(ba.as_ref().and_then(f));
                views.push(LinkView {
                    a,
                    b,
                    kind: first.kind,
                    rtt_p50_us: either(|r| r.rtt_p50_us),
                    rtt_p99_us: either(|r| r.rtt_p99_us),
                    echo_rtt_us: either(|r| r.echo_rtt_us),
                    throughput_a_to_b_bps: ab.as_ref().and_then(|r| r.throughput_bps),
                    throughput_b_to_a_bps: ba.as_ref().and_then(|r| r.throughput_bps),
                    errors: ab.as_ref().map_or(0, |r| r.errors) + ba.as_ref().map_or(0, |r| r.errors),
                    reports: ab.into_iter().chain(ba).collect(),
                });
            }
        }
        views
    }

    /// Chooses the ring transport of each of this node's links from the doctors' reports of this node
    /// (first in `nodes`) and of the members, and the cables between them.
    pub fn choose_transports(&self, nodes: Vec<NodeRdma>, now_ms: u64) {
        let cluster = crate::rdma::assess(nodes);
        let Some((local, remotes)) = cluster.nodes.split_first() else { return };
        let mut links = self.links.locked();
        for remote in remotes {
            if let Some(link) = links.get_mut(&remote.node) {
                let facts = LinkFacts { build: RdmaBuild::current(), local, remote, cables: &cluster.cables };
                let running_fallback = link.ring_fallbacks.values().next().map(String::as_str);
                let (transport, route) = link.selector.choose_ring(&facts, now_ms, running_fallback);
                link.ring_route = route;
                link.transport = Some(transport);
            }
        }
    }

    /// The RDMA route for a ring link from this node to `peer`, when the link selection chose RDMA.
    pub fn ring_route(&self, peer: NodeId) -> Option<RdmaRoute> {
        self.links.locked().get(&peer).and_then(|l| l.ring_route.clone())
    }

    /// A local stage of `instance` reports the transport of its link to `peer`. A fallback counts as an
    /// RDMA failure of the link (new launches wait before trying RDMA again) and pins the link's badge to
    /// TCP, with the reason, while that instance runs.
    pub fn ring_link_changed(&self, peer: NodeId, instance: &str, transport: RingTransport) {
        let mut links = self.links.locked();
        let Some(link) = links.get_mut(&peer) else { return };
        match transport {
            RingTransport::Rdma { device } => {
                tracing::info!("instance {instance}: the ring link to {} runs over RDMA ({device})", peer.short());
                link.selector.rdma_worked();
                link.ring_fallbacks.remove(instance);
            }
            RingTransport::Tcp { reason } => {
                tracing::warn!("instance {instance}: the ring link to {} uses TCP: {reason}", peer.short());
                link.selector.rdma_failed(&reason, crate::util::now_ms());
                link.ring_fallbacks.insert(instance.to_string(), reason);
            }
        }
    }

    /// `instance` stopped here: its links' fallbacks no longer pin their badges.
    pub fn forget_ring_links(&self, instance: &str) {
        for link in self.links.locked().values_mut() {
            link.ring_fallbacks.remove(instance);
        }
    }

    /// Waits for the answer to measurement `request` asked of another member.
    pub(super) fn expect_measurement(&self, request: u64) -> oneshot::Receiver<Option<u64>> {
        let (tx, rx) = oneshot::channel();
        self.pending.locked().insert(request, tx);
        rx
    }

    pub(super) fn drop_measurement(&self, request: u64) {
        self.pending.locked().remove(&request);
    }

    /// A member answered measurement `request`.
    pub fn answer_measurement(&self, request: u64, bps: Option<u64>) {
        if let Some(tx) = self.pending.locked().remove(&request) {
            let _ = tx.send(bps);
        }
    }

    /// Whether this node is sending or receiving a bulk transfer right now.
    pub fn in_bulk_transfer(&self) -> bool {
        self.bulk.load(Ordering::Relaxed) > 0
    }

    /// Marks a bulk transfer for as long as the guard lives.
    pub fn bulk_guard(&self) -> BulkGuard {
        self.bulk.fetch_add(1, Ordering::Relaxed);
        BulkGuard(self.bulk.clone())
    }
}

/// Counts a bulk transfer while alive.
pub struct BulkGuard(Arc<AtomicUsize>);

impl Drop for BulkGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::links::probe::Measured;

    fn node(n: u8) -> NodeId {
        NodeId(uuid::Uuid::from_bytes([n; 16]))
    }

    #[test]
    fn a_link_is_viewed_from_both_ends_reports() {
        let (me, peer, other) = (node(1), node(2), node(3));
        let links = Links::new(me);
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let remote: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        assert!(links.connected(peer, Some(local), Some(remote)), "never measured");
        links.record_rtt(peer, Duration::from_micros(300));
        links.measured(peer, Some(Measured { bps: 8_000_000, round_trip_us: Some(35) }));
        assert!(!links.connected(peer, Some(local), Some(remote)), "measured once");
        links.record_rtt(peer, Duration::from_micros(400));
        let theirs = LinkReport { throughput_bps: Some(9_000_000), echo_rtt_us: None, ..links.my_reports()[0].clone() };
        links.reported(peer, vec![LinkReport { peer: me, ..theirs.clone() }, LinkReport { peer: other, ..theirs }]);

        let views = links.views(&[me, peer, other]);
        assert_eq!(views.len(), 2, "me–peer from both ends, peer–other from the peer's report: {views:?}");
        let mine = &views[0];
        assert_eq!((mine.a, mine.b), (me, peer));
        assert_eq!(mine.rtt_p50_us, Some(400), "the round trips of the newest connection only");
        assert_eq!((mine.throughput_a_to_b_bps, mine.throughput_b_to_a_bps), (Some(8_000_000), Some(9_000_000)));
        assert_eq!(mine.echo_rtt_us, Some(35), "the round trip this end's probe timed");
        // A later probe whose echo failed (an older peer) keeps the round trip timed before.
        links.measured(peer, Some(Measured { bps: 7_000_000, round_trip_us: None }));
        assert_eq!(links.my_reports()[0].echo_rtt_us, Some(35));
        assert_eq!(mine.reports.len(), 2);
        assert_eq!((views[1].a, views[1].b), (peer, other));
        assert_eq!(views[1].reports.len(), 1);
    }

    #[test]
    fn errors_count_faults_not_departures() {
        let (me, peer) = (node(1), node(2));
        let links = Links::new(me);
        links.connected(peer, None, None);
        links.disconnected(peer, false);
        links.disconnected(peer, true);
        links.failed(peer);
        links.measured(peer, None);
        assert_eq!(links.my_reports(), vec![], "no connection and no round trips: nothing to report");
        links.connected(peer, None, None);
        assert_eq!(links.my_reports()[0].errors, 3);
        assert_eq!(links.my_reports()[0].probe_failures, 1, "of which one a probe");
        links.retain(&BTreeSet::from([me]));
        assert_eq!(links.my_reports(), vec![], "a member forgotten takes its link along");
    }

    #[test]
    fn a_fallback_pins_the_link_until_its_instance_stops() {
        let (me, peer) = (node(1), node(2));
        let links = Links::new(me);
        links.connected(peer, None, None);
        links.ring_link_changed(peer, "i1", RingTransport::Tcp { reason: "no device".into() });
        assert_eq!(links.links.locked()[&peer].ring_fallbacks.len(), 1);
        links.forget_ring_links("i1");
        assert!(links.links.locked()[&peer].ring_fallbacks.is_empty());
        let guard = links.bulk_guard();
        assert!(links.in_bulk_transfer());
        drop(guard);
        assert!(!links.in_bulk_transfer());
    }
}

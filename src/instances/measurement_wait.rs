//! A launch's wait for what placement plans from: each node's telemetry and each link's first probe.
//! A node times its memory and its products when it starts (a few seconds) and only then reports its
//! telemetry; then each node probes its links to the others (throughput and the round trip a model's
//! frames see). Until a link is probed placement can only assume a round trip of a millisecond, which
//! is slower than any link a tensor-parallel group would use and would choose the mode and predict the
//! rate from a guess. So a launch right after nodes start or join waits for both, rather than failing,
//! leaving nodes out or planning from guesses; a node or link that stays silent (broken, probes refused
//! by a firewall, a hostile member) is waited for once, not by every launch.

use super::service::Instances;
use crate::cluster::ClusterSnapshot;
use crate::node::NodeId;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long a node may be up without telemetry, or a link between two nodes up without a probe, before
/// launches stop waiting for it.
const PATIENCE: Duration = Duration::from_secs(20);

/// What a launch may wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Awaited {
    /// A node's telemetry.
    Telemetry(NodeId),
    /// The first probe of the link between two nodes (the lower id first).
    Probe(NodeId, NodeId),
}

/// When each thing a launch waits for was first seen missing.
#[derive(Debug, Default)]
pub(super) struct MeasurementWaits {
    first_seen: HashMap<Awaited, Instant>,
}

impl MeasurementWaits {
    /// Whether a launch should wait on: something of `missing` was first seen missing less than
    /// [`PATIENCE`] before `now`. What is no longer missing is forgotten, so a node that restarts (or a
    /// link that comes back) is waited for again.
    fn should_wait(&mut self, missing: impl IntoIterator<Item = Awaited>, now: Instant) -> bool {
        let missing: HashSet<Awaited> = missing.into_iter().collect();
        self.first_seen.retain(|what, _| missing.contains(what));
        let mut wait = false;
        for what in missing {
            let since = *self.first_seen.entry(what).or_insert(now);
            wait |= now.duration_since(since) < PATIENCE;
        }
        wait
    }
}

/// What placement lacks in `snapshot`: the telemetry of nodes that are up, and the probe of each link
/// between two of them that reports telemetry (a node still timing itself is not probed yet) that no
/// probe has timed. A link whose probe ran is not waited for again: its echo timed the round trip, or
/// the echo failed after the transfers (placement then takes the heartbeats' round trip), or the probe
/// failed (its `probe_failures` say so). Other errors on a link (a refused dial while the cluster forms,
/// a lost connection) say nothing of its probe: a launch planned then would assume a millisecond a
/// round trip.
fn missing(snapshot: &ClusterSnapshot) -> Vec<Awaited> {
    let up: Vec<_> = snapshot.nodes.iter().filter(|n| n.status.is_up()).collect();
    let mut missing: Vec<Awaited> =
        up.iter().filter(|n| n.telemetry.is_none()).map(|n| Awaited::Telemetry(n.id)).collect();
    let timed: Vec<NodeId> = up.iter().filter(|n| n.telemetry.is_some()).map(|n| n.id).collect();
    for (i, &a) in timed.iter().enumerate() {
        for &b in &timed[i + 1..] {
            let link = snapshot.links.iter().find(|l| (l.a, l.b) == (a, b) || (l.a, l.b) == (b, a));
            let probed = link.is_some_and(|l| {
                l.echo_rtt_us.is_some()
                    || l.throughput_a_to_b_bps.is_some()
                    || l.throughput_b_to_a_bps.is_some()
                    || l.reports.iter().any(|r| r.probe_failures > 0)
            });
            if !probed {
                missing.push(Awaited::Probe(a.min(b), a.max(b)));
            }
        }
    }
    missing
}

/// Waits until every node that is up has reported its telemetry and every link between them has been
/// probed, or each of those still missing has been for [`PATIENCE`].
pub async fn await_measurements(instances: &Instances) {
    let mut told = false;
    loop {
        let missing = missing(&instances.agent.snapshot());
        if !instances.measurement_waits().should_wait(missing.iter().copied(), Instant::now()) {
            return;
        }
        if !told {
            tracing::info!("waiting for the cluster's first measurements before placing: {missing:?}");
            told = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_missing_is_waited_for_once_and_again_when_it_goes_missing_again() {
        let (a, b) = (Awaited::Telemetry(NodeId::random()), Awaited::Probe(NodeId::random(), NodeId::random()));
        let t0 = Instant::now();
        let mut waits = MeasurementWaits::default();
        assert!(!waits.should_wait([], t0), "nothing missing");
        assert!(waits.should_wait([a], t0), "a node just up");
        assert!(waits.should_wait([a], t0 + Duration::from_secs(19)));
        assert!(!waits.should_wait([a], t0 + PATIENCE), "silent for the whole patience: not waited for again");
        assert!(waits.should_wait([a, b], t0 + PATIENCE), "a link just up");
        assert!(!waits.should_wait([a, b], t0 + 2 * PATIENCE));
        assert!(!waits.should_wait([b], t0 + 2 * PATIENCE), "a reported");
        assert!(waits.should_wait([a, b], t0 + 2 * PATIENCE), "a restarted: missing again");
    }

    fn node(id: NodeId, status: crate::cluster::NodeStatus, timed: bool) -> crate::cluster::NodeView {
        crate::cluster::NodeView {
            id,
            name: String::new(),
            is_self: false,
            status,
            control: Vec::new(),
            api_port: 0,
            last_heard_ms_ago: None,
            telemetry: timed.then(Default::default),
        }
    }

    /// A view of the link between `a` and `b` from `a`'s report, with `errors` of which `probe_failures`.
    fn link(
        a: NodeId,
        b: NodeId,
        echo_rtt_us: Option<u64>,
        errors: u64,
        probe_failures: u64,
    ) -> crate::cluster::LinkView {
        let report = crate::links::LinkReport {
            peer: b,
            kind: Default::default(),
            interface: None,
            local_addr: None,
            remote_addr: None,
            rtt_p50_us: Some(200),
            rtt_p99_us: Some(400),
            rtt_samples: 10,
            throughput_bps: None,
            throughput_measured_at_ms: None,
            echo_rtt_us,
            errors,
            probe_failures,
            transport: None,
        };
        crate::cluster::LinkView {
            a,
            b,
            kind: Default::default(),
            rtt_p50_us: Some(200),
            rtt_p99_us: Some(400),
            echo_rtt_us,
            throughput_a_to_b_bps: None,
            throughput_b_to_a_bps: None,
            errors,
            reports: vec![report],
        }
    }

    #[test]
    fn a_launch_waits_for_telemetry_and_for_the_probes_of_links_between_timed_nodes() {
        use crate::cluster::NodeStatus::{Alive, Down, Myself};
        let mut ids: Vec<NodeId> = (0..5).map(|_| NodeId::random()).collect();
        ids.sort();
        let [me, timed, also_timed, timing, down] = ids[..] else { unreachable!() };
        let mut snapshot = ClusterSnapshot {
            cluster_id: String::new(),
            node_id: me,
            nodes: vec![
                node(me, Myself, true),
                node(timed, Alive, true),
                node(also_timed, Alive, true),
                node(timing, Alive, false),
                node(down, Down, false),
            ],
            // Only the heartbeat's round trip so far between me and `timed`, and no view at all of the others.
            links: vec![link(timed, me, None, 0, 0)],
            pool: Default::default(),
            nearby: Vec::new(),
            join_code_expires_at_ms: None,
        };
        let expected = vec![
            Awaited::Telemetry(timing),
            Awaited::Probe(me, timed),
            Awaited::Probe(me, also_timed),
            Awaited::Probe(timed, also_timed),
        ];
        assert_eq!(missing(&snapshot), expected, "a node down is not waited for, nor a node still timing itself");
        snapshot.links = vec![link(timed, me, Some(40), 0, 0), link(timed, also_timed, None, 1, 1)];
        assert_eq!(
            missing(&snapshot),
            [Awaited::Telemetry(timing), Awaited::Probe(me, also_timed)],
            "a probed link, and one whose probe failed, are not waited for"
        );
        // A dial refused while the cluster formed is an error on the link but no probe of it.
        snapshot.links.push(link(me, also_timed, None, 2, 0));
        assert_eq!(
            missing(&snapshot),
            [Awaited::Telemetry(timing), Awaited::Probe(me, also_timed)],
            "a link with errors but no probe is still waited for"
        );
        // A probe that timed the throughput but whose echo then failed ran: not waited for again.
        snapshot.links.last_mut().unwrap().throughput_b_to_a_bps = Some(10_000_000_000);
        assert_eq!(missing(&snapshot), [Awaited::Telemetry(timing)], "a probe whose echo failed still ran");
    }
}

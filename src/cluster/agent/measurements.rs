//! Link measurements driven by the runtime: this node's outgoing throughput to a member, a probe served
//! to a member measuring its link to this node, and a cluster-wide round that asks every member to
//! measure every link in turn. What they find is kept by the links service ([`super::Links`]).

use super::*;

impl Shared {
    /// Measures every link in both directions, one transfer at a time across the cluster (transfers
    /// running at once would share links and CPUs and understate each other). Runs in the background.
    pub fn measure_links(self: &Arc<Self>) {
        let shared = self.clone();
        tokio::spawn(async move {
            let _round = shared.links.round.lock().await;
            let me = shared.id();
            let up: Vec<NodeId> = {
                let state = shared.state.locked();
                let mut up: Vec<NodeId> =
                    state.peers.iter().filter(|(_, p)| p.connection.is_some()).map(|(id, _)| *id).collect();
                up.push(me);
                up
            };
            for &from in &up {
                for &to in up.iter().filter(|&&to| to != from) {
                    if from == me {
                        measure_to(&shared, to).await;
                    } else {
                        shared.ask_measurement(from, to).await;
                    }
                }
            }
        });
    }

    /// Asks member `from` to measure its link to `to`, and waits for the answer (or 30 s).
    async fn ask_measurement(&self, from: NodeId, to: NodeId) -> Option<u64> {
        let request = self.next_connection_id();
        let rx = self.links.expect_measurement(request);
        let answer = if self.send_to(from, ControlMessage::MeasureLink { peer: to, request }) {
            tokio::time::timeout(Duration::from_secs(30), rx).await.ok().and_then(|r| r.ok()).flatten()
        } else {
            None
        };
        self.links.drop_measurement(request);
        answer
    }

    /// Serves a member's measurement of its link to this node (one at a time).
    pub(super) async fn serve_probe(
        &self,
        reader: secure::SecureReader,
        writer: secure::SecureWriter,
    ) -> Result<(), NetError> {
        let _busy = self.links.bulk_guard();
        probe::serve(reader, writer, &self.links.inbound).await
    }
}

/// How long the first measurement of a link waits for its two ends to finish timing themselves.
const START_TIMING_PATIENCE: Duration = Duration::from_secs(60);

/// Measures this node's outgoing throughput to `peer` at join: `delay` after both ends have reported
/// their telemetry. A node times its memory and its products when it starts, on every core, and only
/// then reports; a probe beside that timing competes with it for the cores (two netns nodes on one
/// 2-core VM: 8.5–14.8 Gb/s measured during the timing, 14.8–42.5 after it; round trips 18–32 µs
/// against 16–19), and placement would plan a launch from those figures. An end that stays silent is
/// waited for at most [`START_TIMING_PATIENCE`].
pub(in crate::cluster) fn spawn_measurement(shared: Agent, peer: NodeId, delay: Duration) {
    tokio::spawn(async move {
        let started = Instant::now();
        while !both_ends_timed(&shared, peer) && started.elapsed() < START_TIMING_PATIENCE {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(delay).await;
        measure_to(&shared, peer).await;
    });
}

/// Whether this node and `peer` have both reported telemetry (so neither is timing itself now).
fn both_ends_timed(shared: &Agent, peer: NodeId) -> bool {
    let state = shared.state.locked();
    state.telemetry.is_some() && state.peers.get(&peer).is_some_and(|p| p.telemetry.is_some())
}

/// Measures and records this node's outgoing throughput to `peer` and the round trip of small frames,
/// one measurement at a time.
pub(in crate::cluster) async fn measure_to(shared: &Agent, peer: NodeId) -> Option<u64> {
    let _permit = shared.links.outgoing.acquire().await.ok()?;
    let target = shared.peer_control(peer)?;
    let result = {
        let _busy = shared.links.bulk_guard();
        probe::measure_outgoing(target, &shared.secret()).await
    };
    let measured = match result {
        Ok(measured) => Some(measured),
        Err(e) => {
            tracing::info!("measuring the link to {}: {e}", peer.short());
            None
        }
    };
    shared.links.measured(peer, measured);
    measured.map(|m| m.bps)
}

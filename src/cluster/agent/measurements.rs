//! Link measurements: this node's outgoing throughput to a member (one at a time), a probe served to a
//! member measuring its link to this node (one at a time), a cluster-wide round that asks every member
//! to measure every link in turn, and the count of bulk transfers under way, during which round trips
//! say little about a link and are not recorded.

use super::*;

/// The measurement state of one node.
pub(super) struct LinkMeasurements {
    /// One outgoing measurement at a time.
    outgoing: Semaphore,
    /// One incoming measurement at a time.
    inbound: tokio::sync::Mutex<()>,
    /// One cluster-wide measurement round at a time.
    round: tokio::sync::Mutex<()>,
    /// Measurements asked of other members, by request id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Option<u64>>>>,
    /// Bulk transfers (link measurements, model copies) this node takes part in right now.
    bulk: Arc<AtomicUsize>,
}

impl Default for LinkMeasurements {
    fn default() -> LinkMeasurements {
        LinkMeasurements {
            outgoing: Semaphore::new(1),
            inbound: tokio::sync::Mutex::new(()),
            round: tokio::sync::Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            bulk: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Shared {
    /// Measures every link in both directions, one transfer at a time across the cluster (transfers
    /// running at once would share links and CPUs and understate each other). Runs in the background.
    pub fn measure_links(self: &Arc<Self>) {
        let shared = self.clone();
        tokio::spawn(async move {
            let _round = shared.measurements.round.lock().await;
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
        let (tx, rx) = oneshot::channel();
        self.measurements.pending.locked().insert(request, tx);
        let answer = if self.send_to(from, ControlMessage::MeasureLink { peer: to, request }) {
            tokio::time::timeout(Duration::from_secs(30), rx).await.ok().and_then(|r| r.ok()).flatten()
        } else {
            None
        };
        self.measurements.pending.locked().remove(&request);
        answer
    }

    /// A member answered a measurement request.
    pub(in crate::cluster) fn measured(&self, request: u64, bps: Option<u64>) {
        if let Some(tx) = self.measurements.pending.locked().remove(&request) {
            let _ = tx.send(bps);
        }
    }

    /// Serves a member's measurement of its link to this node (one at a time).
    pub(super) async fn serve_probe(
        &self,
        reader: secure::SecureReader,
        writer: secure::SecureWriter,
    ) -> Result<(), NetError> {
        let _busy = self.bulk_guard();
        probe::serve(reader, writer, &self.measurements.inbound).await
    }

    /// Whether this node is sending or receiving a bulk transfer right now.
    pub fn in_bulk_transfer(&self) -> bool {
        self.measurements.bulk.load(Ordering::Relaxed) > 0
    }

    /// Marks a bulk transfer for as long as the guard lives.
    pub(super) fn bulk_guard(&self) -> BulkGuard {
        self.measurements.bulk.fetch_add(1, Ordering::Relaxed);
        BulkGuard(self.measurements.bulk.clone())
    }
}

/// Measures this node's outgoing throughput to `peer` after `delay` (at join).
pub(in crate::cluster) fn spawn_measurement(shared: Agent, peer: NodeId, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        measure_to(&shared, peer).await;
    });
}

/// Measures and records this node's outgoing throughput to `peer`, one measurement at a time.
pub(in crate::cluster) async fn measure_to(shared: &Agent, peer: NodeId) -> Option<u64> {
    let _permit = shared.measurements.outgoing.acquire().await.ok()?;
    let target = {
        let mut state = shared.state.locked();
        let p = state.peers.get_mut(&peer)?;
        let target = p.connection.as_ref()?.peer_control;
        p.measuring = true;
        target
    };
    let result = {
        let _busy = shared.bulk_guard();
        probe::measure_outgoing(target, &shared.secret()).await
    };
    let mut state = shared.state.locked();
    let p = state.peers.get_mut(&peer)?;
    p.measuring = false;
    match result {
        Ok(bps) => {
            p.throughput_bps = Some(bps);
            p.throughput_at_ms = Some(crate::util::now_ms());
            Some(bps)
        }
        Err(e) => {
            p.errors += 1;
            tracing::info!("measuring the link to {}: {e}", peer.short());
            None
        }
    }
}

/// Counts a bulk transfer while alive.
pub(super) struct BulkGuard(Arc<AtomicUsize>);

impl Drop for BulkGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

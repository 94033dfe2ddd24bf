//! The instances service: the state behind model instances on one node — the registry (instances,
//! local workers, generation calls), the requests finished through this node's API and the token
//! counters behind the cluster-wide rates. It is attached to the cluster runtime, which hands it the
//! control messages about instances and the members it finds down; it reaches the cluster through
//! `agent` (sending, membership, events) and owns nothing of the cluster's.

use super::Registry;
use crate::cluster::messages::ControlMessage;
use crate::cluster::{Agent, ClusterEvent, ClusterService};
use crate::metrics::{ClusterRates, CounterWindow, RequestWindow};
use crate::node::NodeId;
use crate::util::LockExt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub struct Instances {
    /// The cluster runtime this service runs on.
    pub agent: Agent,
    registry: Mutex<Registry>,
    /// Requests finished through this node's API, for requests per minute.
    finished: Mutex<RequestWindow>,
    /// Stage-0 token counters over the last seconds, for cluster-wide rates.
    counters: Mutex<CounterWindow>,
    /// The rates sampled last (every second).
    latest_rates: Mutex<ClusterRates>,
    /// What launches waited for (nodes' telemetry, links' first probes), and since when.
    measurement_waits: Mutex<super::measurement_wait::MeasurementWaits>,
}

impl Instances {
    /// Starts the service on `agent`: attaches it, and samples the rates every second.
    pub fn start(agent: Agent) -> Arc<Instances> {
        let instances = Arc::new(Instances {
            agent,
            registry: Mutex::default(),
            finished: Mutex::default(),
            counters: Mutex::default(),
            latest_rates: Mutex::default(),
            measurement_waits: Mutex::default(),
        });
        let weak: Weak<Instances> = Arc::downgrade(&instances);
        instances.agent.attach(weak.clone());
        tokio::spawn(rates_loop(weak));
        instances
    }

    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.locked()
    }

    /// What launches waited for (nodes' telemetry, links' first probes), and since when.
    pub(super) fn measurement_waits(&self) -> MutexGuard<'_, super::measurement_wait::MeasurementWaits> {
        self.measurement_waits.locked()
    }

    /// Records a request finished through this node's API (its rates go to the event stream).
    pub fn record_request(&self, model: &str, report: &crate::worker::GenerationReport) {
        self.finished.locked().record();
        self.agent.emit(ClusterEvent::RequestFinished { model: model.to_string(), report: report.clone() });
    }

    /// The cluster-wide rates as last sampled (at most a second old).
    pub fn rates(&self) -> ClusterRates {
        self.latest_rates.locked().clone()
    }

    /// Samples the cluster-wide rates (stage 0 of every instance counts the tokens it serves; requests
    /// per minute are those finished through this node's API) and keeps them for [`Instances::rates`].
    fn sample_rates(&self) -> ClusterRates {
        let counters: Vec<(String, u64, u64)> = self
            .registry()
            .instances
            .values()
            .filter_map(|i| {
                i.stages
                    .first()
                    .and_then(|s| s.stats.as_ref())
                    .map(|s| (i.id.clone(), s.tokens.saturating_sub(s.generated_tokens), s.generated_tokens))
            })
            .collect();
        let mut rates = self.counters.locked().rates(&counters);
        rates.requests_per_minute = self.finished.locked().per_minute();
        *self.latest_rates.locked() = rates.clone();
        rates
    }
}

impl ClusterService for Instances {
    fn on_message(self: Arc<Self>, from: NodeId, message: ControlMessage) {
        super::messages::on_message(&self, from, message);
    }

    /// A member that (re)connects learns this node's instances now, not at their next change.
    fn on_peer_connected(self: Arc<Self>, peer: NodeId) {
        let me = self.agent.id();
        let owned: Vec<_> =
            self.registry().instances.values().filter(|i| i.owner == me && i.state.is_active()).cloned().collect();
        for info in owned {
            self.agent.send_to(peer, ControlMessage::Instance { info: Box::new(info) });
        }
    }

    fn on_peer_down(self: Arc<Self>, peer: NodeId) {
        super::lifecycle::on_peer_down(&self, peer);
    }
}

/// Samples the rates every second and sends them to the event stream, while the service lives.
async fn rates_loop(instances: Weak<Instances>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(instances) = instances.upgrade() else { return };
        let rates = instances.sample_rates();
        instances.agent.emit(ClusterEvent::Rates { rates });
    }
}

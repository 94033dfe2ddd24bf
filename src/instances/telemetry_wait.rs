//! A launch's wait for nodes that are up but have not yet said what they offer: a node times its memory
//! and its products when it starts (a few seconds) and only then reports its telemetry, which placement
//! needs. A launch right after nodes start waits for them rather than failing or leaving them out; a node
//! that stays silent (broken, or a hostile member) is waited for once, not by every launch.

use super::service::Instances;
use crate::node::NodeId;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long a node that is up may go without telemetry before launches stop waiting for it.
const PATIENCE: Duration = Duration::from_secs(20);

/// When each node that is up without telemetry was first seen so.
#[derive(Debug, Default)]
pub(super) struct TelemetryWaits {
    first_seen: HashMap<NodeId, Instant>,
}

impl TelemetryWaits {
    /// Whether a launch should wait on: some node of `missing` (up, without telemetry) was first seen so
    /// less than [`PATIENCE`] before `now`. Nodes no longer missing are forgotten, so a node that
    /// restarts is waited for again.
    fn should_wait(&mut self, missing: impl IntoIterator<Item = NodeId>, now: Instant) -> bool {
        let missing: HashSet<NodeId> = missing.into_iter().collect();
        self.first_seen.retain(|id, _| missing.contains(id));
        let mut wait = false;
        for id in missing {
            let since = *self.first_seen.entry(id).or_insert(now);
            wait |= now.duration_since(since) < PATIENCE;
        }
        wait
    }
}

/// Waits until every node that is up has reported its telemetry, or each of those still silent has been
/// for [`PATIENCE`].
pub async fn await_telemetry(instances: &Instances) {
    loop {
        let missing: Vec<NodeId> = instances
            .agent
            .snapshot()
            .nodes
            .iter()
            .filter(|n| n.status.is_up() && n.telemetry.is_none())
            .map(|n| n.id)
            .collect();
        if !instances.telemetry_waits().should_wait(missing, Instant::now()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_node_is_waited_for_once_and_a_restarted_one_again() {
        let (a, b) = (NodeId::random(), NodeId::random());
        let t0 = Instant::now();
        let mut waits = TelemetryWaits::default();
        assert!(!waits.should_wait([], t0), "every node has reported");
        assert!(waits.should_wait([a], t0), "a node just up");
        assert!(waits.should_wait([a], t0 + Duration::from_secs(19)));
        assert!(!waits.should_wait([a], t0 + PATIENCE), "silent for the whole patience: not waited for again");
        assert!(waits.should_wait([a, b], t0 + PATIENCE), "another node just up");
        assert!(!waits.should_wait([a, b], t0 + 2 * PATIENCE));
        assert!(!waits.should_wait([b], t0 + 2 * PATIENCE), "a reported");
        assert!(waits.should_wait([a, b], t0 + 2 * PATIENCE), "a restarted: without telemetry again");
    }
}

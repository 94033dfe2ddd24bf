//! Failure detection: every member pings every other four times a second over its control connection;
//! a member not heard from for a second is suspected, and after 2.5 seconds it is down. There is no
//! leader and no election, so nothing can wedge: each node judges its peers from what it hears itself,
//! and a member that comes back is alive again as soon as it is heard.

use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const PING_INTERVAL: Duration = Duration::from_millis(250);
pub const SUSPECT_AFTER: Duration = Duration::from_millis(1000);
pub const DOWN_AFTER: Duration = Duration::from_millis(2500);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum PeerStatus {
    /// Known but not heard from yet since this node started.
    Connecting,
    Alive,
    Suspect,
    Down,
}

/// A member's status as this node sees it, in the cluster's snapshot: this node itself, or a peer's
/// [`PeerStatus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// This node.
    #[serde(rename = "self")]
    Myself,
    Connecting,
    Alive,
    Suspect,
    Down,
}

impl NodeStatus {
    /// This node, or a peer heard from within the last second: it can be given work.
    pub fn is_up(self) -> bool {
        matches!(self, NodeStatus::Myself | NodeStatus::Alive)
    }
}

impl std::fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            NodeStatus::Myself => "self",
            NodeStatus::Connecting => "connecting",
            NodeStatus::Alive => "alive",
            NodeStatus::Suspect => "suspect",
            NodeStatus::Down => "down",
        };
        f.pad(name)
    }
}

impl From<PeerStatus> for NodeStatus {
    fn from(status: PeerStatus) -> NodeStatus {
        match status {
            PeerStatus::Connecting => NodeStatus::Connecting,
            PeerStatus::Alive => NodeStatus::Alive,
            PeerStatus::Suspect => NodeStatus::Suspect,
            PeerStatus::Down => NodeStatus::Down,
        }
    }
}

/// A peer's status after `silence` without hearing from it (`heard`: whether it was ever heard).
pub fn status_after(silence: Duration, heard: bool) -> PeerStatus {
    match (heard, silence) {
        (_, s) if s >= DOWN_AFTER => PeerStatus::Down,
        (false, _) => PeerStatus::Connecting,
        (true, s) if s >= SUSPECT_AFTER => PeerStatus::Suspect,
        (true, _) => PeerStatus::Alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_status_is_written_as_the_api_and_the_dashboard_name_it() {
        for (status, name) in [(NodeStatus::Myself, "self"), (NodeStatus::Alive, "alive"), (NodeStatus::Down, "down")] {
            assert_eq!(serde_json::to_value(status).unwrap(), name);
            assert_eq!(format!("{status:<6}|"), format!("{name:<6}|"));
        }
    }

    #[test]
    fn silence_turns_alive_into_suspect_then_down() {
        let ms = Duration::from_millis;
        assert_eq!(status_after(ms(100), true), PeerStatus::Alive);
        assert_eq!(status_after(ms(1200), true), PeerStatus::Suspect);
        assert_eq!(status_after(ms(2600), true), PeerStatus::Down);
        assert_eq!(status_after(ms(500), false), PeerStatus::Connecting);
        assert_eq!(status_after(ms(3000), false), PeerStatus::Down);
        assert!(DOWN_AFTER < Duration::from_secs(3), "a silent member must be down within 3 s");
    }
}

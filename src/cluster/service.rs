//! The seam between the cluster runtime and the services built on it. The runtime owns membership,
//! connections, health and links; a service (today the instances service) owns its own state and is
//! handed what the runtime does not handle itself: the control messages meant for it and the members
//! found down. The runtime holds it weakly, so neither keeps the other alive and `cluster` needs no
//! knowledge of what the service is.

use super::messages::ControlMessage;
use crate::node::NodeId;
use crate::util::LockExt;
use std::sync::{Arc, Mutex, Weak};

/// A service that runs on the cluster runtime.
pub trait ClusterService: Send + Sync {
    /// A member sent a message the runtime does not handle itself (it comes from an authenticated
    /// member, but is not yet validated: the service checks it before using it).
    fn on_message(self: Arc<Self>, from: NodeId, message: ControlMessage);
    /// A control connection to `peer` is up (a member joined, came back, or reconnected).
    fn on_peer_connected(self: Arc<Self>, peer: NodeId);
    /// The failure detector found `peer` down.
    fn on_peer_down(self: Arc<Self>, peer: NodeId);
}

/// Where the runtime finds its service, once one is attached.
#[derive(Default)]
pub struct ServiceSlot(Mutex<Option<Weak<dyn ClusterService>>>);

impl ServiceSlot {
    pub fn attach(&self, service: Weak<dyn ClusterService>) {
        *self.0.locked() = Some(service);
    }

    /// The attached service while it lives (messages that arrive before one is attached, or after it
    /// is gone, are dropped: nothing of theirs exists on this node).
    pub fn get(&self) -> Option<Arc<dyn ClusterService>> {
        self.0.locked().as_ref().and_then(Weak::upgrade)
    }
}

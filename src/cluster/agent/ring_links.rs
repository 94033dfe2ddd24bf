//! The agent's side of the ring links' transports: which RDMA route a local stage's link to the next
//! node takes (chosen by the link selection from both doctors' reports), and what the worker says
//! afterwards — RDMA carries the link, or it fell back to TCP. A fallback counts as an RDMA failure of
//! the link (new launches wait before trying RDMA again) and pins the link's badge to TCP, with the
//! reason, while that instance runs.

use super::Shared;
use crate::node::NodeId;
use crate::transport::ring::{RdmaRoute, RingTransport};
use crate::util::LockExt;

impl Shared {
    /// The RDMA route for a ring link from this node to `peer`, when the link selection chose RDMA.
    pub fn ring_route(&self, peer: NodeId) -> Option<RdmaRoute> {
        let state = self.state.locked();
        state.peers.get(&peer).and_then(|p| p.ring_route.clone())
    }

    /// A local stage of `instance` reports the transport of its link to `peer`.
    pub fn ring_link_changed(&self, peer: NodeId, instance: &str, transport: RingTransport) {
        let mut state = self.state.locked();
        let Some(link) = state.peers.get_mut(&peer) else { return };
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
        let mut state = self.state.locked();
        for peer in state.peers.values_mut() {
            peer.ring_fallbacks.remove(instance);
        }
    }
}

//! Links between members: what kind each is, its round-trip times from small probes every second, its
//! throughput from bulk transfers (at join and on demand) with the round trip a model's traffic sees,
//! and its errors.

pub mod echo;
pub mod kind;
pub mod probe;
mod rtt;

pub use kind::{Interfaces, LinkKind};
pub use rtt::RttWindow;

use crate::node::NodeId;
use serde::{Deserialize, Serialize};

/// One node's measurements of its link to a peer, as it reports them to the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct LinkReport {
    pub peer: NodeId,
    pub kind: LinkKind,
    /// The local interface carrying the link.
    pub interface: Option<String>,
    pub local_addr: Option<String>,
    pub remote_addr: Option<String>,
    pub rtt_p50_us: Option<u64>,
    pub rtt_p99_us: Option<u64>,
    pub rtt_samples: usize,
    /// Bits per second from the reporting node to the peer, from the last bulk transfer.
    pub throughput_bps: Option<u64>,
    pub throughput_measured_at_ms: Option<u64>,
    /// The median round trip of small frames between two threads waiting for them, as a model's sums
    /// and hops see it (the probe's echo; absent until a probe ran, or from older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub echo_rtt_us: Option<u64>,
    /// Connections lost, refused dials and malformed input on this link since the node started.
    pub errors: u64,
    /// Probes of the link (throughput and echo) that failed since the node started; counted in `errors`
    /// too. Tells a link whose probe failed (not waited for by launches) from one not probed yet.
    #[serde(default)]
    pub probe_failures: u64,
    /// The transport the ring uses on this link (an RDMA or TCP badge) and why; absent from older nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<crate::transport::select::LinkTransport>,
}

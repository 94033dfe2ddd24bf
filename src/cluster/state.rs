//! The membership service's state — the members, their health, control connections and telemetry,
//! nearby clusters, the active join code — and the snapshot of the cluster that the API and
//! `shoal status` show (with the links, which the links service owns).

use super::health::{NodeStatus, PeerStatus};
use super::membership::Membership;
use super::messages::ControlMessage;
use super::pairing::JoinCode;
use crate::discovery::DiscoveredNode;
use crate::links::{LinkKind, LinkReport};
use crate::node::{NodeId, NodeTelemetry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;
use tokio::sync::mpsc;

/// A live control connection to a peer.
pub struct Connection {
    pub id: u64,
    /// Which side opened it: of two connections between a pair, the one opened by the lower id stays.
    pub dialer: NodeId,
    pub tx: mpsc::UnboundedSender<ControlMessage>,
    /// Where the peer's control port was reached (for link probes).
    pub peer_control: SocketAddr,
}

/// What this node knows about one other member: its health, its control connection and its telemetry
/// (its link is the links service's).
pub struct Peer {
    pub status: PeerStatus,
    pub last_heard: Option<Instant>,
    /// When this node started watching the peer (for "down" without ever having heard it).
    pub watched_since: Instant,
    pub connection: Option<Connection>,
    pub dialing: bool,
    pub telemetry: Option<NodeTelemetry>,
}

impl Peer {
    pub fn new() -> Peer {
        Peer {
            status: PeerStatus::Connecting,
            last_heard: None,
            watched_since: Instant::now(),
            connection: None,
            dialing: false,
            telemetry: None,
        }
    }
}

impl Default for Peer {
    fn default() -> Self {
        Self::new()
    }
}

pub struct ClusterState {
    pub me: NodeId,
    pub membership: Membership,
    pub peers: BTreeMap<NodeId, Peer>,
    pub telemetry: Option<NodeTelemetry>,
    /// Nodes of this cluster seen by mDNS (their addresses).
    pub discovered: BTreeMap<NodeId, DiscoveredNode>,
    /// Nodes of other clusters seen by mDNS.
    pub nearby: BTreeMap<NodeId, DiscoveredNode>,
    /// Addresses given with --peer, by the node that answered there.
    pub static_routes: BTreeMap<NodeId, SocketAddr>,
    pub code: Option<JoinCode>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    pub is_self: bool,
    /// `self` for this node, else the peer's status as this node sees it.
    pub status: NodeStatus,
    pub control: Vec<SocketAddr>,
    pub api_port: u16,
    pub last_heard_ms_ago: Option<u64>,
    pub telemetry: Option<NodeTelemetry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct LinkView {
    pub a: NodeId,
    pub b: NodeId,
    pub kind: LinkKind,
    pub rtt_p50_us: Option<u64>,
    pub rtt_p99_us: Option<u64>,
    /// The round trip of small frames between waiting threads, as a model's traffic sees it (from
    /// either end's last probe; absent until one ran, or from older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub echo_rtt_us: Option<u64>,
    pub throughput_a_to_b_bps: Option<u64>,
    pub throughput_b_to_a_bps: Option<u64>,
    pub errors: u64,
    /// The reports the view was made from (a's, then b's).
    pub reports: Vec<LinkReport>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct PoolView {
    /// Members currently up (this node and alive or suspect peers).
    pub nodes_up: usize,
    pub memory_total: u64,
    pub memory_available: u64,
    pub memory_used_by_shoal: u64,
    /// Sum of the GPU-usable limits of the nodes that report one (macOS).
    pub gpu_memory_limit: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct NearbyNodeView {
    pub id: NodeId,
    pub name: String,
    pub control: Vec<SocketAddr>,
    pub api_port: u16,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct NearbyCluster {
    pub cluster_id: String,
    pub nodes: Vec<NearbyNodeView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ClusterSnapshot {
    pub cluster_id: String,
    pub node_id: NodeId,
    pub nodes: Vec<NodeView>,
    pub links: Vec<LinkView>,
    pub pool: PoolView,
    pub nearby: Vec<NearbyCluster>,
    /// When the active join code expires (the code itself is shown only to whoever created it).
    pub join_code_expires_at_ms: Option<u64>,
}

impl ClusterState {
    pub fn cluster_id(&self) -> String {
        self.membership.cluster_id()
    }

    /// This node and every peer with the RDMA doctor's report each gave (this node's is `mine`), for the
    /// link selection.
    pub fn rdma_reports(&self, mine: Option<&crate::rdma::NodeReport>) -> Vec<crate::rdma::NodeRdma> {
        let name = |id: &NodeId| self.membership.members.get(id).map_or_else(|| id.short(), |m| m.name.clone());
        let mut nodes = vec![crate::rdma::NodeRdma { node: self.me, name: name(&self.me), report: mine.cloned() }];
        nodes.extend(self.peers.iter().map(|(id, p)| crate::rdma::NodeRdma {
            node: *id,
            name: name(id),
            report: p.telemetry.as_ref().and_then(|t| t.rdma.as_deref().cloned()),
        }));
        nodes
    }

    /// The cluster as this node sees it, without its links (the links service adds them).
    pub fn snapshot(&self) -> ClusterSnapshot {
        let now = Instant::now();
        let mut nodes = Vec::new();
        let mut pool = PoolView::default();
        for (id, record) in &self.membership.members {
            let is_self = *id == self.me;
            let peer = self.peers.get(id);
            let status = if is_self {
                NodeStatus::Myself
            } else {
                NodeStatus::from(peer.map_or(PeerStatus::Connecting, |p| p.status))
            };
            let telemetry = if is_self { self.telemetry.clone() } else { peer.and_then(|p| p.telemetry.clone()) };
            let up = is_self || matches!(peer.map(|p| p.status), Some(PeerStatus::Alive | PeerStatus::Suspect));
            if up {
                pool.nodes_up += 1;
                if let Some(t) = &telemetry {
                    pool.memory_total += t.memory_total;
                    pool.memory_available += t.memory_available;
                    pool.memory_used_by_shoal += t.memory_used_by_shoal;
                    pool.gpu_memory_limit += t.gpu_memory_limit.unwrap_or(0);
                }
            }
            nodes.push(NodeView {
                id: *id,
                name: record.name.clone(),
                is_self,
                status,
                control: record.control.clone(),
                api_port: record.api_port,
                last_heard_ms_ago: peer.and_then(|p| p.last_heard).map(|t| now.duration_since(t).as_millis() as u64),
                telemetry,
            });
        }
        let mut nearby: BTreeMap<String, Vec<NearbyNodeView>> = BTreeMap::new();
        for n in self.nearby.values() {
            nearby.entry(n.cluster_id.clone()).or_default().push(NearbyNodeView {
                id: n.id,
                name: n.name.clone(),
                control: n.control.clone(),
                api_port: n.api_port,
            });
        }
        ClusterSnapshot {
            cluster_id: self.cluster_id(),
            node_id: self.me,
            nodes,
            links: Vec::new(),
            pool,
            nearby: nearby.into_iter().map(|(cluster_id, nodes)| NearbyCluster { cluster_id, nodes }).collect(),
            join_code_expires_at_ms: self.code.as_ref().filter(|c| !c.is_expired()).map(|c| c.expires_at_ms),
        }
    }
}

/// Changes, in the order they happen, for the UI and any client of `/api/events`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClusterEvent {
    NodeJoined {
        node: NodeId,
        name: String,
    },
    NodeStatus {
        node: NodeId,
        status: PeerStatus,
    },
    NodeLeft {
        node: NodeId,
    },
    Telemetry {
        node: NodeId,
        telemetry: Box<NodeTelemetry>,
    },
    Links {
        node: NodeId,
        links: Vec<LinkReport>,
    },
    Nearby {
        clusters: Vec<NearbyCluster>,
    },
    JoinAttempt {
        from: String,
        accepted: bool,
        reason: String,
    },
    CodeCreated {
        expires_at_ms: u64,
    },
    CodeRevoked {
        reason: String,
    },
    /// This node now belongs to another cluster (it joined one, or left and started its own).
    ClusterChanged {
        cluster_id: String,
    },
    /// An instance as its owner sees it (launch progress, stage states, stats).
    Instance {
        info: Box<crate::records::InstanceInfo>,
    },
    /// An instance failed (for notifications).
    InstanceFailed {
        instance: String,
        model: String,
        error: String,
    },
    /// A request finished, with its rates.
    RequestFinished {
        model: String,
        report: crate::worker::GenerationReport,
    },
    /// Cluster-wide rates over the last seconds.
    Rates {
        rates: crate::metrics::ClusterRates,
    },
    /// A model download on this node (`POST /api/models/pull`): its progress, then its end.
    ModelPull {
        id: String,
        repo: String,
        /// The layers asked for (`FIRST-LAST`, both included) when only a stage's shard is fetched.
        layers: Option<String>,
        /// The rank asked for (`RANK/NODES`) when only a tensor-parallel node's slice is fetched.
        #[serde(default)]
        rank: Option<String>,
        progress: crate::model::pull::PullProgress,
        /// The downloaded files, once done.
        paths: Vec<std::path::PathBuf>,
        error: Option<String>,
    },
    /// A copy of a model file from another node to this one (`POST /api/models/copy`): its progress,
    /// then its end (the report with the rate, or the error).
    ModelCopy {
        id: String,
        from: NodeId,
        to: NodeId,
        file: String,
        progress: crate::model::peer_copy::CopyProgress,
        done: Option<crate::model::peer_copy::CopyReport>,
        error: Option<String>,
    },
}

impl ClusterEvent {
    pub fn name(&self) -> &'static str {
        match self {
            ClusterEvent::NodeJoined { .. } => "node_joined",
            ClusterEvent::NodeStatus { .. } => "node_status",
            ClusterEvent::NodeLeft { .. } => "node_left",
            ClusterEvent::Telemetry { .. } => "telemetry",
            ClusterEvent::Links { .. } => "links",
            ClusterEvent::Nearby { .. } => "nearby",
            ClusterEvent::JoinAttempt { .. } => "join_attempt",
            ClusterEvent::CodeCreated { .. } => "code_created",
            ClusterEvent::CodeRevoked { .. } => "code_revoked",
            ClusterEvent::ClusterChanged { .. } => "cluster_changed",
            ClusterEvent::Instance { .. } => "instance",
            ClusterEvent::InstanceFailed { .. } => "instance_failed",
            ClusterEvent::RequestFinished { .. } => "request_finished",
            ClusterEvent::Rates { .. } => "rates",
            ClusterEvent::ModelCopy { .. } => "model_copy",
            ClusterEvent::ModelPull { .. } => "model_pull",
        }
    }
}

//! The node agent's cluster runtime: it listens for connections, dials the members it knows, keeps one
//! authenticated control connection to each, watches their health, shares telemetry and link reports,
//! answers joins, and follows mDNS. The membership is one [`ClusterState`] behind a mutex that is never
//! held across an `.await`; the links are their own service ([`Links`]) with their own lock, and model
//! instances are the service attached to the runtime ([`ClusterService`]).

use super::connection;
use super::health::{self, PeerStatus};
use super::join::{self, AcceptError};
use super::links::Links;
use super::membership::{MemberRecord, Membership};
use super::messages::ControlMessage;
use super::pairing::{self, JoinCode, Refusal};
use super::service::{ClusterService, ServiceSlot};
use super::state::{ClusterEvent, ClusterSnapshot, ClusterState, Peer};
use crate::discovery::{Advertisement, DiscoveredNode, Discovery, DiscoveryEvent};
use crate::links::probe;
use crate::net::secure;
use crate::net::{ConnectionKind, NetError};
use crate::node::{DataDir, NodeId, NodeIdentity, TelemetrySampler};
use crate::util::LockExt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};

mod budget;
mod joining;
mod loops;
mod measurements;
mod nearby;

use joining::*;
use loops::*;
pub(super) use measurements::{measure_to, spawn_measurement};
use nearby::*;

/// The API port when none is given; the control port is the next one.
pub const DEFAULT_API_PORT: u16 = 52520;

/// Where to join: a code, and optionally the member to ask (otherwise one found by mDNS).
#[derive(Clone, Debug, PartialEq)]
pub struct JoinTarget {
    pub code: String,
    pub address: Option<String>,
}

impl std::str::FromStr for JoinTarget {
    type Err = String;
    /// `CODE` or `CODE@HOST:PORT`.
    fn from_str(s: &str) -> Result<JoinTarget, String> {
        let (code, address) = match s.split_once('@') {
            Some((c, a)) => (c, Some(a.trim().to_string())),
            None => (s, None),
        };
        let code = pairing::normalize(code).map_err(|e| e.to_string())?;
        Ok(JoinTarget { code, address })
    }
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub data_dir: DataDir,
    pub name: Option<String>,
    pub api_port: u16,
    /// Address the control listener binds (all interfaces by default).
    pub control_bind: IpAddr,
    /// Peers to dial by address (HOST:PORT of their control port), for networks without multicast.
    pub peers: Vec<String>,
    pub mdns: bool,
    /// Caps the memory this node offers to models (--memory-limit).
    pub memory_limit: Option<u64>,
    /// A member down for this long is forgotten (it may join again by reconnecting with the secret).
    pub forget_down_after: Duration,
    /// The device this node's stages compute on.
    pub device: crate::worker::StageDevice,
}

/// How long a member may stay down before the others forget it.
pub const FORGET_DOWN_AFTER: Duration = Duration::from_secs(600);

impl AgentConfig {
    pub fn control_port(&self) -> u16 {
        self.api_port.wrapping_add(1)
    }
}

/// What the cluster runtime of one node owns: who it is, the membership and the health of every peer
/// (`state`, never held across an `.await`), the links service, the event stream, the pairing limiter,
/// the --peer dialing, the worker processes it counts in its memory and the RDMA doctor's report. Model
/// instances are not here: they are the service attached to it ([`ServiceSlot`]), which gets the
/// messages and member failures that concern it.
pub struct Shared {
    pub identity: NodeIdentity,
    pub config: AgentConfig,
    pub state: Mutex<ClusterState>,
    events: broadcast::Sender<ClusterEvent>,
    discovery: Mutex<Option<Discovery>>,
    limiter: Mutex<pairing::RateLimiter>,
    next_connection: AtomicU64,
    /// Bumped whenever this node changes cluster; connections of an older epoch close.
    epoch: watch::Sender<u64>,
    /// Members that left recently: gossip about them is ignored.
    departed: Mutex<BTreeSet<NodeId>>,
    /// Every link of this node: measurements, reports and ring transports.
    pub links: Links,
    static_peers: StaticPeers,
    /// Worker processes whose memory counts as shoal's.
    tracked: Mutex<Vec<u32>>,
    /// The RDMA doctor's latest report on this node.
    rdma: Mutex<Option<Box<crate::rdma::NodeReport>>>,
    /// The service that owns model instances, once attached.
    service: ServiceSlot,
}

pub type Agent = Arc<Shared>;

/// Starts the cluster runtime: loads or creates the identity and membership, binds the control port,
/// starts the service built on it (`service`, which attaches itself before any member can send it
/// anything) and spawns the loops. With `join`, first joins that cluster (and fails if it cannot).
pub async fn start<S>(
    config: AgentConfig,
    join: Option<JoinTarget>,
    service: impl FnOnce(Agent) -> Arc<S>,
) -> anyhow::Result<(Agent, Arc<S>)> {
    let identity = NodeIdentity::load_or_create(&config.data_dir, config.name.as_deref())?;
    let bind = SocketAddr::new(config.control_bind, config.control_port());
    let listener = TcpListener::bind(bind).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on the control port {bind}: {e} (is another node running? pick another --port)")
    })?;
    let me = MemberRecord {
        id: identity.id,
        name: identity.name.clone(),
        control: control_addresses(&config),
        api_port: config.api_port,
    };
    let mut membership = match Membership::load(&config.data_dir)? {
        Some(m) => m,
        None => {
            let m = Membership::new_cluster(me.clone());
            m.save(&config.data_dir)?;
            m
        }
    };
    membership.upsert(me.clone());
    let discovery = if config.mdns {
        match Discovery::start() {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!("{e}; continuing without mDNS (use --peer or --join CODE@HOST:PORT)");
                None
            }
        }
    } else {
        None
    };
    let (epoch, _) = watch::channel(0);
    let shared = Arc::new(Shared {
        state: Mutex::new(ClusterState {
            me: identity.id,
            membership,
            peers: BTreeMap::new(),
            telemetry: None,
            discovered: BTreeMap::new(),
            nearby: BTreeMap::new(),
            static_routes: BTreeMap::new(),
            code: None,
        }),
        links: Links::new(identity.id),
        identity,
        config,
        events: broadcast::channel(1024).0,
        discovery: Mutex::new(discovery),
        limiter: Mutex::new(pairing::RateLimiter::default()),
        next_connection: AtomicU64::new(1),
        epoch,
        departed: Mutex::new(BTreeSet::new()),
        static_peers: StaticPeers::default(),
        tracked: Mutex::new(Vec::new()),
        rdma: Mutex::new(None),
        service: ServiceSlot::default(),
    });
    let service = service(shared.clone());
    if let Some(target) = join {
        shared.join(target).await?;
    }
    shared.save();
    shared.readvertise();
    tokio::spawn(accept_loop(shared.clone(), listener));
    tokio::spawn(dial_loop(shared.clone()));
    tokio::spawn(health_loop(shared.clone()));
    tokio::spawn(telemetry_loop(shared.clone()));
    tokio::spawn(doctor_loop(shared.clone()));
    start_browsing(&shared);
    tracing::info!(
        "node {} ({}) in cluster {}, control port {}",
        shared.identity.name,
        shared.identity.id.short(),
        shared.cluster_id(),
        shared.config.control_port()
    );
    Ok((shared, service))
}

/// The control addresses this node can be reached at.
fn control_addresses(config: &AgentConfig) -> Vec<SocketAddr> {
    let port = config.control_port();
    if !config.control_bind.is_unspecified() {
        return vec![SocketAddr::new(config.control_bind, port)];
    }
    let mut ips: Vec<IpAddr> = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.ip())
        .filter(|ip| ip.is_ipv4() && !ip.is_loopback())
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect()
}

impl Shared {
    pub fn id(&self) -> NodeId {
        self.identity.id
    }

    pub fn cluster_id(&self) -> String {
        self.state.locked().cluster_id()
    }

    /// The cluster as this node sees it: the membership's view, then the links between its members.
    pub fn snapshot(&self) -> ClusterSnapshot {
        let mut snapshot = self.state.locked().snapshot();
        let members: Vec<NodeId> = snapshot.nodes.iter().map(|n| n.id).collect();
        snapshot.links = self.links.views(&members);
        snapshot
    }

    pub fn subscribe(&self) -> broadcast::Receiver<ClusterEvent> {
        self.events.subscribe()
    }

    /// Attaches the service that owns model instances: the runtime hands it the messages it does not
    /// handle itself and the members it finds down.
    pub fn attach(&self, service: std::sync::Weak<dyn ClusterService>) {
        self.service.attach(service);
    }

    pub(super) fn service(&self) -> Option<Arc<dyn ClusterService>> {
        self.service.get()
    }

    /// Whether `node` is this node or a member the failure detector has not found down.
    pub fn is_up(&self, node: NodeId) -> bool {
        let state = self.state.locked();
        node == state.me || state.peers.get(&node).is_some_and(|p| p.status != PeerStatus::Down)
    }

    /// Sends `message` to `peer` on its control connection; false when there is none.
    pub fn send_to(&self, peer: NodeId, message: ControlMessage) -> bool {
        let state = self.state.locked();
        state.peers.get(&peer).and_then(|p| p.connection.as_ref()).is_some_and(|c| c.tx.send(message).is_ok())
    }

    /// Whether `ip` is an address a known member listens on or was last connected from (its
    /// connections get handshake slots of their own).
    pub(super) fn is_member_address(&self, ip: IpAddr) -> bool {
        let seen = self.links.remote_addresses();
        let state = self.state.locked();
        let me = state.me;
        let records = state.membership.members.values().filter(|m| m.id != me);
        budget::member_addresses(records, seen.into_iter()).contains(&ip)
    }

    /// The IP this node reaches `peer` at.
    pub fn peer_ip(&self, peer: NodeId) -> Option<IpAddr> {
        let state = self.state.locked();
        state.peers.get(&peer).and_then(|p| p.connection.as_ref()).map(|c| c.peer_control.ip())
    }

    /// The address `peer`'s agent listens at (for connections of other kinds than control).
    pub fn peer_control(&self, peer: NodeId) -> Option<SocketAddr> {
        let state = self.state.locked();
        state.peers.get(&peer).and_then(|p| p.connection.as_ref()).map(|c| c.peer_control)
    }

    pub fn secret_bytes(&self) -> [u8; 32] {
        self.secret()
    }

    /// Counts process `pid` (a worker) in this node's shoal memory.
    pub fn track_process(&self, pid: u32) {
        self.tracked.locked().push(pid);
    }

    pub fn emit(&self, event: ClusterEvent) {
        let _ = self.events.send(event);
    }

    pub(super) fn epoch(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    pub(super) fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    pub fn my_record(&self) -> MemberRecord {
        MemberRecord {
            id: self.identity.id,
            name: self.identity.name.clone(),
            control: control_addresses(&self.config),
            api_port: self.config.api_port,
        }
    }

    pub(super) fn save(&self) {
        let membership = self.state.locked().membership.clone();
        if let Err(e) = membership.save(&self.config.data_dir) {
            tracing::error!("{}", crate::errors::chain(&e));
        }
    }

    pub(super) fn is_departed(&self, id: NodeId) -> bool {
        self.departed.locked().contains(&id)
    }

    /// Sends `message` on every live control connection.
    pub fn broadcast(&self, message: ControlMessage) {
        let state = self.state.locked();
        for peer in state.peers.values() {
            if let Some(c) = &peer.connection {
                let _ = c.tx.send(message.clone());
            }
        }
    }

    /// Publishes this node's mDNS record with the current cluster id (a no-op when unchanged).
    pub(super) fn readvertise(&self) {
        let ad = Advertisement {
            id: self.identity.id,
            name: self.identity.name.clone(),
            cluster_id: self.cluster_id(),
            api_port: self.config.api_port,
            control_port: self.config.control_port(),
        };
        if let Some(d) = self.discovery.locked().as_mut() {
            if let Err(e) = d.advertise(&ad) {
                tracing::warn!("{e}");
            }
        }
    }

    /// A peer proved it holds the secret: make sure it is a member (and tell the others if it is new).
    pub(super) fn admit(&self, record: MemberRecord) {
        self.departed.locked().remove(&record.id);
        let (new, changed) = {
            let mut state = self.state.locked();
            let new = !state.membership.members.contains_key(&record.id);
            let changed = state.membership.upsert(record.clone());
            state.peers.entry(record.id).or_default();
            (new, changed)
        };
        if changed {
            self.save();
        }
        if new {
            self.emit(ClusterEvent::NodeJoined { node: record.id, name: record.name.clone() });
            self.gossip();
        }
    }

    /// Learns members from a peer's list (only members this node does not know yet: each member is the
    /// authority on its own record, which it sends in its Hello).
    pub(super) fn learn_members(&self, members: Vec<MemberRecord>) {
        let mut added = Vec::new();
        {
            let mut state = self.state.locked();
            for m in members {
                if m.id == state.me || state.membership.members.contains_key(&m.id) || self.is_departed(m.id) {
                    continue;
                }
                if let Err(why) = m.check() {
                    tracing::warn!("ignoring a gossiped member {}: {why}", m.id.short());
                    continue;
                }
                if state.membership.members.len() >= super::membership::MAX_MEMBERS {
                    tracing::warn!(
                        "ignoring gossiped members: this node knows {} already",
                        super::membership::MAX_MEMBERS
                    );
                    break;
                }
                state.membership.members.insert(m.id, m.clone());
                state.peers.entry(m.id).or_default();
                added.push(m);
            }
        }
        if !added.is_empty() {
            self.save();
            for m in added {
                self.emit(ClusterEvent::NodeJoined { node: m.id, name: m.name });
            }
            self.gossip();
        }
    }

    /// A member said it is leaving for good.
    pub(super) fn forget(&self, id: NodeId) {
        self.departed.locked().insert(id);
        {
            let mut state = self.state.locked();
            state.membership.members.remove(&id);
            state.peers.remove(&id);
            state.static_routes.remove(&id);
        }
        self.links.forget(id);
        self.save();
        self.emit(ClusterEvent::NodeLeft { node: id });
    }

    pub(super) fn gossip(&self) {
        let members: Vec<MemberRecord> = self.state.locked().membership.members.values().cloned().collect();
        self.broadcast(ControlMessage::Members { members });
    }

    pub(super) fn set_status(&self, peer: &mut Peer, id: NodeId, status: PeerStatus) {
        if peer.status != status {
            peer.status = status;
            self.emit(ClusterEvent::NodeStatus { node: id, status });
        }
    }

    fn secret(&self) -> [u8; 32] {
        *self.state.locked().membership.secret.bytes()
    }
}

//! The agent's background loops: accepting connections, dialing members, health, telemetry and the
//! RDMA doctor.

use super::*;

/// `step` of a connection before it proved it holds the secret, within the pre-authentication deadline.
async fn pre_auth<T>(step: impl std::future::Future<Output = Result<T, NetError>>) -> Result<T, NetError> {
    tokio::time::timeout(budget::PRE_AUTH_DEADLINE, step).await.map_err(|_| NetError::Timeout)?
}

/// How long a join connection may take, from its preamble to the member's welcome.
const JOIN_DEADLINE: Duration = Duration::from_secs(10);

pub(super) async fn accept_loop(shared: Agent, listener: TcpListener) {
    let budget = Arc::new(budget::HandshakeBudget::default());
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let member = shared.is_member_address(from.ip());
        let Some(slot) = budget.take(from.ip(), member) else {
            tracing::debug!("refused a connection from {from}: its handshake budget is spent");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = handle_incoming(shared, stream, from, slot).await {
                tracing::info!("closed a connection from {from}: {e}");
            }
        });
    }
}

pub(super) async fn handle_incoming(
    shared: Agent,
    mut stream: TcpStream,
    from: SocketAddr,
    permit: budget::Slot,
) -> Result<(), NetError> {
    stream.set_nodelay(true)?;
    let preamble = pre_auth(secure::read_preamble(&mut stream)).await?;
    match preamble.kind {
        ConnectionKind::Member => {
            let (reader, writer) = pre_auth(secure::respond(stream, preamble, &shared.secret())).await?;
            drop(permit);
            connection::run(shared, reader, writer, connection::Origin::Accepted).await;
            Ok(())
        }
        ConnectionKind::LinkProbe => {
            let (reader, writer) = pre_auth(secure::respond(stream, preamble, &shared.secret())).await?;
            drop(permit);
            shared.serve_probe(reader, writer).await
        }
        // The join exchange (key agreement, handshake, the joiner's introduction) keeps its slot; it is
        // rate-limited per address inside.
        ConnectionKind::Join => {
            let joined = tokio::time::timeout(JOIN_DEADLINE, serve_join(shared, stream, from)).await;
            drop(permit);
            joined.map_err(|_| NetError::Timeout)?
        }
        ConnectionKind::Stage => Err(NetError::BadPreamble("stage connections go to the workers".into())),
        ConnectionKind::ModelCopy => {
            let (reader, writer) = pre_auth(secure::respond(stream, preamble, &shared.secret())).await?;
            drop(permit);
            let _busy = shared.links.bulk_guard();
            let library = crate::model::library::Library::new(&shared.config.data_dir);
            crate::model::peer_copy::serve(reader, writer, library).await
        }
    }
}

/// The --peer addresses: whether they are dialed still (joining a cluster stops that), which are being
/// dialed now, and which were tried at least once.
pub(super) struct StaticPeers {
    on: std::sync::atomic::AtomicBool,
    pub dialing: Mutex<BTreeSet<SocketAddr>>,
    pub tried: Mutex<BTreeSet<String>>,
}

impl Default for StaticPeers {
    fn default() -> StaticPeers {
        StaticPeers { on: true.into(), dialing: Mutex::default(), tried: Mutex::default() }
    }
}

impl StaticPeers {
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
    }
}

/// Dials members without a connection (the lower id first; the higher after a grace period, in case the
/// lower cannot reach it), --peer addresses, and same-cluster nodes seen by mDNS.
pub(super) async fn dial_loop(shared: Agent) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let me = shared.id();
        let mut to_dial: Vec<(NodeId, Vec<SocketAddr>)> = Vec::new();
        {
            let mut state = shared.state.locked();
            let members: Vec<(NodeId, Vec<SocketAddr>)> =
                state.membership.members.values().filter(|m| m.id != me).map(|m| (m.id, m.control.clone())).collect();
            let discovered: Vec<(NodeId, Vec<SocketAddr>)> =
                state.discovered.values().map(|d| (d.id, d.control.clone())).collect();
            for (id, addresses) in members.into_iter().chain(discovered) {
                let route = state.static_routes.get(&id).copied();
                let found = state.discovered.get(&id).map(|d| d.control.clone()).unwrap_or_default();
                let peer = state.peers.entry(id).or_default();
                if peer.connection.is_some() || peer.dialing {
                    continue;
                }
                let quiet = peer.last_heard.map_or(peer.watched_since.elapsed(), |t| t.elapsed());
                if me > id && quiet < health::SUSPECT_AFTER {
                    continue;
                }
                peer.dialing = true;
                let mut candidates: Vec<SocketAddr> = route.into_iter().chain(addresses).chain(found).collect();
                let mut seen = BTreeSet::new();
                candidates.retain(|a| seen.insert(*a));
                to_dial.push((id, candidates));
            }
        }
        // --peer addresses are the user's explicit routes: members are dialed by their other addresses
        // only once each of them has been tried.
        let statics_tried = shared.config.peers.iter().all(|p| shared.static_peers.tried.locked().contains(p));
        for (id, candidates) in to_dial {
            if statics_tried || !shared.static_peers.is_on() {
                tokio::spawn(dial_member(shared.clone(), id, candidates));
            } else if let Some(p) = shared.state.locked().peers.get_mut(&id) {
                p.dialing = false;
            }
        }
        if shared.static_peers.is_on() {
            for address in &shared.config.peers {
                let Ok(addr) = resolve(address, shared.config.control_port()).await else {
                    shared.static_peers.tried.locked().insert(address.clone());
                    continue;
                };
                let connected = {
                    let state = shared.state.locked();
                    state
                        .static_routes
                        .iter()
                        .any(|(id, a)| *a == addr && state.peers.get(id).is_some_and(|p| p.connection.is_some()))
                };
                if connected || !shared.static_peers.dialing.locked().insert(addr) {
                    continue;
                }
                tokio::spawn(dial_static(shared.clone(), addr, address.clone()));
            }
        }
    }
}

pub(super) async fn dial_member(shared: Agent, id: NodeId, candidates: Vec<SocketAddr>) {
    let secret = shared.secret();
    for addr in candidates {
        match secure::connect(addr, ConnectionKind::Member, &secret).await {
            Ok((reader, writer)) => {
                connection::run(shared.clone(), reader, writer, connection::Origin::Dialed(addr)).await;
                break;
            }
            Err(e) => {
                tracing::debug!("dialing {} at {addr}: {e}", id.short());
                shared.links.failed(id);
            }
        }
    }
    if let Some(p) = shared.state.locked().peers.get_mut(&id) {
        p.dialing = false;
    }
}

pub(super) async fn dial_static(shared: Agent, addr: SocketAddr, address: String) {
    let secret = shared.secret();
    match secure::connect(addr, ConnectionKind::Member, &secret).await {
        Ok((reader, writer)) => {
            shared.static_peers.tried.locked().insert(address);
            connection::run(shared.clone(), reader, writer, connection::Origin::DialedPeerOption(addr)).await
        }
        Err(e) => {
            shared.static_peers.tried.locked().insert(address);
            tracing::debug!("dialing --peer {addr}: {e}")
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    shared.static_peers.dialing.locked().remove(&addr);
}

/// Moves peers through alive → suspect → down as silence grows, and expires the join code.
pub(super) async fn health_loop(shared: Agent) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let mut code_expired = false;
        let mut went_down = Vec::new();
        let mut expired = Vec::new();
        let members = {
            let mut guard = shared.state.locked();
            let state = &mut *guard;
            let members: BTreeSet<NodeId> = state.membership.members.keys().copied().collect();
            state.peers.retain(|id, _| members.contains(id));
            for (id, peer) in state.peers.iter_mut() {
                let silence = peer.last_heard.map_or(peer.watched_since.elapsed(), |t| t.elapsed());
                let status = health::status_after(silence, peer.last_heard.is_some());
                if status == PeerStatus::Down && peer.status != PeerStatus::Down {
                    went_down.push(*id);
                }
                if status == PeerStatus::Down && peer.connection.is_none() && silence >= shared.config.forget_down_after
                {
                    expired.push(*id);
                }
                shared.set_status(peer, *id, status);
            }
            if state.code.as_ref().is_some_and(|c| c.is_expired()) {
                state.code = None;
                code_expired = true;
            }
            members
        };
        shared.links.retain(&members);
        if code_expired {
            shared.emit(ClusterEvent::CodeRevoked { reason: "expired".into() });
        }
        if let Some(service) = shared.service() {
            for peer in went_down {
                service.clone().on_peer_down(peer);
            }
        }
        for peer in expired {
            tracing::info!(
                "forgetting member {}: down for more than {:?} (it rejoins by reconnecting)",
                peer.short(),
                shared.config.forget_down_after
            );
            shared.forget(peer);
        }
    }
}

/// Samples this node's telemetry every second and shares it, with this node's link reports.
pub(super) async fn telemetry_loop(shared: Agent) {
    let limit = shared.config.memory_limit;
    let device = shared.config.device.name.clone();
    let Ok(mut sampler) = tokio::task::spawn_blocking(move || TelemetrySampler::new(limit, device.as_deref())).await
    else {
        return;
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for pid in std::mem::take(&mut *shared.tracked.locked()) {
            sampler.track_process(pid);
        }
        let mut telemetry = sampler.sample();
        telemetry.rdma = shared.rdma.locked().clone();
        let nodes = {
            let mut state = shared.state.locked();
            state.telemetry = Some(telemetry.clone());
            state.rdma_reports(telemetry.rdma.as_deref())
        };
        shared.links.choose_transports(nodes, crate::util::now_ms());
        let links = shared.links.my_reports();
        shared.broadcast(ControlMessage::Telemetry { telemetry: telemetry.clone() });
        shared.broadcast(ControlMessage::Links { links: links.clone() });
        shared.emit(ClusterEvent::Telemetry { node: shared.id(), telemetry: Box::new(telemetry) });
        shared.emit(ClusterEvent::Links { node: shared.id(), links });
    }
}

/// Runs the RDMA doctor when the node starts and again whenever this machine's network interfaces change
/// (a Thunderbolt cable plugged in or out, an address given to a bridge). The doctor's tools are processes,
/// system_profiler a slow one, so they do not run on a timer; the interfaces are read every few seconds
/// without one (getifaddrs). Enabling RDMA takes a restart, after which the doctor runs again anyway.
pub(super) async fn doctor_loop(shared: Agent) {
    let mut examined: Option<crate::links::Interfaces> = None;
    loop {
        let now = crate::links::Interfaces::read();
        if examined.as_ref() != Some(&now) {
            let captures = tokio::task::spawn_blocking(crate::rdma::Captures::live).await;
            if let Ok(captures) = captures {
                *shared.rdma.locked() = Some(Box::new(crate::rdma::doctor(&captures)));
            }
            examined = Some(now);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

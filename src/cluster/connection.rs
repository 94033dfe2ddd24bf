//! One authenticated control connection to a peer: the Hello exchange, registration (of two connections
//! between a pair, the one opened by the lower id stays), pings every 250 ms for health and round-trip
//! times, and the handling of everything the peer sends. Malformed input closes the connection with the
//! reason logged; a connection silent for longer than the down threshold is closed too.

use super::agent::{measure_to, spawn_measurement, Agent};
use super::health::{self, PeerStatus};
use super::messages::{self, ControlMessage, MAX_CONTROL_FRAME};
use super::state::{ClusterEvent, Connection};
use crate::net::{NetError, SecureReader, SecureWriter};
use crate::node::NodeId;
use crate::util::LockExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Why a control connection ended.
#[derive(Debug)]
enum CloseReason {
    /// This node joined or left a cluster: connections of the old one end.
    ChangedCluster,
    Silent,
    ClosedByPeer,
    /// The peer said it is leaving for good (the only ending that is not a fault).
    Left,
    SecondHello,
    Network(NetError),
    Malformed(messages::MessageError),
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::ChangedCluster => write!(f, "this node changed cluster"),
            CloseReason::Silent => write!(f, "silent for {:?}", health::DOWN_AFTER),
            CloseReason::ClosedByPeer => write!(f, "closed by the peer"),
            CloseReason::Left => write!(f, "left the cluster"),
            CloseReason::SecondHello => write!(f, "a second Hello"),
            CloseReason::Network(e) => write!(f, "{e}"),
            CloseReason::Malformed(e) => write!(f, "{e}"),
        }
    }
}

/// How a connection came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Accepted,
    /// This node dialed a member's address.
    Dialed(SocketAddr),
    /// This node dialed an address given with --peer (preferred for that member from now on).
    DialedPeerOption(SocketAddr),
}

/// Runs a connection until it ends.
pub async fn run(shared: Agent, mut reader: SecureReader, mut writer: SecureWriter, origin: Origin) {
    let dialed = match origin {
        Origin::Accepted => None,
        Origin::Dialed(a) | Origin::DialedPeerOption(a) => Some(a),
    };
    let mut epoch = shared.epoch();
    let my_epoch = *epoch.borrow();
    let hello = messages::encode(&ControlMessage::Hello { node: shared.my_record() });
    if writer.write_frame(&hello).await.is_err() {
        return;
    }
    let first = tokio::time::timeout(crate::net::HANDSHAKE_TIMEOUT, reader.read_frame(MAX_CONTROL_FRAME)).await;
    let mut record = match first.map(|f| f.map(|f| messages::decode::<ControlMessage>(&f))) {
        Ok(Ok(Ok(ControlMessage::Hello { node }))) => node,
        other => {
            tracing::info!("closing a connection that did not start with Hello: {other:?}");
            return;
        }
    };
    if let Err(why) = record.check() {
        tracing::warn!("closing a connection from a member that introduced itself badly: {why}");
        return;
    }
    let me = shared.id();
    if record.id == me {
        return; // This node reached itself (through an advertised address).
    }
    let remote = reader.peer_addr();
    let peer_control = match (dialed, remote) {
        (Some(addr), _) => addr,
        (None, Some(remote)) => {
            let port = record.control.first().map_or(shared.config.control_port(), |a| a.port());
            let addr = SocketAddr::new(remote.ip(), port);
            if !record.control.contains(&addr) {
                record.control.insert(0, addr);
            }
            addr
        }
        (None, None) => return,
    };
    let dialer = if dialed.is_some() { me } else { record.id };
    let peer_id = record.id;
    if *epoch.borrow() != my_epoch {
        return;
    }
    shared.admit(record);

    let (tx, rx) = mpsc::unbounded_channel();
    let connection_id = shared.next_connection_id();
    let local = reader.local_addr();
    {
        let mut state = shared.state.locked();
        if let Origin::DialedPeerOption(_) = origin {
            state.static_routes.insert(peer_id, peer_control);
        }
        let peer = state.peers.entry(peer_id).or_default();
        if let Some(existing) = &peer.connection {
            let keep_existing = existing.dialer == me.min(peer_id) && dialer != me.min(peer_id);
            if keep_existing {
                return;
            }
        }
        peer.connection = Some(Connection { id: connection_id, dialer, tx: tx.clone(), peer_control });
        peer.last_heard = Some(Instant::now());
        shared.set_status(peer, peer_id, PeerStatus::Alive);
    };
    let first_contact = shared.links.connected(peer_id, local, remote);
    tracing::info!("connected to {} ({:?})", peer_id.short(), remote);
    if first_contact {
        let jitter = Duration::from_millis(200 + rand::random_range(0..800));
        spawn_measurement(shared.clone(), peer_id, jitter);
    }
    let writer_task = tokio::spawn(write_loop(writer, rx));
    let pings: Arc<Mutex<HashMap<u64, (Instant, bool)>>> = Arc::default();
    let ping_task = tokio::spawn(ping_loop(shared.clone(), tx.clone(), pings.clone()));
    shared.gossip();
    let telemetry = shared.state.locked().telemetry.clone();
    if let Some(telemetry) = telemetry {
        let _ = tx.send(ControlMessage::Telemetry { telemetry });
    }
    if let Some(service) = shared.service() {
        service.on_peer_connected(peer_id);
    }

    let reason = loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(health::DOWN_AFTER, reader.read_frame(MAX_CONTROL_FRAME)) => frame,
            _ = epoch.changed() => break CloseReason::ChangedCluster,
        };
        let frame = match frame {
            Err(_) => break CloseReason::Silent,
            Ok(Err(NetError::Closed)) => break CloseReason::ClosedByPeer,
            Ok(Err(e)) => break CloseReason::Network(e),
            Ok(Ok(frame)) => frame,
        };
        let message = match messages::decode::<ControlMessage>(&frame) {
            Ok(m) => m,
            Err(e) => break CloseReason::Malformed(e),
        };
        if let Some(reason) = handle(&shared, peer_id, message, &tx, &pings) {
            break reason;
        }
    };
    ping_task.abort();
    let graceful = matches!(reason, CloseReason::Left);
    let was_current = {
        let mut state = shared.state.locked();
        let peer = state.peers.get_mut(&peer_id);
        peer.filter(|p| p.connection.as_ref().is_some_and(|c| c.id == connection_id)).map(|p| p.connection = None)
    };
    if was_current.is_some() {
        shared.links.disconnected(peer_id, !graceful);
    }
    drop(tx);
    let _ = writer_task.await;
    tracing::info!("connection to {} ended: {reason}", peer_id.short());
}

/// Handles one message; returns why to close the connection, if it must close.
fn handle(
    shared: &Agent,
    peer_id: NodeId,
    message: ControlMessage,
    tx: &mpsc::UnboundedSender<ControlMessage>,
    pings: &Mutex<HashMap<u64, (Instant, bool)>>,
) -> Option<CloseReason> {
    let now = Instant::now();
    {
        let mut state = shared.state.locked();
        if let Some(peer) = state.peers.get_mut(&peer_id) {
            peer.last_heard = Some(now);
            shared.set_status(peer, peer_id, PeerStatus::Alive);
        }
    }
    match message {
        ControlMessage::Hello { .. } => return Some(CloseReason::SecondHello),
        ControlMessage::Ping { seq } => {
            let _ = tx.send(ControlMessage::Pong { seq, busy: shared.links.in_bulk_transfer() });
        }
        ControlMessage::Pong { seq, busy } => {
            let sent = pings.locked().remove(&seq);
            // A round trip that overlapped a bulk transfer at either end measures the queue, not the link.
            if let Some((sent, busy_then)) = sent.filter(|_| !busy && !shared.links.in_bulk_transfer()) {
                if !busy_then {
                    shared.links.record_rtt(peer_id, now.duration_since(sent));
                }
            }
        }
        ControlMessage::Telemetry { telemetry } => {
            if let Some(peer) = shared.state.locked().peers.get_mut(&peer_id) {
                peer.telemetry = Some(telemetry.clone());
            }
            shared.emit(ClusterEvent::Telemetry { node: peer_id, telemetry: Box::new(telemetry) });
        }
        ControlMessage::Links { links } => {
            shared.links.reported(peer_id, links.clone());
            shared.emit(ClusterEvent::Links { node: peer_id, links });
        }
        ControlMessage::Members { members } => shared.learn_members(members),
        ControlMessage::MeasureLink { peer, request } => {
            let (shared, tx) = (shared.clone(), tx.clone());
            tokio::spawn(async move {
                let bps = measure_to(&shared, peer).await;
                let _ = tx.send(ControlMessage::LinkMeasured { request, bps });
            });
        }
        ControlMessage::LinkMeasured { request, bps } => shared.links.answer_measurement(request, bps),
        ControlMessage::Leaving => {
            shared.forget(peer_id);
            return Some(CloseReason::Left);
        }
        other => {
            if let Some(service) = shared.service() {
                service.on_message(peer_id, other);
            }
        }
    }
    None
}

async fn write_loop(mut writer: SecureWriter, mut rx: mpsc::UnboundedReceiver<ControlMessage>) {
    while let Some(message) = rx.recv().await {
        if writer.write_frame(&messages::encode(&message)).await.is_err() {
            break;
        }
    }
}

async fn ping_loop(
    shared: Agent,
    tx: mpsc::UnboundedSender<ControlMessage>,
    pings: Arc<Mutex<HashMap<u64, (Instant, bool)>>>,
) {
    let mut tick = tokio::time::interval(health::PING_INTERVAL);
    let mut seq = 0u64;
    loop {
        tick.tick().await;
        seq += 1;
        {
            let mut pending = pings.locked();
            pending.retain(|_, (sent, _)| sent.elapsed() < Duration::from_secs(10));
            pending.insert(seq, (Instant::now(), shared.links.in_bulk_transfer()));
        }
        if tx.send(ControlMessage::Ping { seq }).is_err() {
            return;
        }
    }
}

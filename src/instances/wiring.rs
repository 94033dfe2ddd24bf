//! Connecting an instance's stages: which connections the owner orders as its stages report that they
//! listen and are ready (each tensor-parallel group's ranks to each other, then the ring between the
//! ring's stages), and a node's own workers told where to connect.

use super::service::Instances;
use super::InstanceInfo;
use crate::cluster::messages::ControlMessage;
use crate::node::NodeId;
use crate::worker::WorkerCommand;
use std::net::SocketAddr;
use std::sync::Arc;

/// A group's stages and where each listens, in rank order.
pub(super) type GroupWiring = (Vec<usize>, Vec<(NodeId, u16)>);
/// The ring's stages in order: each one's leading stage, its node and its data port.
pub(super) type RingWiring = Vec<(usize, NodeId, u16)>;

/// What a launching instance's latest report lets the owner connect: once every stage listens
/// (`port_reported` by the last of them), each group's ranks to each other; and the ring between the
/// ring's stages (each the leading stage, node and data port) at once when the ring has no group, else
/// once every group's followers have linked (`became_ready`, the last of them): until then a leader's
/// data port belongs to its group's handshakes, and a ring connection would be read as a rank's.
pub(super) fn wiring(
    info: &InstanceInfo,
    stage: usize,
    port_reported: bool,
    became_ready: bool,
) -> (Option<Vec<GroupWiring>>, Option<RingWiring>) {
    let ring = info.plan.ring();
    let port = |i: usize| Some((info.stages[i].node, info.stages[i].data_port?));
    let listening = info.stages.iter().all(|s| s.data_port.is_some());
    let grouped: Vec<&Vec<usize>> = ring.iter().filter(|g| g.len() > 1).collect();
    let leaders = || -> Option<RingWiring> {
        let leaders: Option<Vec<_>> = ring.iter().map(|g| port(g[0]).map(|(node, p)| (g[0], node, p))).collect();
        leaders.filter(|l| l.len() > 1)
    };
    let groups = (port_reported && listening && !grouped.is_empty())
        .then(|| grouped.iter().map(|g| ((*g).clone(), g.iter().filter_map(|&i| port(i)).collect())).collect());
    let followers_ready = grouped.iter().flat_map(|g| &g[1..]).all(|&i| info.stages[i].state.is_ready());
    let is_follower = grouped.iter().any(|g| g[1..].contains(&stage));
    let ring_now = if grouped.is_empty() {
        port_reported && listening
    } else {
        became_ready && is_follower && followers_ready && listening
    };
    (groups, if ring_now { leaders() } else { None })
}

/// Orders the connections `groups` and `ring` (from [`wiring`]): each rank's and each ring stage's own
/// node is told, this node's workers directly.
pub(super) fn order_connections(
    instances: &Arc<Instances>,
    instance: &str,
    groups: Vec<GroupWiring>,
    ring: RingWiring,
) {
    for (stages, peers) in groups {
        for (&i, &(node, _)) in stages.iter().zip(&peers) {
            if node == instances.agent.id() {
                connect_group_local(instances, instance, i, &peers);
            } else {
                let message =
                    ControlMessage::ConnectGroup { instance: instance.to_string(), stage: i, peers: peers.clone() };
                instances.agent.send_to(node, message);
            }
        }
    }
    for (i, &(stage, node, _)) in ring.iter().enumerate() {
        let (_, next_node, next_port) = ring[(i + 1) % ring.len()];
        if node == instances.agent.id() {
            connect_local(instances, instance, stage, next_node, next_port);
        } else {
            let message = ControlMessage::ConnectStage { instance: instance.to_string(), stage, next_node, next_port };
            instances.agent.send_to(node, message);
        }
    }
}

/// Tells a local worker where the next stage listens.
pub(super) fn connect_local(
    instances: &Arc<Instances>,
    instance: &str,
    stage: usize,
    next_node: NodeId,
    next_port: u16,
) {
    let ip = if next_node == instances.agent.id() {
        Some(std::net::IpAddr::from([127, 0, 0, 1]))
    } else {
        instances.agent.peer_ip(next_node)
    };
    let handle = instances.registry().local.get_mut(&(instance.to_string(), stage)).map(|l| {
        l.next = Some(next_node);
        l.handle.clone()
    });
    let (Some(ip), Some(handle)) = (ip, handle) else { return };
    let next = SocketAddr::new(ip, next_port);
    let rdma = if next_node == instances.agent.id() { None } else { instances.agent.links.ring_route(next_node) };
    tokio::spawn(async move {
        let _ = handle.command(&WorkerCommand::Connect { next, rdma }).await;
    });
}

/// Tells a local rank of a tensor-parallel group where every rank listens.
pub(super) fn connect_group_local(instances: &Arc<Instances>, instance: &str, stage: usize, peers: &[(NodeId, u16)]) {
    let me = instances.agent.id();
    let addresses: Option<Vec<SocketAddr>> = peers
        .iter()
        .map(|&(node, port)| {
            let ip =
                if node == me { Some(std::net::IpAddr::from([127, 0, 0, 1])) } else { instances.agent.peer_ip(node) };
            ip.map(|ip| SocketAddr::new(ip, port))
        })
        .collect();
    // RDMA where the agent chose it for the link to the rank's node (never between ranks on this node).
    let rdma =
        peers.iter().map(|&(node, _)| if node == me { None } else { instances.agent.links.ring_route(node) }).collect();
    let handle = instances.registry().local.get_mut(&(instance.to_string(), stage)).map(|l| {
        l.group = peers.iter().map(|&(node, _)| node).collect();
        l.handle.clone()
    });
    let (Some(peers), Some(handle)) = (addresses, handle) else { return };
    tokio::spawn(async move {
        let _ = handle.command(&WorkerCommand::ConnectGroup { peers, rdma }).await;
    });
}

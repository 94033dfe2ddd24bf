//! Which cluster events deserve a desktop notification, worded for people: a node joined, went down or
//! came back, a link started failing or fell back from RDMA to TCP, a model became ready, lost a node
//! and is being placed again, was placed again, or failed. Each happening gives at most one
//! notice (a status is reported on its change only; a failing link at most once per
//! [`LINK_NOTICE_INTERVAL_MS`]). Whether to show it (not while the window has focus) is the app's call.

use crate::cluster::{ClusterEvent, ClusterSnapshot, NodeStatus, PeerStatus};
use crate::instances::InstanceState;
use crate::links::LinkReport;
use crate::node::NodeId;
use crate::transport::select::LinkTransport;
use std::collections::{HashMap, HashSet};

/// A failing link is notified again only after this long.
pub const LINK_NOTICE_INTERVAL_MS: u64 = 10 * 60 * 1000;
/// Errors on a link count as failing only while they go on this long with both ends up: a node that
/// stops breaks its links at once, and is reported down (not its links) 2.5 s later.
pub const LINK_FAILING_AFTER_MS: u64 = 4_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub title: String,
    pub body: String,
}

impl Notice {
    fn new(title: impl Into<String>, body: impl Into<String>) -> Notice {
        Notice { title: title.into(), body: body.into() }
    }
}

#[derive(Default)]
pub struct NoticeBoard {
    me: Option<NodeId>,
    names: HashMap<NodeId, String>,
    members: HashSet<NodeId>,
    down: HashSet<NodeId>,
    instance_states: HashMap<String, InstanceState>,
    link_errors: HashMap<(NodeId, NodeId), u64>,
    link_noticed_at: HashMap<(NodeId, NodeId), u64>,
    /// When a link's current run of errors began.
    link_failing_since: HashMap<(NodeId, NodeId), u64>,
    /// Links whose last report said RDMA.
    on_rdma: HashSet<(NodeId, NodeId)>,
}

impl NoticeBoard {
    /// Starts from what the cluster is now, so what was already so is not announced.
    pub fn new(snapshot: &ClusterSnapshot) -> NoticeBoard {
        let mut board = NoticeBoard::default();
        board.reset(snapshot);
        board
    }

    /// Forgets what changed while events were missed (the event stream lagged, or the node changed
    /// cluster) and starts again from `snapshot`.
    pub fn reset(&mut self, snapshot: &ClusterSnapshot) {
        self.me = Some(snapshot.node_id);
        self.members.clear();
        self.down.clear();
        for node in &snapshot.nodes {
            self.names.insert(node.id, node.name.clone());
            self.members.insert(node.id);
            if node.status == NodeStatus::Down {
                self.down.insert(node.id);
            }
        }
        self.link_errors.clear();
        for link in &snapshot.links {
            for report in &link.reports {
                let from = if report.peer == link.a { link.b } else { link.a };
                self.link_errors.insert(pair(from, report.peer), report.errors);
            }
        }
    }

    /// The notice `event` calls for, if any. `now_ms` is the wall clock (for the link interval).
    pub fn on_event(&mut self, event: &ClusterEvent, now_ms: u64) -> Option<Notice> {
        match event {
            ClusterEvent::NodeJoined { node, name } => {
                self.names.insert(*node, name.clone());
                let new = self.members.insert(*node);
                (new && Some(*node) != self.me).then(|| Notice::new(format!("{name} joined the cluster"), ""))
            }
            ClusterEvent::NodeLeft { node } => {
                self.members.remove(node);
                self.down.remove(node);
                Some(Notice::new(format!("{} left the cluster", self.name(*node)), ""))
            }
            ClusterEvent::NodeStatus { node, status } => match status {
                PeerStatus::Down if self.down.insert(*node) => {
                    self.forget_failures_of(*node);
                    Some(Notice::new(
                        format!("{} is down", self.name(*node)),
                        "Not heard from for a few seconds. Models with a stage on it stop answering.",
                    ))
                }
                PeerStatus::Alive if self.down.remove(node) => {
                    Some(Notice::new(format!("{} is back", self.name(*node)), ""))
                }
                _ => None,
            },
            ClusterEvent::Links { node, links } => self.on_links(*node, links, now_ms),
            ClusterEvent::Instance { info } => {
                let before = self.instance_states.insert(info.id.clone(), info.state);
                if before == Some(info.state) {
                    return None;
                }
                let nodes = info.stages.len();
                let across = if nodes == 1 { "on 1 node".to_string() } else { format!("across {nodes} nodes") };
                match info.state {
                    InstanceState::Ready if info.recovery.is_some() => {
                        Some(Notice::new(format!("{} is serving again", info.model), format!("Placed again {across}.")))
                    }
                    InstanceState::Ready => {
                        Some(Notice::new(format!("{} is ready", info.model), format!("Serving {across}.")))
                    }
                    InstanceState::Recovering => Some(Notice::new(
                        format!("{} lost part of its cluster", info.model),
                        info.error.clone().unwrap_or_default(),
                    )),
                    _ => None,
                }
            }
            // A code that ran its time out is no news; one revoked by wrong attempts is.
            ClusterEvent::CodeRevoked { reason } if reason != "expired" => {
                Some(Notice::new("The join code was revoked", reason))
            }
            ClusterEvent::InstanceFailed { instance, model, error } => {
                let before = self.instance_states.insert(instance.clone(), InstanceState::Failed);
                (before != Some(InstanceState::Failed)).then(|| Notice::new(format!("{model} stopped working"), error))
            }
            _ => None,
        }
    }

    fn on_links(&mut self, from: NodeId, links: &[LinkReport], now_ms: u64) -> Option<Notice> {
        let mut notice = None;
        for report in links {
            let key = pair(from, report.peer);
            match &report.transport {
                Some(LinkTransport::Rdma { .. }) => {
                    self.on_rdma.insert(key);
                }
                Some(LinkTransport::Tcp { reason, .. }) if self.on_rdma.remove(&key) && notice.is_none() => {
                    notice = Some(Notice::new(
                        format!("Link {} ↔ {} fell back to TCP", self.name(from), self.name(report.peer)),
                        format!("RDMA stopped: {reason}. It is tried again later; nothing restarts."),
                    ));
                }
                _ => {}
            }
            let before = self.link_errors.insert(key, report.errors).unwrap_or(report.errors);
            let ends_up = !self.down.contains(&from) && !self.down.contains(&report.peer);
            if report.errors <= before || !ends_up {
                continue;
            }
            let since = *self.link_failing_since.entry(key).or_insert(now_ms);
            let lasting = now_ms >= since + LINK_FAILING_AFTER_MS;
            let quiet = self.link_noticed_at.get(&key).is_none_or(|at| now_ms >= at + LINK_NOTICE_INTERVAL_MS);
            if lasting && quiet && notice.is_none() {
                self.link_failing_since.remove(&key);
                self.link_noticed_at.insert(key, now_ms);
                notice = Some(Notice::new(
                    format!("Link {} ↔ {} is failing", self.name(from), self.name(report.peer)),
                    format!("{} errors so far on the {} link, and counting.", report.errors, report.kind.label()),
                ));
            }
        }
        notice
    }

    /// A node that went down explains its links' errors.
    fn forget_failures_of(&mut self, node: NodeId) {
        self.link_failing_since.retain(|(a, b), _| *a != node && *b != node);
    }

    fn name(&self, node: NodeId) -> String {
        self.names.get(&node).cloned().unwrap_or_else(|| node.short())
    }
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a < b {
        (a, b)
    } else {
        (b, a)
    }
}

#[cfg(test)]
#[path = "notices/tests.rs"]
mod tests;

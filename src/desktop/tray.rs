//! The tray icon's look and its menu's status lines, from the cluster snapshot, the model instances
//! and the cluster-wide rates.

use crate::cluster::{ClusterSnapshot, NodeStatus};
use crate::instances::{InstanceInfo, InstanceState};
use crate::metrics::ClusterRates;
use crate::util::format_bytes;

/// What the tray icon says at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrayLook {
    /// This node is on its own.
    Alone,
    /// In a cluster with others, all healthy, no model.
    Cluster,
    /// A model is ready to answer.
    Serving,
    /// A member is suspect or down, or a model failed.
    Degraded,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TraySummary {
    pub look: TrayLook,
    /// e.g. "3 nodes · 1.4 TB pool", "1 of 3 nodes down · 512 GB pool", "Alone · 24 GB".
    pub cluster_line: String,
    /// e.g. "SmolLM2 · 41.2 tok/s", "SmolLM2 · loading 40%", "No model running".
    pub model_line: String,
    /// Short text beside the icon where the platform shows one (macOS): the decode rate while serving.
    pub title: Option<String>,
    pub tooltip: String,
}

/// What the tray menu offers; a menu item's id is its action's [`TrayAction::id`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrayAction {
    OpenDashboard,
    Join,
    Leave,
    RdmaSetup,
    StartAtLogin,
    Quit,
}

impl TrayAction {
    pub const ALL: [TrayAction; 6] = [
        TrayAction::OpenDashboard,
        TrayAction::Join,
        TrayAction::Leave,
        TrayAction::RdmaSetup,
        TrayAction::StartAtLogin,
        TrayAction::Quit,
    ];

    /// The menu item's id (what the menu event carries back).
    pub fn id(self) -> &'static str {
        match self {
            TrayAction::OpenDashboard => "open",
            TrayAction::Join => "join",
            TrayAction::Leave => "leave",
            TrayAction::RdmaSetup => "rdma",
            TrayAction::StartAtLogin => "login",
            TrayAction::Quit => "quit",
        }
    }

    pub fn from_id(id: &str) -> Option<TrayAction> {
        TrayAction::ALL.into_iter().find(|a| a.id() == id)
    }

    pub fn label(self) -> &'static str {
        match self {
            TrayAction::OpenDashboard => "Open dashboard",
            TrayAction::Join => "Join a cluster…",
            TrayAction::Leave => "Leave cluster",
            TrayAction::RdmaSetup => "RDMA setup…",
            TrayAction::StartAtLogin => "Start at login",
            TrayAction::Quit => "Quit shoal",
        }
    }

    /// The dashboard view the action opens in the window (None: the action opens no window; Some(None):
    /// the dashboard's first view).
    pub fn dashboard_route(self) -> Option<Option<&'static str>> {
        match self {
            TrayAction::OpenDashboard => Some(None),
            TrayAction::Join => Some(Some("mesh/join")),
            TrayAction::RdmaSetup => Some(Some("setup")),
            TrayAction::Leave | TrayAction::StartAtLogin | TrayAction::Quit => None,
        }
    }
}

pub fn summarize(snapshot: &ClusterSnapshot, instances: &[InstanceInfo], rates: &ClusterRates) -> TraySummary {
    let members = snapshot.nodes.len();
    let troubled = snapshot.nodes.iter().filter(|n| matches!(n.status, NodeStatus::Suspect | NodeStatus::Down)).count();
    let pool = format_bytes(snapshot.pool.memory_total);
    let cluster_line = match (members, troubled) {
        (0 | 1, _) => format!("Alone · {pool}"),
        (n, 0) => format!("{n} nodes · {pool} pool"),
        (n, t) => format!("{t} of {n} nodes unreachable · {pool} pool"),
    };

    let mut live: Vec<&InstanceInfo> =
        instances.iter().filter(|i| !matches!(i.state, InstanceState::Stopped | InstanceState::Replaced)).collect();
    live.sort_by_key(|i| (state_rank(i.state), std::cmp::Reverse(i.created_at_ms)));
    let serving = live.iter().any(|i| i.state == InstanceState::Ready);
    let failed = live.iter().any(|i| matches!(i.state, InstanceState::Failed | InstanceState::Recovering));
    let decode = rates.decode_tokens_per_second;
    let model_line = match live.first() {
        None => "No model running".to_string(),
        Some(i) => {
            let more = if live.len() > 1 { format!(" (+{} more)", live.len() - 1) } else { String::new() };
            let what = match i.state {
                InstanceState::Ready if decode > 0.0 => format!("{decode:.1} tok/s"),
                InstanceState::Ready => "ready".to_string(),
                InstanceState::Launching => launching_text(i),
                InstanceState::Recovering => "recovering".to_string(),
                InstanceState::Failed => "failed".to_string(),
                InstanceState::Stopped => "stopped".to_string(),
                InstanceState::Replaced => "replaced".to_string(),
            };
            format!("{} · {what}{more}", i.model)
        }
    };

    let look = if troubled > 0 || failed {
        TrayLook::Degraded
    } else if serving {
        TrayLook::Serving
    } else if members > 1 {
        TrayLook::Cluster
    } else {
        TrayLook::Alone
    };
    let title = (serving && decode > 0.0).then(|| format!("{decode:.0} tok/s"));
    let tooltip = format!("shoal — {cluster_line} — {model_line}");
    TraySummary { look, cluster_line, model_line, title, tooltip }
}

/// Ready first, then launching, recovering, failed; newest first within each.
fn state_rank(state: InstanceState) -> u8 {
    match state {
        InstanceState::Ready => 0,
        InstanceState::Launching => 1,
        InstanceState::Recovering => 2,
        InstanceState::Failed => 3,
        InstanceState::Stopped | InstanceState::Replaced => 4,
    }
}

fn launching_text(instance: &InstanceInfo) -> String {
    if instance.stages.is_empty() {
        return "starting".to_string();
    }
    let progress = instance.stages.iter().map(|s| s.progress as f64).sum::<f64>() / instance.stages.len() as f64;
    format!("loading {:.0}%", progress * 100.0)
}

#[cfg(test)]
#[path = "tray/tests.rs"]
mod tests;

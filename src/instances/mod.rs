//! Model instances: a model split over nodes by a placement, one worker per stage. The node that
//! launches an instance owns it: it plans the placement, starts the stages on their nodes, wires the
//! ring, tracks every stage's state and tells the cluster (every node can list instances and route
//! requests to stage 0). When a stage fails or a node hosting one goes down, the instance's workers are
//! stopped and its owner places it again on the nodes that are up (`recovery`), or marks it failed when
//! that cannot help; when the owner goes down, its instances end everywhere. A node lacking a stage's
//! share of the model fetches just that first (`share`). `Fit` says whether a model would be placed now,
//! before anything is launched.

mod fit;
mod generate;
mod lifecycle;
mod recovery;
mod share;
mod validate;

pub use fit::{Fit, PoolOffers};
pub use generate::{generate, generate_when_ready, lost_and_recovering, GenerateError};
pub use lifecycle::{launch, on_message, on_peer_down, preview, preview_fetches, stop, LaunchError, LaunchRequest};
pub use recovery::Recovery;
pub use share::{ShareNeed, StageFetch};

/// Types the control messages carry.
pub mod lifecycle_types {
    pub use super::lifecycle::StageReport;
}

use crate::engine::StageMemory;
use crate::node::NodeId;
use crate::placement::Plan;
use crate::worker::supervisor::WorkerHandle;
use crate::worker::{FrontEvent, StageStats, WorkerState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Launching,
    Ready,
    /// It lost a node or a worker; its workers are stopped and its owner is placing it again (its
    /// `error` says what happened and, while it does not fit, what it lacks).
    Recovering,
    Failed,
    Stopped,
    /// Placed again as the instance `replaced_by` names.
    Replaced,
}

impl InstanceState {
    /// Launching, ready or recovering: the instance is (or will again be) the model's server.
    pub fn is_active(self) -> bool {
        matches!(self, InstanceState::Launching | InstanceState::Ready | InstanceState::Recovering)
    }

    /// Failed, stopped or replaced: nothing of it runs any more, and nothing will.
    pub fn has_ended(self) -> bool {
        !self.is_active()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageStatus {
    pub node: NodeId,
    pub node_name: String,
    pub layers: Range<usize>,
    pub state: WorkerState,
    /// Loading progress, 0..=1.
    pub progress: f32,
    pub data_port: Option<u16>,
    pub memory: Option<StageMemory>,
    pub stats: Option<StageStats>,
    pub error: Option<String>,
    /// The fetch of this stage's share of the model, when its node lacked it.
    #[serde(default)]
    pub fetch: Option<StageFetch>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceInfo {
    pub id: String,
    /// The name clients use (`model` in the OpenAI API).
    pub model: String,
    pub model_path: PathBuf,
    pub owner: NodeId,
    pub state: InstanceState,
    pub error: Option<String>,
    pub context: usize,
    pub sequences: usize,
    pub created_at_ms: u64,
    pub plan: Plan,
    pub stages: Vec<StageStatus>,
    /// When every stage was first ready.
    #[serde(default)]
    pub ready_at_ms: Option<u64>,
    /// The instance this one replaces, and why (set when it was placed again without a person).
    #[serde(default)]
    pub recovery: Option<Recovery>,
    /// The instance that replaced this one.
    #[serde(default)]
    pub replaced_by: Option<String>,
}

impl InstanceInfo {
    pub fn head(&self) -> Option<NodeId> {
        self.stages.first().map(|s| s.node)
    }

    pub fn uses(&self, node: NodeId) -> bool {
        self.owner == node || self.stages.iter().any(|s| s.node == node)
    }
}

/// A worker this node runs.
pub(crate) struct LocalStage {
    pub handle: Arc<WorkerHandle>,
    pub front_port: Option<u16>,
    /// The node the stage's ring link goes to, once it is connected.
    pub next: Option<NodeId>,
}

/// Instances known to this node, the workers it runs, and the generation calls it has in flight.
#[derive(Default)]
pub struct Registry {
    pub instances: BTreeMap<String, InstanceInfo>,
    /// How this node's own instances were launched, to place them again after a loss.
    pub(crate) requests: HashMap<String, LaunchRequest>,
    pub(crate) local: HashMap<(String, usize), LocalStage>,
    /// Calls this node sent to another node's stage 0: where their events go, and which peer serves them.
    pub(crate) calls: HashMap<u64, (NodeId, UnboundedSender<FrontEvent>)>,
    /// Calls this node serves for other nodes: a handle to cancel each.
    pub(crate) serving: HashMap<(NodeId, u64), tokio::task::AbortHandle>,
}

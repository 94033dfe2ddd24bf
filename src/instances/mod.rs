//! Model instances: a model split over nodes by a placement, one worker per stage. The node that
//! launches an instance owns it: it plans the placement, starts the stages on their nodes, wires the
//! ring, tracks every stage's state and tells the cluster (every node can list instances and route
//! requests to stage 0). When a stage fails or a node hosting one goes down, the instance's workers are
//! stopped and its owner places it again on the nodes that are up (`recovery`), or marks it failed when
//! that cannot help; when the owner goes down, a node that remains takes the instance over and does the
//! same (`takeover`). A node lacking a stage's share of the model fetches just that first (`share`).
//! `Fit` says whether a model would be placed now, before anything is launched. All of it runs in the
//! [`Instances`] service, which owns this state and is attached to the cluster runtime (the records it
//! shares with the cluster and the API are in [`crate::records`]).

mod ending;
mod fit;
mod generate;
mod lifecycle;
mod measurement_wait;
mod messages;
mod recovery;
mod service;
mod share;
mod takeover;
mod threads;
mod validate;
mod wiring;

pub use crate::records::{InstanceInfo, InstanceState, LaunchRequest, Recovery, StageFetch, StageReport, StageStatus};
pub use ending::{relaunch, stop, stop_all_local};
pub use fit::{Fit, PoolOffers};
pub use generate::{generate, generate_when_ready, lost_and_recovering, GenerateError};
pub use lifecycle::{check_name_free, launch, on_peer_down, preview, preview_fetches, LaunchError};
pub use measurement_wait::await_measurements;
pub use messages::on_message;
pub use service::Instances;
pub use share::ShareNeed;

use crate::node::NodeId;
use crate::worker::supervisor::WorkerHandle;
use crate::worker::FrontEvent;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// A worker this node runs.
pub(crate) struct LocalStage {
    pub handle: Arc<WorkerHandle>,
    /// The compute threads it was started with.
    pub threads: usize,
    pub front_port: Option<u16>,
    /// The node the stage's ring link goes to, once it is connected.
    pub next: Option<NodeId>,
    /// A rank of a tensor-parallel group: the node of each rank, once the group connects.
    pub group: Vec<NodeId>,
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

//! The records that describe model instances: what an instance is (its stages, their states, how it was
//! launched and what it replaces) and what a stage's node reports of it. They cross the network in
//! control messages and the HTTP API, so the cluster, the instances service and the API all read them;
//! they live here, apart from the code that acts on them, so that none of those depends on another
//! just for its types.

use crate::engine::StageMemory;
use crate::node::NodeId;
use crate::placement::Plan;
use crate::worker::{StageStats, WorkerState};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
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
    /// The device the stage computes on (`CPU`, `Metal`, …), once it has loaded.
    #[serde(default)]
    pub device: Option<String>,
    /// A tensor-parallel rank's slice of every layer: its heads, feed-forward columns, experts and
    /// output rows.
    #[serde(default)]
    pub slice: Option<crate::model::TensorSlice>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
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
    /// How it was launched, so that a member can place it again when its owner is gone.
    #[serde(default)]
    pub request: Option<LaunchRequest>,
}

impl InstanceInfo {
    pub fn head(&self) -> Option<NodeId> {
        self.stages.first().map(|s| s.node)
    }

    pub fn uses(&self, node: NodeId) -> bool {
        self.owner == node || self.stages.iter().any(|s| s.node == node)
    }
}

/// Why an instance exists: it replaces another one that lost a node or a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct Recovery {
    /// The instance this one replaces.
    pub replaces: String,
    /// What happened to that one.
    pub reason: String,
    /// 1 when the instance it replaces had served; one more for each replacement in a row that had not.
    pub attempt: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(optional_fields = nullable)]
pub struct LaunchRequest {
    /// Path of the GGUF file on the launching node (the other nodes find it in their library or fetch
    /// their share of it).
    pub model: PathBuf,
    /// Explicit placement, `NODE:0-9,NODE:10-29`.
    #[serde(default)]
    pub layers: Option<String>,
    /// Context of each request, in tokens (default 2048).
    #[serde(default)]
    pub context: Option<usize>,
    /// Requests served at once (default 4).
    #[serde(default)]
    pub sequences: Option<usize>,
    /// Compute threads per stage (default: the node's cores divided by its stages).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Most prompt tokens a step takes (default 512): a longer prompt runs in chunks of at most this
    /// many. A larger batch takes a larger compute buffer on every stage.
    #[serde(default)]
    pub batch: Option<usize>,
    /// The KV cache's element type on every stage (default f16; q8_0 and q4_0 hold about twice and
    /// four times the context in the same memory).
    #[serde(default)]
    pub kv_type: Option<crate::engine::KvType>,
    /// Tokens of saved prefixes (the prompt cache beyond the slots) to keep in memory, as far as the
    /// nodes' memory beyond the plan allows (default: one more context per slot; 0 keeps none).
    #[serde(default)]
    pub prompt_cache: Option<usize>,
    /// Whether requests draft tokens from their own history and verify them in one step (speculative
    /// decoding; default auto: where the model keeps enough of them to pay for the drafts).
    #[serde(default)]
    pub speculation: Option<crate::engine::Speculation>,
    /// Most drafted tokens a request's step carries (default 8, at most 32).
    #[serde(default)]
    pub draft_tokens: Option<usize>,
    /// Most tokens any reply may have, whatever a request asks (default: up to the context's end).
    /// Bounds what a client that sets no limit (an agent) can make the instance generate.
    #[serde(default)]
    pub max_reply_tokens: Option<usize>,
    /// The name clients use (default: the file name without `.gguf`).
    #[serde(default)]
    pub name: Option<String>,
    /// How to split the model: a pipeline of layer ranges, tensor parallel, or a chain of groups
    /// (default: the fastest placement predicts).
    #[serde(default)]
    pub parallel: Option<crate::placement::Parallelism>,
    /// Run it on exactly these nodes (names or id prefixes), in this order: the ring of a pipeline, or
    /// the ranks of a tensor-parallel group (the first leads).
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
}

/// A stage's change of state, as its node reports it to the owner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub state: WorkerState,
    pub progress: Option<f32>,
    pub data_port: Option<u16>,
    pub memory: Option<StageMemory>,
    pub stats: Option<StageStats>,
    pub error: Option<String>,
    pub fetch: Option<StageFetch>,
    pub device: Option<String>,
}

/// A stage's fetch of its share, as the instance shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct StageFetch {
    /// The member the bytes come from (None: the hub).
    pub from_node: Option<NodeId>,
    /// Its name, or the hub's address.
    pub from: String,
    pub bytes_done: u64,
    /// The header and the stage's tensors.
    pub bytes_total: u64,
    /// Bytes that came over the network (not those already here).
    pub bytes_fetched: u64,
    pub bytes_per_second: u64,
    pub done: bool,
}

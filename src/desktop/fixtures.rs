//! Snapshots and instances for the desktop module's tests, built from a few numbers.

use crate::cluster::{ClusterSnapshot, NodeStatus, NodeView, PoolView};
use crate::instances::{InstanceInfo, InstanceState, StageStatus};
use crate::node::NodeId;
use crate::placement::Plan;
use crate::worker::WorkerState;

pub fn id(n: u8) -> NodeId {
    NodeId(uuid::Uuid::from_bytes([n; 16]))
}

/// A cluster whose first node is this one; `statuses` are the others' ("alive", "suspect", "down").
pub fn snapshot(statuses: &[&str], memory_each: u64) -> ClusterSnapshot {
    let mut nodes = vec![node(1, "self")];
    nodes.extend(statuses.iter().enumerate().map(|(i, s)| node(i as u8 + 2, s)));
    let up = nodes.iter().filter(|n| n.status != NodeStatus::Down).count();
    ClusterSnapshot {
        cluster_id: "c".into(),
        node_id: id(1),
        nodes,
        links: Vec::new(),
        pool: PoolView { nodes_up: up, memory_total: memory_each * up as u64, ..PoolView::default() },
        nearby: Vec::new(),
        join_code_expires_at_ms: None,
    }
}

fn node(n: u8, status: &str) -> NodeView {
    NodeView {
        id: id(n),
        name: format!("node{n}"),
        is_self: status == "self",
        status: serde_json::from_value(serde_json::json!(status)).expect("a node status"),
        control: Vec::new(),
        api_port: 52520,
        last_heard_ms_ago: None,
        telemetry: None,
    }
}

/// An instance of `model` with one stage per entry of `progress` (on nodes 1, 2, …).
pub fn instance(model: &str, state: InstanceState, progress: &[f32]) -> InstanceInfo {
    InstanceInfo {
        id: format!("{model}-id"),
        model: model.into(),
        model_path: format!("/models/{model}.gguf").into(),
        owner: id(1),
        state,
        error: None,
        context: 512,
        sequences: 1,
        created_at_ms: 1,
        plan: Plan {
            model: model.into(),
            context: 512,
            vocabulary: 49152,
            stages: Vec::new(),
            total_bytes: 0,
            kv_cache_per_1k_tokens: 0,
            recurrent_state_per_sequence: 0,
            saved_prefix_tokens: 0,
            ring_us: 0,
            expected_decode_tokens_per_second: None,
            parallel: Default::default(),
            alternatives: Vec::new(),
        },
        stages: progress
            .iter()
            .enumerate()
            .map(|(i, p)| StageStatus {
                node: id(i as u8 + 1),
                node_name: format!("node{}", i + 1),
                layers: i * 10..(i + 1) * 10,
                state: WorkerState::Loading,
                progress: *p,
                data_port: None,
                memory: None,
                stats: None,
                error: None,
                fetch: None,
                device: None,
                slice: None,
            })
            .collect(),
        ready_at_ms: None,
        recovery: None,
        replaced_by: None,
        request: None,
    }
}

//! Launching, wiring, watching and stopping instances, on the owner and on the nodes that run stages.

use super::{InstanceInfo, InstanceState, LocalStage, StageStatus};
use crate::cluster::messages::ControlMessage;
use crate::cluster::state::ClusterEvent;
use crate::cluster::Agent;
use crate::model::{Model, ModelError};
use crate::node::NodeId;
use crate::placement::{self, LinkCost, ModelNeeds, NodeOffer, PlacementError, Plan};
use crate::worker::supervisor::{self, StageSpec};
use crate::worker::{WorkerCommand, WorkerEvent, WorkerState};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Prompt chunk size of every stage.
const BATCH: usize = 512;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Path of the GGUF file (the same path on every node that runs a stage).
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
    /// The name clients use (default: the file name without `.gguf`).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("{0}")]
    Invalid(String),
}

/// The nodes that are up, what they offer, and the measured links between them.
pub(super) fn cluster_offers(agent: &Agent) -> (Vec<NodeOffer>, Vec<LinkCost>) {
    let snapshot = agent.snapshot();
    let offers = snapshot
        .nodes
        .iter()
        .filter(|n| n.status.is_up())
        .filter_map(|n| {
            let t = n.telemetry.as_ref()?;
            Some(NodeOffer {
                id: n.id,
                name: n.name.clone(),
                bytes: t.memory_offer,
                memory_bandwidth: t.memory_bandwidth,
            })
        })
        .collect();
    let links = snapshot
        .links
        .iter()
        .map(|l| LinkCost {
            a: l.a,
            b: l.b,
            rtt_us: l.rtt_p50_us,
            throughput_bps: match (l.throughput_a_to_b_bps, l.throughput_b_to_a_bps) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            },
        })
        .collect();
    (offers, links)
}

/// What `model` needs with the request's context and sequences (2048 tokens and 4 by default).
pub(super) fn needs_for(model: &Model, request: &LaunchRequest) -> ModelNeeds {
    let context = request.context.unwrap_or(2048).clamp(16, model.config().training_context.max(16));
    let sequences = request.sequences.unwrap_or(4).clamp(1, 64);
    ModelNeeds::of(model, context, sequences, BATCH)
}

/// The plan a launch would use.
pub async fn preview(agent: &Agent, request: &LaunchRequest) -> Result<(Plan, String), LaunchError> {
    let path = request.model.clone();
    let model = tokio::task::spawn_blocking(move || Model::open(&path))
        .await
        .map_err(|e| LaunchError::Invalid(e.to_string()))??;
    let needs = needs_for(&model, request);
    let (offers, links) = cluster_offers(agent);
    let plan = match &request.layers {
        Some(spec) => placement::plan_override(&needs, &offers, &links, &placement::parse_layers(spec)?)?,
        None => placement::plan(&needs, &offers, &links)?,
    };
    // Clients name models by id; the file name has no spaces, unlike many models' own names.
    let default_name =
        request.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| model.name());
    Ok((plan, request.name.clone().unwrap_or(default_name)))
}

/// What each stage's node would fetch of the model at launch (None: it holds its share already).
pub async fn preview_fetches(agent: &Agent, request: &LaunchRequest, plan: &Plan) -> Vec<Option<super::ShareNeed>> {
    let path = request.model.clone();
    let Ok(Ok(model)) = tokio::task::spawn_blocking(move || Model::open(&path)).await else {
        return vec![None; plan.stages.len()];
    };
    super::share::plan_fetches(agent, &model, plan).await
}

/// Launches an instance; this node owns it. Returns as soon as the stages are starting.
pub async fn launch(agent: &Agent, request: LaunchRequest) -> Result<InstanceInfo, LaunchError> {
    launch_as(agent, request, None).await
}

/// Launches an instance, placed with the cluster as it is now; `recovery` names the instance it
/// replaces, if any.
pub(super) async fn launch_as(
    agent: &Agent,
    request: LaunchRequest,
    recovery: Option<super::Recovery>,
) -> Result<InstanceInfo, LaunchError> {
    let (plan, name) = preview(agent, &request).await?;
    let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let me = agent.id();
    let info = InstanceInfo {
        id: id.clone(),
        model: name,
        model_path: request.model.clone(),
        owner: me,
        state: InstanceState::Launching,
        error: None,
        context: plan.context,
        sequences: request.sequences.unwrap_or(4).clamp(1, 64),
        created_at_ms: crate::util::now_ms(),
        stages: plan
            .stages
            .iter()
            .map(|s| StageStatus {
                node: s.node,
                node_name: s.node_name.clone(),
                layers: s.layers.clone(),
                state: WorkerState::Starting,
                progress: 0.0,
                data_port: None,
                memory: None,
                stats: None,
                error: None,
                fetch: None,
            })
            .collect(),
        plan,
        ready_at_ms: None,
        recovery,
        replaced_by: None,
    };
    {
        let mut registry = agent.registry();
        registry.instances.insert(id.clone(), info.clone());
        registry.requests.insert(id.clone(), request.clone());
    }
    publish(agent, &info);
    let path = request.model.clone();
    // Every file of the model (each part of a split set), as the stages' nodes find or fetch them.
    let files = tokio::task::spawn_blocking(move || {
        crate::model::peer_copy::describe_model(&crate::model::Model::open(&path).ok()?)
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_default();
    let (file, parts) = (files.first().cloned(), if files.len() > 1 { files } else { Vec::new() });
    for (i, stage) in info.stages.iter().enumerate() {
        let spec = StageSpec {
            instance: id.clone(),
            stage: i,
            stages: info.stages.len(),
            model_path: request.model.clone(),
            layers: stage.layers.clone(),
            context: info.context,
            sequences: info.sequences,
            batch: BATCH,
            threads: request.threads.unwrap_or(0),
            file: file.clone(),
            parts: parts.clone(),
        };
        if stage.node == me {
            start_local(agent, spec, me);
        } else if !agent.send_to(stage.node, ControlMessage::StartStage { spec }) {
            lose(agent, &id, format!("cannot reach {} to start stage {i}", stage.node_name), false);
        }
    }
    Ok(info)
}

/// Sends the owner's view of an instance to every node and to the local event stream.
pub(super) fn publish(agent: &Agent, info: &InstanceInfo) {
    agent.broadcast(ControlMessage::Instance { info: Box::new(info.clone()) });
    agent.emit(ClusterEvent::Instance { info: Box::new(info.clone()) });
}

/// Starts a stage on this node: fetches its share of the model if this node lacks it, then starts its
/// worker — unless the instance ended meanwhile.
fn start_local(agent: &Agent, spec: StageSpec, owner: NodeId) {
    let agent = agent.clone();
    tokio::spawn(async move {
        let (instance, stage) = (spec.instance.clone(), spec.stage);
        let reporter = {
            let (agent, instance) = (agent.clone(), instance.clone());
            move |r| report(&agent, owner, &instance, stage, r)
        };
        match super::share::ensure_share(&agent, &spec, reporter).await {
            Ok(path) => {
                let ended = agent.registry().instances.get(&instance).is_none_or(|i| !running(i.state));
                if !ended {
                    start_worker(&agent, StageSpec { model_path: path, ..spec }, owner);
                }
            }
            Err(error) => {
                tracing::warn!("stage {stage} of instance {instance} does not start: {error}");
                let failed = StageReport { state: WorkerState::Failed, error: Some(error), ..Default::default() };
                report(&agent, owner, &instance, stage, failed);
            }
        }
    });
}

/// Starts a worker for a stage on this node and relays its events to the owner.
fn start_worker(agent: &Agent, spec: StageSpec, owner: NodeId) {
    let key = (spec.instance.clone(), spec.stage);
    let threads = if spec.threads > 0 { spec.threads } else { crate::engine::default_threads() };
    let secret = agent.secret_bytes();
    let log_dir = agent.config.data_dir.file("logs");
    let (events_agent, exit_agent) = (agent.clone(), agent.clone());
    let (instance, stage) = (spec.instance.clone(), spec.stage);
    let (instance2, stage2) = (spec.instance.clone(), spec.stage);
    let spawned = supervisor::spawn(
        &spec,
        threads,
        // The data port listens where the agent's control port does (--bind), never wider.
        agent.config.control_bind,
        &secret,
        &log_dir,
        move |event| on_worker_event(&events_agent, owner, &instance, stage, event),
        move |ended| {
            let stopped = exit_agent.registry().local.remove(&(instance2.clone(), stage2)).is_none();
            let update = if stopped { (WorkerState::Stopped, None) } else { (WorkerState::Failed, Some(ended)) };
            report(
                &exit_agent,
                owner,
                &instance2,
                stage2,
                StageReport { state: update.0, error: update.1, ..Default::default() },
            );
        },
    );
    match spawned {
        Ok(handle) => {
            if let Some(pid) = handle.pid {
                agent.track_process(pid);
            }
            agent.registry().local.insert(key, LocalStage { handle: Arc::new(handle), front_port: None, next: None });
        }
        Err(e) => report(
            agent,
            owner,
            &spec.instance,
            spec.stage,
            StageReport { state: WorkerState::Failed, error: Some(e.to_string()), ..Default::default() },
        ),
    }
}

/// A stage's change of state, as its node reports it to the owner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub state: WorkerState,
    pub progress: Option<f32>,
    pub data_port: Option<u16>,
    pub memory: Option<crate::engine::StageMemory>,
    pub stats: Option<crate::worker::StageStats>,
    pub error: Option<String>,
    pub fetch: Option<super::StageFetch>,
}

fn on_worker_event(agent: &Agent, owner: NodeId, instance: &str, stage: usize, event: WorkerEvent) {
    let report_of = match event {
        WorkerEvent::Loading { progress } => {
            StageReport { state: WorkerState::Loading, progress: Some(progress), ..Default::default() }
        }
        WorkerEvent::Listening { data_port, front_port, memory } => {
            if let Some(local) = agent.registry().local.get_mut(&(instance.to_string(), stage)) {
                local.front_port = front_port;
            }
            StageReport {
                state: WorkerState::Connecting,
                progress: Some(1.0),
                data_port: Some(data_port),
                memory: Some(memory),
                ..Default::default()
            }
        }
        WorkerEvent::Ready => StageReport { state: WorkerState::Ready, progress: Some(1.0), ..Default::default() },
        WorkerEvent::Stats { stats } => {
            let state = if stats.active_requests > 0 { WorkerState::Serving } else { WorkerState::Ready };
            StageReport { state, stats: Some(stats), ..Default::default() }
        }
        WorkerEvent::Failed { error } => {
            StageReport { state: WorkerState::Failed, error: Some(error), ..Default::default() }
        }
        WorkerEvent::RingLink { transport } => {
            let next = agent.registry().local.get(&(instance.to_string(), stage)).and_then(|l| l.next);
            if let Some(next) = next {
                agent.ring_link_changed(next, instance, transport);
            }
            return;
        }
    };
    report(agent, owner, instance, stage, report_of);
}

fn report(agent: &Agent, owner: NodeId, instance: &str, stage: usize, report: StageReport) {
    if owner == agent.id() {
        apply_report(agent, instance, stage, report);
    } else {
        agent.send_to(owner, ControlMessage::StageUpdate { instance: instance.to_string(), stage, report });
    }
}

/// The owner takes in a stage's report: wires the ring once every stage listens, marks the instance
/// ready once every stage is, and fails it when a stage fails.
fn apply_report(agent: &Agent, instance: &str, stage: usize, report: StageReport) {
    let mut failed = None;
    let mut wire = None;
    let info = {
        let mut registry = agent.registry();
        let Some(info) = registry.instances.get_mut(instance) else { return };
        let Some(s) = info.stages.get_mut(stage) else { return };
        if !running(info.state) && report.state != WorkerState::Stopped {
            return;
        }
        // Stats only move a ready stage between ready and serving.
        if report.stats.is_none() || matches!(s.state, WorkerState::Ready | WorkerState::Serving) {
            s.state = report.state;
        }
        if let Some(p) = report.progress {
            s.progress = p;
        }
        if report.data_port.is_some() {
            s.data_port = report.data_port;
        }
        if report.memory.is_some() {
            s.memory = report.memory;
        }
        if report.stats.is_some() {
            s.stats = report.stats;
        }
        if report.fetch.is_some() {
            s.fetch = report.fetch;
        }
        if let Some(e) = &report.error {
            s.error = Some(e.clone());
            failed = Some(format!("stage {stage} on {} failed: {e}", s.node_name));
        }
        if info.state == InstanceState::Launching
            && report.data_port.is_some()
            && info.stages.iter().all(|s| s.data_port.is_some())
        {
            wire = Some(info.stages.iter().filter_map(|s| Some((s.node, s.data_port?))).collect::<Vec<_>>());
        }
        if info.state == InstanceState::Launching
            && info.stages.iter().all(|s| matches!(s.state, WorkerState::Ready | WorkerState::Serving))
        {
            info.state = InstanceState::Ready;
            info.ready_at_ms.get_or_insert_with(crate::util::now_ms);
        }
        info.clone()
    };
    if let Some(error) = failed {
        return lose(agent, instance, error, false);
    }
    if let Some(ring) = wire.filter(|r| r.len() > 1) {
        for (i, &(node, _)) in ring.iter().enumerate() {
            let (next_node, next_port) = ring[(i + 1) % ring.len()];
            let message =
                ControlMessage::ConnectStage { instance: instance.to_string(), stage: i, next_node, next_port };
            if node == agent.id() {
                connect_local(agent, instance, i, next_node, next_port);
            } else {
                agent.send_to(node, message);
            }
        }
    }
    publish(agent, &info);
}

/// Tells a local worker where the next stage listens.
fn connect_local(agent: &Agent, instance: &str, stage: usize, next_node: NodeId, next_port: u16) {
    let ip =
        if next_node == agent.id() { Some(std::net::IpAddr::from([127, 0, 0, 1])) } else { agent.peer_ip(next_node) };
    let handle = agent.registry().local.get_mut(&(instance.to_string(), stage)).map(|l| {
        l.next = Some(next_node);
        l.handle.clone()
    });
    let (Some(ip), Some(handle)) = (ip, handle) else { return };
    let next = SocketAddr::new(ip, next_port);
    let rdma = if next_node == agent.id() { None } else { agent.ring_route(next_node) };
    tokio::spawn(async move {
        let _ = handle.command(&WorkerCommand::Connect { next, rdma }).await;
    });
}

/// Whether the instance's stages should be running: it is launching or ready.
fn running(state: InstanceState) -> bool {
    matches!(state, InstanceState::Launching | InstanceState::Ready)
}

/// The owner's instance lost a stage (`node_lost`: its node went down): its stages are stopped
/// everywhere, and it is placed again when [`super::recovery`] says that can help, or marked failed.
fn lose(agent: &Agent, instance: &str, error: String, node_lost: bool) {
    let (info, attempt) = {
        let mut registry = agent.registry();
        let relaunchable = registry.requests.contains_key(instance);
        let Some(info) = registry.instances.get_mut(instance) else { return };
        if !running(info.state) {
            return;
        }
        let attempt = super::recovery::next_attempt(info, node_lost).filter(|_| relaunchable);
        (info.state, info.error) = match attempt {
            Some(_) => (InstanceState::Recovering, Some(format!("{error}; placing it again"))),
            None => (InstanceState::Failed, Some(error.clone())),
        };
        let info = info.clone();
        if attempt.is_none() {
            registry.requests.remove(instance);
        }
        (info, attempt)
    };
    let (id, model) = (instance.to_string(), info.model.clone());
    match attempt {
        Some(attempt) => {
            tracing::warn!("instance {instance} ({model}) lost a stage: {error}; placing it again");
            publish(agent, &info);
            stop_stages(agent, &info);
            super::recovery::spawn(agent, id, error, attempt, node_lost);
        }
        None => {
            tracing::warn!("instance {instance} ({model}) failed: {error}");
            agent.emit(ClusterEvent::InstanceFailed { instance: id, model, error });
            publish(agent, &info);
            stop_stages(agent, &info);
        }
    }
}

fn stop_stages(agent: &Agent, info: &InstanceInfo) {
    let mut nodes: Vec<NodeId> = info.stages.iter().map(|s| s.node).collect();
    nodes.sort();
    nodes.dedup();
    for node in nodes {
        if node == agent.id() {
            stop_local(agent, &info.id);
        } else {
            agent.send_to(node, ControlMessage::StopInstance { instance: info.id.clone() });
        }
    }
}

fn stop_local(agent: &Agent, instance: &str) {
    agent.forget_ring_links(instance);
    let handles: Vec<_> = {
        let mut registry = agent.registry();
        let keys: Vec<_> = registry.local.keys().filter(|(i, _)| i == instance).cloned().collect();
        keys.into_iter().filter_map(|k| registry.local.remove(&k)).map(|l| l.handle).collect()
    };
    for handle in handles {
        tokio::spawn(async move { handle.stop().await });
    }
}

/// Stops an instance (any node may ask; the owner records it).
pub fn stop(agent: &Agent, instance: &str) -> Option<InstanceInfo> {
    let info = agent.registry().instances.get(instance).cloned()?;
    if info.owner == agent.id() {
        let updated = {
            let mut registry = agent.registry();
            registry.requests.remove(instance);
            let i = registry.instances.get_mut(instance)?;
            i.state = InstanceState::Stopped;
            i.clone()
        };
        publish(agent, &updated);
        stop_stages(agent, &updated);
        Some(updated)
    } else {
        agent.send_to(info.owner, ControlMessage::StopInstance { instance: instance.to_string() });
        stop_stages(agent, &info);
        Some(info)
    }
}

/// Instance messages on the control connections. Each is checked against what this node knows before
/// it is used (see [`super::validate`]); a message that fails is logged and dropped.
pub fn on_message(agent: &Agent, from: NodeId, message: ControlMessage) {
    let refuse = |what: &str, why: String| tracing::warn!("ignoring {what} from {}: {why}", from.short());
    match message {
        ControlMessage::StartStage { spec } => {
            let known = {
                let registry = agent.registry();
                registry.instances.get(&spec.instance).map(|i| {
                    let node = i.stages.get(spec.stage).map(|s| s.node);
                    (i.owner, node, i.stages.len())
                })
            };
            let checked = super::validate::stage_spec(&spec).and_then(|()| match known {
                Some((owner, Some(node), stages)) if owner == from && node == agent.id() && stages == spec.stages => {
                    Ok(())
                }
                Some(_) => {
                    Err(format!("stage {} of instance {} is not the sender's to place here", spec.stage, spec.instance))
                }
                None => Err(format!("instance {} is unknown", spec.instance)),
            });
            match checked {
                Ok(()) => start_local(agent, spec, from),
                Err(why) => {
                    refuse("a stage to start", why.clone());
                    let failed = StageReport { state: WorkerState::Failed, error: Some(why), ..Default::default() };
                    report(agent, from, &spec.instance, spec.stage, failed);
                }
            }
        }
        ControlMessage::StageUpdate { instance, stage, report } => {
            // Only the node that runs a stage reports on it, and only to the instance's owner.
            let runs_it = agent
                .registry()
                .instances
                .get(&instance)
                .is_some_and(|i| i.owner == agent.id() && i.stages.get(stage).is_some_and(|s| s.node == from));
            if runs_it {
                apply_report(agent, &instance, stage, report);
            } else {
                refuse("a stage update", format!("it does not run stage {stage} of an instance of this node"));
            }
        }
        ControlMessage::ConnectStage { instance, stage, next_node, next_port } => {
            let owned_by_sender = agent.registry().instances.get(&instance).is_some_and(|i| i.owner == from);
            if owned_by_sender {
                connect_local(agent, &instance, stage, next_node, next_port)
            } else {
                refuse("a ring connection", format!("instance {instance} is not the sender's"));
            }
        }
        ControlMessage::StopInstance { instance } => {
            let owned = agent.registry().instances.get(&instance).is_some_and(|i| i.owner == agent.id());
            if owned {
                stop(agent, &instance);
            } else {
                stop_local(agent, &instance);
            }
        }
        ControlMessage::Instance { info } => {
            let checked = {
                let mut registry = agent.registry();
                let checked = super::validate::instance(&info, from, registry.instances.get(&info.id));
                if checked.is_ok() {
                    registry.instances.insert(info.id.clone(), (*info).clone());
                }
                checked
            };
            match checked {
                Ok(()) => agent.emit(ClusterEvent::Instance { info }),
                Err(why) => refuse("an instance", why),
            }
        }
        other => super::generate::on_message(agent, from, other),
    }
}

/// A node went down: instances that used it fail; instances it owned end here; calls through it fail.
pub fn on_peer_down(agent: &Agent, peer: NodeId) {
    let me = agent.id();
    let affected: Vec<InstanceInfo> =
        agent.registry().instances.values().filter(|i| i.uses(peer) && i.state.is_active()).cloned().collect();
    for info in affected {
        let name = info.stages.iter().find(|s| s.node == peer).map_or_else(|| peer.short(), |s| s.node_name.clone());
        if info.owner == me {
            lose(agent, &info.id, format!("node {name} is down"), true);
        } else if info.owner == peer {
            {
                let mut registry = agent.registry();
                if let Some(i) = registry.instances.get_mut(&info.id) {
                    i.state = InstanceState::Failed;
                    i.error = Some("its owner node is down".into());
                }
            }
            stop_local(agent, &info.id);
        }
    }
    super::generate::fail_calls_through(agent, peer);
}

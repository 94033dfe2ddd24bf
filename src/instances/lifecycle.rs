//! Launching and watching instances, on the owner and on the nodes that run stages, and what a
//! node going down does to them (stopping them is in `ending`, the control messages in `messages`, the
//! connections between stages in `wiring`).

use super::ending::{settle_stages, stop_stages};
use super::service::Instances;
use super::wiring::{order_connections, wiring};
use super::{InstanceInfo, InstanceState, LaunchRequest, LocalStage, StageReport, StageStatus};
use crate::cluster::messages::ControlMessage;
use crate::cluster::state::ClusterEvent;
use crate::cluster::Agent;
use crate::model::{Model, ModelError};
use crate::node::NodeId;
use crate::placement::{self, LinkCost, ModelNeeds, NodeOffer, PlacementError, Plan};
use crate::worker::supervisor::{self, StageSpec};
use crate::worker::{WorkerEvent, WorkerState};
use std::sync::Arc;

/// Prompt tokens a step takes unless the launch asks for another batch.
const DEFAULT_BATCH: usize = 512;
/// The largest batch a launch may ask for.
pub(super) const MAX_LAUNCH_BATCH: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("{0}")]
    Invalid(String),
    /// An instance already serves (or is being launched or placed again under) the name asked for.
    #[error("{0}")]
    AlreadyRunning(String),
    /// No instance has the id given.
    #[error("{0}")]
    NotFound(String),
}

/// The nodes that are up, what they offer, and the measured links between them; each node's weight
/// rate for `weights` (the model's bytes by ggml type name) on a stage of `threads` threads (None: all
/// its cores).
pub(super) fn cluster_offers(
    agent: &Agent,
    weights: &[crate::engine::weight_rate::TypeReads],
    threads: Option<usize>,
) -> (Vec<NodeOffer>, Vec<LinkCost>) {
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
                weight_rate: crate::engine::weight_rate::rate_for_mix(&t.weight_rates, weights, threads),
            })
        })
        .collect();
    let links = snapshot
        .links
        .iter()
        .map(|l| LinkCost {
            a: l.a,
            b: l.b,
            // A model's traffic waits for its frames on threads of its own: its round trip where a probe
            // timed it, else the agent's (which adds its runtime's wake-ups).
            rtt_us: l.echo_rtt_us.or(l.rtt_p50_us),
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
    let batch = batch_for(request);
    // Stage 0 drafts (and the last stage verifies) unless drafting is off or the model has a recurrent
    // state: a step carries at most that many drafts in all.
    let drafts = match request.speculation.unwrap_or_default().for_model(model.config()) {
        crate::engine::Speculation::Off => 0,
        _ => request.draft_tokens.unwrap_or(crate::engine::DEFAULT_DRAFT_TOKENS).min(batch.saturating_sub(sequences)),
    };
    ModelNeeds::of_kv(model, context, sequences, batch, request.kv_type.unwrap_or_default()).with_draft_rows(drafts)
}

/// The batch of the request's stages.
fn batch_for(request: &LaunchRequest) -> usize {
    request.batch.unwrap_or(DEFAULT_BATCH)
}

/// A batch the request names must be one a stage can take: refused (not clamped) when 0 or past
/// [`MAX_LAUNCH_BATCH`]; so is a reply limit of 0.
fn check_limits(request: &LaunchRequest) -> Result<(), LaunchError> {
    match request.batch {
        Some(batch) if batch == 0 || batch > MAX_LAUNCH_BATCH => Err(LaunchError::Invalid(format!(
            "a batch of {batch} tokens cannot be used: give 1 to {MAX_LAUNCH_BATCH} (the default is {DEFAULT_BATCH})"
        ))),
        _ => Ok(()),
    }?;
    match request.max_reply_tokens {
        Some(0) => Err(LaunchError::Invalid(
            "a reply limit of 0 tokens would answer nothing: give 1 or more, or leave it out".into(),
        )),
        _ => Ok(()),
    }?;
    let most = crate::engine::MAX_DRAFT_TOKENS;
    match request.draft_tokens {
        Some(n) if n == 0 || n > most => Err(LaunchError::Invalid(format!(
            "{n} drafted tokens a step cannot be used: give 1 to {most} (the default is {}), or turn drafting off \
             with speculation off",
            crate::engine::DEFAULT_DRAFT_TOKENS
        ))),
        _ => Ok(()),
    }
}

/// Fewest tokens of context a launch may ask for (a chat template alone takes more).
const MIN_CONTEXT: usize = 16;

/// A context the request names must be one the model can use: refused (not clamped) when it is too
/// small or beyond the context the model was trained on, so that nobody gets less memory planned than
/// asked for, or a model answering past what it knows, without being told.
fn check_context(model: &Model, request: &LaunchRequest) -> Result<(), LaunchError> {
    let Some(context) = request.context else { return Ok(()) };
    let trained = model.config().training_context;
    if context < MIN_CONTEXT {
        return Err(LaunchError::Invalid(format!(
            "a context of {context} tokens is too small: give at least {MIN_CONTEXT}"
        )));
    }
    if trained > 0 && context > trained {
        return Err(LaunchError::Invalid(format!(
            "a context of {context} tokens is more than the {trained} this model was trained on: give {trained} or less"
        )));
    }
    Ok(())
}

/// The plan a launch would use.
pub async fn preview(instances: &Arc<Instances>, request: &LaunchRequest) -> Result<(Plan, String), LaunchError> {
    let path = request.model.clone();
    // A model whose chat template cannot render is refused here, not by its workers after placement.
    let model =
        tokio::task::spawn_blocking(move || Model::open(&path).and_then(|m| m.check_chat_template().map(|_| m)))
            .await
            .map_err(|e| LaunchError::Invalid(e.to_string()))??;
    check_context(&model, request)?;
    check_limits(request)?;
    request.kv_type.unwrap_or_default().check_model(model.config()).map_err(LaunchError::Invalid)?;
    remember_in_library(instances, &request.model).await;
    super::measurement_wait::await_measurements(instances).await;
    let needs = needs_for(&model, request);
    let (offers, links) = cluster_offers(&instances.agent, &needs.weight_mix, request.threads);
    if let Some(names) = &request.nodes {
        if request.layers.is_some() {
            return Err(LaunchError::Invalid("--layers names the nodes already; leave out --nodes".into()));
        }
        let pinned = placement::pinned(&offers, names)?;
        let plan = placement::plan_on(&needs, &pinned, &links, request.parallel)?;
        return Ok((
            with_saved_prefixes(plan, &needs, request)?,
            instance_name(request).unwrap_or_else(|| model.name()),
        ));
    }
    let plan = match (&request.layers, request.parallel) {
        (Some(_), Some(mode @ (placement::Parallelism::Tensor | placement::Parallelism::Chain))) => {
            return Err(LaunchError::Invalid(format!(
                "--layers splits the model into layer ranges (a pipeline); leave it out for --parallel {mode}"
            )))
        }
        (Some(spec), _) => placement::plan_override(&needs, &offers, &links, &placement::parse_layers(spec)?)?,
        (None, forced) => placement::plan_mode(&needs, &offers, &links, forced)?,
    };
    Ok((with_saved_prefixes(plan, &needs, request)?, instance_name(request).unwrap_or_else(|| model.name())))
}

/// `plan` with the tokens of saved prefixes (the prompt cache beyond the slots) its nodes have room
/// for, up to what the launch asks (`prompt_cache`; by default one more context per slot).
fn with_saved_prefixes(mut plan: Plan, needs: &ModelNeeds, request: &LaunchRequest) -> Result<Plan, LaunchError> {
    let slots = needs.context * needs.sequences;
    let most = slots * super::validate::SAVED_PREFIX_CONTEXTS;
    let wanted = request.prompt_cache.unwrap_or(slots);
    if wanted > most {
        return Err(LaunchError::Invalid(format!(
            "a prompt cache of {wanted} tokens is more than {} contexts per slot ({most} tokens)",
            super::validate::SAVED_PREFIX_CONTEXTS
        )));
    }
    plan.saved_prefix_tokens = placement::saved_prefix_tokens(&plan, needs, wanted);
    Ok(plan)
}

/// A model given by path (to `shoal run`, the launch form or `--run`) joins this node's library, so the
/// placement preview and the other nodes see that this node holds it (and can fetch their shares from
/// it). A file the library cannot take stays out, with a warning: the launch itself goes on.
async fn remember_in_library(instances: &Arc<Instances>, path: &std::path::Path) {
    let library = || crate::model::library::Library::new(&instances.agent.config.data_dir);
    let known = {
        let library = library();
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let wanted = std::fs::canonicalize(&path).unwrap_or(path);
            library.list().iter().any(|m| m.parts.iter().any(|p| std::fs::canonicalize(p).is_ok_and(|p| p == wanted)))
        })
    };
    if known.await.unwrap_or(true) {
        return;
    }
    let (library, path) = (library(), path.to_path_buf());
    match tokio::task::spawn_blocking(move || library.add(&path)).await {
        Ok(Ok(model)) => tracing::info!("{} is now in this node's library", model.path.display()),
        Ok(Err(e)) => tracing::warn!("{e}"),
        Err(_) => {}
    }
}

/// The name clients use for the instance a request launches: the one it gives, or the model's name in
/// the library (its file name, which has no spaces, unlike many models' own names).
fn instance_name(request: &LaunchRequest) -> Option<String> {
    request.name.clone().or_else(|| crate::model::library::model_name(&request.model))
}

/// What each stage's node would fetch of the model at launch (None: it holds its share already).
pub async fn preview_fetches(
    instances: &Arc<Instances>,
    request: &LaunchRequest,
    plan: &Plan,
) -> Vec<Option<super::ShareNeed>> {
    let path = request.model.clone();
    let Ok(Ok(model)) = tokio::task::spawn_blocking(move || Model::open(&path)).await else {
        return vec![None; plan.stages.len()];
    };
    super::share::plan_fetches(&instances.agent, &model, plan).await
}

/// Launches an instance; this node owns it. Returns as soon as the stages are starting. Refused while
/// another instance runs under the same name: clients name models by it, so the second would never
/// be reached.
pub async fn launch(instances: &Arc<Instances>, request: LaunchRequest) -> Result<InstanceInfo, LaunchError> {
    if let Some(name) = instance_name(&request) {
        super::validate::model_name(&name).map_err(LaunchError::Invalid)?;
    }
    check_name_free(instances, &request)?;
    launch_as(instances, request, None).await
}

/// Refuses a launch whose name (given, or the file's) an active instance already serves.
pub fn check_name_free(instances: &Arc<Instances>, request: &LaunchRequest) -> Result<(), LaunchError> {
    let name = instance_name(request);
    let running = name.as_ref().and_then(|name| {
        let registry = instances.registry();
        registry.instances.values().find(|i| i.state.is_active() && &i.model == name).cloned()
    });
    match running {
        None => Ok(()),
        Some(running) => Err(LaunchError::AlreadyRunning(format!(
            "`{}` already runs as instance {} ({}); stop it first (`shoal stop {}`, or `shoal run --replace`), or launch this one under another name (--name)",
            running.model,
            running.id,
            format!("{:?}", running.state).to_lowercase(),
            running.model
        ))),
    }
}

/// Launches an instance, placed with the cluster as it is now; `recovery` names the instance it
/// replaces, if any.
pub(super) async fn launch_as(
    instances: &Arc<Instances>,
    request: LaunchRequest,
    recovery: Option<super::Recovery>,
) -> Result<InstanceInfo, LaunchError> {
    let (plan, name) = preview(instances, &request).await?;
    let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let me = instances.agent.id();
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
                device: None,
                slice: s.slice.clone(),
            })
            .collect(),
        plan,
        ready_at_ms: None,
        recovery,
        replaced_by: None,
        request: Some(request.clone()),
    };
    {
        let mut registry = instances.registry();
        registry.instances.insert(id.clone(), info.clone());
        registry.requests.insert(id.clone(), request.clone());
    }
    publish(instances, &info);
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
    let ring = info.plan.ring();
    for (i, stage) in info.stages.iter().enumerate() {
        // A group's ranks hold the shares placement planned (equal when it gave none), and know their
        // group's place in the ring; a whole stage chained with groups is told its place.
        let tensor = info.plan.rank_of(i).map(|r| supervisor::TensorRank {
            rank: r.rank,
            shares: r.shares,
            ring_stage: r.ring_stage,
            ring_stages: r.ring_stages,
        });
        let place = ring.iter().position(|g| g.contains(&i)).unwrap_or(i);
        let chained = tensor.is_none() && (place, ring.len()) != (i, info.stages.len());
        let spec = StageSpec {
            instance: id.clone(),
            stage: i,
            stages: info.stages.len(),
            model_path: request.model.clone(),
            layers: stage.layers.clone(),
            context: info.context,
            sequences: info.sequences,
            batch: batch_for(&request),
            kv_type: request.kv_type.unwrap_or_default(),
            saved_prefix_tokens: Some(info.plan.saved_prefix_tokens),
            threads: request.threads.unwrap_or(0),
            speculation: request.speculation.unwrap_or_default(),
            draft_tokens: request.draft_tokens,
            file: file.clone(),
            parts: parts.clone(),
            tensor,
            ring: chained.then_some(supervisor::RingPlace { stage: place, stages: ring.len() }),
        };
        if stage.node == me {
            start_local(instances, spec, me);
        } else if !instances.agent.send_to(stage.node, ControlMessage::StartStage { spec }) {
            lose(instances, &id, format!("cannot reach {} to start stage {i}", stage.node_name), false);
        }
    }
    Ok(info)
}

/// Sends the owner's view of an instance to every node and to the local event stream.
pub(super) fn publish(instances: &Arc<Instances>, info: &InstanceInfo) {
    instances.agent.broadcast(ControlMessage::Instance { info: Box::new(info.clone()) });
    instances.agent.emit(ClusterEvent::Instance { info: Box::new(info.clone()) });
}

/// Starts a stage on this node: fetches its share of the model if this node lacks it, then starts its
/// worker — unless the instance ended meanwhile.
pub(super) fn start_local(instances: &Arc<Instances>, spec: StageSpec, owner: NodeId) {
    let instances = instances.clone();
    tokio::spawn(async move {
        let (instance, stage) = (spec.instance.clone(), spec.stage);
        let reporter = {
            let (instances, instance) = (instances.clone(), instance.clone());
            move |r| report(&instances, owner, &instance, stage, r)
        };
        match super::share::ensure_share(&instances, &spec, reporter).await {
            Ok(path) => {
                let ended = instances.registry().instances.get(&instance).is_none_or(|i| !running(i.state));
                if !ended {
                    start_worker(&instances, StageSpec { model_path: path, ..spec }, owner);
                }
            }
            Err(error) => {
                tracing::warn!("stage {stage} of instance {instance} does not start: {error}");
                let failed = StageReport { state: WorkerState::Failed, error: Some(error), ..Default::default() };
                report(&instances, owner, &instance, stage, failed);
            }
        }
    });
}

/// Starts a worker for a stage on this node and relays its events to the owner.
fn start_worker(instances: &Arc<Instances>, spec: StageSpec, owner: NodeId) {
    let key = (spec.instance.clone(), spec.stage);
    let threads = if spec.threads > 0 {
        spec.threads
    } else {
        let hosted: Vec<usize> = instances.registry().local.values().map(|l| l.threads).collect();
        let on_gpu = instances.agent.config.device.on_gpu();
        super::threads::for_new_stage(crate::engine::default_threads(), &hosted, on_gpu)
    };
    let secret = instances.agent.secret_bytes();
    let log_dir = instances.agent.config.data_dir.file("logs");
    let prompt_cache_dir = instances.agent.config.data_dir.file("prompt-cache");
    let (events_agent, exit_instances) = (instances.clone(), instances.clone());
    let (instance, stage) = (spec.instance.clone(), spec.stage);
    let (instance2, stage2) = (spec.instance.clone(), spec.stage);
    let setup = supervisor::WorkerSetup {
        threads,
        device: &instances.agent.config.device,
        // The data port listens where the instances's control port does (--bind), never wider.
        listen: instances.agent.config.control_bind,
        prompt_cache_dir: Some(&prompt_cache_dir),
    };
    let spawned = supervisor::spawn(
        &spec,
        setup,
        &secret,
        &log_dir,
        move |event| on_worker_event(&events_agent, owner, &instance, stage, event),
        move |ended| {
            let stopped = exit_instances.registry().local.remove(&(instance2.clone(), stage2)).is_none();
            let update = if stopped { (WorkerState::Stopped, None) } else { (WorkerState::Failed, Some(ended)) };
            report(
                &exit_instances,
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
                instances.agent.track_process(pid);
            }
            instances.registry().local.insert(
                key,
                LocalStage { handle: Arc::new(handle), threads, front_port: None, next: None, group: Vec::new() },
            );
        }
        Err(e) => report(
            instances,
            owner,
            &spec.instance,
            spec.stage,
            StageReport { state: WorkerState::Failed, error: Some(e.to_string()), ..Default::default() },
        ),
    }
}

fn on_worker_event(instances: &Arc<Instances>, owner: NodeId, instance: &str, stage: usize, event: WorkerEvent) {
    let report_of = match event {
        WorkerEvent::Loading { progress } => {
            StageReport { state: WorkerState::Loading, progress: Some(progress), ..Default::default() }
        }
        WorkerEvent::Listening { data_port, front_port, memory, device } => {
            if let Some(local) = instances.registry().local.get_mut(&(instance.to_string(), stage)) {
                local.front_port = front_port;
            }
            StageReport {
                state: WorkerState::Connecting,
                progress: Some(1.0),
                data_port: Some(data_port),
                memory: Some(memory),
                device: Some(device),
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
            let next = instances.registry().local.get(&(instance.to_string(), stage)).and_then(|l| l.next);
            if let Some(next) = next {
                instances.agent.links.ring_link_changed(next, instance, transport);
            }
            return;
        }
        WorkerEvent::GroupLink { peer, transport } => {
            let key = (instance.to_string(), stage);
            let node = instances.registry().local.get(&key).and_then(|l| l.group.get(peer).copied());
            if let Some(node) = node.filter(|n| *n != instances.agent.id()) {
                instances.agent.links.ring_link_changed(node, instance, transport);
            }
            return;
        }
    };
    report(instances, owner, instance, stage, report_of);
}

pub(super) fn report(instances: &Arc<Instances>, owner: NodeId, instance: &str, stage: usize, report: StageReport) {
    if owner == instances.agent.id() {
        apply_report(instances, instance, stage, report);
    } else {
        instances.agent.send_to(owner, ControlMessage::StageUpdate { instance: instance.to_string(), stage, report });
    }
}

/// The owner takes in a stage's report: wires the ring once every stage listens, marks the instance
/// ready once every stage is, and fails it when a stage fails.
pub(super) fn apply_report(instances: &Arc<Instances>, instance: &str, stage: usize, report: StageReport) {
    let mut failed = None;
    let (mut groups, mut ring) = (None, None);
    let info = {
        let mut registry = instances.registry();
        let Some(info) = registry.instances.get_mut(instance) else { return };
        let Some(s) = info.stages.get_mut(stage) else { return };
        if !running(info.state) && report.state != WorkerState::Stopped {
            return;
        }
        let was_ready = s.state.is_ready();
        // Stats only move a ready stage between ready and serving.
        if report.stats.is_none() || was_ready {
            s.state = report.state;
        }
        let became_ready = !was_ready && s.state.is_ready();
        if let Some(p) = report.progress {
            s.progress = p;
        }
        if report.data_port.is_some() {
            s.data_port = report.data_port;
        }
        if report.memory.is_some() {
            s.memory = report.memory;
        }
        if report.device.is_some() {
            s.device = report.device.clone();
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
        if info.state == InstanceState::Launching {
            (groups, ring) = wiring(info, stage, report.data_port.is_some(), became_ready);
        }
        if info.state == InstanceState::Launching && info.stages.iter().all(|s| s.state.is_ready()) {
            info.state = InstanceState::Ready;
            info.ready_at_ms.get_or_insert_with(crate::util::now_ms);
        }
        info.clone()
    };
    if let Some(error) = failed {
        return lose(instances, instance, error, false);
    }
    order_connections(instances, instance, groups.unwrap_or_default(), ring.unwrap_or_default());
    publish(instances, &info);
}

/// Whether the instance's stages should be running: it is launching or ready.
fn running(state: InstanceState) -> bool {
    matches!(state, InstanceState::Launching | InstanceState::Ready)
}

/// The owner's instance lost a stage (`node_lost`: its node went down): its stages are stopped
/// everywhere, and it is placed again when [`super::recovery`] says that can help, or marked failed.
fn lose(instances: &Arc<Instances>, instance: &str, error: String, node_lost: bool) {
    let (info, attempt) = {
        let mut registry = instances.registry();
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
        settle_stages(info, |node| instances.agent.is_up(node));
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
            publish(instances, &info);
            stop_stages(instances, &info);
            super::recovery::spawn(instances, id, error, attempt, node_lost);
        }
        None => {
            tracing::warn!("instance {instance} ({model}) failed: {error}");
            instances.agent.emit(ClusterEvent::InstanceFailed { instance: id, model, error });
            publish(instances, &info);
            stop_stages(instances, &info);
        }
    }
}

/// A node went down: the instances this node owns that used it are placed again (or fail); those whose
/// owner is down are taken over by a node that remains ([`super::takeover`]); calls through it fail.
pub fn on_peer_down(instances: &Arc<Instances>, peer: NodeId) {
    let me = instances.agent.id();
    let owner_down = |i: &InstanceInfo| i.owner != me && !instances.agent.is_up(i.owner);
    let affected: Vec<InstanceInfo> = instances
        .registry()
        .instances
        .values()
        .filter(|i| i.state.is_active() && (i.uses(peer) || owner_down(i)))
        .cloned()
        .collect();
    for info in affected {
        if info.owner == me {
            let name =
                info.stages.iter().find(|s| s.node == peer).map_or_else(|| peer.short(), |s| s.node_name.clone());
            lose(instances, &info.id, format!("node {name} is down"), true);
        } else if owner_down(&info) {
            super::takeover::owner_down(instances, &info);
        }
    }
    super::ending::node_down_in_stopped(instances, peer);
    super::generate::fail_calls_through(instances, peer);
}

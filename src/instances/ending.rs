//! How instances end, and start again by hand. Stopping one stops its workers on every node; once an
//! instance's workers are stopped (it was stopped, failed, or is being placed again) its stages say what
//! they are now rather than what they last reported: a stage whose node is down failed, and says so,
//! and the others are stopped ([`settle_stages`]). An ended instance can be launched again as it was
//! launched — same model, layers, context, sequences and name — by any node that has the model
//! ([`relaunch`]).

use super::lifecycle::{launch, publish, LaunchError};
use super::service::Instances;
use super::{InstanceInfo, InstanceState, LaunchRequest};
use crate::cluster::messages::ControlMessage;
use crate::model::library::Library;
use crate::node::NodeId;
use crate::worker::WorkerState;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Sets the stages of `info`, whose workers are stopped, to what they are now: a stage on a node that
/// is not up (`is_up`) failed with "node NAME is down" (one that failed by itself keeps its own error),
/// every other stage is stopped. Returns whether a stage changed.
pub(super) fn settle_stages(info: &mut InstanceInfo, is_up: impl Fn(NodeId) -> bool) -> bool {
    let mut changed = false;
    for stage in &mut info.stages {
        let before = (stage.state, stage.error.clone());
        match stage.state {
            WorkerState::Failed => {}
            _ if !is_up(stage.node) => {
                stage.state = WorkerState::Failed;
                stage.error = Some(format!("node {} is down", stage.node_name));
            }
            _ => stage.state = WorkerState::Stopped,
        }
        changed |= before != (stage.state, stage.error.clone());
    }
    changed
}

/// Sends every node that runs a stage of `info` the order to stop it (this node stops its own).
pub(super) fn stop_stages(instances: &Arc<Instances>, info: &InstanceInfo) {
    let mut nodes: Vec<NodeId> = info.stages.iter().map(|s| s.node).collect();
    nodes.sort();
    nodes.dedup();
    for node in nodes {
        if node == instances.agent.id() {
            stop_local(instances, &info.id);
        } else {
            instances.agent.send_to(node, ControlMessage::StopInstance { instance: info.id.clone() });
        }
    }
}

/// Stops this node's workers of `instance`.
pub(super) fn stop_local(instances: &Arc<Instances>, instance: &str) {
    instances.agent.links.forget_ring_links(instance);
    let handles: Vec<_> = {
        let mut registry = instances.registry();
        let keys: Vec<_> = registry.local.keys().filter(|(i, _)| i == instance).cloned().collect();
        keys.into_iter().filter_map(|k| registry.local.remove(&k)).map(|l| l.handle).collect()
    };
    for handle in handles {
        tokio::spawn(async move { handle.stop().await });
    }
}

/// Stops every worker of this node and waits for them (each saves what its prompt cache has not saved
/// yet, and is killed a second after it was asked): the node is shutting down.
pub async fn stop_all_local(instances: &Arc<Instances>) {
    let handles: Vec<_> = instances.registry().local.drain().map(|(_, l)| l.handle).collect();
    let stops = handles.iter().map(|h| h.stop());
    futures_util::future::join_all(stops).await;
}

/// Stops an instance (any node may ask; the owner records it).
pub fn stop(instances: &Arc<Instances>, instance: &str) -> Option<InstanceInfo> {
    let info = instances.registry().instances.get(instance).cloned()?;
    if info.owner == instances.agent.id() {
        let updated = {
            let mut registry = instances.registry();
            registry.requests.remove(instance);
            let i = registry.instances.get_mut(instance)?;
            i.state = InstanceState::Stopped;
            settle_stages(i, |node| instances.agent.is_up(node));
            i.clone()
        };
        publish(instances, &updated);
        stop_stages(instances, &updated);
        Some(updated)
    } else {
        instances.agent.send_to(info.owner, ControlMessage::StopInstance { instance: instance.to_string() });
        stop_stages(instances, &info);
        Some(info)
    }
}

/// A node went down: the stages it ran of this node's instances whose workers are already stopped
/// (ended, or waiting to be placed again) now say so.
pub(super) fn node_down_in_stopped(instances: &Arc<Instances>, peer: NodeId) {
    let me = instances.agent.id();
    let changed: Vec<InstanceInfo> = {
        let mut registry = instances.registry();
        let stopped = registry.instances.values_mut().filter(|i| {
            i.owner == me && !matches!(i.state, InstanceState::Launching | InstanceState::Ready) && i.uses(peer)
        });
        stopped.filter_map(|i| settle_stages(i, |node| node != peer).then(|| i.clone())).collect()
    };
    for info in changed {
        publish(instances, &info);
    }
}

/// Launches the ended instance `id` again, owned by this node: the same model (this node's copy of
/// it), with the options it was launched with. When the layers it was given cannot be placed now (a
/// node it named is gone), it is placed where placement puts it, as after any loss. Refused while the
/// instance is active, or while another instance serves its name.
pub async fn relaunch(instances: &Arc<Instances>, id: &str) -> Result<InstanceInfo, LaunchError> {
    let info = instances.registry().instances.get(id).cloned();
    let info = info.ok_or_else(|| LaunchError::NotFound(format!("no instance {id}")))?;
    let library = Library::new(&instances.agent.config.data_dir);
    let request = relaunch_request(&info, |path| local_copy(&library, path)).map_err(LaunchError::Invalid)?;
    match launch(instances, request.clone()).await {
        Err(LaunchError::Placement(_)) if request.layers.is_some() => {
            launch(instances, LaunchRequest { layers: None, ..request }).await
        }
        launched => launched,
    }
}

/// The request that launches `info` again: the one it was launched with (or, for a record without
/// it, its model, context, sequences and name), reading the model from this node's copy (`local_copy`
/// of the launching node's path), under the same name.
pub(super) fn relaunch_request(
    info: &InstanceInfo,
    local_copy: impl FnOnce(&Path) -> Option<PathBuf>,
) -> Result<LaunchRequest, String> {
    if info.state.is_active() {
        return Err(format!(
            "instance {} (`{}`) is {}: only an instance that ended is launched again",
            info.id,
            info.model,
            format!("{:?}", info.state).to_lowercase()
        ));
    }
    let original = info.request.clone().unwrap_or_else(|| LaunchRequest {
        model: info.model_path.clone(),
        context: Some(info.context),
        sequences: Some(info.sequences),
        ..LaunchRequest::default()
    });
    let Some(path) = local_copy(&original.model) else {
        return Err(format!(
            "this node has no whole copy of {}: copy it here first, or relaunch it from a node that has it",
            super::takeover::file_name(&original.model)
        ));
    };
    let request = super::takeover::taken_over_request(&original, path);
    Ok(LaunchRequest { name: request.name.clone().or_else(|| Some(info.model.clone())), ..request })
}

/// The model at `path` (a path on the node that launched it) on this node: that very file when it is
/// here, else this node's whole copy of it in its library.
fn local_copy(library: &Library, path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    super::takeover::whole_model_here(library, path)
}

#[cfg(test)]
#[path = "ending/tests.rs"]
mod tests;

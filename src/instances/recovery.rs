//! Recovery without a person. When an instance loses a node or a worker, its owner stops what is left
//! of it and places the model again, with the request it was launched with, on the nodes that are up
//! now: the shares they hold are reused and what a node lacks is fetched, as at any launch. While the
//! model does not fit, the instance waits in the `recovering` state, its error saying what it lacks,
//! and is tried again every [`RETRY_EVERY`]: a node that comes back is used at the next try. Once the
//! new instance is placed, the old one is `replaced` and names it; requests for the model wait for it
//! meanwhile ([`super::generate_when_ready`]).
//!
//! It does not loop on a model that cannot run: an instance that never became ready is placed again
//! only after it lost a node, and at most [`MAX_ATTEMPTS`] times in a row without serving.

use super::lifecycle::{launch_as, publish, LaunchError};
use super::service::Instances;
use super::{InstanceInfo, InstanceState, LaunchRequest, Recovery};
use std::sync::Arc;
use std::time::Duration;

/// How often a recovering instance tries to be placed again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Most replacements in a row that never became ready.
pub const MAX_ATTEMPTS: u32 = 3;

/// The attempt number of placing `info` again after it lost a stage (`node_lost`: its node went
/// down), or None when placing it again cannot help: a stage of a model that never served failed by
/// itself (a file or memory error would fail again), or too many replacements in a row never served.
pub(super) fn next_attempt(info: &InstanceInfo, node_lost: bool) -> Option<u32> {
    let attempt = match (&info.recovery, info.ready_at_ms) {
        (_, Some(_)) => 1,
        (Some(previous), None) => previous.attempt + 1,
        (None, None) if node_lost => 1,
        (None, None) => return None,
    };
    (attempt <= MAX_ATTEMPTS).then_some(attempt)
}

/// Places the owner's instance `old` again in the background, until it is placed or stopped.
/// `node_lost`: it lost a node, which the cluster already knows is down.
pub(super) fn spawn(instances: &Arc<Instances>, old: String, reason: String, attempt: u32, node_lost: bool) {
    let instances = instances.clone();
    // A stage that failed may be the first sign of its own or a neighbour's node dying (the ring
    // breaks at once; the node is known down only after `DOWN_AFTER` of silence): placing it again
    // before then could pick that node.
    let settle = if node_lost { Duration::ZERO } else { crate::cluster::health::DOWN_AFTER + RETRY_EVERY / 2 };
    // A replacement that failed before serving waits longer each time.
    let wait = settle + RETRY_EVERY * 5 * (attempt - 1);
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        replace(&instances, &old, &reason, attempt).await
    });
}

async fn replace(instances: &Arc<Instances>, old: &str, reason: &str, attempt: u32) {
    loop {
        let request = {
            let registry = instances.registry();
            let recovering = registry.instances.get(old).is_some_and(|i| i.state == InstanceState::Recovering);
            match registry.requests.get(old) {
                Some(request) if recovering => request.clone(),
                _ => return,
            }
        };
        let recovery = Recovery { replaces: old.to_string(), reason: reason.to_string(), attempt };
        match place_again(instances, &request, recovery).await {
            Ok(new) => return replaced(instances, old, &new, request),
            Err(why) => waiting(instances, old, format!("{reason}; waiting to place it again: {why}")),
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// Launches `request` again: as the user chose (the layers, the nodes, the way to split it) while the
/// nodes that are up can hold it so, else where placement puts it now (a tensor-parallel group that
/// lost a node serves as a pipeline on one node rather than not at all).
async fn place_again(
    instances: &Arc<Instances>,
    request: &LaunchRequest,
    recovery: Recovery,
) -> Result<InstanceInfo, LaunchError> {
    if request.layers.is_some() || request.nodes.is_some() || request.parallel.is_some() {
        if let Ok(info) = launch_as(instances, request.clone(), Some(recovery.clone())).await {
            return Ok(info);
        }
    }
    let anywhere = LaunchRequest { layers: None, nodes: None, parallel: None, ..request.clone() };
    launch_as(instances, anywhere, Some(recovery)).await
}

/// `old` is replaced by `new`, which keeps the request `old` was launched with. If `old` was stopped
/// while `new` was being placed, `new` is stopped too.
fn replaced(instances: &Arc<Instances>, old: &str, new: &InstanceInfo, request: LaunchRequest) {
    let info = {
        let mut registry = instances.registry();
        let Some(_) = registry.requests.remove(old) else {
            drop(registry);
            super::stop(instances, &new.id);
            return;
        };
        registry.requests.insert(new.id.clone(), request);
        let Some(info) = registry.instances.get_mut(old) else { return };
        info.state = InstanceState::Replaced;
        info.replaced_by = Some(new.id.clone());
        info.clone()
    };
    tracing::info!("instance {old} ({}) is placed again as {}", info.model, new.id);
    publish(instances, &info);
}

/// `old` is still waiting to be placed again, for the reason `why`.
fn waiting(instances: &Arc<Instances>, old: &str, why: String) {
    let info = {
        let mut registry = instances.registry();
        let Some(info) = registry.instances.get_mut(old).filter(|i| i.state == InstanceState::Recovering) else {
            return;
        };
        if info.error.as_ref() == Some(&why) {
            return;
        }
        info.error = Some(why);
        info.clone()
    };
    publish(instances, &info);
}

#[cfg(test)]
mod tests;

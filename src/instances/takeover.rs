//! When an instance's owner goes down. The owner is the node that launched the instance and the only
//! one that places it again after a loss; if it is the node that died, one of the nodes that remain
//! takes the instance over: the same node on every member ([`successor`]: the lowest id among the
//! nodes up that ran one of its stages, else the lowest up), computed from the same view of the
//! membership. The successor becomes the owner and places the model again with the request it was
//! launched with (carried in the instance record), from its own whole copy of the model; the others
//! mark the instance recovering and wait for the successor's word. A successor without the whole
//! model, or an instance that cannot be placed again, ends as failed, saying why.

use super::ending::{settle_stages, stop_local, stop_stages};
use super::lifecycle::publish;
use super::service::Instances;
use super::{InstanceInfo, InstanceState, LaunchRequest};
use crate::cluster::state::ClusterEvent;
use crate::model::library::Library;
use crate::node::NodeId;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The node that takes `info` over when its owner is down, among the nodes `up` (never the owner).
pub(super) fn successor(info: &InstanceInfo, up: &[NodeId]) -> Option<NodeId> {
    let candidates = up.iter().copied().filter(|n| *n != info.owner);
    let ran_a_stage = candidates.clone().filter(|n| info.stages.iter().any(|s| s.node == *n)).min();
    ran_a_stage.or_else(|| candidates.min())
}

/// The owner of `info` is down: this node takes it over when it is the successor; otherwise it stops
/// its own stages and waits for the successor.
pub(super) fn owner_down(instances: &Arc<Instances>, info: &InstanceInfo) {
    let me = instances.agent.id();
    let nodes = instances.agent.snapshot().nodes;
    let up: Vec<NodeId> = nodes.iter().filter(|n| n.status.is_up()).map(|n| n.id).collect();
    let name = |node: NodeId| nodes.iter().find(|n| n.id == node).map_or_else(|| node.short(), |n| n.name.clone());
    let owner = name(info.owner);
    let Some(successor) = successor(info, &up) else { return };
    if successor == me {
        adopt(instances, info, format!("its owner {owner} is down"));
        return;
    }
    let waiting = {
        let mut registry = instances.registry();
        let Some(i) = registry.instances.get_mut(&info.id).filter(|i| i.owner == info.owner) else { return };
        i.state = InstanceState::Recovering;
        i.error = Some(format!("its owner {owner} is down; {} takes it over", name(successor)));
        settle_stages(i, |node| up.contains(&node));
        i.clone()
    };
    instances.agent.emit(ClusterEvent::Instance { info: Box::new(waiting) });
    stop_local(instances, &info.id);
}

/// Makes this node the owner of `info` and places it again, or ends it as failed when this node
/// cannot (no launch request recorded, no whole copy of the model here, too many attempts).
fn adopt(instances: &Arc<Instances>, info: &InstanceInfo, reason: String) {
    let library = Library::new(&instances.agent.config.data_dir);
    let request = info.request.as_ref().map(|r| (r, whole_model_here(&library, &info.model_path)));
    let attempt = super::recovery::next_attempt(info, true);
    let plan = match (request, attempt) {
        (Some((request, Some(path))), Some(attempt)) => Ok((taken_over_request(request, path), attempt)),
        (None, _) => Err("it does not say how it was launched".to_string()),
        (Some((_, None)), _) => {
            Err(format!("this node has no whole copy of {} to place it again", file_name(&info.model_path)))
        }
        (_, None) => Err("it was placed again too many times without serving".to_string()),
    };
    let me = instances.agent.id();
    let adopted = {
        let mut registry = instances.registry();
        let Some(i) = registry.instances.get_mut(&info.id).filter(|i| i.owner == info.owner) else { return };
        i.owner = me;
        match &plan {
            Ok(_) => {
                i.state = InstanceState::Recovering;
                i.error = Some(format!("{reason}; this node takes it over and places it again"));
            }
            Err(why) => {
                i.state = InstanceState::Failed;
                i.error = Some(format!("{reason}, and it cannot be placed again here: {why}"));
            }
        }
        settle_stages(i, |node| instances.agent.is_up(node));
        let adopted = i.clone();
        if let Ok((request, _)) = &plan {
            registry.requests.insert(info.id.clone(), request.clone());
        }
        adopted
    };
    publish(instances, &adopted);
    stop_stages(instances, &adopted);
    match plan {
        Ok((_, attempt)) => {
            tracing::warn!("instance {} ({}): {reason}; taking it over", info.id, info.model);
            super::recovery::spawn(instances, info.id.clone(), reason, attempt, true);
        }
        Err(why) => {
            tracing::warn!("instance {} ({}): {reason}; cannot take it over: {why}", info.id, info.model);
            let error = adopted.error.clone().unwrap_or_default();
            instances.agent.emit(ClusterEvent::InstanceFailed {
                instance: info.id.clone(),
                model: info.model.clone(),
                error,
            });
        }
    }
}

/// The request the successor launches with: the owner's, reading the model from this node's copy, its
/// thread count bounded as a stage's is and a batch no launch may ask for dropped.
pub(super) fn taken_over_request(request: &LaunchRequest, path: PathBuf) -> LaunchRequest {
    LaunchRequest {
        model: path,
        threads: request.threads.filter(|t| *t <= 1024),
        batch: request.batch.filter(|b| (1..=super::lifecycle::MAX_LAUNCH_BATCH).contains(b)),
        draft_tokens: request.draft_tokens.filter(|n| (1..=crate::engine::MAX_DRAFT_TOKENS).contains(n)),
        ..request.clone()
    }
}

/// This node's whole copy (not a shard) of the model the owner read from `owner_path`, found by file
/// name in its library.
pub(super) fn whole_model_here(library: &Library, owner_path: &Path) -> Option<PathBuf> {
    let name = owner_path.file_name()?;
    library.list().into_iter().find(|m| m.shard.is_none() && m.path.file_name() == Some(name)).map(|m| m.path)
}

pub(super) fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desktop::fixtures::{id, instance};

    #[test]
    fn the_successor_is_the_lowest_up_node_that_ran_a_stage_and_never_the_owner() {
        // Stages on nodes 1 and 2; the owner is node 1.
        let info = instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0]);
        assert_eq!(info.owner, id(1));
        assert_eq!(successor(&info, &[id(1), id(2), id(3)]), Some(id(2)), "the owner is never its own successor");
        assert_eq!(successor(&info, &[id(3), id(2)]), Some(id(2)), "a node that ran a stage comes first");
        assert_eq!(successor(&info, &[id(4), id(3)]), Some(id(3)), "else the lowest node up");
        assert_eq!(successor(&info, &[id(1)]), None, "nobody is left");
    }

    #[test]
    fn the_successor_launches_from_its_own_copy_with_the_owners_choices() {
        let request = LaunchRequest {
            model: "/owner/models/m.gguf".into(),
            layers: Some("a:0-9,b:10-29".into()),
            context: Some(1024),
            sequences: Some(2),
            threads: Some(1_000_000),
            batch: Some(1 << 20),
            kv_type: Some(crate::engine::KvType::Q8_0),
            prompt_cache: Some(4096),
            max_reply_tokens: Some(64),
            speculation: Some(crate::engine::Speculation::On),
            draft_tokens: Some(1 << 20),
            name: Some("m".into()),
            parallel: Some(crate::placement::Parallelism::Tensor),
            nodes: Some(vec!["a".into(), "b".into()]),
        };
        let taken = taken_over_request(&request, "/me/models/m.gguf".into());
        assert_eq!(taken.model, PathBuf::from("/me/models/m.gguf"));
        assert_eq!((taken.context, taken.sequences, taken.name.as_deref()), (Some(1024), Some(2), Some("m")));
        assert_eq!(taken.layers, request.layers, "the user's layers are tried first, as after any loss");
        assert_eq!(taken.threads, None, "a member's absurd thread count is not used");
        assert_eq!(taken.batch, None, "nor its absurd batch");
        assert_eq!(taken.draft_tokens, None, "nor its absurd drafts");
        assert_eq!(taken.speculation, request.speculation);
        let sane = LaunchRequest { batch: Some(1024), ..request };
        assert_eq!(taken_over_request(&sane, "/me/models/m.gguf".into()).batch, Some(1024));
        assert_eq!(taken.parallel, request.parallel, "the way it was split is kept");
    }
}

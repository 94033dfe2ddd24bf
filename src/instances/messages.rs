//! Instance messages on the control connections: an owner starting, wiring and stopping stages on this
//! node, a stage's node reporting to the owner, and an owner's view of its instance. Each is checked
//! against what this node knows before it is used (see [`super::validate`]); a message that fails is
//! logged and dropped.

use super::ending::{stop, stop_local};
use super::lifecycle::{apply_report, report, start_local};
use super::service::Instances;
use super::wiring::{connect_group_local, connect_local};
use super::StageReport;
use crate::cluster::messages::ControlMessage;
use crate::cluster::state::ClusterEvent;
use crate::node::NodeId;
use crate::worker::WorkerState;
use std::sync::Arc;

/// Acts on an instance message from `from`, once checked.
pub fn on_message(instances: &Arc<Instances>, from: NodeId, message: ControlMessage) {
    let refuse = |what: &str, why: String| tracing::warn!("ignoring {what} from {}: {why}", from.short());
    match message {
        ControlMessage::StartStage { spec } => {
            let known = {
                let registry = instances.registry();
                registry.instances.get(&spec.instance).map(|i| {
                    let node = i.stages.get(spec.stage).map(|s| s.node);
                    (i.owner, node, i.stages.len())
                })
            };
            let checked = super::validate::stage_spec(&spec).and_then(|()| match known {
                Some((owner, Some(node), stages))
                    if owner == from && node == instances.agent.id() && stages == spec.stages =>
                {
                    Ok(())
                }
                Some(_) => {
                    Err(format!("stage {} of instance {} is not the sender's to place here", spec.stage, spec.instance))
                }
                None => Err(format!("instance {} is unknown", spec.instance)),
            });
            match checked {
                Ok(()) => start_local(instances, spec, from),
                Err(why) => {
                    refuse("a stage to start", why.clone());
                    let failed = StageReport { state: WorkerState::Failed, error: Some(why), ..Default::default() };
                    report(instances, from, &spec.instance, spec.stage, failed);
                }
            }
        }
        ControlMessage::StageUpdate { instance, stage, report } => {
            // Only the node that runs a stage reports on it, and only to the instance's owner.
            let runs_it = instances.registry().instances.get(&instance).is_some_and(|i| {
                i.owner == instances.agent.id() && i.stages.get(stage).is_some_and(|s| s.node == from)
            });
            if runs_it {
                apply_report(instances, &instance, stage, report);
            } else {
                refuse("a stage update", format!("it does not run stage {stage} of an instance of this node"));
            }
        }
        ControlMessage::ConnectStage { instance, stage, next_node, next_port } => {
            let owned_by_sender = instances.registry().instances.get(&instance).is_some_and(|i| i.owner == from);
            if owned_by_sender {
                connect_local(instances, &instance, stage, next_node, next_port)
            } else {
                refuse("a ring connection", format!("instance {instance} is not the sender's"));
            }
        }
        ControlMessage::ConnectGroup { instance, stage, peers } => {
            let owned_by_sender = instances.registry().instances.get(&instance).is_some_and(|i| {
                i.owner == from && i.plan.rank_of(stage).is_some_and(|r| r.shares.len() == peers.len())
            });
            if owned_by_sender {
                connect_group_local(instances, &instance, stage, &peers)
            } else {
                refuse("a group connection", format!("instance {instance} is not the sender's tensor-parallel group"));
            }
        }
        ControlMessage::StopInstance { instance } => {
            let owned = instances.registry().instances.get(&instance).is_some_and(|i| i.owner == instances.agent.id());
            if owned {
                stop(instances, &instance);
            } else {
                stop_local(instances, &instance);
            }
        }
        ControlMessage::Instance { info } => {
            let checked = {
                let mut registry = instances.registry();
                let existing = registry.instances.get(&info.id);
                let owner_gone = existing.is_some_and(|e| !instances.agent.is_up(e.owner));
                let checked = super::validate::instance(&info, from, existing, owner_gone);
                if checked.is_ok() {
                    registry.instances.insert(info.id.clone(), (*info).clone());
                }
                checked
            };
            match checked {
                Ok(()) => instances.agent.emit(ClusterEvent::Instance { info }),
                Err(why) => refuse("an instance", why),
            }
        }
        other => super::generate::on_message(instances, from, other),
    }
}

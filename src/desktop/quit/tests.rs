use super::*;
use crate::desktop::fixtures::{id, instance};
use crate::instances::InstanceState;

/// Node 1 is this node; each instance's stages run on nodes 1, 2, … (one per entry), owned by node 1.
fn on(model: &str, state: InstanceState, stages: usize) -> InstanceInfo {
    instance(model, state, &vec![1.0; stages])
}

#[test]
fn quitting_stops_what_runs_a_stage_here_or_is_managed_here() {
    let serving = on("SmolLM2", InstanceState::Ready, 3);
    let mut elsewhere = on("Qwen3", InstanceState::Ready, 3);
    elsewhere.owner = id(2);
    elsewhere.stages.remove(0);
    let mut managed = on("Gemma3", InstanceState::Recovering, 3);
    managed.stages.remove(0);
    let ended = on("Old", InstanceState::Failed, 2);
    let stops = quitting_stops(id(1), &[serving, elsewhere, managed, ended]);
    assert_eq!(
        stops,
        [
            Stopped {
                id: "Gemma3-id".into(),
                model: "Gemma3".into(),
                nodes: vec!["node2".into(), "node3".into()],
                only_owned: true
            },
            Stopped {
                id: "SmolLM2-id".into(),
                model: "SmolLM2".into(),
                nodes: vec!["this node".into(), "node2".into(), "node3".into()],
                only_owned: false
            },
        ],
        "an instance of another owner without a stage here, and one that ended, go on without this node"
    );
    assert_eq!(
        warning(&stops).unwrap(),
        "Quitting stops Gemma3 (it runs on node2 and node3; this node manages it) and SmolLM2 on this node, node2 and node3."
    );
}

#[test]
fn a_model_that_runs_on_this_node_alone_is_stopped_too_and_nothing_running_asks_nothing() {
    let alone = on("SmolLM2", InstanceState::Launching, 1);
    assert_eq!(warning(&quitting_stops(id(1), &[alone])).unwrap(), "Quitting stops SmolLM2 on this node.");
    assert_eq!(warning(&quitting_stops(id(1), &[])), None);
    assert_eq!(warning(&quitting_stops(id(1), &[on("SmolLM2", InstanceState::Stopped, 2)])), None);
}

#[test]
fn the_switch_quits_only_once_the_app_set_it() {
    let switch = QuitSwitch::default();
    assert!(!switch.is_set() && !switch.request(), "a headless node has nothing to quit through");
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    switch.clone().set(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    assert!(switch.is_set() && switch.request());
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
}

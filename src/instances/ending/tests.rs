use super::*;
use crate::desktop::fixtures::{id, instance};

/// A ready instance of three stages, on node1, node2 and node3.
fn ready() -> InstanceInfo {
    let mut info = instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0, 1.0]);
    for stage in &mut info.stages {
        stage.state = WorkerState::Ready;
    }
    info
}

fn states(info: &InstanceInfo) -> Vec<(WorkerState, Option<&str>)> {
    info.stages.iter().map(|s| (s.state, s.error.as_deref())).collect()
}

#[test]
fn once_its_workers_are_stopped_no_stage_reads_ready_and_the_dead_nodes_stage_says_so() {
    let mut info = ready();
    info.state = InstanceState::Failed;
    assert!(settle_stages(&mut info, |node| node != id(3)));
    assert_eq!(
        states(&info),
        [(WorkerState::Stopped, None), (WorkerState::Stopped, None), (WorkerState::Failed, Some("node node3 is down")),]
    );
    assert!(!settle_stages(&mut info, |node| node != id(3)), "settling twice changes nothing");

    // The node of a stopped stage goes down later: that stage says so now.
    assert!(settle_stages(&mut info, |node| node == id(1)));
    assert_eq!(states(&info)[1], (WorkerState::Failed, Some("node node2 is down")));
}

#[test]
fn a_stage_that_failed_by_itself_keeps_its_own_error() {
    let mut info = ready();
    info.stages[1].state = WorkerState::Failed;
    info.stages[1].error = Some("out of memory".into());
    settle_stages(&mut info, |node| node != id(2));
    assert_eq!(states(&info)[1], (WorkerState::Failed, Some("out of memory")));
    assert_eq!(states(&info)[0], (WorkerState::Stopped, None));
}

#[test]
fn a_relaunch_uses_the_original_options_and_this_nodes_copy() {
    let mut info = ready();
    info.state = InstanceState::Replaced;
    info.request = Some(LaunchRequest {
        model: "/owner/models/m.gguf".into(),
        layers: Some("node1:0-9,node2:10-19,node3:20-29".into()),
        context: Some(1024),
        sequences: Some(2),
        threads: Some(3),
        batch: Some(128),
        kv_type: None,
        prompt_cache: None,
        max_reply_tokens: None,
        speculation: None,
        draft_tokens: None,
        name: None,
        parallel: None,
        nodes: None,
    });
    let request = relaunch_request(&info, |path| {
        assert_eq!(path, Path::new("/owner/models/m.gguf"), "the copy asked for is the launching node's file");
        Some("/here/m.gguf".into())
    })
    .unwrap();
    assert_eq!(request.model, PathBuf::from("/here/m.gguf"));
    assert_eq!(request.layers.as_deref(), Some("node1:0-9,node2:10-19,node3:20-29"));
    assert_eq!((request.context, request.sequences, request.threads), (Some(1024), Some(2), Some(3)));
    assert_eq!(request.batch, Some(128));
    assert_eq!(request.name.as_deref(), Some("SmolLM2"), "it serves under the same name");
}

#[test]
fn a_record_without_its_request_relaunches_with_what_it_shows() {
    let mut info = ready();
    info.state = InstanceState::Failed;
    let request = relaunch_request(&info, |path| Some(path.to_path_buf())).unwrap();
    assert_eq!(request.model, info.model_path);
    assert_eq!((request.context, request.sequences), (Some(info.context), Some(info.sequences)));
    assert_eq!((request.layers, request.name.as_deref()), (None, Some("SmolLM2")));
}

#[test]
fn a_relaunch_is_refused_while_the_instance_is_active_or_without_the_model_here() {
    let info = ready();
    let refused = relaunch_request(&info, |path| Some(path.to_path_buf())).unwrap_err();
    assert!(refused.contains("is ready: only an instance that ended"), "{refused}");

    let mut ended = ready();
    ended.state = InstanceState::Stopped;
    let refused = relaunch_request(&ended, |_| None).unwrap_err();
    assert!(refused.contains("no whole copy of SmolLM2.gguf"), "{refused}");
}

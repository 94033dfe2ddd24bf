use super::*;
use crate::desktop::fixtures::{id, instance, snapshot};
use crate::links::LinkKind;

fn link(peer: NodeId, errors: u64) -> LinkReport {
    LinkReport {
        peer,
        kind: LinkKind::Thunderbolt,
        interface: None,
        local_addr: None,
        remote_addr: None,
        rtt_p50_us: Some(100),
        rtt_p99_us: Some(200),
        rtt_samples: 10,
        throughput_bps: None,
        throughput_measured_at_ms: None,
        echo_rtt_us: None,
        errors,
        probe_failures: 0,
        transport: None,
    }
}

#[test]
fn a_node_going_down_is_told_once_and_its_return_once() {
    let mut board = NoticeBoard::new(&snapshot(&["alive"], 1));
    let down = ClusterEvent::NodeStatus { node: id(2), status: PeerStatus::Down };
    assert_eq!(board.on_event(&down, 0).unwrap().title, "node2 is down");
    assert_eq!(board.on_event(&down, 1), None, "the same status again is no news");
    let suspect = ClusterEvent::NodeStatus { node: id(2), status: PeerStatus::Suspect };
    assert_eq!(board.on_event(&suspect, 2), None, "suspect is too brief to notify");
    let alive = ClusterEvent::NodeStatus { node: id(2), status: PeerStatus::Alive };
    assert_eq!(board.on_event(&alive, 3).unwrap().title, "node2 is back");
    assert_eq!(board.on_event(&alive, 4), None);
}

#[test]
fn only_new_members_are_announced() {
    let mut board = NoticeBoard::new(&snapshot(&["alive"], 1));
    let known = ClusterEvent::NodeJoined { node: id(2), name: "node2".into() };
    assert_eq!(board.on_event(&known, 0), None, "node2 was already a member");
    let new = ClusterEvent::NodeJoined { node: id(9), name: "studio".into() };
    assert_eq!(board.on_event(&new, 0).unwrap().title, "studio joined the cluster");
    assert_eq!(board.on_event(&new, 0), None);
}

#[test]
fn a_model_is_ready_once_and_fails_once() {
    let mut board = NoticeBoard::new(&snapshot(&["alive", "alive"], 1));
    let launching = instance("SmolLM2", InstanceState::Launching, &[0.5, 0.5, 0.5]);
    assert_eq!(board.on_event(&ClusterEvent::Instance { info: Box::new(launching) }, 0), None);
    let ready = ClusterEvent::Instance { info: Box::new(instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0, 1.0])) };
    let notice = board.on_event(&ready, 0).unwrap();
    assert_eq!((notice.title.as_str(), notice.body.as_str()), ("SmolLM2 is ready", "Serving across 3 nodes."));
    assert_eq!(board.on_event(&ready, 0), None, "progress updates of a ready model say nothing");

    let failed = ClusterEvent::InstanceFailed {
        instance: "SmolLM2-id".into(),
        model: "SmolLM2".into(),
        error: "stage 1 on node2 exited".into(),
    };
    assert_eq!(board.on_event(&failed, 0).unwrap().body, "stage 1 on node2 exited");
    assert_eq!(board.on_event(&failed, 0), None);
}

#[test]
fn a_model_that_loses_a_node_is_told_once_and_again_when_it_serves_again() {
    let mut board = NoticeBoard::new(&snapshot(&["alive", "alive"], 1));
    let ready = ClusterEvent::Instance { info: Box::new(instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0, 1.0])) };
    assert!(board.on_event(&ready, 0).is_some());
    let mut lost = instance("SmolLM2", InstanceState::Recovering, &[1.0, 1.0, 1.0]);
    lost.error = Some("node node3 is down; placing it again".into());
    let lost = ClusterEvent::Instance { info: Box::new(lost) };
    let notice = board.on_event(&lost, 0).unwrap();
    assert_eq!(
        (notice.title.as_str(), notice.body.as_str()),
        ("SmolLM2 lost part of its cluster", "node node3 is down; placing it again")
    );
    assert_eq!(board.on_event(&lost, 0), None, "a new reason to wait is not a new notice");

    let mut again = instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0]);
    again.id = "SmolLM2-new".into();
    again.recovery = Some(crate::instances::Recovery {
        replaces: "SmolLM2-id".into(),
        reason: "node node3 is down".into(),
        attempt: 1,
    });
    let notice = board.on_event(&ClusterEvent::Instance { info: Box::new(again) }, 0).unwrap();
    assert_eq!(
        (notice.title.as_str(), notice.body.as_str()),
        ("SmolLM2 is serving again", "Placed again across 2 nodes.")
    );
}

#[test]
fn a_link_that_keeps_failing_is_told_at_most_once_per_interval() {
    let mut board = NoticeBoard::new(&snapshot(&["alive", "alive"], 1));
    let report = |errors| ClusterEvent::Links { node: id(1), links: vec![link(id(2), errors)] };
    assert_eq!(board.on_event(&report(0), 0), None);
    assert_eq!(board.on_event(&report(3), 1_000), None, "one burst of errors is not yet failing");
    let notice = board.on_event(&report(5), 1_000 + LINK_FAILING_AFTER_MS).unwrap();
    assert_eq!(notice.title, "Link node1 ↔ node2 is failing");
    assert_eq!(notice.body, "5 errors so far on the Thunderbolt link, and counting.");
    assert_eq!(board.on_event(&report(9), 20_000), None, "within the interval");
    let again = board.on_event(&report(10), 20_000 + LINK_NOTICE_INTERVAL_MS);
    assert!(again.is_some(), "still failing after the interval");
}

#[test]
fn a_node_that_stops_is_told_as_down_not_as_failing_links() {
    let mut board = NoticeBoard::new(&snapshot(&["alive", "alive"], 1));
    let to_node3 = |errors| ClusterEvent::Links { node: id(1), links: vec![link(id(3), errors)] };
    assert_eq!(board.on_event(&to_node3(0), 0), None);
    assert_eq!(board.on_event(&to_node3(2), 500), None, "its connection broke as it stopped");
    let down = ClusterEvent::NodeStatus { node: id(3), status: PeerStatus::Down };
    assert_eq!(board.on_event(&down, 2_500).unwrap().title, "node3 is down");
    assert_eq!(board.on_event(&to_node3(40), 500 + LINK_FAILING_AFTER_MS), None);
}

#[test]
fn a_link_falling_back_from_rdma_to_tcp_is_told_once() {
    let mut board = NoticeBoard::new(&snapshot(&["alive"], 1));
    let with = |transport| ClusterEvent::Links {
        node: id(1),
        links: vec![LinkReport { transport: Some(transport), ..link(id(2), 0) }],
    };
    let tcp = || LinkTransport::Tcp { reason: "send timed out".into(), retry_at_ms: Some(5) };
    assert_eq!(board.on_event(&with(tcp()), 0), None, "a link that never had RDMA did not fall back");
    assert_eq!(board.on_event(&with(LinkTransport::Rdma { device: "rdma_en3".into() }), 0), None);
    let notice = board.on_event(&with(tcp()), 0).unwrap();
    assert_eq!(notice.title, "Link node1 ↔ node2 fell back to TCP");
    assert!(notice.body.contains("send timed out"), "{}", notice.body);
    assert_eq!(board.on_event(&with(tcp()), 0), None);
}

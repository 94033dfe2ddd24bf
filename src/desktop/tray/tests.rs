use super::*;
use crate::desktop::fixtures::{instance, snapshot};

fn rates(decode: f64) -> ClusterRates {
    ClusterRates {
        prefill_tokens_per_second: 0.0,
        decode_tokens_per_second: decode,
        requests_per_minute: 0.0,
        window_seconds: 10.0,
    }
}

#[test]
fn a_node_on_its_own_is_alone() {
    let s = summarize(&snapshot(&[], 24_000_000_000), &[], &rates(0.0));
    assert_eq!(s.look, TrayLook::Alone);
    assert_eq!(s.cluster_line, "Alone · 24 GB");
    assert_eq!(s.model_line, "No model running");
    assert_eq!(s.title, None);
}

#[test]
fn three_healthy_nodes_show_the_pool() {
    let s = summarize(&snapshot(&["alive", "alive"], 512_000_000_000), &[], &rates(0.0));
    assert_eq!(s.look, TrayLook::Cluster);
    assert_eq!(s.cluster_line, "3 nodes · 1.5 TB pool");
}

#[test]
fn a_ready_model_shows_the_decode_rate() {
    let ready = instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0]);
    let s = summarize(&snapshot(&["alive"], 1_000_000_000), &[ready], &rates(41.24));
    assert_eq!(s.look, TrayLook::Serving);
    assert_eq!(s.model_line, "SmolLM2 · 41.2 tok/s");
    assert_eq!(s.title.as_deref(), Some("41 tok/s"));
}

#[test]
fn a_launching_model_shows_its_loading_progress() {
    let launching = instance("Llama", InstanceState::Launching, &[1.0, 0.2]);
    let s = summarize(&snapshot(&["alive"], 1_000_000_000), &[launching], &rates(0.0));
    assert_eq!(s.model_line, "Llama · loading 60%");
    assert_eq!(s.look, TrayLook::Cluster);
}

#[test]
fn an_unreachable_member_or_failed_model_degrades_the_icon() {
    let s = summarize(&snapshot(&["alive", "down"], 8_000_000_000), &[], &rates(0.0));
    assert_eq!(s.look, TrayLook::Degraded);
    assert_eq!(s.cluster_line, "1 of 3 nodes unreachable · 16 GB pool");

    let failed = instance("Llama", InstanceState::Failed, &[1.0]);
    let ready = instance("SmolLM2", InstanceState::Ready, &[1.0]);
    let s = summarize(&snapshot(&["alive"], 8_000_000_000), &[failed, ready], &rates(0.0));
    assert_eq!(s.look, TrayLook::Degraded);
    assert_eq!(s.model_line, "SmolLM2 · ready (+1 more)", "the ready model is named first");
}

#[test]
fn every_tray_action_is_found_again_by_its_menu_id() {
    let ids: Vec<&str> = TrayAction::ALL.iter().map(|a| a.id()).collect();
    assert_eq!(ids, ["open", "join", "leave", "rdma", "login", "quit"]);
    for action in TrayAction::ALL {
        assert_eq!(TrayAction::from_id(action.id()), Some(action));
    }
    assert_eq!(TrayAction::from_id("cluster"), None, "status lines are not actions");
    assert_eq!(TrayAction::Join.dashboard_route(), Some(Some("mesh/join")));
    assert_eq!(TrayAction::Quit.dashboard_route(), None);
}

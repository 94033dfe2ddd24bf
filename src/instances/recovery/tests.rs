use super::*;
use crate::desktop::fixtures::instance;

fn replacement(attempt: u32) -> Option<Recovery> {
    Some(Recovery { replaces: "old".into(), reason: "node node2 is down".into(), attempt })
}

#[test]
fn a_model_that_served_is_placed_again_whatever_it_lost() {
    let mut info = instance("SmolLM2", InstanceState::Ready, &[1.0, 1.0]);
    info.ready_at_ms = Some(5);
    assert_eq!(next_attempt(&info, true), Some(1));
    assert_eq!(next_attempt(&info, false), Some(1));
    // Having served resets the count of replacements in a row.
    info.recovery = replacement(MAX_ATTEMPTS);
    assert_eq!(next_attempt(&info, false), Some(1));
}

#[test]
fn a_launch_that_never_served_is_placed_again_only_after_losing_a_node() {
    let info = instance("SmolLM2", InstanceState::Launching, &[0.5, 0.5]);
    assert_eq!(next_attempt(&info, true), Some(1));
    assert_eq!(next_attempt(&info, false), None, "a stage that fails to load would fail again");
}

#[test]
fn replacements_that_never_serve_stop_after_the_last_attempt() {
    let mut info = instance("SmolLM2", InstanceState::Launching, &[0.5, 0.5]);
    for attempt in 1..MAX_ATTEMPTS {
        info.recovery = replacement(attempt);
        assert_eq!(next_attempt(&info, false), Some(attempt + 1));
        assert_eq!(next_attempt(&info, true), Some(attempt + 1));
    }
    info.recovery = replacement(MAX_ATTEMPTS);
    assert_eq!(next_attempt(&info, true), None);
    assert_eq!(next_attempt(&info, false), None);
}

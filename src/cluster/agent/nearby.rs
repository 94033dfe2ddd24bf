//! Nearby nodes: follows mDNS and sorts what it sees into members of this cluster (to dial) and other
//! clusters (to show as nearby, with Join).

use super::*;

pub(super) static BROWSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Follows mDNS on a thread of its own (the daemon's channel is blocking).
pub(super) fn start_browsing(shared: &Agent) {
    let receiver = match shared.discovery.locked().as_ref().map(|d| d.browse()) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            tracing::warn!("{e}");
            return;
        }
        None => return,
    };
    if BROWSING.swap(true, Ordering::Relaxed) {
        return;
    }
    let shared = shared.clone();
    std::thread::spawn(move || {
        while let Ok(event) = receiver.recv() {
            let interpreted = shared.discovery.locked().as_mut().and_then(|d| d.interpret(event));
            match interpreted {
                Some(DiscoveryEvent::Found(node)) => on_discovered(&shared, node),
                Some(DiscoveryEvent::Lost(id)) => {
                    let changed = {
                        let mut state = shared.state.locked();
                        state.discovered.remove(&id);
                        state.nearby.remove(&id).is_some()
                    };
                    if changed {
                        emit_nearby(&shared);
                    }
                }
                None => {}
            }
        }
        BROWSING.store(false, Ordering::Relaxed);
    });
}

pub(super) fn on_discovered(shared: &Agent, node: DiscoveredNode) {
    if node.id == shared.id() {
        return;
    }
    let nearby_changed = {
        let mut state = shared.state.locked();
        if node.cluster_id == state.cluster_id() {
            state.nearby.remove(&node.id);
            state.discovered.insert(node.id, node);
            false
        } else {
            state.discovered.remove(&node.id);
            let changed = state.nearby.get(&node.id) != Some(&node);
            state.nearby.insert(node.id, node);
            changed
        }
    };
    if nearby_changed {
        emit_nearby(shared);
    }
}

pub(super) fn emit_nearby(shared: &Agent) {
    let clusters = shared.snapshot().nearby;
    shared.emit(ClusterEvent::Nearby { clusters });
}

//! `shoal node --run MODEL.gguf`: a node that launches a model as soon as it can place it, so that one
//! command gives a node whose chat answers. Nothing is launched when the cluster already serves a model
//! of that name (a restarted node of a running cluster finds it there).

use crate::instances::{self, Instances};
use crate::records::LaunchRequest;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long to wait, at least, for the cluster's running instances to reach this node (placement also
/// waits for the nodes' first telemetry and their links' first probes: it plans from them).
const SETTLE: Duration = Duration::from_secs(3);

/// Launches `model` on the cluster in the background once this node can place it.
pub fn spawn(instances: Arc<Instances>, model: PathBuf) {
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        instances::await_measurements(&instances).await;
        // Members send their running instances on connecting: give them a moment to arrive.
        tokio::time::sleep_until(started + SETTLE).await;
        let name = model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let served = instances.registry().instances.values().any(|i| i.model == name && i.state.is_active());
        if served {
            tracing::info!("--run {}: the cluster already serves {name}", model.display());
            return;
        }
        match instances::launch(&instances, LaunchRequest { model: model.clone(), ..LaunchRequest::default() }).await {
            Ok(info) => tracing::info!("--run: launched {} as instance {}", info.model, info.id),
            Err(e) => tracing::error!("--run {}: {e}", model.display()),
        }
    });
}

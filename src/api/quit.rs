//! `GET /api/quit`: what quitting the app would stop on the cluster (the dashboard's confirmation
//! shows it); `POST /api/quit`: quit the app that hosts this node ("Quit anyway"). A headless node
//! refuses the second: it is stopped where it was started.

use super::{ApiError, ApiState};
use crate::desktop::quit::{quitting_stops, warning, Stopped};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use std::time::Duration;

/// What quitting would stop, and whether quitting here is the app's to do.
#[derive(serde::Serialize, ts_rs::TS)]
pub struct QuitImpact {
    /// The instances quitting would stop.
    pub stops: Vec<Stopped>,
    /// The sentence that says so (null: nothing would stop).
    pub message: Option<String>,
    /// Whether this node runs inside the app, which `POST /api/quit` ends.
    pub in_app: bool,
}

pub async fn what_it_stops(State(state): State<ApiState>) -> Json<QuitImpact> {
    let instances: Vec<_> = state.instances.registry().instances.values().cloned().collect();
    let stops = quitting_stops(state.agent.id(), &instances);
    Json(QuitImpact { message: warning(&stops), stops, in_app: state.quit.is_set() })
}

pub async fn quit(State(state): State<ApiState>) -> Result<Json<serde_json::Value>, ApiError> {
    if !state.quit.is_set() {
        return Err(ApiError {
            status: StatusCode::CONFLICT,
            code: Some("not_in_app"),
            ..ApiError::bad_request(
                "this node runs without the app (`shoal node`): stop it where it was started (Ctrl-C)",
            )
        });
    }
    tracing::info!("quitting, as the dashboard asked");
    // After this answer has left: quitting ends the runtime this handler runs on.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        state.quit.request();
    });
    Ok(Json(serde_json::json!({ "quitting": true })))
}

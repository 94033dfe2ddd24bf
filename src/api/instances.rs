//! Instance endpoints: `POST /api/placements/preview`, `POST /api/instances` (launch),
//! `GET /api/instances[/{id}]`, `DELETE /api/instances/{id}`, `POST /api/instances/{id}/relaunch` (an
//! ended instance launched again as it was launched).

use super::{ApiError, ApiState};
use crate::instances::{self, InstanceInfo, LaunchError, LaunchRequest, ShareNeed};
use crate::placement::Plan;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

pub(super) fn launch_request(body: Result<Json<Value>, JsonRejection>) -> Result<LaunchRequest, ApiError> {
    let Json(value) =
        body.map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {}", e.body_text())))?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("expected {{\"model\": \"/path/to/model.gguf\", ...}}: {e}")))
}

fn launch_error(e: LaunchError) -> ApiError {
    match e {
        LaunchError::Model(e) => ApiError::bad_param("model", e.to_string()),
        LaunchError::Placement(e) => ApiError::unprocessable(e.to_string()),
        LaunchError::Invalid(m) => ApiError::bad_request(m),
        LaunchError::AlreadyRunning(m) => ApiError {
            status: axum::http::StatusCode::CONFLICT,
            code: Some("model_already_running"),
            ..ApiError::bad_request(m)
        },
        LaunchError::NotFound(m) => ApiError::not_found(m, "instance_not_found"),
    }
}

#[derive(serde::Serialize, ts_rs::TS)]
#[ts(rename = "PlacementPreview")]
pub struct Preview {
    pub model: String,
    pub plan: Plan,
    /// For each stage: what its node would fetch of the model at launch (null: it has its share).
    pub fetches: Vec<Option<ShareNeed>>,
}

pub async fn preview(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Preview>, ApiError> {
    let request = launch_request(body)?;
    instances::check_name_free(&state.instances, &request).map_err(launch_error)?;
    let (plan, model) = instances::preview(&state.instances, &request).await.map_err(launch_error)?;
    let fetches = instances::preview_fetches(&state.instances, &request, &plan).await;
    Ok(Json(Preview { model, plan, fetches }))
}

pub async fn launch(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<InstanceInfo>, ApiError> {
    let request = launch_request(body)?;
    Ok(Json(instances::launch(&state.instances, request).await.map_err(launch_error)?))
}

pub async fn list(State(state): State<ApiState>) -> Json<Vec<InstanceInfo>> {
    Json(state.instances.registry().instances.values().cloned().collect())
}

pub async fn get(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<InstanceInfo>, ApiError> {
    let info = state.instances.registry().instances.get(&id).cloned();
    info.map(Json).ok_or_else(|| ApiError::not_found(format!("no instance {id}"), "instance_not_found"))
}

pub async fn stop(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<InstanceInfo>, ApiError> {
    instances::stop(&state.instances, &id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no instance {id}"), "instance_not_found"))
}

pub async fn relaunch(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<InstanceInfo>, ApiError> {
    Ok(Json(instances::relaunch(&state.instances, &id).await.map_err(launch_error)?))
}

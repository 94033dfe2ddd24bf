//! Model endpoints: `GET /api/models` (this node's library) and `POST /api/models/pull` (start a download
//! from the hub, of the whole file, with `"layers": "FIRST-LAST"` only a stage's shard, or with
//! `"rank": "RANK/NODES"` only a tensor-parallel node's slice; it answers at once with the pull's id and
//! reports progress as `model_pull` events).
//! `GET /api/models/fit` (the library with the fit check) is in `fit.rs`.

use super::{ApiError, ApiState};
use crate::cluster::ClusterEvent;
use crate::model::library::{Library, LibraryModel};
use crate::model::pull::{self, Hub, PullProgress, PullRequest, PullState};
use crate::model::shard::{self, StageShare};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use std::time::{Duration, Instant};

/// The models this node has (to a reader without the token of a node that has one, by file name only:
/// see [`for_reader`]).
pub async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<Vec<LibraryModel>>, ApiError> {
    let library = Library::new(&state.agent.config.data_dir);
    let stranger = state.token.is_some() && !state.carries_token(&headers);
    tokio::task::spawn_blocking(move || library.list())
        .await
        .map(|mut models| {
            if stranger {
                models.iter_mut().for_each(by_file_name);
            }
            Json(models)
        })
        .map_err(|e| ApiError::failed(format!("listing the models failed: {e}")))
}

/// `model` as a reader without the API token of a node that has one sees it: the files by name, not
/// by where they are on this machine (its folders and user name are none of a stranger's business),
/// in the problem too. Launching one takes the token anyway.
pub(super) fn by_file_name(model: &mut LibraryModel) {
    let name = |path: &std::path::Path| std::path::PathBuf::from(path.file_name().unwrap_or_default());
    if let Some(problem) = &mut model.problem {
        for path in model.parts.iter().chain([&model.path]) {
            *problem = problem.replace(&path.display().to_string(), &name(path).display().to_string());
        }
    }
    model.path = name(&model.path);
    model.parts = model.parts.iter().map(|p| name(p)).collect();
}

#[derive(serde::Serialize, ts_rs::TS)]
pub struct PullStarted {
    pub id: String,
}

/// A pull: the hub request, and the layers or the rank when only a share of the model is wanted.
#[derive(serde::Deserialize, ts_rs::TS)]
#[ts(rename = "PullRequest", optional_fields = nullable)]
pub struct PullBody {
    #[serde(flatten)]
    request: PullRequest,
    /// `FIRST-LAST` (both included), as `shoal pull --layers` takes it.
    #[serde(default)]
    layers: Option<String>,
    /// `RANK/NODES`, as `shoal pull --rank` takes it: what that node of a tensor-parallel group of equal
    /// nodes reads.
    #[serde(default)]
    rank: Option<String>,
}

/// A pull body as `pull` checks it: the hub request, the share wanted (none: the whole model), and the
/// repository as given.
pub(super) fn check_pull(
    body: Result<Json<PullBody>, JsonRejection>,
) -> Result<(PullRequest, Option<StageShare>, String), ApiError> {
    let Json(PullBody { request: body, layers, rank }) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let share = match (layers.as_deref(), rank.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_param("rank", "give layers or a rank, not both".to_string()));
        }
        (Some(layers), None) => Some(StageShare::Layers(
            shard::parse_layers(layers).map_err(|e| ApiError::bad_param("layers", e.to_string()))?,
        )),
        (None, Some(rank)) => Some(shard::parse_rank(rank).map_err(|e| ApiError::bad_param("rank", e.to_string()))?),
        (None, None) => None,
    };
    let mut request = PullRequest::parse(body.repo.trim()).map_err(|e| ApiError::bad_param("repo", e.to_string()))?;
    if request.file.as_deref().is_some_and(str::is_empty) {
        return Err(ApiError::bad_param("repo", format!("{:?} names no file after the colon", body.repo)));
    }
    request.file = request.file.or(body.file);
    request.revision = body.revision;
    Ok((request, share, body.repo.trim().to_string()))
}

/// Starts downloading `{"repo", "file"?, "revision"?, "layers"? | "rank"?}` into this node's models
/// directory. `repo` may name the file or quantization itself, as `shoal pull` does: `ORG/NAME:Q4_K_M`.
pub async fn pull(
    State(state): State<ApiState>,
    body: Result<Json<PullBody>, JsonRejection>,
) -> Result<Json<PullStarted>, ApiError> {
    let (request, share, spec) = check_pull(body)?;
    let id = uuid::Uuid::new_v4().to_string();
    let agent = state.agent.clone();
    let models_dir = Library::new(&agent.config.data_dir).models_dir();
    let pull_id = id.clone();
    let (layers_text, rank_text) = match &share {
        Some(StageShare::Layers(l)) => (Some(format!("{}-{}", l.start, l.end - 1)), None),
        Some(StageShare::Rank { rank, shares, .. }) => (None, Some(format!("{rank}/{}", shares.len()))),
        None => (None, None),
    };
    tokio::task::spawn_blocking(move || {
        let event =
            |progress: &PullProgress, paths: Vec<std::path::PathBuf>, error: Option<String>| ClusterEvent::ModelPull {
                id: pull_id.clone(),
                repo: spec.clone(),
                layers: layers_text.clone(),
                rank: rank_text.clone(),
                progress: progress.clone(),
                paths,
                error,
            };
        let mut last = PullProgress {
            file: String::new(),
            bytes_done: 0,
            bytes_total: 0,
            rate_bytes_per_second: 0,
            eta_seconds: None,
            state: PullState::Resolving,
        };
        let mut last_sent = Instant::now() - Duration::from_secs(1);
        let mut report = |progress: &PullProgress| {
            let state_changed = progress.state != last.state;
            last = progress.clone();
            if progress.state != PullState::Done && (state_changed || last_sent.elapsed() >= Duration::from_millis(250))
            {
                agent.emit(event(progress, Vec::new(), None));
                last_sent = Instant::now();
            }
        };
        let hub = Hub::from_env();
        let result = match share {
            Some(share) => shard::pull_share(&hub, &models_dir, &request, &share, &mut report).map(|p| vec![p]),
            None => pull::pull(&hub, &models_dir, &request, &mut report),
        };
        match result {
            Ok(paths) => agent.emit(event(&last, paths, None)),
            Err(e) => {
                last.state = PullState::Failed;
                agent.emit(event(&last, Vec::new(), Some(crate::errors::chain(&e))));
            }
        }
    });
    Ok(Json(PullStarted { id }))
}

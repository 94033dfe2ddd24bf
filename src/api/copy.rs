//! Model files across the cluster: `GET /api/models/cluster` (which node offers which file, and which
//! holds which layers of one as a shard, asked of every member that is up) and `POST /api/models/copy`
//! (copy a file from a member to this node over the cluster's authenticated connection; it answers at
//! once with the copy's id and reports progress and the measured rate as `model_copy` events).

use super::{ApiError, ApiState};
use crate::cluster::{Agent, ClusterEvent};
use crate::model::library::Library;
use crate::model::peer_copy::{self, CopyProgress, OfferedFile};
use crate::model::pull::repo_dir;
use crate::node::NodeId;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a member may take to list its files.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// One node's files.
#[derive(Serialize)]
pub struct NodeFiles {
    pub node: NodeId,
    pub name: String,
    pub files: Vec<OfferedFile>,
    /// Why the node's list is missing.
    pub error: Option<String>,
}

/// Every member's files (this node's from its own library).
pub async fn cluster_files(State(state): State<ApiState>) -> Json<Vec<NodeFiles>> {
    let agent = state.agent.clone();
    let snapshot = agent.snapshot();
    let asks =
        snapshot.nodes.into_iter().filter(|n| n.is_self || n.status == "alive" || n.status == "suspect").map(|node| {
            let agent = agent.clone();
            async move {
                let files = if node.is_self {
                    let library = Library::new(&agent.config.data_dir);
                    tokio::task::spawn_blocking(move || peer_copy::listed_files(&library))
                        .await
                        .map_err(|e| e.to_string())
                } else {
                    match agent.peer_control(node.id) {
                        None => Err("no connection to it".to_string()),
                        Some(addr) => tokio::time::timeout(LIST_TIMEOUT, peer_copy::list(addr, &agent.secret_bytes()))
                            .await
                            .map_err(|_| format!("it did not answer within {LIST_TIMEOUT:?}"))
                            .and_then(|r| r.map_err(|e| e.to_string())),
                    }
                };
                let (files, error) = match files {
                    Ok(files) => (files, None),
                    Err(e) => (Vec::new(), Some(e)),
                };
                NodeFiles { node: node.id, name: node.name, files, error }
            }
        });
    Json(futures_util::future::join_all(asks).await)
}

#[derive(Deserialize)]
pub struct CopyRequest {
    /// The node to copy from: its name or id.
    pub from: String,
    /// The file's name, as `GET /api/models/cluster` lists it.
    pub file: String,
    /// Its size, as listed: a file of the same name and another size is not it.
    #[serde(default)]
    pub size: Option<u64>,
}

#[derive(Serialize)]
pub struct CopyStarted {
    pub id: String,
    pub path: std::path::PathBuf,
}

/// Starts copying `{"from", "file"}` into this node's models directory.
pub async fn copy(
    State(state): State<ApiState>,
    body: Result<Json<CopyRequest>, JsonRejection>,
) -> Result<Json<CopyStarted>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let agent = state.agent.clone();
    let from = agent
        .snapshot()
        .nodes
        .into_iter()
        .find(|n| !n.is_self && (n.name == request.from || n.id.to_string() == request.from))
        .ok_or_else(|| ApiError::bad_param("from", format!("no other member is called {}", request.from)))?;
    let addr = agent
        .peer_control(from.id)
        .ok_or_else(|| ApiError::bad_param("from", format!("{} is not connected", from.name)))?;
    let files = peer_copy::list(addr, &agent.secret_bytes())
        .await
        .map_err(|e| ApiError::failed(format!("asking {} for its files failed: {e}", from.name)))?;
    let wanted = |f: &OfferedFile| {
        f.name == request.file && f.layers.is_none() && request.size.is_none_or(|size| size == f.size)
    };
    let file = files.into_iter().find(wanted).ok_or_else(|| {
        ApiError::bad_param(
            "file",
            format!("{} does not offer {} (see GET /api/models/cluster)", from.name, request.file),
        )
    })?;
    let models_dir = Library::new(&agent.config.data_dir).models_dir();
    let folder = file.repo.as_deref().map_or_else(|| models_dir.clone(), |repo| repo_dir(&models_dir, repo));
    let dest = folder.join(&file.name);
    if dest.exists() {
        return Err(ApiError::bad_param("file", format!("{} is already here", dest.display())));
    }
    let id = uuid::Uuid::new_v4().to_string();
    tokio::spawn(run_copy(agent, id.clone(), from.id, addr, file, dest.clone()));
    Ok(Json(CopyStarted { id, path: dest }))
}

async fn run_copy(
    agent: Agent,
    id: String,
    from: NodeId,
    addr: std::net::SocketAddr,
    file: OfferedFile,
    dest: std::path::PathBuf,
) {
    let event = |progress: CopyProgress, done, error| ClusterEvent::ModelCopy {
        id: id.clone(),
        from,
        to: agent.id(),
        file: file.name.clone(),
        progress,
        done,
        error,
    };
    let start = CopyProgress { bytes_done: 0, bytes_total: file.size, bytes_per_second: 0 };
    agent.emit(event(start.clone(), None, None));
    let mut last = start;
    let result = peer_copy::fetch(addr, &agent.secret_bytes(), &file, &[], &dest, |p| {
        last = p.clone();
        agent.emit(event(p.clone(), None, None));
    })
    .await;
    match result {
        Ok(report) => {
            tracing::info!(
                "copied {} from {} at {:.1} MB/s",
                file.name,
                from.short(),
                report.bytes_per_second as f64 / 1e6
            );
            agent.emit(event(last, Some(report), None));
        }
        Err(e) => agent.emit(event(last, None, Some(e.to_string()))),
    }
}

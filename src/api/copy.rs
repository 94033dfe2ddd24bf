//! Model files across the cluster: `GET /api/models/cluster` (which node offers which file, and which
//! holds which layers of one as a shard, asked of every member that is up) and `POST /api/models/copy`
//! (copy a file from a member to this node over the cluster's authenticated connection — every part of
//! a split set when the file is one of them — or, onto a shard of it here, only the shard's holes; it
//! answers at once with the copy's id and reports progress and the measured rate as `model_copy`
//! events).

use super::{ApiError, ApiState};
use crate::cluster::{Agent, ClusterEvent, NodeStatus};
use crate::model::library::{split_part, Library};
use crate::model::names;
use crate::model::peer_copy::{self, CopyProgress, CopyReport, OfferedFile};
use crate::model::pull::{PullProgress, PullState};
use crate::model::shard::{self, PeerRanges, ShardSource};
use crate::net::secure::Psk;
use crate::node::NodeId;
use crate::util::LockExt;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How long a member may take to list its files.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// One node's files.
#[derive(Serialize, Deserialize, ts_rs::TS)]
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
    let asks = snapshot
        .nodes
        .into_iter()
        .filter(|n| matches!(n.status, NodeStatus::Myself | NodeStatus::Alive | NodeStatus::Suspect))
        .map(|node| {
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

#[derive(Deserialize, ts_rs::TS)]
#[ts(optional_fields = nullable)]
pub struct CopyRequest {
    /// The node to copy from: its name or id.
    pub from: String,
    /// The file's name, as `GET /api/models/cluster` lists it.
    pub file: String,
    /// Its size, as listed: a file of the same name and another size is not it.
    #[serde(default)]
    pub size: Option<u64>,
}

#[derive(Serialize, ts_rs::TS)]
pub struct CopyStarted {
    pub id: String,
    pub path: PathBuf,
}

/// A copy body as `copy` checks it before it asks the member.
pub(super) fn check_copy(body: Result<Json<CopyRequest>, JsonRejection>) -> Result<CopyRequest, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    // A file name is one plain name: never a path (which could lead anywhere the node's user can write).
    names::plain(&request.file).map_err(|e| ApiError::bad_param("file", e.to_string()))?;
    Ok(request)
}

/// Starts copying `{"from", "file"}` into this node's models directory.
pub async fn copy(
    State(state): State<ApiState>,
    body: Result<Json<CopyRequest>, JsonRejection>,
) -> Result<Json<CopyStarted>, ApiError> {
    let request = check_copy(body)?;
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
    let file = files.iter().find(|f| wanted(f)).cloned().ok_or_else(|| {
        ApiError::bad_param(
            "file",
            format!("{} does not offer {} (see GET /api/models/cluster)", from.name, request.file),
        )
    })?;
    let set = set_of(&file, &files)
        .map_err(|missing| ApiError::bad_param("file", format!("{} does not offer {missing}", from.name)))?;
    let models_dir = Library::new(&agent.config.data_dir).models_dir();
    // The member's list names the files and their repository: checked before they become paths.
    let dests = set
        .iter()
        .map(|file| names::destination(&models_dir, file.repo.as_deref(), &file.name))
        .collect::<Result<Vec<PathBuf>, _>>()
        .map_err(|e| ApiError::failed(format!("{} offers a file this node will not write: {e}", from.name)))?;
    // A shard of a file here is completed (only its holes are copied); a whole file is not copied again.
    if dests.iter().all(|dest| dest.exists() && !shard::is_shard(dest)) {
        return Err(ApiError::bad_param("file", format!("{} is already here", dests[0].display())));
    }
    let id = uuid::Uuid::new_v4().to_string();
    let source = Source { node: from.id, name: from.name, addr };
    let path = dests[0].clone();
    tokio::spawn(run_copy(agent, id.clone(), source, set.into_iter().zip(dests).collect()));
    Ok(Json(CopyStarted { id, path }))
}

/// Every file to copy for `file`: it alone, or, when it is a part of a split set, every part of the set
/// in order, each of which `offered` must hold whole (else the name of the first it lacks).
fn set_of(file: &OfferedFile, offered: &[OfferedFile]) -> Result<Vec<OfferedFile>, String> {
    let Some((base, _, count)) = split_part(Path::new(&file.name)).filter(|(_, _, count)| *count > 1) else {
        return Ok(vec![file.clone()]);
    };
    (1..=count)
        .map(|index| {
            let name = format!("{base}-{index:05}-of-{count:05}.gguf");
            let part = offered.iter().find(|f| f.name == name && f.layers.is_none() && f.repo == file.repo);
            part.cloned().ok_or_else(|| format!("{name}, part {index} of the set of {}", file.name))
        })
        .collect()
}

/// The member a copy comes from.
struct Source {
    node: NodeId,
    name: String,
    addr: std::net::SocketAddr,
}

/// Copies `files` (one, or every part of a split set) into their destinations in turn, reporting the
/// progress over all of them as one copy. A file already here whole is skipped; a shard is completed.
async fn run_copy(agent: Agent, id: String, source: Source, files: Vec<(OfferedFile, PathBuf)>) {
    let event = {
        let (id, from, to, name) = (id, source.node, agent.id(), files[0].0.name.clone());
        move |progress: CopyProgress, done: Option<CopyReport>, error: Option<String>| ClusterEvent::ModelCopy {
            id: id.clone(),
            from,
            to,
            file: name.clone(),
            progress,
            done,
            error,
        }
    };
    let total = files.iter().map(|(f, _)| f.size).sum();
    let start = CopyProgress { bytes_done: 0, bytes_total: total, bytes_per_second: 0 };
    agent.emit(event(start.clone(), None, None));
    let last = Arc::new(Mutex::new(start));
    let started = Instant::now();
    let (mut before, mut copied, mut result) = (0, 0, Ok(None));
    for (file, dest) in &files {
        let report = {
            let (agent, event, last) = (agent.clone(), event.clone(), last.clone());
            move |p: &CopyProgress| {
                let p = CopyProgress { bytes_done: before + p.bytes_done, bytes_total: total, ..p.clone() };
                *last.locked() = p.clone();
                agent.emit(event(p, None, None));
            }
        };
        let copy = if shard::is_shard(dest) {
            complete_shard(agent.secret_bytes(), &source, file, dest, report).await.map(Some)
        } else if std::fs::metadata(dest).is_ok_and(|m| m.len() == file.size) {
            Ok(None)
        } else {
            let fetched = peer_copy::fetch(source.addr, &agent.secret_bytes(), file, &[], dest, report).await;
            fetched.map(Some).map_err(|e| e.to_string())
        };
        match copy {
            Ok(report) => {
                copied += report.as_ref().map_or(0, |r| r.bytes);
                // The report of the copy names the first file and its hash.
                result = result.map(|first: Option<CopyReport>| first.or(report));
            }
            Err(e) => {
                result = Err(if files.len() > 1 { format!("{}: {e}", file.name) } else { e });
                break;
            }
        }
        before += file.size;
    }
    let last = last.locked().clone();
    let seconds = started.elapsed().as_secs_f64();
    let bytes_per_second = (copied as f64 / seconds.max(1e-6)) as u64;
    match result {
        Ok(first) => {
            tracing::info!(
                "copied {} ({} file(s)) from {} at {:.1} MB/s",
                files[0].0.name,
                files.len(),
                source.name,
                bytes_per_second as f64 / 1e6
            );
            let sha256 = first.map(|r| r.sha256).unwrap_or_default();
            let path = files[0].1.clone();
            let report = CopyReport { path, bytes: copied, seconds, bytes_per_second, sha256 };
            agent.emit(event(last, Some(report), None));
        }
        Err(e) => agent.emit(event(last, None, Some(e))),
    }
}

/// Fills the holes of the shard at `dest` from `source` (each piece checked against the sender's
/// hash), then checks the whole file against its sha256 when either side knows it.
async fn complete_shard(
    secret: Psk,
    source: &Source,
    file: &OfferedFile,
    dest: &Path,
    report: impl Fn(&CopyProgress) + Send + 'static,
) -> Result<CopyReport, String> {
    let mut reader = PeerRanges::new(&source.name, source.addr, secret, file.clone(), Handle::current());
    let url = PeerRanges::url(&source.name, file);
    let shard_source = ShardSource { url, size: Some(file.size), sha256: file.sha256.clone() };
    let dest = dest.to_path_buf();
    let started = Instant::now();
    let blocking = move || {
        let (mut first, mut fetched) = (None, 0);
        let mut progress = |p: &PullProgress| {
            if p.state == PullState::Downloading && first.is_none() {
                first = Some(p.bytes_done);
            }
            fetched = p.bytes_done - first.unwrap_or(p.bytes_done);
            let bytes_per_second = p.rate_bytes_per_second;
            report(&CopyProgress { bytes_done: p.bytes_done, bytes_total: p.bytes_total, bytes_per_second });
        };
        let sha256 = shard::complete_from(&mut reader, &shard_source, &dest, &mut progress)
            .map_err(|e| crate::errors::chain(&e))?;
        let seconds = started.elapsed().as_secs_f64();
        let bytes_per_second = (fetched as f64 / seconds.max(1e-6)) as u64;
        Ok(CopyReport { path: dest, bytes: fetched, seconds, bytes_per_second, sha256 })
    };
    tokio::task::spawn_blocking(blocking).await.map_err(|e| e.to_string())?
}

//! A stage's share of the model: before a node starts a stage's worker it makes sure it holds what that
//! stage reads, and fetches only that when it does not. The owner names the file (name, size, hash,
//! repository — never only a path, which differs from node to node), and of a split GGUF set every
//! part; the stage's node looks for them at the owner's path and in its library (whole files, or shards
//! holding the stage's bytes). Missing, it fetches the stage's share ([`shard::fetch_parts`]: each
//! file's header and the stage's tensors it holds — of a tensor-parallel rank, only its slice of them —
//! into sparse shard files side by side in its models directory) from the member with the fastest measured link that offers every file whole, trying the
//! next one if that fails, and from the hub (when the repository is known) only when no member can
//! serve it. Progress goes to the owner as the stage's `fetch`; the fetch ends when its instance does.
//! Before a launch, [`plan_fetches`] tells the preview which node would fetch how much, and from where.

use super::service::Instances;
use super::{InstanceState, StageFetch, StageReport};
use crate::cluster::{Agent, ClusterSnapshot, NodeStatus};
use crate::model::library::Library;
use crate::model::names;
use crate::model::peer_copy::{self, OfferedFile};
use crate::model::pull::{Hub, PullProgress};
use crate::model::shard::{self, PeerRanges, ShardSource, StageShare, Stoppable};
use crate::model::Model;
use crate::node::NodeId;
use crate::placement::Plan;
use crate::worker::supervisor::StageSpec;
use crate::worker::WorkerState;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a member may take to list its files.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a stage's node finds the model: a file here that holds the stage's share already, or the
/// files to complete (shards of other layers of the same files, or nothing yet): one, or each part of a
/// split set, side by side.
enum Found {
    Ready(PathBuf),
    Missing { destinations: Vec<PathBuf> },
}

/// Makes sure this node holds what the stage `spec` reads, fetching its share if needed (of a split
/// set, each part's share), reporting progress through `report`. Returns the path the worker opens.
pub async fn ensure_share(
    instances: &Arc<Instances>,
    spec: &StageSpec,
    report: impl Fn(StageReport) + Send + Sync + 'static,
) -> Result<PathBuf, String> {
    let files = spec.files();
    let Some(file) = files.first().cloned() else { return Ok(spec.model_path.clone()) };
    let library = Library::new(&instances.agent.config.data_dir);
    let share = stage_share(spec);
    let (path, wanted, looked_for) = (spec.model_path.clone(), files.clone(), share.clone());
    let found = tokio::task::spawn_blocking(move || find_here(&library, &path, &wanted, &looked_for))
        .await
        .map_err(|e| e.to_string())??;
    let destinations = match found {
        Found::Ready(path) => return Ok(path),
        Found::Missing { destinations } => destinations,
    };
    let report = Arc::new(report);
    // The fetch ends with its instance (stopped, or failed elsewhere meanwhile).
    let stop: Arc<dyn Fn() -> bool + Send + Sync> = {
        let (instances, instance) = (instances.clone(), spec.instance.clone());
        Arc::new(move || {
            let registry = instances.registry();
            let state = registry.instances.get(&instance).map(|i| i.state);
            state.is_none_or(|s| !matches!(s, InstanceState::Launching | InstanceState::Ready))
        })
    };
    let mut failures = Vec::new();
    for (node, name, addr) in members_offering(&instances.agent, &files).await {
        let parts = files
            .iter()
            .zip(&destinations)
            .map(|(file, destination)| {
                let reader = PeerRanges::new(
                    &name,
                    addr,
                    instances.agent.secret_bytes(),
                    file.clone(),
                    tokio::runtime::Handle::current(),
                );
                let url = PeerRanges::url(&name, file);
                Part::new(Stoppable::new(reader, stop.clone(), destination), url, file, destination)
            })
            .collect();
        match fetch(parts, share.clone(), (Some(node), name.clone()), report.clone()).await {
            Ok(()) => return Ok(destinations[0].clone()),
            Err(e) if stop() => return Err(e),
            Err(e) => {
                tracing::warn!("fetching the share of stage {} from {name} failed: {e}", spec.stage);
                failures.push(format!("from {name}: {e}"));
            }
        }
    }
    if let Some(repo) = &file.repo {
        let hub = Hub::from_env();
        let parts = files
            .iter()
            .zip(&destinations)
            .map(|(file, destination)| {
                let url = hub.file_url(repo, "main", &file.name);
                let reader = Stoppable::new(shard::HubRanges::new(&hub, &url), stop.clone(), destination);
                Part::new(reader, url, file, destination)
            })
            .collect();
        let from = (None, format!("Hugging Face ({repo})"));
        match fetch(parts, share.clone(), from, report.clone()).await {
            Ok(()) => return Ok(destinations[0].clone()),
            Err(e) => failures.push(format!("from the hub: {e}")),
        }
    }
    Err(if failures.is_empty() {
        format!(
            "{} is not here and no member offers it{} (nor is its Hugging Face repository known): copy it to this node or pull it here",
            file.name,
            if files.len() > 1 { " with every part of its set" } else { "" }
        )
    } else {
        format!("this node lacks its share of {} and could not fetch it: {}", file.name, failures.join("; "))
    })
}

/// What the stage `spec` reads: its layers, or a tensor-parallel rank's slice of every layer.
fn stage_share(spec: &StageSpec) -> StageShare {
    match &spec.tensor {
        Some(rank) => StageShare::Rank {
            rank: rank.rank,
            shares: rank.shares.clone(),
            layers: (rank.ring_stages > 1).then(|| spec.layers.clone()),
        },
        None => StageShare::Layers(spec.layers.clone()),
    }
}

/// Looks for the stage's share at the owner's path, then in the library (by file names and sizes);
/// fails when the owner named a file or its repository with anything but plain names.
fn find_here(library: &Library, owner_path: &Path, files: &[OfferedFile], share: &StageShare) -> Result<Found, String> {
    let models_dir = library.models_dir();
    let destinations = files
        .iter()
        .map(|file| names::destination(&models_dir, file.repo.as_deref(), &file.name).map_err(|e| e.to_string()))
        .collect::<Result<Vec<PathBuf>, String>>()?;
    // The owner's path counts only when it holds everything (a disk the nodes share): a shard there is
    // the owner's to complete, not this node's. The other parts of a set lie beside the first.
    let owner_paths: Vec<PathBuf> = files.iter().map(|f| owner_path.with_file_name(&f.name)).collect();
    if owner_path.file_name().is_some_and(|n| *n == *files[0].name) {
        if let Holds::All = holds_share(&owner_paths, files, share) {
            return Ok(Found::Ready(owner_path.to_path_buf()));
        }
    }
    let mut partial = None;
    for model in library.list() {
        let same_names = model.parts.len() == files.len()
            && model.parts.iter().zip(files).all(|(p, f)| p.file_name().is_some_and(|n| *n == *f.name));
        if !same_names {
            continue;
        }
        match holds_share(&model.parts, files, share) {
            Holds::All => return Ok(Found::Ready(model.path)),
            Holds::Part => partial = partial.or(Some(model.parts)),
            Holds::Nothing => {}
        }
    }
    Ok(Found::Missing { destinations: partial.unwrap_or(destinations) })
}

enum Holds {
    /// Every file whole, or shards with every byte the stage reads.
    All,
    /// Shards of these files without all of the stage's bytes.
    Part,
    Nothing,
}

/// What the files at `paths` (one, or each part of a set) hold of the stage's share of `files`.
fn holds_share(paths: &[PathBuf], files: &[OfferedFile], share: &StageShare) -> Holds {
    let same = paths.iter().zip(files).all(|(path, file)| {
        peer_copy::describe(path).is_some_and(|here| here.size == file.size && same_hash(&here, file))
    });
    if !same || paths.len() != files.len() {
        return Holds::Nothing;
    }
    if !paths.iter().any(|p| shard::is_shard(p)) {
        return Holds::All;
    }
    let complete = Model::open(&paths[0]).is_ok_and(|model| {
        let label = share.label();
        model.parts().len() == paths.len()
            && share.ranges(&model).is_ok_and(|by_part| {
                paths.iter().zip(by_part).all(|(path, ranges)| {
                    shard::check_ranges(path, ranges.into_iter().map(|r| (label.as_str(), r))).is_ok()
                })
            })
    });
    if complete {
        Holds::All
    } else {
        Holds::Part
    }
}

/// The members that offer every one of `files` whole (same name, size and, when both know it, hash),
/// fastest measured link to this node first.
async fn members_offering(agent: &Agent, files: &[OfferedFile]) -> Vec<(NodeId, String, std::net::SocketAddr)> {
    let snapshot = agent.snapshot();
    let me = agent.id();
    let asks = snapshot.nodes.iter().filter(|n| n.status == NodeStatus::Alive).filter_map(|n| {
        let addr = agent.peer_control(n.id)?;
        let secret = agent.secret_bytes();
        let (id, name) = (n.id, n.name.clone());
        Some(async move {
            let offered = tokio::time::timeout(LIST_TIMEOUT, peer_copy::list(addr, &secret)).await.ok()?.ok()?;
            offers_all(&offered, files).then_some((id, name, addr))
        })
    });
    let mut members: Vec<_> = futures_util::future::join_all(asks).await.into_iter().flatten().collect();
    members.sort_by_key(|m| std::cmp::Reverse(throughput(&snapshot, m.0, me)));
    members
}

/// Whether `offered` (a member's list) holds every one of `files` whole.
fn offers_all(offered: &[OfferedFile], files: &[OfferedFile]) -> bool {
    files.iter().all(|file| offered.iter().any(|f| f.layers.is_none() && same_file(f, file)))
}

/// One file of a stage's fetch, with its reader (which must outlive the async caller).
struct Part {
    reader: Box<dyn shard::RangeReader + Send>,
    source: ShardSource,
    destination: PathBuf,
}

impl Part {
    fn new(reader: impl shard::RangeReader + Send + 'static, url: String, file: &OfferedFile, to: &Path) -> Part {
        let source = ShardSource { url, size: Some(file.size), sha256: file.sha256.clone() };
        Part { reader: Box::new(reader), source, destination: to.to_path_buf() }
    }
}

/// Fetches the stage's share of every file from the readers of `parts`, reporting progress as the
/// stage's fetch.
async fn fetch(
    mut parts: Vec<Part>,
    share: StageShare,
    from: (Option<NodeId>, String),
    report: Arc<impl Fn(StageReport) + Send + Sync + 'static>,
) -> Result<(), String> {
    let blocking = move || {
        let (from_node, from) = from;
        let mut last = StageFetch { from_node, from, ..StageFetch::default() };
        let mut progress = |p: &PullProgress| {
            last.bytes_done = p.bytes_done;
            last.bytes_total = p.bytes_total;
            last.bytes_per_second = p.rate_bytes_per_second;
            let fraction = if p.bytes_total == 0 { 0.0 } else { p.bytes_done as f32 / p.bytes_total as f32 };
            report(StageReport {
                state: WorkerState::Fetching,
                progress: Some(fraction),
                fetch: Some(last.clone()),
                ..Default::default()
            });
        };
        let url = parts[0].source.url.clone();
        let mut fetches: Vec<shard::PartFetch> = parts
            .iter_mut()
            .map(|p| shard::PartFetch {
                reader: p.reader.as_mut(),
                source: p.source.clone(),
                destination: p.destination.clone(),
            })
            .collect();
        let fetched = shard::fetch_parts(&mut fetches, &share, &mut progress).map_err(|e| e.to_string())?;
        tracing::info!("fetched {} bytes of {url} (and the other parts) from {}", fetched.bytes_fetched, last.from);
        let fetch = StageFetch { bytes_fetched: fetched.bytes_fetched, done: true, ..last };
        report(StageReport {
            state: WorkerState::Starting,
            progress: Some(0.0),
            fetch: Some(fetch),
            ..Default::default()
        });
        Ok(())
    };
    tokio::task::spawn_blocking(blocking).await.map_err(|e| e.to_string())?
}

/// What a stage's node will fetch at launch, as a preview shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ShareNeed {
    /// The header and the stage's tensors: what comes over when the node has nothing of the file.
    pub bytes: u64,
    /// The member it would come from (the fastest measured link to that node with the whole file), or
    /// the hub; None when neither has it (the launch would fail).
    pub from: Option<String>,
}

/// For each stage of `plan`, what its node lacks of `model` (None: it holds its share already), from
/// what the members list (`GET /api/models/cluster`'s view) and this node's own library. Of a split
/// set, each part's header and the stage's tensors it holds count (of a tensor-parallel rank, its
/// slice's pieces of them). A shard counts as holding a pipeline stage's layers, and a rank's slice
/// when the byte ranges it lists hold every piece the rank reads.
pub async fn plan_fetches(agent: &Agent, model: &Model, plan: &Plan) -> Vec<Option<ShareNeed>> {
    let Some(files) = peer_copy::describe_model(model) else { return vec![None; plan.stages.len()] };
    let me = agent.id();
    let snapshot = agent.snapshot();
    let lists = snapshot.nodes.iter().filter(|n| n.status.is_up()).map(|n| {
        let (id, name, addr, secret) = (n.id, n.name.clone(), agent.peer_control(n.id), agent.secret_bytes());
        let library = Library::new(&agent.config.data_dir);
        async move {
            let files = if id == me {
                tokio::task::spawn_blocking(move || peer_copy::listed_files(&library)).await.ok()
            } else {
                let asked = tokio::time::timeout(LIST_TIMEOUT, peer_copy::list(addr?, &secret)).await;
                asked.ok().and_then(Result::ok)
            };
            Some((id, name, files?))
        }
    });
    let holdings: Vec<(NodeId, String, Vec<OfferedFile>)> =
        futures_util::future::join_all(lists).await.into_iter().flatten().collect();
    let whole: Vec<&(NodeId, String, Vec<OfferedFile>)> =
        holdings.iter().filter(|(_, _, offered)| offers_all(offered, &files)).collect();
    plan.stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            // A rank reads its slice's pieces (of its group's layers, in a chain), a pipeline stage its
            // layers' tensors whole.
            let share = match plan.rank_of(i) {
                Some(r) => StageShare::Rank {
                    rank: r.rank,
                    shares: r.shares,
                    layers: (r.ring_stages > 1).then(|| stage.layers.clone()),
                },
                None => StageShare::Layers(stage.layers.clone()),
            };
            let read = share.ranges(model).unwrap_or_default();
            let held = holdings.iter().find(|(id, _, _)| *id == stage.node).map(|(_, _, files)| files);
            let holds = held.is_some_and(|held| {
                files.iter().enumerate().all(|(part, file)| {
                    held.iter().filter(|f| same_file(f, file)).any(|f| match (&f.layers, &f.present) {
                        (None, _) => true,
                        (Some(_), Some(present)) if stage.slice.is_some() => {
                            read.get(part).is_some_and(|wanted| ranges_cover(present, wanted))
                        }
                        (Some(text), _) => stage.slice.is_none() && layers_cover(text, &stage.layers),
                    })
                })
            });
            if holds {
                return None;
            }
            let bytes = model
                .parts()
                .iter()
                .zip(&read)
                .map(|(part, ranges)| part.data_offset() + ranges.iter().map(|r| r.end - r.start).sum::<u64>())
                .sum();
            let nearest = whole
                .iter()
                .filter(|(id, _, _)| *id != stage.node)
                .max_by_key(|(id, _, _)| throughput(&snapshot, *id, stage.node));
            let from = match (nearest, &files[0].repo) {
                (Some((_, name, _)), _) => Some(name.clone()),
                (None, Some(repo)) => Some(format!("Hugging Face ({repo})")),
                (None, None) => None,
            };
            Some(ShareNeed { bytes, from })
        })
        .collect()
}

/// Whether a shard's layers (`0-9, 20-29`, both ends included) hold every layer of `wanted`.
fn layers_cover(text: &str, wanted: &Range<usize>) -> bool {
    let held: Vec<Range<usize>> = text.split(',').filter_map(|part| shard::parse_layers(part).ok()).collect();
    wanted.clone().all(|layer| held.iter().any(|r| r.contains(&layer)))
}

/// Whether the byte ranges `present` (sorted, merged, as a shard's record keeps them) hold every range
/// of `wanted`.
fn ranges_cover(present: &[Range<u64>], wanted: &[Range<u64>]) -> bool {
    wanted.iter().filter(|w| !w.is_empty()).all(|w| present.iter().any(|p| p.start <= w.start && w.end <= p.end))
}

/// The measured throughput from `from` to `to` (0 when not measured).
fn throughput(snapshot: &ClusterSnapshot, from: NodeId, to: NodeId) -> u64 {
    let link = snapshot.links.iter().find(|l| (l.a == from && l.b == to) || (l.a == to && l.b == from));
    link.and_then(|l| if l.a == from { l.throughput_a_to_b_bps } else { l.throughput_b_to_a_bps }).unwrap_or(0)
}

/// Whether `a` and `b` are the same file: same name and size, and same hash when both know it.
fn same_file(a: &OfferedFile, b: &OfferedFile) -> bool {
    a.name == b.name && a.size == b.size && same_hash(a, b)
}

fn same_hash(a: &OfferedFile, b: &OfferedFile) -> bool {
    match (&a.sha256, &b.sha256) {
        (Some(x), Some(y)) => x.eq_ignore_ascii_case(y),
        _ => true,
    }
}

//! Shard-only fetch: a node that hosts layers [a, b) of a model downloads only the GGUF header and the
//! bytes of the tensors its stage reads ([`Model::stage_tensors`], what `Stage::load` maps: the layers'
//! tensors, RoPE factors, the token embedding on the first stage, the final norm and output head on the
//! last — the embedding matrix when the head is tied to it); a node that hosts a tensor-parallel rank,
//! only that rank's slice of every tensor ([`StageShare`]). The bytes come with HTTP range requests from
//! the hub, or from any server that answers range requests for the file (a peer), and land at their
//! offsets in a sparse file of the whole file's length, which the engine maps as it maps a whole file;
//! the holes take no disk space. The header is read progressively: a first chunk, then more until it
//! parses. Adjacent tensors are fetched together, one request per run of them. Of a split GGUF set each
//! part is fetched so ([`fetch_parts`]): its header and those of the stage's tensors it holds, into a
//! shard of its own under the part's name, beside the others, so that `Model::open` finds them.
//!
//! A member of the cluster serves ranges too ([`PeerRanges`]): a node fetches the share of a model
//! another member has over the cluster's authenticated connection, each piece checked against the
//! sender's hash before it is written.
//!
//! Beside the file, `<file>.shard.json` ([`ShardRecord`]) records the source, the whole file's size
//! and sha256, and the byte ranges and layers present. A later fetch for other layers, or a rerun after
//! an interruption, fetches only what is missing (the bytes of a broken connection are kept up to where
//! it broke). The library lists such a file as a shard with its layers, never as a whole model; a stage
//! refuses to map a tensor that was not fetched; `shoal pull` without `--layers` fills the holes of a
//! shard in place and then checks the whole file's sha256.
//!
//! Verified: the header parses and describes a model shoal runs (what [`Model::open`] checks); every
//! answer is a 206 whose `Content-Range` holds exactly the bytes asked for, of a file of the size the
//! hub lists (or the first answer gave); each range arrived with exactly its length. NOT verified: the
//! content of the tensor bytes. The hub publishes one sha256 for the whole file and nothing per range,
//! so a shard cannot be checked against it; a server that sends wrong bytes with correct framing goes
//! unnoticed until the file is completed (`shoal pull` without `--layers`), which checks the sha256.

mod http;
mod peer;
mod record;
mod share;
mod sparse;

pub use http::{Failure, HubRanges, Sink};
pub use peer::PeerRanges;
pub use record::{
    check_present, check_ranges, is_shard, parse_record, read_record, sidecar, ShardRecord, SIDECAR_SUFFIX,
};
pub use share::StageShare;

use super::gguf::GgufHeader;
use super::pull::{choose_files, sha256_of, Hub, HubFile, PullProgress, PullRequest, PullState};
use super::{Model, ModelError, Value};
use http::Meter;
use sparse::{Existing, FolderLock, Shard, Spare};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The first request for the header asks for this much; later ones for as much again, up to
/// [`HEADER_STEP`] each.
const HEADER_FIRST: u64 = 1 << 20;
const HEADER_STEP: u64 = 4 << 20;
/// Headers larger than this are not GGUF files shoal fetches by shard.
const HEADER_LIMIT: u64 = 256 << 20;
/// Attempts of one run of bytes, each resuming where the previous one broke.
const ATTEMPTS: usize = 4;
/// A long run of bytes is recorded as present every this many bytes, so a crash loses little.
const CHECKPOINT: u64 = 256 << 20;

/// Why a shard fetch failed; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("layers {spec:?}: write FIRST-LAST, both included, such as 10-19")]
    BadLayers { spec: String },
    #[error("rank {spec:?}: write RANK/NODES, such as 1/2 for the second node of a group of two")]
    BadRank { spec: String },
    #[error("layers {}-{} are not inside the model's {model_layers} layers (0-{})", layers.start, layers.end.saturating_sub(1), model_layers.saturating_sub(1))]
    LayersOutside { layers: Range<usize>, model_layers: usize },
    #[error("the slice {label} of a tensor-parallel group cannot be planned for this model: {reason}")]
    Slice { label: String, reason: String },
    #[error("cannot reach {url}: {reason}. Check the address and the network (HF_ENDPOINT for the hub)")]
    Unreachable { url: String, reason: String },
    #[error("{url}: {reason}")]
    Peer { url: String, reason: String },
    #[error("{} needs {} more on its disk and {} is free: free some space (or remove models with `shoal models`) and run it again", path.display(), crate::util::format_bytes(*needed), crate::util::format_bytes(*free))]
    NoSpace { path: PathBuf, needed: u64, free: u64 },
    #[error("the fetch into {} was stopped", path.display())]
    Stopped { path: PathBuf },
    #[error("{url} answered {status} when asked for bytes {start}-{last}; nothing of that answer was kept. Check that the file is still there and run the same command again")]
    Status { url: String, status: u16, start: u64, last: u64 },
    #[error("{url} sent the whole file when asked for a byte range: a shard fetch needs a server that answers range requests. Download the whole file instead (without --layers)")]
    NoRanges { url: String },
    #[error("the answer of {url} for bytes {start}-{last} is damaged: {reason}; nothing of it was kept. Run the same command again; if it happens again, the server is faulty")]
    Damaged { url: String, start: u64, last: u64, reason: String },
    #[error("the transfer from {url} broke {attempts} times (last: {reason}); the bytes that arrived are kept: run the same command again to fetch the rest")]
    Interrupted { url: String, attempts: usize, reason: String },
    #[error("{url} serves a file of {served} bytes where {expected} were expected: it is not the same file. Check which file the URL names")]
    WrongSize { url: String, served: u64, expected: u64 },
    #[error("the GGUF header of {url} does not end within its first {limit} bytes; the file is damaged or not a model shoal fetches by shard")]
    HeaderTooLarge { url: String, limit: u64 },
    #[error("{} holds a shard of another version of this file ({reason}); delete it and {}, then fetch again", path.display(), sidecar(path).display())]
    DifferentFile { path: PathBuf, reason: String },
    #[error("{} already exists and is not a shard of this file (it has no {}); move it away and fetch again", path.display(), sidecar(path).display())]
    NotAShard { path: PathBuf },
    #[error("cannot write {}: {source}. Check the disk's free space and the permissions", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("a fetch needs at least one file")]
    NoParts,
    #[error("{} is not in the folder of {}: the parts of a split set must lie side by side", part.display(), first.display())]
    PartElsewhere { part: PathBuf, first: PathBuf },
    #[error("{} opens as a model of {found} file(s) where {parts} were fetched: the parts named are not the set's. Check the names of its parts", first.display())]
    PartsDiffer { first: PathBuf, parts: usize, found: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Something that answers range requests for one file: an HTTP server such as the hub
/// ([`HubRanges`]), or a peer over the cluster's authenticated connection ([`PeerRanges`]).
pub trait RangeReader {
    /// Asks for `range` and hands the bytes to `sink(offset, bytes)` as they arrive. `size` is the
    /// whole file's length when known; the first answer tells it otherwise (then `range` may run past
    /// the end of the file and is cut there). Returns the end of the bytes delivered.
    fn get(&mut self, range: Range<u64>, size: &mut Option<u64>, sink: &mut Sink<'_>) -> Result<u64, Failure>;
}

/// A reader that gives up with [`ShardError::Stopped`] once `stop()` says so: checked before each
/// request and as bytes arrive (what arrived since the last checkpoint is fetched again next time).
pub struct Stoppable<R> {
    inner: R,
    stop: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
    path: PathBuf,
}

impl<R: RangeReader> Stoppable<R> {
    pub fn new(inner: R, stop: std::sync::Arc<dyn Fn() -> bool + Send + Sync>, destination: &Path) -> Self {
        Stoppable { inner, stop, path: destination.into() }
    }
}

impl<R: RangeReader> RangeReader for Stoppable<R> {
    fn get(&mut self, range: Range<u64>, size: &mut Option<u64>, sink: &mut Sink<'_>) -> Result<u64, Failure> {
        let (stop, path) = (&self.stop, &self.path);
        if stop() {
            return Err(Failure::Fatal(ShardError::Stopped { path: path.clone() }));
        }
        let mut checked = |offset: u64, bytes: &[u8]| {
            if stop() {
                return Err(ShardError::Stopped { path: path.clone() });
            }
            sink(offset, bytes)
        };
        self.inner.get(range, size, &mut checked)
    }
}

/// Where a shard's bytes come from: a URL that answers range requests for the whole file.
#[derive(Clone, Debug)]
pub struct ShardSource {
    /// The URL (or, for a peer, `shoal://NODE/FILE`): named in messages and kept in the record.
    pub url: String,
    /// The whole file's length, when known (the hub lists it); otherwise the first answer tells it.
    pub size: Option<u64>,
    /// The whole file's sha256, when known: kept in the record for when the file is completed.
    pub sha256: Option<String>,
}

/// What a fetch did.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// Bytes that came over the network (of every part of a split set).
    pub bytes_fetched: u64,
    /// The shard's record afterwards (of a split set, the first part's; each part has its own beside
    /// it); None when the whole file was already there.
    pub record: Option<ShardRecord>,
}

/// `FIRST-LAST` (both included, as `shoal run --layers` writes them) or `LAYER` → the range of layers.
pub fn parse_layers(spec: &str) -> Result<Range<usize>, ShardError> {
    let bad = || ShardError::BadLayers { spec: spec.to_string() };
    let (first, last) = spec.trim().split_once('-').unwrap_or((spec.trim(), spec.trim()));
    let (first, last): (usize, usize) =
        (first.trim().parse().map_err(|_| bad())?, last.trim().parse().map_err(|_| bad())?);
    if last < first {
        return Err(bad());
    }
    Ok(first..last.checked_add(1).ok_or_else(bad)?)
}

/// `RANK/NODES` → rank `RANK` of a tensor-parallel group of `NODES` nodes holding equal shares, as
/// `shoal run --parallel tensor` gives alike nodes.
pub fn parse_rank(spec: &str) -> Result<StageShare, ShardError> {
    let bad = || ShardError::BadRank { spec: spec.to_string() };
    let (rank, nodes) = spec.trim().split_once('/').ok_or_else(bad)?;
    let (rank, nodes): (usize, usize) =
        (rank.trim().parse().map_err(|_| bad())?, nodes.trim().parse().map_err(|_| bad())?);
    if nodes < 2 || rank >= nodes || nodes > super::slice::MAX_GROUP {
        return Err(bad());
    }
    Ok(StageShare::Rank { rank, shares: vec![1.0; nodes], layers: None })
}

/// Fetches the shard of `layers` of the hub model `request` names into `models_dir`, where `pull`
/// puts the whole file: of a split set, each part's share (its header and the stage's tensors it
/// holds). Returns the path to open (the first part of a set).
pub fn pull_shard(
    hub: &Hub,
    models_dir: &Path,
    request: &PullRequest,
    layers: Range<usize>,
    progress: &mut dyn FnMut(&PullProgress),
) -> anyhow::Result<PathBuf> {
    pull_share(hub, models_dir, request, &StageShare::Layers(layers), progress)
}

/// [`pull_shard`] of any stage's share: its layers, or a tensor-parallel rank's slice of every layer.
pub fn pull_share(
    hub: &Hub,
    models_dir: &Path,
    request: &PullRequest,
    share: &StageShare,
    progress: &mut dyn FnMut(&PullProgress),
) -> anyhow::Result<PathBuf> {
    let files = choose_files(request, &hub.files(&request.repo, request.revision())?)?;
    let mut readers = Vec::with_capacity(files.len());
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        let url = hub.file_url(&request.repo, request.revision(), &file.path);
        readers.push(HubRanges::new(hub, &url));
        sources.push((
            ShardSource { url, size: Some(file.size), sha256: file.sha256.clone() },
            super::pull::hub_destination(models_dir, &request.repo, &file.path)?,
        ));
    }
    let mut parts: Vec<PartFetch> = readers
        .iter_mut()
        .zip(sources)
        .map(|(reader, (source, destination))| PartFetch { reader, source, destination })
        .collect();
    fetch_parts(&mut parts, share, progress)?;
    Ok(parts[0].destination.clone())
}

/// Fetches what a stage running `layers` reads from the URL `source` names (over HTTP, with the hub's
/// token only when the URL is the hub's) into the sparse file `destination`; see [`fetch_from`].
pub fn fetch(
    hub: &Hub,
    source: &ShardSource,
    destination: &Path,
    layers: Range<usize>,
    progress: &mut dyn FnMut(&PullProgress),
) -> Result<Fetched, ShardError> {
    fetch_from(&mut HubRanges::new(hub, &source.url), source, destination, layers, progress)
}

/// Fetches what a stage running `layers` reads from `reader` into the sparse file `destination`,
/// adding to a shard already there; see [`fetch_parts`].
pub fn fetch_from(
    reader: &mut dyn RangeReader,
    source: &ShardSource,
    destination: &Path,
    layers: Range<usize>,
    progress: &mut dyn FnMut(&PullProgress),
) -> Result<Fetched, ShardError> {
    let part = PartFetch { reader, source: source.clone(), destination: destination.into() };
    fetch_parts(&mut [part], &StageShare::Layers(layers), progress)
}

/// One file of a fetch — the only file of a model, or a part of a split set — with where its bytes come
/// from and where they go.
pub struct PartFetch<'a> {
    pub reader: &'a mut dyn RangeReader,
    pub source: ShardSource,
    pub destination: PathBuf,
}

/// Fetches what a stage reads (`share`: its layers, or a tensor-parallel rank's slice) from every file
/// of a model (`parts`: the one file, or each part of a split set in order, all in one folder under the
/// names `Model::open` finds them by): each file's header, then from each the stage's bytes it holds,
/// into sparse shard files, adding to shards already there. Nothing is fetched of a file that is
/// already whole. Fetches into one folder take turns (also across processes): two of them never write
/// one record.
pub fn fetch_parts(
    parts: &mut [PartFetch<'_>],
    share: &StageShare,
    progress: &mut dyn FnMut(&PullProgress),
) -> Result<Fetched, ShardError> {
    let Some(first) = parts.first().map(|p| p.destination.clone()) else {
        return Err(ShardError::NoParts);
    };
    if let Some(other) = parts.iter().find(|p| p.destination.parent() != first.parent()) {
        return Err(ShardError::PartElsewhere { part: other.destination.clone(), first });
    }
    let _turn = FolderLock::take(&first)?;
    let name = first.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let mut meter = Meter::new(&name, progress);
    let mut opened: Vec<Option<(Shard, Spare)>> = Vec::with_capacity(parts.len());
    let mut whole = 0;
    for part in parts.iter_mut() {
        opened.push(match Shard::open(&part.destination, &part.source)? {
            Existing::Whole(size) => {
                whole += size;
                None
            }
            Existing::Shard(shard) => Some((shard, None)),
            Existing::Nothing => {
                let (header, size) = fetch_header(part.reader, &part.source, &mut meter)?;
                Some(Shard::create(&part.destination, &part.source, size, header)?)
            }
        });
    }
    if opened.iter().all(Option::is_none) {
        meter.set(whole, whole, PullState::Done);
        return Ok(Fetched { bytes_fetched: 0, record: None });
    }
    let forget = |opened: &[Option<(Shard, Spare)>]| opened.iter().flatten().for_each(|(s, _)| s.forget_if_new());
    let model = Model::open(&first).inspect_err(|_| forget(&opened))?;
    let found: Vec<&Path> = model.parts().iter().map(|p| p.path()).collect();
    if found.len() != parts.len() || found.iter().zip(parts.iter()).any(|(f, p)| **f != *p.destination) {
        forget(&opened);
        return Err(ShardError::PartsDiffer { first, parts: parts.len(), found: found.len() });
    }
    let by_part = share.ranges(&model).inspect_err(|_| forget(&opened))?;
    // Gaps smaller than the alignment are padding: fetched with their neighbours, not on their own.
    let alignment = model.file().get("general.alignment").and_then(Value::as_u64).unwrap_or(32);
    let mut plans = Vec::new();
    let (mut total, mut left) = (whole, 0);
    for (index, (opened, ranges)) in opened.into_iter().zip(&by_part).enumerate() {
        let Some((mut shard, spare)) = opened else { continue };
        let mut wanted: Vec<Range<u64>> = ranges.clone();
        record::merge(&mut wanted, alignment);
        if let Some((offset, bytes)) = spare {
            // Bytes past the header that came with its last chunk: keep those the stage needs.
            for run in shard.record.missing(&wanted) {
                let (from, to) = (run.start.max(offset), run.end.min(offset + bytes.len() as u64));
                if from < to {
                    shard.write(from, &bytes[(from - offset) as usize..(to - offset) as usize])?;
                    shard.commit(from..to)?;
                }
            }
        }
        let missing = shard.record.missing(&wanted);
        total += shard.record.header_bytes + wanted.iter().map(|r| r.end - r.start).sum::<u64>();
        left += missing.iter().map(|r| r.end - r.start).sum::<u64>();
        plans.push((index, shard, missing));
    }
    if let Some(free) = crate::util::free_disk_bytes(&first).filter(|&free| free < left) {
        return Err(ShardError::NoSpace { path: first, needed: left, free });
    }
    meter.set(total - left, total, PullState::Downloading);
    let mut record = None;
    for (index, mut shard, missing) in plans {
        let part = &mut parts[index];
        for run in missing {
            fetch_run(part.reader, &part.source.url, &mut shard, run, &mut meter)?;
        }
        shard.record.source = part.source.url.clone();
        match share {
            StageShare::Layers(layers) => shard.record.add_layers(layers.clone()),
            StageShare::Rank { .. } => shard.record.add_slice(share.label()),
        }
        shard.save()?;
        if index == 0 {
            record = Some(shard.record.clone());
        }
    }
    let label = share.label();
    for (part, ranges) in parts.iter().zip(&by_part) {
        check_ranges(&part.destination, ranges.iter().map(|r| (label.as_str(), r.clone())))?;
    }
    meter.state(PullState::Done);
    Ok(Fetched { bytes_fetched: meter.fetched, record })
}

/// Completes the shard at `destination` for `pull` from the hub; see [`complete_from`].
pub(super) fn complete(
    hub: &Hub,
    url: &str,
    file: &HubFile,
    destination: &Path,
    progress: &mut dyn FnMut(u64, u64, PullState),
) -> anyhow::Result<()> {
    let source = ShardSource { url: url.to_string(), size: Some(file.size), sha256: file.sha256.clone() };
    let mut report = |p: &PullProgress| progress(p.bytes_done, p.rate_bytes_per_second, p.state);
    complete_from(&mut HubRanges::new(hub, url), &source, destination, &mut report)?;
    Ok(())
}

/// Completes the shard at `destination` from `reader`: fetches every byte still missing, checks the
/// whole file against the sha256 `source` (or the shard's record) knows, and drops the record, leaving
/// a whole file. Returns the file's sha256. A file failing the check is deleted, as `pull` does.
pub fn complete_from(
    reader: &mut dyn RangeReader,
    source: &ShardSource,
    destination: &Path,
    progress: &mut dyn FnMut(&PullProgress),
) -> anyhow::Result<String> {
    let _turn = FolderLock::take(destination)?;
    let name = destination.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let mut meter = Meter::new(&name, progress);
    let Existing::Shard(mut shard) = Shard::open(destination, source)? else {
        anyhow::bail!("{} changed while it was being completed; run the command again", destination.display());
    };
    let size = shard.record.size;
    let everything = 0..size;
    let missing = shard.record.missing(std::slice::from_ref(&everything));
    let left: u64 = missing.iter().map(|r| r.end - r.start).sum();
    if let Some(free) = crate::util::free_disk_bytes(destination).filter(|&free| free < left) {
        return Err(ShardError::NoSpace { path: destination.into(), needed: left, free }.into());
    }
    meter.set(size - left, size, PullState::Downloading);
    for run in missing {
        fetch_run(reader, &source.url, &mut shard, run, &mut meter)?;
    }
    meter.state(PullState::Verifying);
    drop(meter);
    let actual = sha256_of(destination)?;
    if let Some(expected) = source.sha256.as_ref().or(shard.record.sha256.as_ref()) {
        if !actual.eq_ignore_ascii_case(expected) {
            let _ = std::fs::remove_file(destination);
            let _ = std::fs::remove_file(sidecar(destination));
            anyhow::bail!(
                "{name} failed its checksum once completed: its sha256 should be {expected}, the file has {actual}; the damaged file was deleted, fetch it again"
            );
        }
    }
    std::fs::remove_file(sidecar(destination))
        .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", sidecar(destination).display()))?;
    Ok(actual)
}

/// Reads the header progressively. Returns its bytes (with whatever came after it in the last chunk)
/// and the whole file's size.
fn fetch_header(
    reader: &mut dyn RangeReader,
    source: &ShardSource,
    meter: &mut Meter,
) -> Result<(Vec<u8>, u64), ShardError> {
    let mut size = source.size;
    let mut bytes: Vec<u8> = Vec::new();
    loop {
        let have = bytes.len() as u64;
        let step = if have == 0 { HEADER_FIRST } else { have.min(HEADER_STEP) };
        let end = (have + step).min(size.unwrap_or(u64::MAX)).min(HEADER_LIMIT);
        if end <= have {
            return Err(ShardError::HeaderTooLarge { url: source.url.clone(), limit: HEADER_LIMIT });
        }
        let mut append = |offset: u64, chunk: &[u8]| {
            debug_assert_eq!(offset, bytes.len() as u64);
            bytes.extend_from_slice(chunk);
            Ok(())
        };
        retry(&source.url, have..end, |range| reader.get(range, &mut size, &mut append))?;
        meter.add(bytes.len() as u64 - have);
        // Every answer tells the size; a reader that did not is faulty, not a reason to panic.
        let Some(size) = size else {
            return Err(ShardError::HeaderTooLarge { url: source.url.clone(), limit: bytes.len() as u64 });
        };
        match GgufHeader::parse(Path::new(&source.url), &bytes) {
            Ok(header) if header.data_offset <= size && header.data_offset <= bytes.len() as u64 => {
                return Ok((bytes, size))
            }
            // The padding up to the tensor data has not all arrived yet.
            Ok(header) if header.data_offset <= size => continue,
            Ok(_) => return Err(ShardError::HeaderTooLarge { url: source.url.clone(), limit: size }),
            Err(ModelError::Truncated { .. }) if (bytes.len() as u64) < size => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Fetches `run` into the shard, resuming after broken connections and recording what arrived.
fn fetch_run(
    reader: &mut dyn RangeReader,
    url: &str,
    shard: &mut Shard,
    run: Range<u64>,
    meter: &mut Meter,
) -> Result<(), ShardError> {
    let mut size = Some(shard.record.size);
    let mut committed = run.start;
    let outcome = retry(url, run.clone(), |range| {
        let mut sink = |offset: u64, bytes: &[u8]| {
            shard.write(offset, bytes)?;
            meter.add(bytes.len() as u64);
            let end = offset + bytes.len() as u64;
            if end - committed >= CHECKPOINT {
                shard.commit(committed..end)?;
                committed = end;
            }
            Ok(())
        };
        let result = reader.get(range, &mut size, &mut sink);
        if let Err(Failure::Broken { reached, .. }) = &result {
            // What arrived before the break is intact: keep it.
            shard.commit(committed..*reached)?;
            committed = *reached;
        }
        result
    });
    match outcome {
        Ok(()) => shard.commit(committed..run.end),
        Err(e) => Err(e),
    }
}

/// Runs `attempt` on `range` up to [`ATTEMPTS`] times, each resuming where the last one broke.
fn retry(
    url: &str,
    range: Range<u64>,
    mut attempt: impl FnMut(Range<u64>) -> Result<u64, Failure>,
) -> Result<(), ShardError> {
    let mut from = range.start;
    let mut last_reason = String::new();
    for n in 0..ATTEMPTS {
        match attempt(from..range.end) {
            Ok(_) => return Ok(()),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Broken { reached, reason }) => {
                tracing::warn!(
                    "the transfer from {url} broke at byte {reached} (attempt {}): {reason}; resuming",
                    n + 1
                );
                from = reached;
                last_reason = reason;
            }
        }
    }
    Err(ShardError::Interrupted { url: url.to_string(), attempts: ATTEMPTS, reason: last_reason })
}

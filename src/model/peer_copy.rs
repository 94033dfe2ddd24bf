//! Copying model files between nodes, so a file one node has need not come from the internet again.
//! A node offers the complete GGUF files of its library to members of its cluster, over a connection
//! authenticated and encrypted with the cluster secret (a node without the secret gets nothing); files
//! are named by file name and size, never by path, so nothing outside the library can be asked for.
//!
//! One request per connection: `List` (the files offered) or `Fetch` (a file, whole or some byte
//! ranges). The answer to a fetch is a header, the bytes in frames of up to 1 MiB, and a trailer with
//! the SHA-256 of every byte sent. The receiver writes into `<name>.part` (ranges at their offsets, so
//! the file stays sparse), hashes what arrives and keeps the file only if the hashes agree — and, for a
//! whole file whose hub hash the sender knows (a Hugging Face cache blob is named by it), only if the
//! whole file hashes to that too.

use super::library::{Library, ModelSource};
use crate::net::secure::{self, Psk};
use crate::net::{ConnectionKind, NetError, SecureReader, SecureWriter};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Bytes per data frame.
const CHUNK: usize = 1 << 20;
/// Largest control message (a list of files, a header, a trailer).
const MAX_MESSAGE: usize = 4 << 20;

/// A file a node offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct OfferedFile {
    pub name: String,
    pub size: u64,
    /// The Hugging Face repository it came from, when known (`ORG/NAME`).
    pub repo: Option<String>,
    /// The hub's SHA-256 of the file, when known.
    pub sha256: Option<String>,
    /// Set when the node holds only a shard of the file: the layers present (`10-19`, as `shoal pull
    /// --layers` writes them). Listed so the cluster sees who has which part; never copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<String>,
    /// Of a shard: the byte ranges of the file it holds (as its record has them), so that a placement
    /// preview can tell whether a stage's bytes, or a tensor-parallel rank's slice, are all there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<Vec<std::ops::Range<u64>>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
enum Request {
    List,
    /// `ranges` as (offset, length); empty for the whole file.
    Fetch {
        name: String,
        size: u64,
        ranges: Vec<(u64, u64)>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    error: Option<String>,
    file: Option<OfferedFile>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Trailer {
    sha256: String,
    /// Set when what was sent cannot be trusted although it hashes as sent: the file changed on the
    /// sender's disk while it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("cannot reach the node: {0}")]
    Connect(NetError),
    #[error("the copy broke off: {0}")]
    Network(#[from] NetError),
    #[error("the node does not offer it: {0}")]
    Refused(String),
    #[error("the copy arrived damaged: {0}; nothing was kept")]
    Damaged(String),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the node answered something else than shoal's file copy: {0}")]
    Protocol(String),
}

/// Where a copy stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct CopyProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub bytes_per_second: u64,
}

/// A finished copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct CopyReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: u64,
    pub sha256: String,
}

/// The files of `library` a peer may copy: every readable part of every model none of whose files is a
/// shard.
pub fn offered_files(library: &Library) -> Vec<(OfferedFile, PathBuf)> {
    offered_of(&library.list())
}

/// The complete files among `models`, with their paths.
fn offered_of(models: &[super::library::LibraryModel]) -> Vec<(OfferedFile, PathBuf)> {
    let mut files = Vec::new();
    for model in models {
        // A shard lacks bytes; a file whose header does not parse is damaged: neither is offered.
        if model.shard.is_some() || model.parameters.is_none() {
            continue;
        }
        for part in &model.parts {
            let (Some(name), Ok(meta)) = (part.file_name().and_then(|n| n.to_str()), std::fs::metadata(part)) else {
                continue;
            };
            if part != &model.path && super::gguf::GgufFile::open(part).is_err() {
                continue;
            }
            let (repo, sha256) = match &model.source {
                ModelSource::HuggingFace { repo, .. } => (Some(repo.clone()), hub_blob_sha256(part)),
                ModelSource::Shoal => (repo_of_shoal_file(part), None),
                ModelSource::Added => (None, None),
            };
            let file =
                OfferedFile { name: name.to_string(), size: meta.len(), repo, sha256, layers: None, present: None };
            files.push((file, part.clone()));
        }
    }
    files
}

/// What a node tells the cluster it holds: the files it offers, and the shards it has (with their
/// layers), which it does not offer.
pub fn listed_files(library: &Library) -> Vec<OfferedFile> {
    let models = library.list();
    let mut files: Vec<OfferedFile> = offered_of(&models).into_iter().map(|(f, _)| f).collect();
    for model in &models {
        let Some(shard) = &model.shard else { continue };
        // Every part of a split set, each with the layers the whole set holds.
        for part in &model.parts {
            let Some(mut file) = describe(part) else { continue };
            file.layers = Some(shard.layers.clone());
            file.present = super::shard::read_record(part).ok().flatten().map(|record| record.present);
            files.push(file);
        }
    }
    files
}

/// How other nodes find every file of `model` ([`describe`] of each): one, or each part of a split set
/// in order. None when one cannot be read.
pub fn describe_model(model: &super::Model) -> Option<Vec<OfferedFile>> {
    model.parts().iter().map(|part| describe(part.path())).collect()
}

/// How other nodes find the model file at `path` (the first part of a split set, or a shard: then its
/// record gives the whole file's size and hash): its name and size, and, when the path tells, the
/// repository it came from and the hub's hash. None when `path` cannot be read.
pub fn describe(path: &Path) -> Option<OfferedFile> {
    let name = path.file_name()?.to_str()?.to_string();
    let (size, shard_sha256) = match super::shard::read_record(path).ok().flatten() {
        Some(record) => (record.size, record.sha256),
        None => (std::fs::metadata(path).ok()?.len(), None),
    };
    let repo = repo_of_hub_cache_file(path).or_else(|| repo_of_shoal_file(path));
    let sha256 = shard_sha256.or_else(|| hub_blob_sha256(path));
    Some(OfferedFile { name, size, repo, sha256, layers: None, present: None })
}

/// `…/hub/models--ORG--NAME/snapshots/REV/FILE` is a Hugging Face cache file of `ORG/NAME`.
fn repo_of_hub_cache_file(path: &Path) -> Option<String> {
    let snapshots = path.ancestors().find(|a| a.file_name().is_some_and(|n| n == "snapshots"))?;
    let folder = snapshots.parent()?.file_name()?.to_str()?;
    let (org, name) = folder.strip_prefix("models--")?.split_once("--")?;
    Some(format!("{org}/{name}"))
}

/// A Hugging Face cache snapshot file links to `blobs/<sha256>`.
fn hub_blob_sha256(path: &Path) -> Option<String> {
    let target = std::fs::canonicalize(path).ok()?;
    let name = target.file_name()?.to_str()?;
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())).then(|| name.to_ascii_lowercase())
}

/// `models/ORG--NAME/FILE` was pulled from `ORG/NAME`.
fn repo_of_shoal_file(path: &Path) -> Option<String> {
    let folder = path.parent()?.file_name()?.to_str()?;
    folder.split_once("--").map(|(org, name)| format!("{org}/{name}"))
}

async fn send_json(writer: &mut SecureWriter, value: &impl Serialize) -> Result<(), NetError> {
    writer.write_frame(&serde_json::to_vec(value).expect("plain data serializes")).await
}

async fn recv_json<T: for<'de> Deserialize<'de>>(reader: &mut SecureReader) -> Result<T, CopyError> {
    let bytes = reader.read_frame(MAX_MESSAGE).await?;
    serde_json::from_slice(&bytes).map_err(|e| CopyError::Protocol(e.to_string()))
}

/// The first of `ranges` (offset, length) that reaches past a file of `size` bytes.
fn outside(ranges: &[(u64, u64)], size: u64) -> Option<&(u64, u64)> {
    ranges.iter().find(|(o, l)| o.checked_add(*l).is_none_or(|end| end > size))
}

/// Decodes `frame` as each message of the protocol, with the checks the server makes of a request (a
/// fetch of a file of the size it names) and the client of a header; for the fuzz targets.
#[doc(hidden)]
pub fn decode_messages(frame: &[u8]) -> Vec<bool> {
    let request = match serde_json::from_slice::<Request>(frame) {
        Ok(Request::Fetch { size, ranges, .. }) => outside(&ranges, size).is_none(),
        Ok(Request::List) => true,
        Err(_) => false,
    };
    let header = serde_json::from_slice::<Header>(frame).is_ok_and(|h| h.error.is_none() && h.file.is_some());
    let trailer = serde_json::from_slice::<Trailer>(frame).is_ok();
    let list = serde_json::from_slice::<Vec<OfferedFile>>(frame).is_ok();
    vec![request, header, trailer, list]
}

/// Serves one copy connection (after its handshake).
pub async fn serve(mut reader: SecureReader, mut writer: SecureWriter, library: Library) -> Result<(), NetError> {
    let request: Request = match reader.read_frame(MAX_MESSAGE).await.map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(request)) => request,
        Ok(Err(e)) => return Err(NetError::BadPreamble(format!("a malformed copy request: {e}"))),
        Err(e) => return Err(e),
    };
    let (name, size, ranges) = match request {
        Request::List => {
            let files = tokio::task::spawn_blocking(move || listed_files(&library)).await.unwrap_or_default();
            return send_json(&mut writer, &files).await;
        }
        Request::Fetch { name, size, ranges } => (name, size, ranges),
    };
    let offered = tokio::task::spawn_blocking(move || offered_files(&library)).await.unwrap_or_default();
    let Some((file, path)) = offered.into_iter().find(|(f, _)| f.name == name && f.size == size) else {
        let error = format!("no complete file {name} of {size} bytes here");
        return send_json(&mut writer, &Header { error: Some(error), file: None }).await;
    };
    if let Some((offset, length)) = outside(&ranges, size) {
        let error = format!("bytes {offset}+{length} are outside the file's {size}");
        return send_json(&mut writer, &Header { error: Some(error), file: None }).await;
    }
    let mut source = tokio::fs::File::open(&path).await?;
    let before = version_of(&source).await?;
    send_json(&mut writer, &Header { error: None, file: Some(file) }).await?;
    let ranges = if ranges.is_empty() { vec![(0, size)] } else { ranges };
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; CHUNK];
    for (offset, length) in ranges {
        source.seek(std::io::SeekFrom::Start(offset)).await?;
        let mut left = length;
        while left > 0 {
            let n = (left as usize).min(CHUNK);
            source.read_exact(&mut buffer[..n]).await?;
            hasher.update(&buffer[..n]);
            writer.write_frame(&buffer[..n]).await?;
            left -= n as u64;
        }
    }
    // A file rewritten while it was read gives a blend of two versions that still hashes as sent.
    let error =
        (version_of(&source).await? != before).then(|| format!("{name} changed on the sending node while it was sent"));
    send_json(&mut writer, &Trailer { sha256: hex::encode(hasher.finalize()), error }).await
}

/// What tells one version of an open file from another: its length and when it was last written.
async fn version_of(file: &tokio::fs::File) -> Result<(u64, Option<std::time::SystemTime>), NetError> {
    let meta = file.metadata().await?;
    Ok((meta.len(), meta.modified().ok()))
}

/// The files the node at `addr` offers, and the shards it holds (with `layers`).
pub async fn list(addr: SocketAddr, secret: &Psk) -> Result<Vec<OfferedFile>, CopyError> {
    let (mut reader, mut writer) =
        secure::connect(addr, ConnectionKind::ModelCopy, secret).await.map_err(CopyError::Connect)?;
    send_json(&mut writer, &Request::List).await?;
    recv_json(&mut reader).await
}

/// Copies `file` (whole, or the byte `ranges`) from the node at `addr` into `dest` (a sparse file of
/// the full size for ranges), reporting progress about four times a second.
pub async fn fetch(
    addr: SocketAddr,
    secret: &Psk,
    file: &OfferedFile,
    ranges: &[(u64, u64)],
    dest: &Path,
    mut progress: impl FnMut(&CopyProgress),
) -> Result<CopyReport, CopyError> {
    let (mut reader, offered) = request(addr, secret, file, ranges).await?;
    let part = dest.with_extension("part");
    let write_error = |source| CopyError::Write { path: part.clone(), source };
    if let Some(folder) = part.parent() {
        tokio::fs::create_dir_all(folder).await.map_err(write_error)?;
    }
    let out = std::fs::File::create(&part).map_err(write_error)?;
    out.set_len(offered.size).map_err(write_error)?;
    let write = |offset: u64, bytes: &[u8]| {
        out.write_all_at(bytes, offset).map_err(|e| CopyError::Damaged(format!("cannot write: {e}")))
    };
    let result = receive(&mut reader, &offered, ranges, &mut progress, write).await;
    let result = result.and_then(|report| {
        out.sync_data().map_err(|e| CopyError::Damaged(format!("cannot write: {e}")))?;
        Ok(report)
    });
    drop(out);
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(e);
        }
    };
    tokio::fs::rename(&part, dest).await.map_err(|source| CopyError::Write { path: dest.to_path_buf(), source })?;
    Ok(CopyReport { path: dest.to_path_buf(), ..report })
}

/// Reads `length` bytes of `file` from `offset` on the node at `addr`, checked against the sender's
/// hash before they are returned (a shard fetch writes them only then).
pub async fn read_range(
    addr: SocketAddr,
    secret: &Psk,
    file: &OfferedFile,
    offset: u64,
    length: u64,
) -> Result<Vec<u8>, CopyError> {
    let (mut reader, offered) = request(addr, secret, file, &[(offset, length)]).await?;
    let mut bytes = vec![0u8; length as usize];
    let write = |at: u64, chunk: &[u8]| {
        let start = (at - offset) as usize;
        bytes[start..start + chunk.len()].copy_from_slice(chunk);
        Ok(())
    };
    receive(&mut reader, &offered, &[(offset, length)], &mut |_: &CopyProgress| {}, write).await?;
    Ok(bytes)
}

/// Opens a copy connection and asks for `file` (whole, or `ranges`); returns the reader positioned at
/// the first data frame and the file as the sender describes it.
async fn request(
    addr: SocketAddr,
    secret: &Psk,
    file: &OfferedFile,
    ranges: &[(u64, u64)],
) -> Result<(SecureReader, OfferedFile), CopyError> {
    let (mut reader, mut writer) =
        secure::connect(addr, ConnectionKind::ModelCopy, secret).await.map_err(CopyError::Connect)?;
    let request = Request::Fetch { name: file.name.clone(), size: file.size, ranges: ranges.to_vec() };
    send_json(&mut writer, &request).await?;
    let header: Header = recv_json(&mut reader).await?;
    if let Some(error) = header.error {
        return Err(CopyError::Refused(error));
    }
    let offered = header.file.ok_or_else(|| CopyError::Protocol("a header without its file".into()))?;
    if offered.size != file.size {
        return Err(CopyError::Protocol(format!("asked for {} bytes of file, offered {}", file.size, offered.size)));
    }
    Ok((reader, offered))
}

/// Receives the frames of `ranges` (the whole file when empty), handing them to `write(offset, bytes)`,
/// and checks the trailer's hash (and, for a whole file, the hub's).
async fn receive(
    reader: &mut SecureReader,
    offered: &OfferedFile,
    ranges: &[(u64, u64)],
    progress: &mut impl FnMut(&CopyProgress),
    mut write: impl FnMut(u64, &[u8]) -> Result<(), CopyError>,
) -> Result<CopyReport, CopyError> {
    let ranges = if ranges.is_empty() { vec![(0, offered.size)] } else { ranges.to_vec() };
    let total: u64 = ranges.iter().map(|(_, l)| l).sum();
    let started = Instant::now();
    let mut last_report = started;
    let mut hasher = Sha256::new();
    let mut done = 0u64;
    let mut frame = Vec::new();
    let rate = |done: u64| (done as f64 / started.elapsed().as_secs_f64().max(1e-6)) as u64;
    for (offset, length) in &ranges {
        let mut at = *offset;
        let end = offset + length;
        while at < end {
            reader.read_frame_into(CHUNK, &mut frame).await?;
            let left = end - at;
            if frame.is_empty() || frame.len() as u64 > left {
                return Err(CopyError::Protocol(format!("{} bytes where at most {left} were due", frame.len())));
            }
            hasher.update(&frame);
            write(at, &frame)?;
            at += frame.len() as u64;
            done += frame.len() as u64;
            if last_report.elapsed() >= Duration::from_millis(250) {
                last_report = Instant::now();
                progress(&CopyProgress { bytes_done: done, bytes_total: total, bytes_per_second: rate(done) });
            }
        }
    }
    let trailer: Trailer = recv_json(reader).await?;
    if let Some(error) = trailer.error {
        return Err(CopyError::Damaged(error));
    }
    let sha256 = hex::encode(hasher.finalize());
    if trailer.sha256 != sha256 {
        return Err(CopyError::Damaged(format!(
            "the sender hashed {}, what arrived hashes to {sha256}",
            trailer.sha256
        )));
    }
    let whole = ranges.len() == 1 && ranges[0] == (0, offered.size);
    if let (true, Some(expected)) = (whole, &offered.sha256) {
        if !expected.eq_ignore_ascii_case(&sha256) {
            return Err(CopyError::Damaged(format!("the hub's SHA-256 is {expected}, the file's is {sha256}")));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    progress(&CopyProgress { bytes_done: done, bytes_total: total, bytes_per_second: rate(done) });
    Ok(CopyReport { path: PathBuf::new(), bytes: done, seconds, bytes_per_second: rate(done), sha256 })
}

#[cfg(test)]
mod tests;

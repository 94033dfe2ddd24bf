//! A shard on disk while a fetch writes it: the sparse file of the whole file's length with its record
//! ([`Shard`]), what a fetch finds at its destination ([`Existing`]), and the lock that makes fetches
//! into one folder take turns ([`FolderLock`]).

use super::record::{self, read_record, sidecar, ShardRecord};
use super::{ShardError, ShardSource};
use crate::model::gguf::GgufHeader;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes that came after the header in its last chunk: their offset and contents.
pub(super) type Spare = Option<(u64, Vec<u8>)>;

/// What is at the destination before a fetch.
pub(super) enum Existing {
    Nothing,
    /// The whole file, of this size.
    Whole(u64),
    Shard(Shard),
}

/// An open shard: its sparse file and record.
pub(super) struct Shard {
    path: PathBuf,
    file: File,
    pub record: ShardRecord,
    /// Created by this fetch (and removed again if the model turns out unusable).
    new: bool,
}

impl Shard {
    pub fn open(path: &Path, source: &ShardSource) -> Result<Existing, ShardError> {
        let record = read_record(path)?;
        let length = match std::fs::metadata(path) {
            Ok(meta) => Some(meta.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(ShardError::Io { path: path.into(), source }),
        };
        let mut record = match (record, length) {
            (None, None) => return Ok(Existing::Nothing),
            (Some(_), None) => {
                // A record whose file is gone (deleted, or a fetch stopped before creating it).
                let _ = std::fs::remove_file(sidecar(path));
                return Ok(Existing::Nothing);
            }
            (None, Some(length)) if source.size == Some(length) => return Ok(Existing::Whole(length)),
            (None, Some(_)) => return Err(ShardError::NotAShard { path: path.into() }),
            (Some(record), Some(_)) if record.header_bytes == 0 || !record.covers(&(0..record.header_bytes)) => {
                // A fetch that stopped before its header was on disk left nothing worth keeping.
                let _ = std::fs::remove_file(path);
                let _ = std::fs::remove_file(sidecar(path));
                return Ok(Existing::Nothing);
            }
            (Some(record), Some(length)) => {
                if length != record.size {
                    let reason = format!("the file has {length} bytes, its record says {}", record.size);
                    return Err(ShardError::DifferentFile { path: path.into(), reason });
                }
                record
            }
        };
        if let Some(size) = source.size.filter(|&s| s != record.size) {
            let reason = format!("{} serves {size} bytes, the shard has {}", source.url, record.size);
            return Err(ShardError::DifferentFile { path: path.into(), reason });
        }
        match (&source.sha256, &record.sha256) {
            (Some(new), Some(old)) if new != old => {
                let reason = format!("sha256 {new} at {}, {old} for the shard", source.url);
                return Err(ShardError::DifferentFile { path: path.into(), reason });
            }
            (Some(new), None) => record.sha256 = Some(new.clone()),
            _ => {}
        }
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| ShardError::Io { path: path.into(), source })?;
        Ok(Existing::Shard(Shard { path: path.into(), file, record, new: false }))
    }

    /// Creates the sparse file with its header. Returns the shard and the bytes that came after the
    /// header (their offset and contents).
    pub fn create(path: &Path, source: &ShardSource, size: u64, bytes: Vec<u8>) -> Result<(Shard, Spare), ShardError> {
        let io = |source| ShardError::Io { path: path.into(), source };
        let header = GgufHeader::parse(path, &bytes)?;
        let header_end = header.data_offset as usize;
        if bytes.len() < header_end {
            return Err(ShardError::HeaderTooLarge { url: source.url.clone(), limit: bytes.len() as u64 });
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // The record comes first, claiming nothing: a file never exists without one.
        let mut record = ShardRecord::new(&source.url, size, source.sha256.clone());
        record.header_bytes = header.data_offset;
        record::save_record(path, &mut record).map_err(io)?;
        let file = File::options().read(true).write(true).create_new(true).open(path).map_err(io)?;
        file.set_len(size).map_err(io)?;
        let mut shard = Shard { path: path.into(), file, record, new: true };
        shard.write(0, &bytes[..header_end])?;
        shard.commit(0..header.data_offset)?;
        let spare = (bytes.len() > header_end).then(|| (header.data_offset, bytes[header_end..].to_vec()));
        Ok((shard, spare))
    }

    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), ShardError> {
        self.file.write_all_at(bytes, offset).map_err(|source| ShardError::Io { path: self.path.clone(), source })
    }

    /// Records `range` as present, once its bytes are on disk.
    pub fn commit(&mut self, range: Range<u64>) -> Result<(), ShardError> {
        if range.is_empty() {
            return Ok(());
        }
        self.file.sync_data().map_err(|source| ShardError::Io { path: self.path.clone(), source })?;
        self.record.add_present(range);
        self.save()
    }

    pub fn save(&mut self) -> Result<(), ShardError> {
        record::save_record(&self.path, &mut self.record)
            .map_err(|source| ShardError::Io { path: sidecar(&self.path), source })
    }

    /// Removes a shard this fetch created, when its model turns out to be one shoal cannot run.
    pub fn forget_if_new(&self) {
        if self.new {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(sidecar(&self.path));
        }
    }
}

/// A turn at fetching into a folder: an exclusive lock on the folder itself, held until dropped. It
/// keeps two fetches (two stages of one node, or `shoal pull --layers` beside a running node) from
/// writing the same shard and its record at once. A folder it had to create goes again if the fetch
/// left it empty.
pub(super) struct FolderLock {
    folder: PathBuf,
    created: bool,
    _held: File,
}

impl FolderLock {
    pub fn take(destination: &Path) -> Result<FolderLock, ShardError> {
        let folder = destination.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let io = |source| ShardError::Io { path: folder.into(), source };
        let created = !folder.exists();
        std::fs::create_dir_all(folder).map_err(io)?;
        let handle = File::open(folder).map_err(io)?;
        // flock(2) on Unix: released when the handle closes, also when the process dies.
        handle.lock().map_err(io)?;
        Ok(FolderLock { folder: folder.to_path_buf(), created, _held: handle })
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        if self.created {
            // Fails, as it should, unless the folder is empty.
            let _ = std::fs::remove_dir(&self.folder);
        }
    }
}

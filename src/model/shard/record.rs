//! The record beside a shard, `<file>.shard.json`: where its bytes came from, the whole file's size and
//! sha256, and which byte ranges and layers are present. Also the range-set arithmetic it needs and the
//! check a stage makes before it maps tensors from a shard.

use crate::model::{ModelError, TensorInfo};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What the record's file name adds to the model file's name.
pub const SIDECAR_SUFFIX: &str = ".shard.json";

/// What a shard holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// The URL the bytes were last fetched from.
    pub source: String,
    /// Bytes of the whole file (the sparse file has this length).
    pub size: u64,
    /// The whole file's sha256 as the hub publishes it, when known. A shard cannot be checked against it.
    pub sha256: Option<String>,
    /// Bytes of the GGUF header, metadata and tensor directory (where tensor data begins).
    pub header_bytes: u64,
    /// Layer ranges (end exclusive) whose stage tensors were all fetched, sorted and merged.
    pub layers: Vec<Range<usize>>,
    /// Byte ranges (end exclusive) present in the file, sorted and merged.
    pub present: Vec<Range<u64>>,
    /// Tensor-parallel slices whose bytes were all fetched (`rank 1 of 2`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<String>,
}

impl ShardRecord {
    pub fn new(source: &str, size: u64, sha256: Option<String>) -> ShardRecord {
        ShardRecord {
            source: source.to_string(),
            size,
            sha256,
            header_bytes: 0,
            layers: Vec::new(),
            present: Vec::new(),
            slices: Vec::new(),
        }
    }

    /// Bytes present in the file.
    pub fn present_bytes(&self) -> u64 {
        self.present.iter().map(|r| r.end - r.start).sum()
    }

    /// Whether every byte of `range` is present.
    pub fn covers(&self, range: &Range<u64>) -> bool {
        range.is_empty() || self.present.iter().any(|p| p.start <= range.start && range.end <= p.end)
    }

    /// The parts of `wanted` (sorted, disjoint) that are not present.
    pub fn missing(&self, wanted: &[Range<u64>]) -> Vec<Range<u64>> {
        subtract(wanted, &self.present)
    }

    /// The layers, as `shoal pull --layers` writes them: `10-20` (both included), comma-separated.
    /// A tensor-parallel slice it holds follows, as `0-9, rank 1 of 2`.
    pub fn layers_text(&self) -> String {
        let mut text: Vec<String> = self.layers.iter().map(|r| format!("{}-{}", r.start, r.end - 1)).collect();
        text.extend(self.slices.iter().cloned());
        if text.is_empty() {
            return "none".into();
        }
        text.join(", ")
    }

    /// Adds a tensor-parallel slice whose bytes are all present.
    pub(crate) fn add_slice(&mut self, label: String) {
        if !self.slices.contains(&label) {
            self.slices.push(label);
        }
    }

    pub(super) fn add_present(&mut self, range: Range<u64>) {
        if !range.is_empty() {
            self.present.push(range);
            merge(&mut self.present, 0);
        }
    }

    /// Adds a layer range. Touching ranges merge: the union of [a, b) and [b, c) holds every tensor of
    /// [a, c), since the first stage's embedding and the last stage's head come with the end ranges.
    pub(crate) fn add_layers(&mut self, layers: Range<usize>) {
        self.layers.push(layers);
        self.layers.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<usize>> = Vec::new();
        for r in self.layers.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.layers = merged;
    }

    /// Adds what `other` (the record as another fetch left it on disk) has and this one lacks.
    fn absorb(&mut self, other: &ShardRecord) {
        for r in &other.present {
            self.add_present(r.clone());
        }
        for l in &other.layers {
            self.add_layers(l.clone());
        }
        for label in &other.slices {
            self.add_slice(label.clone());
        }
    }
}

/// `<file>.shard.json`.
pub fn sidecar(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
}

/// Whether `path` is a shard (its record exists).
pub fn is_shard(path: &Path) -> bool {
    sidecar(path).exists()
}

/// The record of the shard at `path`, or None when `path` has none (a whole file).
pub fn read_record(path: &Path) -> Result<Option<ShardRecord>, ModelError> {
    let record_path = sidecar(path);
    let bytes = match std::fs::read(&record_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ModelError::ShardRecord { path: record_path, reason: e.to_string() }),
    };
    parse_record(&bytes).map(Some).map_err(|reason| ModelError::ShardRecord { path: record_path, reason })
}

/// A record from its JSON, checked: byte ranges sorted, disjoint and inside the file; layer ranges sorted,
/// apart and not empty.
pub fn parse_record(bytes: &[u8]) -> Result<ShardRecord, String> {
    let record: ShardRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let sorted = record.present.windows(2).all(|w| w[0].end < w[1].start);
    if !sorted || record.present.iter().any(|r| r.start >= r.end || r.end > record.size) {
        return Err("its byte ranges are out of order or outside the file".to_string());
    }
    // Empty or reversed layer ranges would underflow where the layers are written out.
    let sorted = record.layers.windows(2).all(|w| w[0].end < w[1].start);
    if !sorted || record.layers.iter().any(|r| r.start >= r.end) {
        return Err("its layer ranges are empty, reversed or out of order".to_string());
    }
    Ok(record)
}

/// Writes `record` (merged with what is on disk, in case another fetch added ranges meanwhile) through
/// a temporary file and a rename, so the record on disk is always whole.
pub(super) fn save_record(path: &Path, record: &mut ShardRecord) -> std::io::Result<()> {
    if let Ok(Some(on_disk)) = read_record(path) {
        if on_disk.size == record.size {
            record.absorb(&on_disk);
        }
    }
    let record_path = sidecar(path);
    let mut temporary = record_path.as_os_str().to_owned();
    temporary.push(".tmp");
    let json = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    std::fs::write(&temporary, json)?;
    std::fs::rename(&temporary, &record_path)
}

/// Checks that every tensor in `tensors` is present in the file at `path` (always true for a whole
/// file). A stage calls this before it maps a shard's tensors, so it never computes with holes.
pub fn check_present(path: &Path, tensors: &[&TensorInfo]) -> Result<(), ModelError> {
    check_ranges(path, tensors.iter().map(|t| (t.name.as_str(), t.offset..t.offset + t.bytes)))
}

/// Checks that every byte range of `ranges` (each with the name of what it holds: a tensor, or a
/// slice's piece of one) is present in the file at `path` (always true for a whole file).
pub fn check_ranges<'a>(
    path: &Path,
    ranges: impl IntoIterator<Item = (&'a str, Range<u64>)>,
) -> Result<(), ModelError> {
    let Some(record) = read_record(path)? else { return Ok(()) };
    match ranges.into_iter().find(|(_, range)| !record.covers(range)) {
        None => Ok(()),
        Some((tensor, range)) => Err(ModelError::ShardIncomplete {
            path: path.into(),
            layers: record.layers_text(),
            tensor: tensor.to_string(),
            offset: range.start,
            bytes: range.end - range.start,
        }),
    }
}

/// Sorts `ranges` and merges those less than `gap` bytes apart (0: only overlapping or touching ones).
pub(super) fn merge(ranges: &mut Vec<Range<u64>>, gap: u64) {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match merged.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(gap) => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    *ranges = merged;
}

/// The parts of `wanted` outside `present` (both sorted and disjoint).
pub(super) fn subtract(wanted: &[Range<u64>], present: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for w in wanted {
        let mut at = w.start;
        for p in present.iter().filter(|p| p.end > w.start && p.start < w.end) {
            if p.start > at {
                out.push(at..p.start);
            }
            at = at.max(p.end);
        }
        if at < w.end {
            out.push(at..w.end);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_subtract() {
        let mut r = vec![10..20, 0..5, 20..25, 30..31, 33..40];
        merge(&mut r, 0);
        assert_eq!(r, vec![0..5, 10..25, 30..31, 33..40]);
        merge(&mut r, 3);
        assert_eq!(r, vec![0..5, 10..25, 30..40]);
        assert_eq!(subtract(&[0..100], &[10..20, 50..60]), vec![0..10, 20..50, 60..100]);
        assert_eq!(subtract(&[10..20, 30..40], &[0..15, 35..50]), vec![15..20, 30..35]);
        assert!(subtract(&[10..20], &[0..100]).is_empty());
    }

    #[test]
    fn layers_merge_when_they_touch() {
        let mut record = ShardRecord::new("u", 100, None);
        record.add_layers(10..21);
        record.add_layers(0..11);
        record.add_layers(25..30);
        assert_eq!(record.layers, vec![0..21, 25..30]);
        assert_eq!(record.layers_text(), "0-20, 25-29");
        record.add_present(0..10);
        record.add_present(10..20);
        assert!(record.covers(&(5..20)) && !record.covers(&(5..21)));
    }
}

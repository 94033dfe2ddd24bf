//! The model library: every GGUF file this node has — in shoal's models directory (`<data-dir>/models`),
//! in the Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`), or added by
//! path (`<data-dir>/models.json`) — with what its header says and whether the engine can run it. A file
//! that cannot be read is listed with the reason; listing never fails because of one bad file.

use super::gguf::{GgufFile, Value};
use super::Model;
use crate::node::DataDir;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The file in the data directory that records models added by path.
pub const ADDED_MODELS_FILE: &str = "models.json";

/// Where a model file was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// shoal's own models directory (where `shoal pull` downloads to).
    Shoal,
    /// The Hugging Face cache, as `huggingface-cli download` leaves it.
    HuggingFace { repo: String, revision: String },
    /// A file added with `shoal models add PATH`.
    Added,
}

/// One model: a GGUF file, or all parts of a split GGUF set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct LibraryModel {
    /// The model's name: its file name without `.gguf` (of a split set, without the part number) — the
    /// name a launch gives its instance by default, and so the one the APIs serve it by.
    pub name: String,
    /// The name the file gives itself (`general.name`), when it has one: a title to show beside `name`.
    #[serde(default)]
    pub title: Option<String>,
    /// The file to open: the only file, or the first part of a split set.
    pub path: PathBuf,
    /// Every file of the model, in order (one unless split).
    pub parts: Vec<PathBuf>,
    pub source: ModelSource,
    /// Bytes of all parts together; for a shard, only the bytes present.
    pub size_bytes: u64,
    pub architecture: Option<String>,
    /// Number of weights (elements of every tensor of every part).
    pub parameters: Option<u64>,
    /// The file type (`general.file_type`), such as Q4_K_M.
    pub quantization: Option<String>,
    pub layers: Option<u64>,
    pub context_length: Option<u64>,
    /// Whether shoal's engine can run this model as it is.
    pub runnable: bool,
    /// Why it cannot be run or read, when it cannot.
    pub problem: Option<String>,
    /// What shoal leaves out of a model it runs (its next-token-prediction layers), when anything.
    #[serde(default)]
    pub note: Option<String>,
    /// Set when the file is a shard (fetched with `shoal pull --layers`): only some layers are present.
    #[serde(default)]
    pub shard: Option<ShardSummary>,
}

/// What a shard holds (see [`super::shard`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ShardSummary {
    /// The layers present, as `shoal pull --layers` writes them: `10-20` (both included), comma-separated.
    pub layers: String,
    /// The same layer ranges, end exclusive.
    pub ranges: Vec<std::ops::Range<usize>>,
    /// Bytes present (header and fetched tensors).
    pub present_bytes: u64,
    /// Bytes of the whole file.
    pub file_bytes: u64,
}

/// The models of one node.
pub struct Library {
    data_dir: PathBuf,
    hf_hub: Option<PathBuf>,
}

#[derive(Default, Serialize, Deserialize)]
struct AddedModels {
    paths: Vec<PathBuf>,
}

impl Library {
    /// The library of the node whose data directory is `data_dir`, with the Hugging Face cache the
    /// environment names.
    pub fn new(data_dir: &DataDir) -> Library {
        Library { data_dir: data_dir.root().to_path_buf(), hf_hub: hugging_face_hub_dir() }
    }

    /// shoal's models directory, where downloads go.
    pub fn models_dir(&self) -> PathBuf {
        self.data_dir.join("models")
    }

    /// Every model this node has, in a stable order (shoal's, the Hugging Face cache, then added ones).
    pub fn list(&self) -> Vec<LibraryModel> {
        let mut found: Vec<(PathBuf, ModelSource)> = Vec::new();
        for file in gguf_files_under(&self.models_dir(), 4) {
            found.push((file, ModelSource::Shoal));
        }
        if let Some(hub) = &self.hf_hub {
            found.extend(hugging_face_files(hub));
        }
        for path in self.added().paths {
            found.push((path, ModelSource::Added));
        }
        let mut seen = HashSet::new();
        found.retain(|(path, _)| seen.insert(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone())));
        group_split_sets(found).into_iter().map(|(parts, source)| describe(parts, source)).collect()
    }

    /// Records `path` as a model of this node and describes it. The file must exist; a file that is not
    /// a model is refused.
    pub fn add(&self, path: &Path) -> anyhow::Result<LibraryModel> {
        let path = std::fs::canonicalize(path).map_err(|e| anyhow::anyhow!("cannot add {}: {e}", path.display()))?;
        let model = describe(vec![path.clone()], ModelSource::Added);
        if model.architecture.is_none() {
            anyhow::bail!(
                "{} is not a model shoal can read: {}",
                path.display(),
                model.problem.as_deref().unwrap_or("unknown reason")
            );
        }
        let mut added = self.added();
        if !added.paths.contains(&path) {
            added.paths.push(path);
            let json = serde_json::to_vec_pretty(&added)?;
            let dir = DataDir::new(Some(&self.data_dir))?;
            dir.write(ADDED_MODELS_FILE, &json, false).map_err(|e| {
                anyhow::anyhow!("cannot write {}: {e}", self.data_dir.join(ADDED_MODELS_FILE).display())
            })?;
        }
        Ok(model)
    }

    fn added(&self) -> AddedModels {
        let path = self.data_dir.join(ADDED_MODELS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!("ignoring {}: {e}", path.display());
                AddedModels::default()
            }),
            Err(_) => AddedModels::default(),
        }
    }
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
pub fn hugging_face_hub_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    directories::BaseDirs::new().map(|b| b.home_dir().join(".cache").join("huggingface").join("hub"))
}

/// `*.gguf` files under `dir` (not following deeper than `depth` levels), sorted.
fn gguf_files_under(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return files };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if depth > 0 {
                files.extend(gguf_files_under(&path, depth - 1));
            }
        } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// GGUF files of the hub cache: `models--ORG--NAME/snapshots/REVISION/FILE` (symlinks into `blobs/`).
fn hugging_face_files(hub: &Path) -> Vec<(PathBuf, ModelSource)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(hub) else { return found };
    let mut repos: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    repos.sort();
    for repo_dir in repos {
        let Some(dir_name) = repo_dir.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(repo) = dir_name.strip_prefix("models--") else { continue };
        let repo = repo.replacen("--", "/", 1);
        let Ok(snapshots) = std::fs::read_dir(repo_dir.join("snapshots")) else { continue };
        let mut revisions: Vec<_> = snapshots.flatten().map(|e| e.path()).collect();
        revisions.sort();
        for revision_dir in revisions {
            let revision = revision_dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
            for file in gguf_files_under(&revision_dir, 3) {
                found.push((file, ModelSource::HuggingFace { repo: repo.clone(), revision: revision.clone() }));
            }
        }
    }
    found
}

/// `name-00002-of-00005.gguf` → (`name`, 2, 5).
/// The name shoal knows the model at `path` by, everywhere (library, instances, APIs): the file name
/// without `.gguf`, and of a split set without the part number (`NAME-00001-of-00003.gguf` is `NAME`).
pub fn model_name(path: &Path) -> Option<String> {
    match split_part(path) {
        Some((base, _, _)) => Some(base),
        None => {
            let file_name = path.file_name()?.to_string_lossy().into_owned();
            Some(file_name.strip_suffix(".gguf").map(str::to_string).unwrap_or(file_name))
        }
    }
}

pub fn split_part(path: &Path) -> Option<(String, u32, u32)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (base, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(total) {
        return None;
    }
    Some((base.to_string(), index.parse().ok()?, total.parse().ok()?))
}

/// Gathers the parts of each split set into one entry (in part order), keeping the order of first
/// appearance.
fn group_split_sets(files: Vec<(PathBuf, ModelSource)>) -> Vec<(Vec<PathBuf>, ModelSource)> {
    let mut groups: Vec<(Vec<PathBuf>, ModelSource)> = Vec::new();
    let mut split_index: BTreeMap<(PathBuf, String, u32), usize> = BTreeMap::new();
    for (path, source) in files {
        match split_part(&path) {
            Some((base, _, total)) => {
                let key = (path.parent().map(Path::to_path_buf).unwrap_or_default(), base, total);
                match split_index.get(&key) {
                    Some(&i) => groups[i].0.push(path),
                    None => {
                        split_index.insert(key, groups.len());
                        groups.push((vec![path], source));
                    }
                }
            }
            None => groups.push((vec![path], source)),
        }
    }
    for (parts, _) in &mut groups {
        parts.sort_by_key(|p| split_part(p).map(|(_, index, _)| index));
    }
    groups
}

/// Reads the header of each part and describes the model; problems end up in `problem`.
pub fn describe(parts: Vec<PathBuf>, source: ModelSource) -> LibraryModel {
    let path = parts[0].clone();
    let file_name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let size_bytes = parts.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let mut model = LibraryModel {
        name: model_name(&path).unwrap_or_else(|| file_name.clone()),
        title: None,
        path: path.clone(),
        parts: parts.clone(),
        source,
        size_bytes,
        architecture: None,
        parameters: None,
        quantization: None,
        layers: None,
        context_length: None,
        runnable: false,
        problem: None,
        note: None,
        shard: None,
    };
    if !path.exists() {
        model.problem = Some(format!("{} no longer exists", path.display()));
        return model;
    }
    if let Some((_, _, total)) = split_part(&path) {
        let present: Vec<u32> = parts.iter().filter_map(|p| split_part(p)).map(|(_, i, _)| i).collect();
        let missing: Vec<String> = (1..=total).filter(|i| !present.contains(i)).map(|i| i.to_string()).collect();
        if !missing.is_empty() {
            model.problem = Some(format!("part(s) {} of {total} are missing", missing.join(", ")));
        }
    }
    let first = match GgufFile::open(&path) {
        Ok(file) => file,
        Err(e) => {
            model.problem = Some(e.to_string());
            return model;
        }
    };
    let architecture = first.get("general.architecture").and_then(Value::as_str).map(str::to_string);
    let key =
        |name: &str| architecture.as_ref().and_then(|a| first.get(&format!("{a}.{name}"))).and_then(Value::as_u64);
    model.layers = key("block_count");
    model.context_length = key("context_length");
    model.quantization = first.get("general.file_type").and_then(Value::as_u64).map(file_type_name);
    model.title = first.get("general.name").and_then(Value::as_str).map(str::to_string).filter(|t| *t != model.name);
    let mut parameters = weights(&first);
    for part in &parts[1..] {
        match GgufFile::open(part) {
            Ok(file) => parameters += weights(&file),
            Err(e) => {
                model.problem.get_or_insert(e.to_string());
            }
        }
    }
    model.parameters = Some(parameters);
    model.architecture = architecture;
    drop(first);
    match shard_summary(&parts) {
        Ok(None) => {}
        Ok(Some(shard)) => {
            model.size_bytes = shard.present_bytes;
            model.problem = Some(format!(
                "a shard: only layers {} of {} are here, so it runs those stages, not the whole model; `shoal pull` without --layers fetches the rest",
                shard.layers,
                model.layers.map_or("?".into(), |n| format!("0-{}", n.saturating_sub(1)))
            ));
            model.shard = Some(shard);
            return model;
        }
        Err(e) => {
            model.problem.get_or_insert(e.to_string());
        }
    }
    if model.problem.is_some() {
        return model;
    }
    match Model::open(&path) {
        Ok(opened) => {
            model.runnable = true;
            // The model's own layers (GLM files also count their next-token-prediction layers).
            model.layers = Some(opened.config().layers as u64);
            model.note = match opened.config().skipped_layers {
                0 => None,
                n => Some(format!(
                    "its {n} next-token-prediction layer{} after layer {} {} skipped: not loaded, not counted",
                    if n == 1 { "" } else { "s" },
                    opened.config().layers - 1,
                    if n == 1 { "is" } else { "are" }
                )),
            };
        }
        Err(e) => model.problem = Some(e.to_string()),
    }
    model
}

/// What the files of a model hold when any of them is a shard (each part of a split set has its own
/// record): the layers every part holds, and the bytes present. None when every file is whole.
fn shard_summary(parts: &[PathBuf]) -> Result<Option<ShardSummary>, super::ModelError> {
    let mut records = Vec::new();
    let (mut present_bytes, mut file_bytes) = (0, 0);
    for part in parts {
        match super::shard::read_record(part)? {
            Some(record) => {
                present_bytes += record.present_bytes();
                file_bytes += record.size;
                records.push(record);
            }
            None => {
                let size = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
                present_bytes += size;
                file_bytes += size;
            }
        }
    }
    let Some(first) = records.first() else { return Ok(None) };
    // A layer counts as present only where every shard part holds it (a whole part holds them all).
    let mut ranges = first.layers.clone();
    for record in &records[1..] {
        ranges = ranges
            .iter()
            .flat_map(|a| record.layers.iter().map(move |b| a.start.max(b.start)..a.end.min(b.end)))
            .filter(|r| !r.is_empty())
            .collect();
    }
    let mut summary = super::shard::ShardRecord::new("", file_bytes, None);
    for r in &ranges {
        summary.add_layers(r.clone());
    }
    // So does a tensor-parallel rank's slice.
    for slice in first.slices.iter().filter(|s| records[1..].iter().all(|r| r.slices.contains(s))) {
        summary.add_slice(slice.clone());
    }
    Ok(Some(ShardSummary { layers: summary.layers_text(), ranges: summary.layers, present_bytes, file_bytes }))
}

fn weights(file: &GgufFile) -> u64 {
    file.tensors().iter().map(|t| t.shape.iter().product::<u64>()).sum()
}

/// llama.cpp's names of `general.file_type` values.
pub fn file_type_name(file_type: u64) -> String {
    let name = match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        other => return format!("file type {other}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_part_names() {
        assert_eq!(split_part(Path::new("a/Big-Q4_K_M-00002-of-00005.gguf")), Some(("Big-Q4_K_M".into(), 2, 5)));
        assert_eq!(split_part(Path::new("model-Q4_K_M.gguf")), None);
        assert_eq!(split_part(Path::new("x-2-of-5.gguf")), None);
    }
}

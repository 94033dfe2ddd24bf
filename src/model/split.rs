//! Split GGUF sets (`NAME-00001-of-00005.gguf` …): the hub caps a file at 50 GB, so every model people
//! pool memory for comes in parts. The first part holds the metadata; every part holds `split.no`,
//! `split.count` and `split.tensors.count` and some of the tensors. Opening the first part finds the
//! others beside it and checks them as llama.cpp does: each part present and numbered as named, no tensor
//! twice, and as many tensors as the first part announces.

use super::gguf::{GgufFile, TensorInfo, Value};
use super::ModelError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The file name of part `index` (1-based) of `count` with the set's common prefix, as llama.cpp names
/// them (`llama_split_path`).
pub fn part_path(prefix: &Path, index: u64, count: u64) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{index:05}-of-{count:05}.gguf"));
    PathBuf::from(name)
}

/// `path` without its `-0000N-of-0000M.gguf` ending, when it has the one `index`/`count` give it.
fn prefix_of(path: &Path, index: u64, count: u64) -> Option<PathBuf> {
    let (base, named_index, named_count) = super::library::split_part(path)?;
    (u64::from(named_index) == index && u64::from(named_count) == count).then(|| path.with_file_name(base))
}

fn split_key(file: &GgufFile, key: &str) -> Option<u64> {
    file.get(key).and_then(Value::as_u64)
}

/// The parts of the model whose first file is `first`: just `first` for a single file, else every part
/// in order, checked.
pub fn open_parts(first: GgufFile) -> Result<Vec<GgufFile>, ModelError> {
    let count = split_key(&first, "split.count").unwrap_or(1);
    if count <= 1 {
        return Ok(vec![first]);
    }
    let path = first.path().to_path_buf();
    let index = split_key(&first, "split.no").unwrap_or(0);
    if index != 0 {
        let first_part = prefix_of(&path, index + 1, count).map(|p| part_path(&p, 1, count));
        return Err(ModelError::SplitPart { path, part: index + 1, parts: count, first: first_part });
    }
    let prefix = prefix_of(&path, 1, count).ok_or_else(|| ModelError::SplitSet {
        path: path.clone(),
        problem: format!(
            "it is part 1 of {count}, but its name does not end in -00001-of-{count:05}.gguf, so its other parts \
             cannot be found; rename the parts as llama.cpp's llama-gguf-split names them"
        ),
    })?;
    let mut parts = vec![first];
    for index in 2..=count {
        let part = part_path(&prefix, index, count);
        let file = GgufFile::open(&part).map_err(|e| match e {
            ModelError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => ModelError::SplitSet {
                path: path.clone(),
                problem: format!(
                    "part {index} of {count} is missing: {} does not exist. Download every part of the set into one folder",
                    part.display()
                ),
            },
            other => other,
        })?;
        if split_key(&file, "split.no") != Some(index - 1) || split_key(&file, "split.count") != Some(count) {
            return Err(ModelError::SplitSet {
                path: path.clone(),
                problem: format!(
                    "{} does not say it is part {index} of {count} (split.no {:?}, split.count {:?}); the parts come from different sets",
                    part.display(),
                    split_key(&file, "split.no").map(|n| n + 1),
                    split_key(&file, "split.count")
                ),
            });
        }
        parts.push(file);
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, part) in parts.iter().enumerate() {
        for t in part.tensors() {
            if let Some(other) = seen.insert(&t.name, i) {
                return Err(ModelError::SplitSet {
                    path: path.clone(),
                    problem: format!("tensor {} is in part {} and again in part {}", t.name, other + 1, i + 1),
                });
            }
        }
    }
    if let Some(expected) = split_key(&parts[0], "split.tensors.count") {
        if expected != seen.len() as u64 {
            return Err(ModelError::SplitSet {
                path,
                problem: format!("the first part announces {expected} tensors, the parts hold {}", seen.len()),
            });
        }
    }
    Ok(parts)
}

/// Where each tensor of a model is: which part, and its entry there.
pub struct TensorIndex {
    by_name: HashMap<String, (usize, usize)>,
}

impl TensorIndex {
    pub fn new(parts: &[GgufFile]) -> TensorIndex {
        let by_name = parts
            .iter()
            .enumerate()
            .flat_map(|(p, file)| file.tensors().iter().enumerate().map(move |(i, t)| (t.name.clone(), (p, i))))
            .collect();
        TensorIndex { by_name }
    }

    /// The part holding tensor `name`, and its entry.
    pub fn find<'a>(&self, parts: &'a [GgufFile], name: &str) -> Option<(usize, &'a TensorInfo)> {
        self.by_name.get(name).map(|&(p, i)| (p, &parts[p].tensors()[i]))
    }
}

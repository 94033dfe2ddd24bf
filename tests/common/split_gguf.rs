//! Splits a GGUF file into a split set as llama.cpp's `llama-gguf-split --split` writes one: the tensors
//! in file order over `parts` files named `PREFIX-0000N-of-0000M.gguf`, all metadata in the first part,
//! and `split.no`, `split.count` and `split.tensors.count` in every part.

use super::gguf_writer::{GgufWriter, Meta, Tensor};
use shoal::model::{GgufFile, Value};
use std::path::{Path, PathBuf};

/// The tensors of `file` (whose bytes are `bytes`) as the writer takes them.
pub fn tensors_of(file: &GgufFile, bytes: &[u8]) -> Vec<Tensor> {
    file.tensors()
        .iter()
        .map(|t| Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            type_id: t.dtype.id(),
            data: bytes[t.offset as usize..(t.offset + t.bytes) as usize].to_vec(),
        })
        .collect()
}

/// Writes the parts of `source` into `dir` with the name prefix `prefix`; returns every part's path.
pub fn split(source: &Path, dir: &Path, prefix: &str, parts: usize) -> Vec<PathBuf> {
    let file = GgufFile::open(source).unwrap();
    let tensors = tensors_of(&file, &std::fs::read(source).unwrap());
    let per_part = tensors.len().div_ceil(parts);
    let mut paths = Vec::new();
    for (i, chunk) in tensors.chunks(per_part).enumerate() {
        let mut writer = GgufWriter::default()
            .meta("split.no", Meta::Value(Value::U16(i as u16)))
            .meta("split.count", Meta::Value(Value::U16(parts as u16)))
            .meta("split.tensors.count", Meta::Value(Value::I32(tensors.len() as i32)));
        if i == 0 {
            for (key, value) in file.metadata() {
                writer = writer.meta(key, Meta::Value(value.clone()));
            }
        }
        writer.tensors.extend(chunk.iter().cloned());
        let path = dir.join(format!("{prefix}-{:05}-of-{parts:05}.gguf", i + 1));
        std::fs::write(&path, writer.bytes()).unwrap();
        paths.push(path);
    }
    assert_eq!(paths.len(), parts, "{} tensors do not fill {parts} parts", tensors.len());
    paths
}

//! Split GGUF sets (`NAME-0000N-of-0000M.gguf`, as llama.cpp's llama-gguf-split writes them, here by
//! tests/common/split_gguf.rs): opened from the first part, they generate exactly what the single file
//! does, whole or as stages; each stage maps its tensors from whichever parts hold them; a missing,
//! foreign or duplicated part, or a wrong tensor count, is refused with a message that says which.

mod common;

use common::gguf_writer::{GgufWriter, Meta, Tensor};
use common::{oracle, random_model, split_gguf};
use shoal::engine::Stage;
use shoal::model::{GgufFile, Model, Value};
use std::path::{Path, PathBuf};

fn tokens_of(model: &Model, splits: &[usize]) -> Vec<u32> {
    let tokenizer = model.tokenizer().unwrap();
    let prompt = tokenizer.encode("The capital of France is").unwrap();
    oracle::greedy(model, splits, &prompt, 16)
}

/// A set of `parts` made from `source` in a fresh folder.
fn set_of(source: &Path, parts: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let paths = split_gguf::split(source, dir.path(), "model", parts);
    (dir, paths)
}

fn check_set_equals_single_file(source: &Path, parts: usize, stage_splits: &[&[usize]]) {
    let single = Model::open(source).unwrap();
    let (_dir, paths) = set_of(source, parts);
    let set = Model::open(&paths[0]).unwrap();
    assert!(set.is_split() && set.parts().len() == parts);
    assert_eq!(set.layout(), single.layout(), "the same tensor bytes, counted across parts");
    let whole = tokens_of(&single, &[]);
    assert_eq!(tokens_of(&set, &[]), whole, "{parts}-part set, one stage");
    for splits in stage_splits {
        assert_eq!(tokens_of(&set, splits), whole, "{parts}-part set, stages split at {splits:?}");
    }
    // Every stage maps exactly the bytes it maps from the single file, whichever parts hold them.
    let layers = single.config().layers;
    for range in [0..1, 1..layers - 1, layers - 1..layers] {
        let from_set = Stage::load(&set, range.clone(), oracle::options()).unwrap();
        let from_file = Stage::load(&single, range.clone(), oracle::options()).unwrap();
        assert_eq!(from_set.weights().mapped_bytes(), from_file.weights().mapped_bytes(), "layers {range:?}");
        assert_eq!(from_set.weights().tensor_names().len(), from_file.weights().tensor_names().len());
    }
}

#[test]
fn a_smollm2_set_generates_what_the_single_file_does() {
    check_set_equals_single_file(&common::model_path(), 3, &[&[10, 20], &[29]]);
}

#[test]
fn a_moe_set_generates_what_the_single_file_does() {
    let model = random_model::qwen3moe();
    check_set_equals_single_file(&model.write(), 4, &[&[2], &[1, 3]]);
}

fn open_error(path: &Path) -> String {
    match Model::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites part `path` with its tensors plus `extra`, and `split.tensors.count` set to `count`.
fn rewrite_part(path: &Path, extra: Option<Tensor>, count: Option<i32>) {
    let file = GgufFile::open(path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let mut writer = GgufWriter::default();
    for (key, value) in file.metadata() {
        let value = match (key.as_str(), count) {
            ("split.tensors.count", Some(n)) => Value::I32(n),
            _ => value.clone(),
        };
        writer = writer.meta(key, Meta::Value(value));
    }
    writer.tensors = split_gguf::tensors_of(&file, &bytes);
    writer.tensors.extend(extra);
    drop(file);
    std::fs::write(path, writer.bytes()).unwrap();
}

#[test]
fn broken_sets_are_refused_saying_what_is_wrong() {
    let source = common::model_path();

    let (_dir, paths) = set_of(&source, 3);
    let error = open_error(&paths[1]);
    assert!(error.contains("part 2 of a split GGUF set of 3 files; open its first part"), "{error}");
    assert!(error.contains("model-00001-of-00003.gguf"), "{error}");
    std::fs::remove_file(&paths[2]).unwrap();
    let error = open_error(&paths[0]);
    assert!(error.contains("part 3 of 3 is missing") && error.contains("model-00003-of-00003.gguf"), "{error}");

    let (_dir, paths) = set_of(&source, 3);
    let second = GgufFile::open(&paths[1]).unwrap();
    let duplicate = split_gguf::tensors_of(&second, &std::fs::read(&paths[1]).unwrap()).remove(0);
    drop(second);
    let name = duplicate.name.clone();
    rewrite_part(&paths[2], Some(duplicate), None);
    let error = open_error(&paths[0]);
    assert!(error.contains(&format!("tensor {name} is in part 2 and again in part 3")), "{error}");

    let (_dir, paths) = set_of(&source, 3);
    rewrite_part(&paths[0], None, Some(7));
    let error = open_error(&paths[0]);
    assert!(error.contains("announces 7 tensors"), "{error}");

    // A part of another set with the same name.
    let (_dir, paths) = set_of(&source, 3);
    let (_other_dir, other) = set_of(&source, 2);
    std::fs::copy(&other[1], &paths[1]).unwrap();
    let error = open_error(&paths[0]);
    assert!(error.contains("does not say it is part 2 of 3"), "{error}");
}

#[test]
fn the_library_lists_a_set_as_one_runnable_model() {
    let data = tempfile::tempdir().unwrap();
    let models = data.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    split_gguf::split(&common::model_path(), &models, "SmolLM2-135M-Q4_1", 3);
    let out = common::shoal()
        .args(["models", "--json", "--data-dir"])
        .arg(data.path())
        .env("HF_HOME", data.path().join("no-hf"))
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["parts"].as_array().unwrap().len(), 3);
    assert_eq!(listed[0]["runnable"], true, "{}", listed[0]);
    assert_eq!(listed[0]["layers"], 30);
}

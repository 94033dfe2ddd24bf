//! The model library through `shoal models`: a file in shoal's models directory, one in a Hugging Face
//! cache (snapshots symlinked into blobs, as the real cache is), a damaged file listed with its reason,
//! a split set listed as one model, and a file added by path.

mod common;

use common::gguf_writer::{GgufWriter, Meta};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

fn models(data_dir: &Path, hf_home: &Path, args: &[&str]) -> Output {
    common::shoal()
        .arg("models")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HF_HOME", hf_home)
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap()
}

fn listing(data_dir: &Path, hf_home: &Path) -> Vec<Value> {
    let out = models(data_dir, hf_home, &["--json"]);
    assert!(out.status.success(), "shoal models --json failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

fn find<'a>(models: &'a [Value], file_name: &str) -> &'a Value {
    models
        .iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with(file_name)))
        .unwrap_or_else(|| panic!("{file_name} is not listed: {models:?}"))
}

fn split_part(tensor: &str, shape: &[u64], with_metadata: bool) -> Vec<u8> {
    let mut writer = GgufWriter::default();
    if with_metadata {
        writer = writer
            .meta("general.architecture", Meta::Str("llama".into()))
            .meta("general.name", Meta::Str("Tiny Split".into()))
            .meta("general.file_type", Meta::U32(15))
            .meta("llama.block_count", Meta::U32(2))
            .meta("llama.context_length", Meta::U32(4096));
    }
    writer.f32_tensor(tensor, shape).bytes()
}

#[test]
fn lists_shoal_hugging_face_damaged_split_and_added_models() {
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, hf_home) = (dir.path().join("data"), dir.path().join("hf"));
    let source = common::model_path();
    let models_dir = data_dir.join("models/HuggingFaceTB--SmolLM2");
    std::fs::create_dir_all(&models_dir).unwrap();
    std::fs::copy(&source, models_dir.join("smol.gguf")).unwrap();
    std::fs::write(models_dir.join("broken.gguf"), b"GGUF\x03\x00\x00\x00 this is not a model").unwrap();
    std::fs::write(models_dir.join("tiny-00001-of-00002.gguf"), split_part("a", &[4, 4], true)).unwrap();
    std::fs::write(models_dir.join("tiny-00002-of-00002.gguf"), split_part("b", &[4, 2], false)).unwrap();
    std::fs::write(models_dir.join("smol.gguf.part"), b"half a download").unwrap();

    let repo = hf_home.join("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::copy(&source, repo.join("blobs/9f1e7c")).unwrap();
    std::os::unix::fs::symlink("../../blobs/9f1e7c", snapshot.join("hf-smol.Q4_1.gguf")).unwrap();

    let elsewhere = dir.path().join("elsewhere.gguf");
    std::fs::copy(&source, &elsewhere).unwrap();
    let added = models(&data_dir, &hf_home, &["add", elsewhere.to_str().unwrap()]);
    assert!(added.status.success(), "shoal models add failed: {}", String::from_utf8_lossy(&added.stderr));
    let refused = models(&data_dir, &hf_home, &["add", models_dir.join("broken.gguf").to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1), "a damaged file was added");

    let listed = listing(&data_dir, &hf_home);
    assert_eq!(listed.len(), 5, "{listed:#?}");
    let size = std::fs::metadata(&source).unwrap().len();
    for (file, kind) in [("smol.gguf", "shoal"), ("hf-smol.Q4_1.gguf", "hugging_face"), ("elsewhere.gguf", "added")] {
        let m = find(&listed, file);
        assert_eq!(m["source"]["kind"], kind, "{m}");
        assert_eq!(m["name"], file.trim_end_matches(".gguf"), "named as the APIs will serve it: {m}");
        assert_eq!(m["runnable"], true, "{m}");
        assert_eq!(m["architecture"], "llama", "{m}");
        assert_eq!(m["quantization"], "Q4_1", "{m}");
        assert_eq!(m["layers"], 30, "{m}");
        assert_eq!(m["context_length"], 8192, "{m}");
        assert_eq!(m["size_bytes"], size, "{m}");
        let parameters = m["parameters"].as_u64().unwrap();
        assert!((130_000_000..140_000_000).contains(&parameters), "SmolLM2-135M has {parameters} parameters?");
    }
    let hf = find(&listed, "hf-smol.Q4_1.gguf");
    assert_eq!(hf["source"]["repo"], "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF");
    assert_eq!(hf["source"]["revision"], "0123abcd");

    let broken = find(&listed, "broken.gguf");
    assert_eq!(broken["runnable"], false);
    assert!(broken["problem"].as_str().unwrap().contains("broken.gguf"), "{broken}");

    let split = find(&listed, "tiny-00001-of-00002.gguf");
    assert_eq!(split["parts"].as_array().unwrap().len(), 2, "{split}");
    assert_eq!(split["name"], "tiny", "a set is named by its file name, without the part number");
    assert_eq!(split["title"], "Tiny Split", "the name the file gives itself is its title");
    assert_eq!(split["parameters"], 24, "the weights of both parts");
    assert_eq!(split["quantization"], "Q4_K_M");
    assert_eq!((split["layers"].as_u64(), split["context_length"].as_u64()), (Some(2), Some(4096)));
    // A set is one model; these crafted parts lack the hyper-parameters of one.
    assert_eq!(split["runnable"], false);
    assert!(split["problem"].as_str().unwrap().contains("lacks the metadata key llama.embedding_length"), "{split}");

    let table = models(&data_dir, &hf_home, &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success());
    assert!(
        text.contains("MODEL")
            && text.contains("tiny (2 parts)")
            && text.contains("Tiny Split · ")
            && text.contains("hf:HuggingFaceTB"),
        "{text}"
    );
}

#[test]
fn a_split_set_with_a_missing_part_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let models_dir = dir.path().join("data/models");
    std::fs::create_dir_all(&models_dir).unwrap();
    std::fs::write(models_dir.join("big-00001-of-00003.gguf"), split_part("a", &[4, 4], true)).unwrap();
    std::fs::write(models_dir.join("big-00003-of-00003.gguf"), split_part("c", &[4, 4], false)).unwrap();
    let listed = listing(&dir.path().join("data"), &dir.path().join("hf"));
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["problem"], "part(s) 2 of 3 are missing");
}

#[test]
fn an_empty_library_tells_how_to_get_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = models(&dir.path().join("data"), &dir.path().join("hf"), &[]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("shoal pull"));
}

//! Bad input never crashes shoal: truncated, bit-flipped and foreign files, crafted GGUFs of models shoal
//! cannot run, and prompts longer than the context each end with exit code 1 and a message that names the
//! file and the problem.

mod common;

use common::gguf_writer::{GgufWriter, Meta};
use std::path::Path;
use std::process::Output;

fn generate(model: &Path, extra: &[&str]) -> Output {
    generate_prompt(model, "The capital of France is", extra)
}

fn generate_prompt(model: &Path, prompt: &str, extra: &[&str]) -> Output {
    common::shoal()
        .args(["generate", "--model"])
        .arg(model)
        .args(["--prompt", prompt, "--max-tokens", "2", "--threads", "1"])
        .args(extra)
        .output()
        .unwrap()
}

/// Exit code 1 with an `error:` line containing `needle`.
#[track_caller]
fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected a clean failure, got {:?}: {stderr}", out.status);
    assert!(stderr.contains("error:") && stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn missing_directory_and_foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert_clean_error(&generate(&dir.path().join("nope.gguf"), &[]), "cannot open the model file");
    assert_clean_error(&generate(dir.path(), &[]), "is not a GGUF model file");
    let text = dir.path().join("notes.gguf");
    std::fs::write(&text, "these are not the weights you are looking for\n").unwrap();
    assert_clean_error(&generate(&text, &[]), "is not a GGUF model file");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_clean_error(&generate(&empty, &[]), "is not a GGUF model file");
}

#[test]
fn truncated_copies_name_the_file_and_say_truncated() {
    let bytes = std::fs::read(common::model_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data_start = 1_600_000; // inside the tensor data of this model (its header is ~1.3 MB)
    for len in [6, 24, 1_000, 300_000, data_start, bytes.len() / 2, bytes.len() - 1] {
        let path = dir.path().join(format!("cut-{len}.gguf"));
        std::fs::write(&path, &bytes[..len]).unwrap();
        let out = generate(&path, &[]);
        assert_clean_error(&out, "truncated");
        assert!(String::from_utf8_lossy(&out.stderr).contains(&path.display().to_string()));
    }
}

#[test]
fn bit_flipped_copies_fail_cleanly_or_run() {
    let original = std::fs::read(common::model_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.gguf");
    // Offsets spread over the header (counts, keys, types, lengths, the vocabulary, the tensor directory)
    // and a few in the tensor data.
    let header = 1_300_000;
    let mut offsets: Vec<usize> = (4..40).step_by(3).collect();
    offsets.extend((0..40).map(|i| 40 + i * (header / 40) + i % 7));
    offsets.extend([1_400_000, 20_000_000, 60_000_000, original.len() - 10]);
    let (mut failed, mut ran) = (0, 0);
    for (i, &offset) in offsets.iter().enumerate() {
        let mut bytes = original.clone();
        bytes[offset] ^= 1 << (i % 8);
        std::fs::write(&path, &bytes).unwrap();
        let out = generate(&path, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => ran += 1,
            Some(1) => {
                assert!(stderr.contains("error:"), "flip at {offset}: {stderr}");
                failed += 1;
            }
            _ => panic!("flipping bit {} of byte {offset} crashed shoal: {:?}\n{stderr}", i % 8, out.status),
        }
        assert!(!stderr.contains("panicked"), "flip at {offset}: {stderr}");
    }
    eprintln!("{failed} flips refused with an error, {ran} ran (flips in token text or weights)");
    assert!(failed > 0);
}

fn tiny_llama(arch: &str) -> GgufWriter {
    GgufWriter::default()
        .meta("general.architecture", Meta::Str(arch.into()))
        .meta(&format!("{arch}.block_count"), Meta::U32(1))
        .meta(&format!("{arch}.embedding_length"), Meta::U32(64))
        .meta(&format!("{arch}.feed_forward_length"), Meta::U32(128))
        .meta(&format!("{arch}.attention.head_count"), Meta::U32(4))
        .meta(&format!("{arch}.attention.layer_norm_rms_epsilon"), Meta::F32(1e-5))
        .meta(&format!("{arch}.context_length"), Meta::U32(256))
        .meta(&format!("{arch}.vocab_size"), Meta::U32(8))
        .meta("tokenizer.ggml.model", Meta::Str("llama".into()))
        .meta("tokenizer.ggml.tokens", Meta::StrArray((0..8).map(|i| format!("t{i}")).collect()))
}

fn with_tensors(w: GgufWriter, skip: &str) -> GgufWriter {
    let mut w = w.f32_tensor("token_embd.weight", &[64, 8]).f32_tensor("output_norm.weight", &[64]);
    for (name, shape) in [
        ("attn_norm.weight", vec![64]),
        ("attn_q.weight", vec![64, 64]),
        ("attn_k.weight", vec![64, 64]),
        ("attn_v.weight", vec![64, 64]),
        ("attn_output.weight", vec![64, 64]),
        ("ffn_norm.weight", vec![64]),
        ("ffn_gate.weight", vec![64, 128]),
        ("ffn_up.weight", vec![64, 128]),
        ("ffn_down.weight", vec![128, 64]),
    ] {
        if name != skip {
            w = w.f32_tensor(&format!("blk.0.{name}"), &shape);
        }
    }
    w
}

#[test]
fn crafted_models_shoal_cannot_run_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, w: GgufWriter| {
        let path = dir.path().join(name);
        std::fs::write(&path, w.bytes()).unwrap();
        path
    };
    assert_clean_error(&generate(&write("mamba.gguf", tiny_llama("mamba")), &[]), "is a \"mamba\" model");
    assert_clean_error(
        &generate(&write("no-ffn.gguf", with_tensors(tiny_llama("llama"), "ffn_up.weight")), &[]),
        "lacks the tensor blk.0.ffn_up.weight",
    );
    let mut wrong_type = with_tensors(tiny_llama("llama"), "");
    wrong_type.tensors[0].type_id = 4; // Q4_2, removed from ggml long ago
    assert_clean_error(&generate(&write("q4_2.gguf", wrong_type), &[]), "tensor type 4");
    let mut wrong_shape = with_tensors(tiny_llama("llama"), "");
    wrong_shape.tensors.iter_mut().find(|t| t.name == "blk.0.attn_q.weight").unwrap().shape = vec![64, 32];
    wrong_shape.tensors.iter_mut().find(|t| t.name == "blk.0.attn_q.weight").unwrap().data.truncate(64 * 32 * 4);
    assert_clean_error(&generate(&write("shape.gguf", wrong_shape), &[]), "has shape [64, 32]");
    let moe = with_tensors(tiny_llama("llama"), "").f32_tensor("blk.0.ffn_gate_inp.weight", &[64, 4]);
    assert_clean_error(&generate(&write("moe.gguf", moe), &[]), "does not use");
    // The first part of a split set holds the metadata and only some tensors.
    let part = tiny_llama("llama").meta("split.no", Meta::U32(0)).meta("split.count", Meta::U32(3));
    let part = part.f32_tensor("token_embd.weight", &[64, 8]);
    assert_clean_error(&generate(&write("big-00001-of-00003.gguf", part), &[]), "part 2 of 3 is missing");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let long = "word ".repeat(300);
    let out = generate_prompt(&common::model_path(), &long, &["--ctx-size", "256"]);
    assert_clean_error(&out, "context holds 256");
}

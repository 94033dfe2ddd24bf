//! Mixture-of-experts models against llama.cpp: random-weight GGUFs of each MoE architecture (written by
//! tests/common/random_model.rs, the same bytes on every run) must give llama.cpp's logits at every
//! position of a few prompts (tests/fixtures/oracle/random/, recorded by scripts/record-oracle-random),
//! its greedy tokens on a CPU with the recording machine's kernels, the same tokens split as unsplit,
//! and stages that map exactly their layers' bytes, experts included.

mod common;

use common::random_model::{self, RandomModel};
use serde::Deserialize;
use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, Stage, StageOptions, WireFormat};
use shoal::model::Model;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Recorded {
    prompt: String,
    prompt_ids: Vec<u32>,
    /// For each position: the ten largest logits as (token id, logit).
    top: Vec<Vec<(u32, f32)>>,
    greedy: Vec<u32>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/random")
}

/// The recording of `model`, after checking that the model written now is the file llama.cpp read.
fn recorded(model: &RandomModel) -> Vec<Recorded> {
    let dir = fixture_dir();
    let want = std::fs::read_to_string(dir.join(format!("{}.sha256", model.architecture))).unwrap();
    let bytes = std::fs::read(model.write()).unwrap();
    let have = sha256_hex(&bytes);
    assert_eq!(
        have,
        want.trim(),
        "the random {} model changed since llama.cpp's outputs were recorded: run scripts/record-oracle-random",
        model.architecture
    );
    let text = std::fs::read_to_string(dir.join(format!("{}.jsonl", model.architecture))).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn options() -> StageOptions {
    StageOptions { context: 512, threads: 2, ..StageOptions::default() }
}

/// Logits after each token of `ids`, fed one at a time (as the recording did).
fn teacher_forced(pipeline: &mut LocalPipeline, ids: &[u32]) -> Vec<Vec<f32>> {
    pipeline.truncate(0, 0);
    ids.iter().enumerate().map(|(pos, &id)| pipeline.forward(0, pos, &[id]).unwrap().to_vec()).collect()
}

/// Whether this CPU runs the ggml kernels of the machine that recorded the fixtures (x86_64 with
/// AVX-512 and AVX-512 VNNI): only there are greedy tokens compared exactly.
fn runs_the_recording_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn check_logits_match_llama_cpp(model: &RandomModel) {
    let cases = recorded(model);
    let file = Model::open(&model.path()).unwrap();
    let tokenizer = file.tokenizer().unwrap();
    let mut pipeline = LocalPipeline::load(&file, &[], &options(), WireFormat::F32).unwrap();
    for case in &cases {
        assert_eq!(tokenizer.encode(&case.prompt).unwrap(), case.prompt_ids, "prompt {:?}", case.prompt);
        let ours = teacher_forced(&mut pipeline, &case.prompt_ids);
        for (pos, (logits, top)) in ours.iter().zip(&case.top).enumerate() {
            for &(id, value) in top {
                let got = logits[id as usize];
                assert!(
                    (got - value).abs() <= 1e-2 + 1e-3 * value.abs(),
                    "{} prompt {:?} position {pos}: logit of token {id} is {got}, llama.cpp's {value}",
                    model.architecture,
                    case.prompt
                );
            }
            // The winner must be llama.cpp's wherever llama.cpp's winner is clear.
            if top[0].1 - top[1].1 > 0.05 {
                assert_eq!(engine::argmax(logits), top[0].0, "{} position {pos}", model.architecture);
            }
        }
    }
}

fn greedy(file: &Model, splits: &[usize], prompt: &[u32], n: usize) -> Vec<u32> {
    let tokenizer = file.tokenizer().unwrap();
    let mut pipeline = LocalPipeline::load(file, splits, &options(), WireFormat::F32).unwrap();
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec![],
        ignore_eos: true,
    };
    engine::generate(&mut pipeline, &tokenizer, &request, |_| true).unwrap().tokens
}

#[test]
fn qwen3moe_gives_llama_cpp_logits_at_every_position() {
    check_logits_match_llama_cpp(&random_model::qwen3moe());
}

#[test]
fn qwen3moe_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    let model = random_model::qwen3moe();
    let cases = recorded(&model);
    let file = Model::open(&model.path()).unwrap();
    for case in &cases {
        let whole = greedy(&file, &[], &case.prompt_ids, case.greedy.len());
        if runs_the_recording_kernels() {
            assert_eq!(whole, case.greedy, "greedy tokens of {:?}", case.prompt);
        }
        for splits in [vec![1], vec![2], vec![1, 2, 3]] {
            assert_eq!(greedy(&file, &splits, &case.prompt_ids, case.greedy.len()), whole, "splits {splits:?}");
        }
    }
}

#[test]
fn a_moe_stage_maps_exactly_its_layers_bytes_experts_included() {
    let model = random_model::qwen3moe();
    let file = Model::open(&model.write()).unwrap();
    assert_eq!(file.config().moe.map(|m| (m.experts, m.experts_used)), Some((model.experts, model.experts_used)));
    for range in [0..1, 1..3, 3..4] {
        let stage = Stage::load(&file, range.clone(), options()).unwrap();
        let in_file: u64 = file
            .file()
            .tensors()
            .iter()
            .filter(|t| {
                let layer = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
                layer.is_some_and(|l| range.contains(&l))
                    || (range.start == 0 && t.name == "token_embd.weight")
                    || (range.end == model.layers && (t.name == "output_norm.weight" || t.name == "token_embd.weight"))
            })
            .map(|t| t.bytes)
            .sum();
        let experts: u64 = file
            .file()
            .tensors()
            .iter()
            .filter(|t| t.name.contains("_exps") && range.clone().any(|l| t.name.starts_with(&format!("blk.{l}."))))
            .map(|t| t.bytes)
            .sum();
        assert!(experts > 0);
        assert_eq!(stage.weights().mapped_bytes(), in_file, "layers {range:?}");
        assert_eq!(file.layout().stage_bytes(range.clone()), in_file, "layers {range:?}");
    }
}

/// Writes the random models for scripts/record-oracle-random (which runs this ignored test).
#[test]
#[ignore]
fn write_the_random_models() {
    for model in [random_model::qwen3moe()] {
        println!("random model: {}", model.write().display());
    }
}

#[test]
fn placement_budgets_at_least_the_compute_buffer_a_moe_stage_reserves() {
    let model = random_model::qwen3moe();
    let file = Model::open(&model.write()).unwrap();
    let options = options();
    let needs = shoal::placement::ModelNeeds::of(&file, options.context, options.sequences, options.batch);
    for range in [0..2, 2..4] {
        let stage = Stage::load(&file, range.clone(), options.clone()).unwrap();
        let budget = needs.stage(range.clone());
        assert!(
            budget.compute >= stage.memory().compute,
            "layers {range:?}: placement budgets {} compute bytes, the stage reserved {}",
            budget.compute,
            stage.memory().compute
        );
        assert_eq!(budget.kv_cache, stage.memory().kv_cache, "layers {range:?}");
    }
}

//! The architectures without a small real model here, against llama.cpp: random-weight GGUFs of
//! qwen3moe, glm4moe, gemma3, Mixtral, deepseek2 (both attention forms) and gpt-oss (written by
//! tests/common/random_model.rs, the same bytes on every run) must give llama.cpp's logits at every
//! position of a few prompts (tests/fixtures/oracle/random/, recorded by scripts/record-oracle),
//! fed a token at a time and prefilled in one step, its greedy tokens on a CPU with the recording
//! machine's kernels, the same tokens split as unsplit, and stages that map exactly their layers' bytes,
//! experts included.

mod common;

use common::oracle;
use common::random_kimi;
use common::random_model::{self, RandomModel};
use shoal::engine::{Stage, StageOptions};
use shoal::model::Model;
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/random")
}

/// The recording of `model`, after checking that the model written now is the file llama.cpp read.
fn recorded(model: &RandomModel) -> Vec<oracle::Recorded> {
    let dir = fixture_dir();
    let want = std::fs::read_to_string(dir.join(format!("{}.sha256", model.name()))).unwrap();
    let have = shoal::model::pull::sha256_of(&model.write()).unwrap();
    assert_eq!(
        have,
        want.trim(),
        "the random {} model changed since llama.cpp's outputs were recorded: run scripts/record-oracle",
        model.architecture
    );
    let suffix = oracle::same_kernels_suffix().unwrap_or("");
    oracle::read(&dir.join(format!("{}{suffix}.jsonl", model.name())))
}

fn options() -> StageOptions {
    oracle::options()
}

fn check_logits_match_llama_cpp(model: &RandomModel) {
    let cases = recorded(model); // writes the model first
    let file = Model::open(&model.path()).unwrap();
    oracle::check_logits(&file, model.architecture, &cases);
}

fn greedy(file: &Model, splits: &[usize], prompt: &[u32], n: usize) -> Vec<u32> {
    oracle::greedy(file, splits, prompt, n)
}

#[test]
fn qwen3moe_gives_llama_cpp_logits_at_every_position() {
    check_logits_match_llama_cpp(&random_model::qwen3moe());
}

fn check_greedy_matches_llama_cpp_split_or_not(model: &RandomModel, split_sets: &[&[usize]]) {
    let cases = recorded(model);
    let file = Model::open(&model.path()).unwrap();
    for case in &cases {
        let whole = greedy(&file, &[], &case.prompt_ids, case.greedy.len());
        if oracle::same_kernels_suffix().is_some() {
            assert_eq!(whole, case.greedy, "{} greedy tokens of {:?}", model.architecture, case.prompt);
        }
        for splits in split_sets {
            let split = greedy(&file, splits, &case.prompt_ids, case.greedy.len());
            assert_eq!(split, whole, "{} split at {splits:?}", model.architecture);
        }
    }
}

/// Every stage of `ranges` maps exactly the bytes of its layers' tensors in the file (experts
/// included), plus the embeddings on the first and the final norm and tied head on the last; the
/// layout (placement's numbers) says the same.
fn check_stage_bytes(model: &RandomModel, ranges: &[std::ops::Range<usize>]) {
    let file = Model::open(&model.write()).unwrap();
    let layer_of = common::layer_of;
    for range in ranges {
        let stage = Stage::load(&file, range.clone(), options()).unwrap();
        let in_file = common::stage_tensor_bytes(&file, range, model.layers);
        let experts: u64 = file
            .file()
            .tensors()
            .iter()
            .filter(|t| t.name.contains("_exps") && layer_of(&t.name).is_some_and(|l| range.contains(&l)))
            .map(|t| t.bytes)
            .sum();
        let sparse = range.clone().any(|l| l >= model.leading_dense);
        assert_eq!(experts > 0, sparse, "layers {range:?}");
        assert_eq!(stage.weights().mapped_bytes(), in_file, "{} layers {range:?}", model.architecture);
        assert_eq!(file.layout().stage_bytes(range.clone()), in_file, "{} layers {range:?}", model.architecture);
        // A decode step reads the stage's layers, of their experts the share a token uses, and on the
        // last stage the norm and head (the tied embeddings); not the token embeddings it takes a row of.
        let used = file.config().moe.map_or(1.0, |m| m.experts_used as f64 / m.experts as f64);
        let reads: u64 = file
            .file()
            .tensors()
            .iter()
            .map(|t| match layer_of(&t.name) {
                Some(l) if range.contains(&l) && t.name.contains("_exps") => (t.bytes as f64 * used) as u64,
                Some(l) if range.contains(&l) => t.bytes,
                None if range.end == model.layers
                    && (t.name == "output_norm.weight" || t.name == "token_embd.weight") =>
                {
                    t.bytes
                }
                _ => 0,
            })
            .sum();
        let needs = shoal::placement::ModelNeeds::of(&file, 64, 1, 32);
        // Besides the weights, a step reads its attention's cache rows (checked on SmolLM2 in
        // tests/placement.rs), and every layer has attention.
        let attention: u64 = needs.attention_reads[range.clone()].iter().sum();
        assert!(needs.attention_reads[range.clone()].iter().all(|&a| a > 0), "{}", model.architecture);
        assert_eq!(needs.stage_reads(range.clone()), reads + attention, "{} layers {range:?}", model.architecture);
        if sparse {
            assert!(reads < in_file, "a token reads a share of the experts");
        }
    }
}

#[test]
fn qwen3moe_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    check_greedy_matches_llama_cpp_split_or_not(&random_model::qwen3moe(), &[&[1], &[2], &[1, 2, 3]]);
}

#[test]
fn a_moe_stage_maps_exactly_its_layers_bytes_experts_included() {
    let model = random_model::qwen3moe();
    let file = Model::open(&model.write()).unwrap();
    assert_eq!(file.config().moe.map(|m| (m.experts, m.experts_used)), Some((model.experts, model.experts_used)));
    check_stage_bytes(&model, &[0..1, 1..3, 3..4]);
}

#[test]
fn glm4moe_gives_llama_cpp_logits_at_every_position() {
    check_logits_match_llama_cpp(&random_model::glm4moe());
}

/// Split points inside the leading dense layers, right after them, and among the sparse ones.
#[test]
fn glm4moe_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    check_greedy_matches_llama_cpp_split_or_not(&random_model::glm4moe(), &[&[1], &[2], &[3], &[1, 2, 4]]);
}

#[test]
fn glm4moe_skips_its_next_token_prediction_layer_and_maps_exact_bytes() {
    let model = random_model::glm4moe();
    let file = Model::open(&model.write()).unwrap();
    let config = file.config();
    assert_eq!((config.layers, config.skipped_layers), (model.layers, model.nextn_layers));
    let moe = config.moe.unwrap();
    assert_eq!((moe.leading_dense_layers, moe.shared_experts), (model.leading_dense, model.shared_experts));
    assert_eq!(config.rope.dimensions as usize, model.rope_dims);
    // The layout counts no byte of the skipped layer.
    let skipped: u64 = file.file().tensors().iter().filter(|t| t.name.starts_with("blk.5.")).map(|t| t.bytes).sum();
    let all: u64 = file.file().tensors().iter().map(|t| t.bytes).sum();
    assert!(skipped > 0);
    assert_eq!(file.layout().total_bytes(), all - skipped);
    check_stage_bytes(&model, &[0..1, 1..2, 2..3, 0..2, 2..5]);
}

#[test]
fn gemma3_gives_llama_cpp_logits_at_every_position_across_its_sliding_window() {
    let model = random_model::gemma3();
    let longest = recorded(&model).iter().map(|c| c.prompt_ids.len()).max().unwrap();
    assert!(longest > model.sliding_window, "a prompt must cross the sliding window");
    check_logits_match_llama_cpp(&model);
}

/// Split points on both sides of the global layer (5).
#[test]
fn gemma3_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    check_greedy_matches_llama_cpp_split_or_not(&random_model::gemma3(), &[&[5], &[6], &[2, 5]]);
}

#[test]
fn mixtral_gives_llama_cpp_logits_and_greedy_tokens_split_or_not() {
    let model = random_model::mixtral();
    check_logits_match_llama_cpp(&model);
    check_greedy_matches_llama_cpp_split_or_not(&model, &[&[2]]);
}

#[test]
fn deepseek2_latent_attention_gives_llama_cpp_logits_at_every_position() {
    check_logits_match_llama_cpp(&random_model::deepseek2());
}

#[test]
fn deepseek2_with_the_combined_kv_b_gives_llama_cpp_logits_at_every_position() {
    check_logits_match_llama_cpp(&random_model::deepseek2_legacy());
}

/// A prompt's first step may attend in the expanded form (keys and values expanded per head from the
/// latents; `arch::deepseek2`, from 8 tokens on at this model's widths): every prefix of the prompts
/// prefilled in one step, short ones (the latent form) and long ones (expanded), gives llama.cpp's
/// logits, which it computes in the latent form: within the measured [`oracle::EXPANDED_LATENT_FORM`]
/// on the recording's kernels, the loose tolerance elsewhere.
#[test]
fn deepseek2_prompts_prefilled_in_one_step_give_llama_cpp_logits() {
    let model = random_model::deepseek2();
    let cases = recorded(&model);
    let file = Model::open(&model.path()).unwrap();
    let same_kernels = oracle::same_kernels_suffix().is_some();
    let relative = if same_kernels { oracle::EXPANDED_LATENT_FORM } else { oracle::tolerance(false) };
    oracle::check_prefill_logits_within(&file, model.architecture, &cases, 2, relative, &oracle::options());
}

/// The other architectures' prompts prefilled in one step, every prefix (sliding windows crossed within
/// a step for gemma3 and gpt-oss): llama.cpp's logits at the prefix's last position, prefilled alike.
#[test]
fn every_architecture_prefilled_in_one_step_gives_llama_cpp_logits() {
    for model in [
        random_model::qwen3moe(),
        random_model::glm4moe(),
        random_model::gemma3(),
        random_model::mixtral(),
        random_model::deepseek2_legacy(),
        random_model::gpt_oss(),
    ] {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        oracle::check_prefill_logits(&file, &model.name(), &cases, 1, true);
    }
}

/// Split points right after the dense layer and among the sparse ones.
#[test]
fn deepseek2_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    check_greedy_matches_llama_cpp_split_or_not(&random_model::deepseek2(), &[&[1], &[2], &[1, 3]]);
    check_greedy_matches_llama_cpp_split_or_not(&random_model::deepseek2_legacy(), &[&[1], &[2, 3]]);
}

/// The split latent form caches, per position and layer, only the latent and the rotary part (F16);
/// the combined form caches full keys and values of every head. Placement counts the same bytes.
#[test]
fn a_deepseek2_stage_caches_the_latent_and_maps_exactly_its_layers_bytes() {
    let options = options();
    let positions = (options.context.div_ceil(256) * 256 * options.sequences) as u64;
    for model in [random_model::deepseek2(), random_model::deepseek2_legacy()] {
        let mla = model.mla.unwrap();
        let per_position = if mla.absorbed {
            2 * (mla.kv_lora_rank + model.rope_dims) as u64
        } else {
            2 * (model.heads * (mla.nope + model.rope_dims) + model.heads * mla.value_head) as u64
        };
        let file = Model::open(&model.write()).unwrap();
        assert_eq!(file.config().layers, model.layers, "the next-token-prediction layer is skipped");
        let needs = shoal::placement::ModelNeeds::of(&file, options.context, options.sequences, options.batch);
        for range in [0..1, 1..4] {
            let stage = Stage::load(&file, range.clone(), options.clone()).unwrap();
            let want = range.len() as u64 * per_position * positions;
            assert_eq!(stage.memory().kv_cache, want, "{} layers {range:?}", model.name());
            assert_eq!(needs.stage(range.clone()).kv_cache, want, "{} layers {range:?}", model.name());
        }
        check_stage_bytes(&model, &[0..1, 1..2, 1..4, 0..4]);
    }
}

/// Attention sinks, a sliding window shorter than the prompts, MXFP4 experts with biases, YaRN.
#[test]
fn gpt_oss_gives_llama_cpp_logits_at_every_position_across_its_sliding_window() {
    let model = random_model::gpt_oss();
    let longest = recorded(&model).iter().map(|c| c.prompt_ids.len()).max().unwrap();
    assert!(longest > model.sliding_window, "a prompt must cross the sliding window");
    let file = Model::open(&model.write()).unwrap();
    let expert_type = file.file().tensors().iter().find(|t| t.name == "blk.0.ffn_up_exps.weight").unwrap().dtype;
    assert_eq!(expert_type.name().to_lowercase(), "mxfp4");
    check_logits_match_llama_cpp(&model);
}

/// Split points after a sliding layer and after a global one.
#[test]
fn gpt_oss_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    check_greedy_matches_llama_cpp_split_or_not(&random_model::gpt_oss(), &[&[1], &[2], &[1, 3]]);
}

/// Writes the random models for scripts/record-oracle (which runs this ignored test).
#[test]
#[ignore]
fn write_the_random_models() {
    for model in [
        random_model::qwen3moe(),
        random_model::glm4moe(),
        random_model::gemma3(),
        random_model::mixtral(),
        random_model::deepseek2(),
        random_model::deepseek2_legacy(),
        random_model::gpt_oss(),
        random_model::qwen35(),
        random_model::qwen35moe(),
        random_model::qwen3next(),
        random_model::qwen3next_fused(),
        random_kimi::kimi_k3(),
        random_kimi::kimi_k3_plain(),
        random_model::minimax_m2(),
        common::random_sparse::deepseek32(),
        common::random_sparse::glm_dsa(),
        common::random_sparse::minimax_m3(),
    ] {
        println!("random model: {}", model.write().display());
    }
}

/// Writes the random models `benches/compare-llama-bench --suite` measures (it runs this ignored test).
#[test]
#[ignore]
fn write_the_benchmark_models() {
    for model in [
        random_model::qwen3moe_bench(),
        random_model::deepseek2_bench(),
        random_model::gpt_oss_bench(),
        random_model::qwen35moe_bench(),
        common::random_sparse::deepseek32_bench(),
    ] {
        println!("benchmark model: {}", model.write().display());
    }
}

#[test]
fn placement_budgets_at_least_the_compute_buffer_a_moe_stage_reserves() {
    for model in [random_model::qwen3moe(), random_model::glm4moe(), random_model::deepseek2()] {
        check_compute_budget(&model);
    }
}

fn check_compute_budget(model: &RandomModel) {
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

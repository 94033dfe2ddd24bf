//! The models of late 2026, part 2, against llama.cpp: random-weight `minimax-m2` models (Q and K
//! normed across all heads; tests/common/random_model.rs) give llama.cpp's logits at every position
//! fed a token at a time, prefilled in one step and prefilled in chunks; greedy tokens equal
//! llama.cpp's and equal split at every layer.

mod common;

use common::oracle;
use common::random_model::{self, RandomModel};
use shoal::engine::{LocalPipeline, WireFormat};
use shoal::model::Model;
use std::path::PathBuf;

/// The recording of `model` by llama.cpp built for x86-64-v3 (as release builds are), after checking
/// that the model written now is the file llama.cpp read. Only builds with those kernels compare
/// greedy tokens exactly and logits tightly; others check the logits within the loose tolerance.
fn recorded(model: &RandomModel) -> Vec<oracle::Recorded> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/random");
    let want = std::fs::read_to_string(dir.join(format!("{}.sha256", model.name()))).unwrap();
    let have = shoal::model::pull::sha256_of(&model.write()).unwrap();
    assert_eq!(have, want.trim(), "the random {} model changed since llama.cpp recorded it", model.name());
    oracle::read(&dir.join(format!("{}-x86-64-v3.jsonl", model.name())))
}

/// Whether this build has the kernels of the recording.
fn same_kernels() -> bool {
    oracle::runs_the_x86_64_v3_kernels()
}

fn models() -> [RandomModel; 1] {
    [random_model::minimax_m2()]
}

#[test]
fn sparse_models_give_llama_cpp_logits_at_every_position_a_token_at_a_time() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        oracle::check_logits_recorded_here(&file, &model.name(), &cases, same_kernels(), &oracle::options());
    }
}

/// Every prefix of the prompts prefilled in one step.
#[test]
fn sparse_models_prefilled_in_one_step_give_llama_cpp_logits() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        oracle::check_prefill_logits_with(&file, &model.name(), &cases, 1, same_kernels(), &oracle::options());
    }
}

/// Prompts prefilled in chunks of 3 tokens give llama.cpp's logits at every chunk's last position, as
/// fed a token at a time.
#[test]
fn sparse_models_prefilled_in_chunks_give_llama_cpp_logits() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        let mut pipeline = LocalPipeline::load(&file, &[], &oracle::options(), WireFormat::F32).unwrap();
        let relative = oracle::tolerance(false);
        for case in &cases {
            pipeline.truncate(0, 0);
            for (i, chunk) in case.prompt_ids.chunks(3).enumerate() {
                let start = 3 * i;
                let logits = pipeline.forward(0, start, chunk).unwrap();
                let last = start + chunk.len() - 1;
                let at = format!("{} prompt {:?} chunk ending at {last}", model.name(), case.prompt);
                oracle::check_position(&at, logits, &case.top[last], relative);
            }
        }
    }
}

/// Split at every layer, and at all of them at once.
#[test]
fn sparse_models_greedy_tokens_are_llama_cpp_and_equal_split_at_every_layer() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        let mut split_sets: Vec<Vec<usize>> = (1..model.layers).map(|l| vec![l]).collect();
        split_sets.push((1..model.layers).collect());
        for case in &cases {
            let whole = oracle::greedy(&file, &[], &case.prompt_ids, case.greedy.len());
            if same_kernels() {
                assert_eq!(whole, case.greedy, "{} greedy tokens of {:?}", model.name(), case.prompt);
            }
            for splits in &split_sets {
                let split = oracle::greedy(&file, splits, &case.prompt_ids, case.greedy.len());
                assert_eq!(split, whole, "{} split at {splits:?}", model.name());
            }
        }
    }
}

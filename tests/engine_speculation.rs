//! A verification step in the engine (issue 50): a decode row followed by drafted tokens, asking logits
//! for every one of them, gives each position the logits decoding those tokens one at a time gives.
//! Checked for the real SmolLM2 and random models of the architectures that draft (dense, mixture of
//! experts, sliding windows, latent and sparse attention), whole and split into stages. SmolLM2's rows
//! are token-at-a-time decoding's bit for bit (its Q4_1 products and Q8_0 head take one kernel for one
//! row and for several), so its greedy output with drafts is exactly the output without. The random
//! models' F16 products take other kernels for several rows than for one, which sum in another order:
//! their rows differ by up to 6e-4 of the logits' spread (measured 2026-12-08), as a chunked prefill's
//! do, and a near tie can tip a greedy token — with drafts as without them on a different chunking.

mod common;

use common::random_model::{self, RandomModel};
use shoal::engine::{argmax, LocalPipeline, Segment, StageOptions, WireFormat};
use shoal::model::Model;
use std::path::Path;

/// One thread: a stage lent fewer threads than it asks for would split a row's work otherwise, which
/// rounds differently (see `engine_batching`).
fn options() -> StageOptions {
    StageOptions { context: 512, threads: 1, batch: 64, ..StageOptions::default() }
}

fn prompt(length: usize) -> Vec<u32> {
    (0..length as u32).map(|i| 2 + (i * 7919) % 40_000).collect()
}

/// Decodes `steps` greedy tokens one at a time after `prompt`; the tokens and each step's logits.
fn one_at_a_time(pipeline: &mut LocalPipeline, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = vec![pipeline.forward(0, 0, prompt).unwrap().to_vec()];
    let mut tokens = vec![argmax(&logits[0])];
    for i in 1..steps {
        logits.push(pipeline.forward(0, prompt.len() + i - 1, &[tokens[i - 1]]).unwrap().to_vec());
        tokens.push(argmax(logits.last().unwrap()));
    }
    (tokens, logits)
}

/// The largest difference between two rows of logits, relative to the larger row's spread.
fn difference(a: &[f32], b: &[f32]) -> f32 {
    let spread = a.iter().chain(b).fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / spread
}

/// After the prompt and the first token, verifies the next `drafted` greedy tokens in one step (as
/// stage 0 runs a decode row with its drafts); each row's logits against token-at-a-time decoding.
/// Returns the largest difference.
fn check(model: &Model, splits: &[usize], what: &str) -> f32 {
    const DRAFTED: usize = 6;
    let prompt = prompt(40);
    let load = || LocalPipeline::load(model, splits, &options(), WireFormat::F32).unwrap();
    let (tokens, logits) = one_at_a_time(&mut load(), &prompt, DRAFTED + 2);
    let mut pipeline = load();
    pipeline.forward(0, 0, &prompt).unwrap();
    // The first token's row, then the drafts: the next greedy tokens.
    let fed = &tokens[..DRAFTED + 1];
    let segment = Segment { seq: 0, start: prompt.len(), tokens: fed.len(), logits: true, drafted: DRAFTED };
    let rows = pipeline.forward_batch(&[segment], fed).unwrap().to_vec();
    let vocabulary = model.config().vocabulary;
    assert_eq!(rows.len(), (DRAFTED + 1) * vocabulary, "{what}: a row of logits per position");
    let mut largest = 0f32;
    for (i, row) in rows.chunks(vocabulary).enumerate() {
        let expected = &logits[i + 1];
        largest = largest.max(difference(row, expected));
        assert_eq!(argmax(row), tokens[i + 1], "{what}: the greedy token after {} drafts", i);
    }
    eprintln!("{what}: verification rows differ from one at a time by at most {largest:e} of the spread");
    largest
}

#[test]
fn verification_rows_are_token_at_a_time_logits_for_smollm2() {
    let model = Model::open(&common::model_path()).unwrap();
    let whole = check(&model, &[], "SmolLM2");
    let split = check(&model, &[10, 20], "SmolLM2 in three stages");
    assert_eq!((whole, split), (0.0, 0.0), "SmolLM2's verification rows are one-at-a-time logits bit for bit");
}

fn check_random(model: RandomModel, splits: &[usize]) {
    let path = model.write();
    let file = Model::open(Path::new(&path)).unwrap();
    let name = file.config().architecture.gguf_name().to_string();
    let largest = check(&file, &[], &name).max(check(&file, splits, &format!("{name} split at {splits:?}")));
    assert!(largest < 2e-3, "{name}: {largest}");
}

#[test]
fn verification_rows_are_token_at_a_time_logits_for_every_drafting_architecture() {
    check_random(random_model::qwen3moe(), &[1]);
    check_random(random_model::gemma3(), &[2]);
    check_random(random_model::deepseek2(), &[1]);
    check_random(random_model::gpt_oss(), &[1]);
    check_random(common::random_sparse::deepseek32(), &[1]);
    check_random(random_model::minimax_m2(), &[1]);
}

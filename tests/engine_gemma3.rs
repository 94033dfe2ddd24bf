//! The real Gemma 3 270M (Q4_K_M) against llama.cpp (tests/fixtures/oracle/gemma3/, recorded by
//! scripts/record-oracle): the tokenizer's ids, the logits at every position of each prompt, greedy
//! tokens on a CPU with a recording machine's kernels, split equal to unsplit, and its chat turns. Two
//! recordings: an AMD EPYC with AVX-512 VNNI (`gemma-3-270m.jsonl`) and an Intel Xeon with AVX512-FP16
//! and AMX (`gemma-3-270m-avx512fp16.jsonl`), whose half-precision F16 kernels move Gemma's logits by up
//! to 10%; a CPU like either is held to its recording exactly.

mod common;

use common::oracle;
use shoal::engine::StageOptions;
use shoal::model::{ChatMessage, Model};
use std::path::PathBuf;

/// A recording of llama.cpp and the stage options that compute as it did.
struct Recording {
    file: &'static str,
    cases: Vec<oracle::Recorded>,
    /// Whether it was made with this build's kernels (then logits are held tightly, greedy tokens exactly).
    same_kernels: bool,
    options: StageOptions,
}

/// The recordings for this CPU's kernels. Release builds on x86_64 have two: llama.cpp as it runs by
/// default (Q4_K matrices repacked, as shoal does by default) and with its weights as the file lays them
/// out (`SHOAL_ORACLE_NO_REPACK=1`, as `--no-repack` runs shoal). The native recordings are of the latter.
fn recordings() -> Vec<Recording> {
    let files: Vec<(&str, bool, StageOptions)> = if oracle::runs_the_x86_64_v3_kernels() {
        vec![
            ("gemma-3-270m-x86-64-v3.jsonl", true, oracle::options()),
            ("gemma-3-270m-x86-64-v3-as-in-file.jsonl", true, oracle::options_as_in_file()),
        ]
    } else if oracle::runs_avx512fp16_kernels() {
        vec![("gemma-3-270m-avx512fp16.jsonl", true, oracle::options_as_in_file())]
    } else {
        vec![("gemma-3-270m.jsonl", oracle::runs_the_recording_kernels(), oracle::options_as_in_file())]
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/gemma3");
    files
        .into_iter()
        .map(|(file, same_kernels, options)| Recording {
            file,
            cases: oracle::read(&dir.join(file)),
            same_kernels,
            options,
        })
        .collect()
}

#[test]
fn gemma3_tokenizer_and_logits_are_llama_cpp() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    assert_eq!(model.config().layers, 18);
    let window = model.config().sliding_window.as_ref().unwrap();
    assert_eq!(window.size, 512);
    assert_eq!(window.layers.iter().filter(|&&sliding| !sliding).count(), 3, "layers 5, 11 and 17 are global");
    for r in recordings() {
        oracle::check_logits_recorded_here(&model, r.file, &r.cases, r.same_kernels, &r.options);
    }
}

/// Each prefix of every recorded prompt prefilled in one step (several rows through the tiled products
/// and flash attention's tiles) gives the logits llama.cpp's own prefill gave at its last position.
/// Only against recordings of llama.cpp's prefill (the x86-64-v3 ones): Gemma's logits move by up to
/// 7% between a token at a time and a prefill in llama.cpp itself, too far for a check against the
/// token-at-a-time logits to mean anything.
#[test]
fn gemma3_prompts_prefilled_in_one_step_give_llama_cpp_logits() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    for r in recordings() {
        if r.cases.iter().any(|case| case.prefill.is_empty()) {
            eprintln!("{}: llama.cpp's prefill is not recorded for this build's kernels; not checked", r.file);
            continue;
        }
        oracle::check_prefill_logits_with(&model, r.file, &r.cases, 2, r.same_kernels, &r.options);
    }
}

#[test]
fn gemma3_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    for r in recordings() {
        for case in r.cases.iter().take(3) {
            let whole = oracle::greedy_with(&model, &[], &r.options, &case.prompt_ids, case.greedy.len());
            if r.same_kernels {
                assert_eq!(whole, case.greedy, "{}: greedy tokens of {:?}", r.file, case.prompt);
            }
            // Around a global layer (5), and three ways.
            for splits in [&[6][..], &[5, 12]] {
                let split = oracle::greedy_with(&model, splits, &r.options, &case.prompt_ids, 12);
                assert_eq!(split, whole[..12], "{}: splits {splits:?}", r.file);
            }
        }
    }
}

/// Placement budgets at least the compute buffer a Gemma 3 stage reserves at a 512-token step, whose
/// products widen the 640-wide Q5_0 matrices to Q8_0 in that buffer (the stage's CPU back end).
#[test]
fn placement_budgets_at_least_the_compute_buffer_a_gemma3_stage_reserves() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    let options = StageOptions { context: 1024, ..StageOptions::default() };
    let needs = shoal::placement::ModelNeeds::of(&model, options.context, options.sequences, options.batch);
    for range in [0..6, 6..18] {
        let stage = shoal::engine::Stage::load(&model, range.clone(), options.clone()).unwrap();
        let (budget, reserved) = (needs.stage(range.clone()).compute, stage.memory().compute);
        assert!(
            budget >= reserved,
            "layers {range:?}: placement budgets {budget} compute bytes, the stage reserved {reserved}"
        );
    }
}

#[test]
fn gemma3_chat_turns_use_gemmas_format() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let template = model.chat_template(&tokenizer).unwrap();
    let prompt = template
        .render(&[
            ChatMessage::new("system", "Answer briefly."),
            ChatMessage::new("user", "What is the capital of France?"),
            ChatMessage::new("assistant", "Paris."),
            ChatMessage::new("user", "And of Italy?"),
        ])
        .unwrap();
    assert_eq!(
        prompt,
        "<start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?<end_of_turn>\n\
         <start_of_turn>model\nParis.<end_of_turn>\n<start_of_turn>user\nAnd of Italy?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    let ids = tokenizer.encode(&prompt).unwrap();
    assert_eq!(ids[0], 2, "the tokenizer adds Gemma's BOS once");
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 1);
    let end_of_turn = tokenizer.encode("<end_of_turn>").unwrap();
    assert_eq!(end_of_turn, [2, 106], "<end_of_turn> is one special token (after the BOS)");
    assert!(tokenizer.is_end_of_generation(106), "<end_of_turn> ends generation");
}

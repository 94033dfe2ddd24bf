//! The real Gemma 3 270M (Q4_K_M) against llama.cpp (tests/fixtures/oracle/gemma3/, recorded by
//! scripts/record-oracle): the tokenizer's ids, the logits at every position of each prompt, greedy
//! tokens on a CPU with a recording machine's kernels, split equal to unsplit, and its chat turns. Two
//! recordings: an AMD EPYC with AVX-512 VNNI (`gemma-3-270m.jsonl`) and an Intel Xeon with AVX512-FP16
//! and AMX (`gemma-3-270m-avx512fp16.jsonl`), whose half-precision F16 kernels move Gemma's logits by up
//! to 10%; a CPU like either is held to its recording exactly.

mod common;

use common::oracle;
use shoal::model::{ChatMessage, Model};
use std::path::PathBuf;

/// The recording for this CPU's kernels, and whether it was made with them.
fn recorded() -> (Vec<oracle::Recorded>, bool) {
    let (file, same_kernels) = if oracle::runs_avx512fp16_kernels() {
        ("gemma-3-270m-avx512fp16.jsonl".to_string(), true)
    } else if let Some(suffix) = oracle::same_kernels_suffix() {
        (format!("gemma-3-270m{suffix}.jsonl"), true)
    } else {
        ("gemma-3-270m.jsonl".to_string(), false)
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/gemma3").join(file);
    (oracle::read(&path), same_kernels)
}

#[test]
fn gemma3_tokenizer_and_logits_are_llama_cpp() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    assert_eq!(model.config().layers, 18);
    let window = model.config().sliding_window.as_ref().unwrap();
    assert_eq!(window.size, 512);
    assert_eq!(window.layers.iter().filter(|&&sliding| !sliding).count(), 3, "layers 5, 11 and 17 are global");
    let (cases, same_kernels) = recorded();
    oracle::check_logits_recorded_here(&model, "gemma 3 270M", &cases, same_kernels);
}

#[test]
fn gemma3_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    let (cases, same_kernels) = recorded();
    for case in cases.iter().take(3) {
        let whole = oracle::greedy(&model, &[], &case.prompt_ids, case.greedy.len());
        if same_kernels {
            assert_eq!(whole, case.greedy, "greedy tokens of {:?}", case.prompt);
        }
        // Around a global layer (5), and three ways.
        for splits in [&[6][..], &[5, 12]] {
            assert_eq!(oracle::greedy(&model, splits, &case.prompt_ids, 12), whole[..12], "splits {splits:?}");
        }
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

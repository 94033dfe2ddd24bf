//! The real Gemma 3 270M (Q4_K_M) against llama.cpp (tests/fixtures/oracle/gemma3/, recorded by
//! scripts/record-oracle): the tokenizer's ids, the logits at every position of each prompt, greedy
//! tokens on a CPU with the recording machine's kernels, split equal to unsplit, and its chat turns.

mod common;

use common::oracle;
use shoal::model::{ChatMessage, Model};
use std::path::PathBuf;

fn recorded() -> Vec<oracle::Recorded> {
    oracle::read(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/gemma3/gemma-3-270m.jsonl"))
}

#[test]
fn gemma3_tokenizer_and_logits_are_llama_cpp() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    assert_eq!(model.config().layers, 18);
    let window = model.config().sliding_window.as_ref().unwrap();
    assert_eq!(window.size, 512);
    assert_eq!(window.layers.iter().filter(|&&sliding| !sliding).count(), 3, "layers 5, 11 and 17 are global");
    oracle::check_logits(&model, "gemma 3 270M", &recorded());
}

#[test]
fn gemma3_greedy_tokens_are_llama_cpp_and_equal_split_or_not() {
    let model = Model::open(&common::gemma3_path()).unwrap();
    for case in recorded().iter().take(3) {
        let whole = oracle::greedy(&model, &[], &case.prompt_ids, case.greedy.len());
        if oracle::runs_the_recording_kernels() {
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

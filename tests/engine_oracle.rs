//! The engine against llama.cpp's own outputs for SmolLM2-135M (tests/fixtures/oracle): the tokenizer
//! must give exactly llama.cpp's ids, and greedy generation must reproduce llama.cpp's continuations.

mod common;

use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, StageOptions, WireFormat};
use shoal::model::Model;

#[test]
fn tokenizer_gives_llama_cpp_ids_for_every_oracle_text() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    for case in common::oracle_tokenize() {
        assert_eq!(tokenizer.encode(&case.text).unwrap(), case.ids, "text {:?}", case.text);
    }
}

#[test]
fn tokenize_command_prints_the_ids_as_a_json_array() {
    use std::io::Write;
    for case in common::oracle_tokenize().into_iter().take(4) {
        let mut child = common::shoal()
            .args(["tokenize", "--model"])
            .arg(common::model_path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(case.text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ids, case.ids);
    }
}

/// How many leading generated tokens spell a prefix of `expected`.
fn matching_tokens(tokenizer: &shoal::model::Tokenizer, tokens: &[u32], expected: &str) -> usize {
    (0..=tokens.len()).rev().find(|&n| expected.starts_with(&tokenizer.decode(&tokens[..n]))).unwrap_or(0)
}

/// Greedy generation against llama.cpp. Where float results can first differ depends on the CPU's
/// kernels: in x86_64 builds with AVX2 kernels (every release build) the reference is llama.cpp run so
/// (greedy-x86_64-avx2.jsonl) and all 32 tokens must be equal; elsewhere it is the shared oracle
/// (greedy.jsonl, recorded on another machine) and the first 16 tokens must be equal.
#[test]
fn greedy_generation_reproduces_llama_cpp() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let options = StageOptions { context: 512, threads: 2, ..StageOptions::default() };
    let mut pipeline = LocalPipeline::load(&model, &[], &options, WireFormat::F32).unwrap();
    let greedy = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    // greedy-x86_64-avx2.jsonl was recorded by llama.cpp built for an AVX2 CPU without AVX-512 or
    // AVX-VNNI: the kernels of shoal's release builds (x86-64-v3) on any x86_64 CPU.
    let same_kernels = common::oracle::runs_the_x86_64_v3_kernels();
    let reference = if same_kernels { common::oracle_greedy_x86_avx2() } else { common::oracle_greedy() };
    let shared = common::oracle_greedy();
    let mut report = Vec::new();
    for (case, shared_case) in reference.iter().zip(&shared) {
        let prompt = tokenizer.encode(&case.prompt).unwrap();
        assert_eq!(prompt, case.prompt_ids, "prompt ids of {:?}", case.prompt);
        let request = GenerateRequest {
            prompt,
            max_tokens: case.n_predict,
            sampling: greedy.clone(),
            stop: vec![],
            ignore_eos: true,
        };
        let stats = engine::generate(&mut pipeline, &tokenizer, &request, |_| true).unwrap();
        assert_eq!(stats.generated_tokens, case.n_predict);
        let text = tokenizer.decode(&stats.tokens);
        let matching = matching_tokens(&tokenizer, &stats.tokens, &case.continuation);
        let required = if same_kernels { case.n_predict } else { 16 };
        assert!(
            matching >= required,
            "only {matching} tokens match llama.cpp for {:?}:\n ours:  {text:?}\n llama: {:?}",
            case.prompt,
            case.continuation
        );
        let shared_matching = matching_tokens(&tokenizer, &stats.tokens, &shared_case.continuation);
        report
            .push(format!("{shared_matching}/{} tokens match the shared oracle for {:?}", case.n_predict, case.prompt));
    }
    eprintln!("same kernels as the AVX2 reference: {same_kernels}\n{}", report.join("\n"));
}

#[test]
fn generate_command_prints_only_the_continuation() {
    let case = &common::oracle_greedy()[0];
    let out = common::shoal()
        .args(["generate", "--model"])
        .arg(common::model_path())
        .args(["--prompt", &case.prompt, "--max-tokens", "12", "--threads", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.is_empty() && case.continuation.starts_with(&text),
        "stdout {text:?} is not a prefix of {:?}",
        case.continuation
    );
}

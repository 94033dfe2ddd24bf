//! Split equals unsplit: the model run as stages that pass hidden states through their byte form gives
//! exactly the tokens of the model run whole.

mod common;

use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, StageOptions, WireFormat};
use shoal::model::{Model, Tokenizer};

const PROMPTS: [&str; 2] =
    ["The capital of France is", "<|im_start|>user\nName three rivers.<|im_end|>\n<|im_start|>assistant\n"];

fn greedy_tokens(model: &Model, tokenizer: &Tokenizer, splits: &[usize], prompt: &str) -> Vec<u32> {
    let options = StageOptions { context: 256, threads: 1, ..StageOptions::default() };
    let mut pipeline = LocalPipeline::load(model, splits, &options, WireFormat::F32).unwrap();
    assert_eq!(pipeline.stages().len(), splits.len() + 1);
    let request = GenerateRequest {
        prompt: tokenizer.encode(prompt).unwrap(),
        max_tokens: 32,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec![],
        ignore_eos: true,
    };
    let stats = engine::generate(&mut pipeline, tokenizer, &request, |_| true).unwrap();
    if !splits.is_empty() {
        assert!(pipeline.boundary_bytes() > 0, "hidden states must cross the stage boundaries as bytes");
    }
    stats.tokens
}

#[test]
fn every_single_split_point_gives_the_unsplit_tokens() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let layers = model.config().layers;
    for prompt in PROMPTS {
        let whole = greedy_tokens(&model, &tokenizer, &[], prompt);
        assert_eq!(whole.len(), 32);
        for split in 1..layers {
            assert_eq!(
                greedy_tokens(&model, &tokenizer, &[split], prompt),
                whole,
                "split at {split}, prompt {prompt:?}"
            );
        }
    }
}

#[test]
fn multi_way_splits_give_the_unsplit_tokens() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let whole = greedy_tokens(&model, &tokenizer, &[], PROMPTS[0]);
    let one_layer_each: Vec<usize> = (1..model.config().layers).collect();
    for splits in [vec![10, 20], vec![1, 2, 3], vec![7, 14, 21, 28], vec![29], one_layer_each] {
        assert_eq!(greedy_tokens(&model, &tokenizer, &splits, PROMPTS[0]), whole, "splits {splits:?}");
    }
}

#[test]
fn generate_command_with_split_prints_the_same_text() {
    let run = |split: Option<&str>| {
        let mut cmd = common::shoal();
        cmd.args(["generate", "--model"]).arg(common::model_path());
        cmd.args(["--prompt", PROMPTS[0], "--max-tokens", "24", "--threads", "2", "--ignore-eos"]);
        if let Some(s) = split {
            cmd.args(["--split", s]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let whole = run(None);
    assert!(!whole.is_empty());
    assert_eq!(run(Some("10,20")), whole);
}

#[test]
fn invalid_splits_are_refused_with_a_clear_message() {
    let out = common::shoal()
        .args(["generate", "--model"])
        .arg(common::model_path())
        .args(["--prompt", "hi", "--split", "20,10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("split points [20, 10]"), "{err}");
}

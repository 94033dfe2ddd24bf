//! The KV cache in Q8_0 and Q4_0 (`--kv-type`, llama.cpp's `-ctk`/`-ctv`, with its Walsh-Hadamard
//! rotation of queries, keys and values): SmolLM2's logits at every position of four prompts (up to 45
//! tokens) equal llama.cpp's with the same cache type (tests/fixtures/oracle/kv/, recorded by llama.cpp
//! 11434 built for x86-64-v3 with SHOAL_ORACLE_KV_TYPE), and its greedy tokens are llama.cpp's with that
//! build's kernels; the cache takes the type's blocks, as placement counts them; a model whose heads do
//! not fill whole blocks, or with latent attention, is refused with the reason.

mod common;

use common::oracle;
use shoal::engine::{KvType, Stage, StageOptions};
use shoal::model::Model;
use std::path::PathBuf;

fn recorded(kv: KvType) -> Vec<oracle::Recorded> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/kv");
    oracle::read(&dir.join(format!("smollm2-{}-x86-64-v3.jsonl", kv.name())))
}

fn options(kv_type: KvType) -> StageOptions {
    StageOptions { kv_type, ..oracle::options() }
}

#[test]
fn a_quantized_kv_cache_gives_llama_cpps_logits_with_the_same_cache_type() {
    let file = Model::open(&common::model_path()).unwrap();
    let same_kernels = oracle::runs_the_x86_64_v3_kernels();
    for kv in [KvType::Q8_0, KvType::Q4_0] {
        let cases = recorded(kv);
        let name = format!("SmolLM2 with a {} KV cache", kv.name());
        oracle::check_logits_recorded_here(&file, &name, &cases, same_kernels, &options(kv));
        if same_kernels {
            for case in &cases {
                let greedy = oracle::greedy_with(&file, &[], &options(kv), &case.prompt_ids, case.greedy.len());
                assert_eq!(greedy, case.greedy, "{name}: greedy tokens of {:?}", case.prompt);
            }
        }
    }
}

/// Each position of each layer takes the type's blocks for its keys and its values (SmolLM2: 3 key/value
/// heads of 64, so 6 blocks each), and placement counts the same bytes.
#[test]
fn the_cache_takes_the_types_blocks_as_placement_counts_them() {
    let file = Model::open(&common::model_path()).unwrap();
    let c = file.config();
    let width = (c.kv_heads * c.head_dim) as u64;
    for (kv, block_bytes) in [(KvType::F16, 64), (KvType::Q8_0, 34), (KvType::Q4_0, 18)] {
        let options = StageOptions { context: 512, sequences: 2, ..options(kv) };
        let per_row = width / 32 * block_bytes;
        let want = c.layers as u64 * 2 * per_row * 512 * 2;
        let stage = Stage::load(&file, 0..c.layers, options.clone()).unwrap();
        assert_eq!(stage.memory().kv_cache, want, "{}", kv.name());
        let needs = shoal::placement::ModelNeeds::of_kv(&file, 512, 2, options.batch, kv);
        assert_eq!(needs.stage(0..c.layers).kv_cache, want, "{}", kv.name());
    }
}

#[test]
fn heads_that_do_not_fill_whole_blocks_are_refused_with_the_reason() {
    let file = Model::open(&common::random_model::qwen3moe().write()).unwrap();
    let error = Stage::load(&file, 0..1, options(KvType::Q8_0)).err().expect("refused").to_string();
    assert!(error.contains("blocks of 32") && error.contains("--kv-type f16"), "{error}");
    let deepseek = Model::open(&common::random_model::deepseek2().write()).unwrap();
    let error = Stage::load(&deepseek, 0..1, options(KvType::Q4_0)).err().expect("refused").to_string();
    assert!(error.contains("latent attention"), "{error}");
}

/// `shoal run --kv-type q8_0` reaches every stage: a node's answer is the engine's with that cache, not
/// with F16's (which differs on this prompt).
#[test]
fn a_node_launched_with_a_quantized_cache_answers_as_the_engine_with_it() {
    let (c, _api) = common::one_loopback_node(&[]);
    let model = common::model_path();
    let path = model.to_str().unwrap();
    let run = ["run", path, "--context", "512", "--sequences", "1", "--threads", "1", "--kv-type", "q4_0"];
    let out = c.cli(0, &run);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let name = c.get_json(0, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    let prompt = "The capital of France is";
    let body =
        serde_json::json!({ "model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true });
    let (status, answer) = c.post_json(0, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}");
    let file = Model::open(&model).unwrap();
    let tokenizer = file.tokenizer().unwrap();
    let ids = tokenizer.encode(prompt).unwrap();
    let engine = |kv| {
        let options = StageOptions { context: 512, threads: 1, kv_type: kv, ..StageOptions::default() };
        tokenizer.decode(&oracle::greedy_with(&file, &[], &options, &ids, 16))
    };
    let (q4, f16) = (engine(KvType::Q4_0), engine(KvType::F16));
    assert_ne!(q4, f16, "the prompt tells the two caches apart");
    assert_eq!(answer["choices"][0]["text"], q4.as_str(), "the node's answer");
}

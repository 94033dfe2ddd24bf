//! The new architectures through the whole product: three `shoal node`s serve a GLM-4.5-style
//! mixture-of-experts model, given as a split GGUF set, with its stages on three nodes (one inside the
//! leading dense layers), a DeepSeek V3-style model (latent attention), a gpt-oss-style model
//! (sinks, sliding window, MXFP4 experts), a Qwen3.5-MoE-style model (linear attention with a recurrent
//! state), a Kimi K3-style model (residual checkpoints carried between stages) and a DeepSeek V3.2-style
//! model (sparse attention), and answer exactly as the single-process engine does. Drafting is off: these
//! random F16 models' verification rows round otherwise than one row's (`tests/engine_speculation.rs`),
//! and their repetitive greedy output drafts a lot, so a near tie would tip — what is compared here is
//! the split against one process, token at a time.

mod common;

use common::cluster::TestCluster;
use common::{random_model, split_gguf};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// As many nodes as `layers` names run `model` with those layers (a stage each) and complete two
/// prompts greedily as one process does.
fn check_nodes_answer_like_one_process(model: &Path, layers: &str) {
    let n = layers.split(',').count();
    let mut c = TestCluster::new(n);
    c.form(&[]);
    let path = model.to_str().unwrap();
    let args = ["--layers", layers, "--context", "256", "--sequences", "1", "--threads", "1", "--speculate", "off"];
    let out = c.cli(0, &[&["run", path][..], &args].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());

    let instances = c.get_json(1, "/api/instances");
    let stages = instances[0]["stages"].as_array().unwrap();
    let mut nodes: Vec<&str> = stages.iter().map(|s| s["node"].as_str().unwrap()).collect();
    nodes.dedup();
    assert_eq!((stages.len(), nodes.len()), (n, n), "a stage on each node: {instances:#}");
    let name = c.get_json(n - 1, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();

    for prompt in ["The capital of France is", "Mixture of experts"] {
        let body = json!({ "model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true });
        let (status, answer) = c.post_json(n - 1, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}\n{}", c.logs());
        let text = answer["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text, common::single_process_of(model, prompt, 16), "prompt {prompt:?}");
    }
}

#[test]
fn three_nodes_serve_a_moe_split_set_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let model = random_model::glm4moe();
    let dir = tempfile::tempdir().unwrap();
    let parts = split_gguf::split(&model.write(), dir.path(), "glm-moe", 3);
    check_nodes_answer_like_one_process(&parts[0], "node0:0-0,node1:1-2,node2:3-4");
}

/// The dense layer alone on one node, the latent-attention MoE layers on the others.
#[test]
fn three_nodes_serve_deepseek2_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    check_nodes_answer_like_one_process(&random_model::deepseek2().write(), "node0:0-0,node1:1-2,node2:3-3");
}

/// DeepSeek V3.2's sparse attention on three nodes: each keeps its layers' latents and indexer keys
/// and narrows its own layers' attention to the positions their indexers choose.
#[test]
fn three_nodes_serve_deepseek32_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let model = common::random_sparse::deepseek32().write();
    check_nodes_answer_like_one_process(&model, "node0:0-0,node1:1-2,node2:3-3");
}

/// MiniMax M3's block-sparse attention on three nodes: the dense layer alone, then the sparse layers,
/// each node caching its layers' indexer keys beside their keys.
#[test]
fn three_nodes_serve_minimax_m3_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let model = common::random_sparse::minimax_m3().write();
    check_nodes_answer_like_one_process(&model, "node0:0-0,node1:1-2,node2:3-3");
}

/// GLM-5.2's sparse attention on two nodes, each beginning at a layer with its own indexer (the layers
/// after it reuse its choice); a range beginning at a layer without one is refused with the reason.
#[test]
fn two_nodes_serve_glm_dsa_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let model = common::random_sparse::glm_dsa().write();
    check_nodes_answer_like_one_process(&model, "node0:0-2,node1:3-4");
    let mut c = TestCluster::new(2);
    c.form(&[]);
    let args = ["run", model.to_str().unwrap(), "--layers", "node0:0-1,node1:2-4", "--context", "256"];
    let out = c.cli(0, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot begin at layer 2"), "{stderr}");
}

/// One node with both kinds of layers, one with a sliding layer only, one with a global layer only.
#[test]
fn three_nodes_serve_gpt_oss_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    check_nodes_answer_like_one_process(&random_model::gpt_oss().write(), "node0:0-1,node1:2-2,node2:3-3");
}

/// Qwen3.5-MoE's hybrid layers: a linear layer alone on one node, a full and a linear layer on the
/// next, a full layer on the last; each node keeps its own layers' recurrent state or KV rows.
#[test]
fn three_nodes_serve_qwen35moe_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    check_nodes_answer_like_one_process(&random_model::qwen35moe().write(), "node0:0-0,node1:1-2,node2:3-3");
}

/// Kimi K3's residual checkpoints cross the network with the hidden state: the boundaries after layer
/// 0 (one checkpoint) and after layer 2 (two) carry 2 and 3 embeddings per token.
#[test]
fn three_nodes_serve_kimi_k3_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let model = common::random_kimi::kimi_k3().write();
    check_nodes_answer_like_one_process(&model, "node0:0-0,node1:1-2,node2:3-4");
}

/// A node of a qwen35moe instance killed: the owner places the model again on the nodes left, each
/// stage starting its recurrent state afresh, and it answers as one process does.
#[test]
fn a_killed_node_of_a_qwen35moe_instance_is_placed_again_and_answers_the_same() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.form(&[]);
    let model = random_model::qwen35moe().write();
    let path = model.to_str().unwrap();
    let args =
        ["run", path, "--layers", "node0:0-1,node2:2-3", "--context", "256", "--sequences", "1", "--threads", "1"];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let old = c.get_json(0, "/api/instances")[0]["id"].as_str().unwrap().to_string();
    c.kill(2);
    c.wait_for(Duration::from_secs(60), "the model to be placed again and ready", || {
        let instances = c.get_json(0, "/api/instances");
        let list = instances.as_array().unwrap();
        list.iter().any(|i| i["id"] == old.as_str() && i["state"] == "replaced")
            && list.iter().any(|i| i["state"] == "ready")
    });
    let name = c.get_json(0, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    let prompt = "The capital of France is";
    let body = json!({ "model": name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true });
    let (status, answer) = c.post_json(0, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}\n{}", c.logs());
    assert_eq!(answer["choices"][0]["text"].as_str().unwrap(), common::single_process_of(&model, prompt, 12));
}

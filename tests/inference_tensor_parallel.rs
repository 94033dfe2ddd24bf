//! Tensor-parallel instances with real processes on real sockets: nodes in their own network
//! namespaces each run a rank holding a slice of every layer, the ranks connect to each other over the
//! cluster's authenticated links and sum their parts twice per layer. An instance over 2 and over 3
//! nodes answers greedy requests exactly as the same group run as threads of one process does (the
//! same slices, summed in the same order: bit for bit), reports every rank's steps and sums' time, and
//! shows each rank's slice; over 2 nodes, one of them short of memory for half the model, that node
//! holds a smaller share. A rank's node killed mid-generation ends the stream with a clear error within
//! the failure detector's bound, the other nodes stay up, and the owner places the model again by
//! itself (on the nodes left) so that requests are served again.

mod common;

use common::cluster::TestCluster;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";
const PROMPTS: [(&str, usize); 2] = [("The capital of France is", 12), ("Write a short poem about the sea.", 16)];

fn launch(c: &TestCluster, nodes: &str) -> Value {
    launch_as(c, nodes, "tensor")
}

/// Launches the model on `nodes` split as `parallel` says (tensor or chain).
fn launch_as(c: &TestCluster, nodes: &str, parallel: &str) -> Value {
    let model = common::model_path();
    let args = [
        "run",
        model.to_str().unwrap(),
        "--parallel",
        parallel,
        "--nodes",
        nodes,
        "--context",
        "512",
        "--sequences",
        "2",
        "--threads",
        "1",
    ];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mode = if parallel == "tensor" { "tensor parallel over" } else { "a chain of groups" };
    assert!(stdout.contains(mode), "the preview names the mode: {stdout}");
    assert!(stdout.contains("% heads"), "the preview gives each node's share: {stdout}");
    c.get_json(0, "/api/instances").as_array().unwrap().iter().find(|i| i["state"] == "ready").cloned().unwrap()
}

fn complete(c: &TestCluster, i: usize, prompt: &str, max_tokens: usize) -> (u16, Value) {
    c.post_json(
        i,
        "/v1/completions",
        json!({ "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true }),
    )
}

/// The instance answers every prompt as the group with its ranks' `shares` in one process does,
/// through any node.
fn answers_as_the_group_in_one_process(c: &TestCluster, shares: &[f64]) {
    for (i, &(prompt, n)) in PROMPTS.iter().enumerate() {
        let (status, answer) = complete(c, i % c.nodes.len(), prompt, n);
        assert_eq!(status, 200, "{answer}\n{}", c.logs());
        assert_eq!(
            answer["choices"][0]["text"].as_str().unwrap(),
            common::group_process(prompt, n, shares),
            "shares {shares:?}: {prompt:?}"
        );
    }
}

/// What the most and the least a rank of an equal group of `ranks` needs at the test's launch (512
/// tokens of context, 2 requests, the default batch of 512).
fn equal_rank_bytes(ranks: usize) -> (u64, u64) {
    let model = shoal::model::Model::open(&common::model_path()).unwrap();
    let needs = shoal::placement::ModelNeeds::of(&model, 512, 2, 512);
    let group = needs.groups.iter().find(|g| g.ranks == ranks).unwrap();
    let totals: Vec<u64> = group.slices.iter().map(|(s, w)| needs.rank(s, *w).total()).collect();
    (*totals.iter().max().unwrap(), *totals.iter().min().unwrap())
}

#[test]
fn two_and_three_nodes_hold_slices_of_every_layer_and_answer_as_the_group_in_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    // node2 offers less than half the model needs, and more than a third: over two nodes it holds a
    // smaller share than node1, over three it can hold an equal one.
    let (half, third) = (equal_rank_bytes(2).1, equal_rank_bytes(3).0);
    assert!(third + 8_000_000 < half, "a third ({third}) and a half ({half}) of the model are far enough apart");
    let limit = format!("{}MB", (third + half) / 2 / 1_000_000);
    c.form_with(&[], &[&[], &[], &["--memory-limit", &limit]]);
    for (nodes, ranks) in [("node1,node2", 2), ("node0,node1,node2", 3)] {
        let info = launch(&c, nodes);
        assert_eq!(info["plan"]["parallel"], "tensor");
        // Launched as soon as the cluster formed: planned from the links' probes (tens of µs per round
        // trip on veth), not from the millisecond assumed for a link not yet probed, which would put
        // 2 sums × 30 layers × 500 µs on the links.
        let link_us = info["plan"]["ring_us"].as_u64().unwrap();
        if link_us >= 30_000 {
            let links: Vec<String> = c.get_json(0, "/api/cluster")["links"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| format!("echo {} heartbeat p50 {} errors {}", l["echo_rtt_us"], l["rtt_p50_us"], l["errors"]))
                .collect();
            panic!("{nodes}: {link_us} µs per token on links, as if not yet probed (or probed while the cores were busy); links now: {links:?}");
        }
        let stages = info["stages"].as_array().unwrap();
        assert_eq!(stages.len(), ranks);
        let shares: Vec<f64> =
            info["plan"]["stages"].as_array().unwrap().iter().map(|s| s["share"].as_f64().unwrap()).collect();
        let held: Vec<u64> = stages
            .iter()
            .map(|s| {
                s["slice"]["query_heads"]["end"].as_u64().unwrap()
                    - s["slice"]["query_heads"]["start"].as_u64().unwrap()
            })
            .collect();
        if ranks == 2 {
            assert!(
                held[1] < held[0],
                "node2, short of memory for half, holds fewer heads: {held:?}, shares {shares:?}"
            );
        }
        let names: Vec<&str> = stages.iter().map(|s| s["node_name"].as_str().unwrap()).collect();
        assert_eq!(names.join(","), nodes, "the ranks are the nodes asked for, in order");
        // Every rank holds every layer and its own heads: together each head once.
        let mut heads = Vec::new();
        for s in stages {
            assert_eq!(s["layers"], json!({ "start": 0, "end": 30 }));
            let slice = &s["slice"];
            heads
                .extend(slice["query_heads"]["start"].as_u64().unwrap()..slice["query_heads"]["end"].as_u64().unwrap());
        }
        assert_eq!(heads, (0..9).collect::<Vec<_>>());
        // Each node's worker was started as its rank.
        for (rank, node) in names.iter().enumerate() {
            let i = node.trim_start_matches("node").parse::<usize>().unwrap();
            let workers: Vec<String> = c.descendants(i).into_iter().map(|(_, cmd)| cmd).collect();
            assert!(
                workers.iter().any(|cmd| cmd.contains(&format!("--tensor-rank {rank} "))),
                "{node} runs rank {rank}: {workers:?}"
            );
        }
        answers_as_the_group_in_one_process(&c, &shares);
        // Every rank reports its steps, their compute time and its sums' time (stats come each second).
        c.wait_for(Duration::from_secs(5), "every rank's steps and sum time", || {
            let instances = c.get_json(0, "/api/instances");
            let ready = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").cloned().unwrap();
            ready["stages"].as_array().unwrap().iter().all(|s| {
                let stats = &s["stats"];
                stats["allreduce_p50_us"].as_u64().is_some()
                    && stats["steps"].as_u64() > Some(0)
                    && stats["compute_us_total"].as_u64() > Some(0)
            })
        });
        let id = info["id"].as_str().unwrap().to_string();
        let out = c.cli(0, &["stop", &id]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        c.wait_for(Duration::from_secs(15), "the instance to stop", || {
            c.get_json(0, "/api/instances").as_array().unwrap().iter().all(|i| i["state"] != "ready")
        });
        // Its workers' memory is node2's to offer again once they are gone.
        c.wait_for(Duration::from_secs(15), "node2 to offer its memory again", || {
            c.status(0).is_some_and(|s| {
                s.nodes
                    .iter()
                    .any(|n| n.name == "node2" && n.telemetry.as_ref().is_some_and(|t| t.memory_offer > third))
            })
        });
    }
}

/// A chain's groups and stages as the plan gives them, in ring order: each one's layers and its ranks'
/// shares (one share: a whole stage).
fn chain_of(info: &Value) -> Vec<(std::ops::Range<usize>, Vec<f64>)> {
    let mut chain: Vec<(usize, std::ops::Range<usize>, Vec<f64>)> = Vec::new();
    for s in info["plan"]["stages"].as_array().unwrap() {
        let place = s["ring_stage"].as_u64().unwrap() as usize;
        let layers = s["layers"]["start"].as_u64().unwrap() as usize..s["layers"]["end"].as_u64().unwrap() as usize;
        let share = s["share"].as_f64();
        match chain.last_mut() {
            Some((p, _, shares)) if *p == place => shares.push(share.unwrap()),
            _ => chain.push((place, layers, vec![share.unwrap_or(1.0)])),
        }
    }
    chain.into_iter().map(|(_, layers, shares)| (layers, shares)).collect()
}

/// Three nodes as a chain: a group of two ranks over some of the layers and one node running the
/// others whole (placement picks which nodes form the group and where the layers are cut). The ranks
/// link to each other first, then the ring links the group's leader and the whole stage; the
/// instance answers exactly as the same chain run as threads of one process does. A node of it
/// killed mid-generation ends the stream within seconds, and the model is placed again by itself.
#[test]
fn three_nodes_as_a_group_chained_with_a_stage_answer_as_the_chain_in_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("chained groups need network namespaces (root)");
    }
    c.form(&[]);
    let info = launch_as(&c, "node0,node1,node2", "chain");
    assert_eq!(info["plan"]["parallel"], "chain");
    let chain = chain_of(&info);
    assert_eq!(chain.iter().map(|(_, shares)| shares.len()).sum::<usize>(), 3, "{chain:?}");
    assert_eq!(chain.len(), 2, "a group of two and a whole stage: {chain:?}");
    assert_eq!((chain[0].0.start, chain[0].0.end, chain[1].0.end), (0, chain[1].0.start, 30), "{chain:?}");
    // The group's workers are its ranks at the group's place in the ring; the whole stage is told its
    // own place (its index among the instance's stages is another number).
    let stages = info["stages"].as_array().unwrap();
    for (i, s) in info["plan"]["stages"].as_array().unwrap().iter().enumerate() {
        let node = stages[i]["node_name"].as_str().unwrap();
        let workers: Vec<String> =
            c.descendants(node.trim_start_matches("node").parse().unwrap()).into_iter().map(|(_, cmd)| cmd).collect();
        let place = s["ring_stage"].as_u64().unwrap();
        let expected = if s["share"].is_f64() {
            format!("--group-stage {place} --group-stages 2")
        } else {
            format!("--stage {place} --stages 2 ")
        };
        assert!(workers.iter().any(|cmd| cmd.contains(&expected)), "{node} runs {expected:?}: {workers:?}");
    }
    for (i, &(prompt, n)) in PROMPTS.iter().enumerate() {
        let (status, answer) = complete(&c, i % c.nodes.len(), prompt, n);
        assert_eq!(status, 200, "{answer}\n{}", c.logs());
        assert_eq!(
            answer["choices"][0]["text"].as_str().unwrap(),
            common::chain_process(prompt, n, &chain),
            "{prompt:?}"
        );
    }

    // A node of the chain other than the owner killed mid-generation (the group's follower where it
    // can be): the stream ends with an error within the failure detector's bound, and the model is
    // placed again on the two nodes left.
    let plan_stages = info["plan"]["stages"].as_array().unwrap();
    let follows = |i: usize| i > 0 && plan_stages[i - 1]["ring_stage"] == plan_stages[i]["ring_stage"];
    let not_owner = |i: &usize| plan_stages[*i]["node_name"] != "node0";
    let victim = (0..plan_stages.len())
        .filter(not_owner)
        .find(|&i| follows(i))
        .or_else(|| (0..plan_stages.len()).find(not_owner))
        .unwrap();
    let victim: usize = plan_stages[victim]["node_name"].as_str().unwrap().trim_start_matches("node").parse().unwrap();
    killed_mid_generation_then_served_again(&mut c, &info, victim);
}

/// Streams a long completion through node `i`: says when tokens come, returns the text, the error it
/// ended with and when.
fn stream(
    c: &TestCluster,
    i: usize,
    started: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<(String, Option<String>, Instant)> {
    let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[i].api_port);
    let body = json!({ "model": MODEL, "prompt": "Once upon a time", "max_tokens": 10_000, "temperature": 0, "ignore_eos": true, "stream": true });
    c.in_network(i, move || {
        use std::io::BufRead;
        let response = ureq::post(&url).send_json(body).expect("the stream starts");
        let (mut text, mut error) = (String::new(), None);
        for line in std::io::BufReader::new(response.into_body().into_reader()).lines() {
            let Ok(line) = line else {
                error = Some("the connection broke".to_string());
                break;
            };
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            if let Some(message) = chunk["error"]["message"].as_str() {
                error = Some(message.to_string());
                continue;
            }
            if text.is_empty() {
                let _ = started.send(());
            }
            text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or_default());
        }
        (text, error, Instant::now())
    })
}

#[test]
fn a_rank_killed_mid_generation_ends_the_stream_and_the_model_serves_again() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    c.form(&[]);
    let info = launch(&c, "node1,node2");
    killed_mid_generation_then_served_again(&mut c, &info, 2);
}

/// Streams a long completion through node0 and kills node `victim` once tokens flow: the stream ends
/// with an error (not a silent stop) within twice the failure detector's bound, the other nodes stay
/// up, and the owner places the model (`info`, the instance) again by itself so that it serves again,
/// answering as its new placement does in one process.
fn killed_mid_generation_then_served_again(c: &mut TestCluster, info: &Value, victim: usize) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let streaming = stream(c, 0, started_tx);
    started.recv_timeout(Duration::from_secs(30)).expect("tokens arrive");
    c.kill(victim);
    let killed = Instant::now();
    let (text, error, ended) = streaming.join().unwrap();
    assert!(!text.is_empty());
    let error = error.expect("the stream ends with an error, not a silent stop");
    let took = ended.duration_since(killed);
    eprintln!("the request ended {took:?} after node{victim} was killed: {error}");
    let bound = 2 * shoal::cluster::health::DOWN_AFTER;
    assert!(took <= bound, "the request took {took:?} to end (bound {bound:?})");
    for i in (0..c.nodes.len()).filter(|&i| i != victim) {
        assert!(c.status(i).is_some(), "node{i} is still up");
    }
    let old = info["id"].as_str().unwrap().to_string();
    c.wait_for(Duration::from_secs(60), "the model to be placed again and ready", || {
        let instances = c.get_json(0, "/api/instances");
        let list = instances.as_array().unwrap();
        let replaced = list.iter().any(|i| i["id"] == old.as_str() && i["state"] == "replaced");
        replaced && list.iter().any(|i| i["state"] == "ready")
    });
    let (status, answer) = complete(c, 0, PROMPTS[0].0, PROMPTS[0].1);
    assert_eq!(status, 200, "the model serves again: {answer}");
    // And answers as its new placement does in one process (a group, a chain or stages of the nodes left).
    let instances = c.get_json(0, "/api/instances");
    let placed = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").unwrap();
    let chain = chain_of(placed);
    assert_eq!(
        answer["choices"][0]["text"].as_str().unwrap(),
        common::chain_process(PROMPTS[0].0, PROMPTS[0].1, &chain),
        "the answer after the rank was lost, placed again as {chain:?}"
    );
}

/// Kimi K3 divided across two nodes: each rank holds its heads of the delta-attention layers (their
/// projections, convolutions and recurrent state) and of the latent attention, its experts, and sums
/// its parts over the links; the residual checkpoints every rank computes whole. The instance answers
/// as the same group in one process.
#[test]
fn two_nodes_divide_a_kimi_k3_and_answer_as_the_group_in_one_process() {
    two_nodes_divide_and_answer_as_the_group_in_one_process(&common::random_kimi::kimi_k3_softplus().write());
}

/// Qwen3.5-MoE divided across two nodes: each rank holds its value heads of the gated delta-net layers
/// (with every key head) and their recurrent state, its heads of the full-attention layers, its experts.
#[test]
fn two_nodes_divide_a_qwen35moe_and_answer_as_the_group_in_one_process() {
    two_nodes_divide_and_answer_as_the_group_in_one_process(&common::random_model::qwen35moe().write());
}

fn two_nodes_divide_and_answer_as_the_group_in_one_process(model: &std::path::Path) {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    c.form(&[]);
    let path = model.to_str().unwrap();
    let args = ["run", path, "--parallel", "tensor", "--nodes", "node0,node1", "--context", "512", "--threads", "1"];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let instances = c.get_json(0, "/api/instances");
    let info = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").unwrap();
    assert_eq!(info["plan"]["parallel"], "tensor", "{info:#}");
    let shares: Vec<f64> =
        info["plan"]["stages"].as_array().unwrap().iter().map(|s| s["share"].as_f64().unwrap()).collect();
    assert_eq!(shares.len(), 2);
    let name = c.get_json(1, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    for (prompt, n) in PROMPTS {
        let body = json!({ "model": name, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true });
        let (status, answer) = c.post_json(1, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}\n{}", c.logs());
        let text = answer["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text, common::group_process_of(model, prompt, n, &shares), "{prompt:?}");
    }
}

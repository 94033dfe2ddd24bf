//! Speculative decoding through real nodes (issue 50): a request drafts the tokens that followed its
//! last few tokens earlier in its prompt or reply (prompt lookup), the model runs them in one step, and
//! the sampler keeps those it agrees with. Greedy answers are exactly what one process decoding a token
//! at a time gives — on one node, with requests batched, after a client hangs up mid-draft, and on a
//! pipeline of three netns nodes and a tensor-parallel group of two, where the drafts travel to the
//! last stage ahead of the step. The APIs and `shoal ps` count the drafts kept.
//!
//! The nodes run without the prompt cache: a prompt given back but its last token runs that token
//! alone, whose logits round otherwise than the whole prompt's in one step, and this prompt's first
//! greedy token tips on it (with or without drafts) — a difference that is not speculation's.

mod common;

use common::cluster::TestCluster;
use serde_json::{json, Value};
use std::time::Duration;

/// A code edit: the model is asked to write a function again under another name, which it does by
/// copying the body — what prompt lookup drafts well.
const CODE_EDIT: &str = "fn area(width: u32, height: u32) -> u32 {
    let area = width * height;
    println!(\"the area is {}\", area);
    if area > 100 {
        println!(\"that is a large area\");
    }
    area
}

// The same function again, named surface:
fn surface(width: u32, height: u32) -> u32 {
";

/// One node on loopback without the prompt cache (see the top of the file), started and ready.
fn one_node() -> TestCluster {
    let mut c = TestCluster::with_network(1, common::cluster::Network::Loopback);
    c.env.push(("SHOAL_PROMPT_CACHE".into(), "0".into()));
    c.start(0, &[]);
    c.wait_ready(0);
    c
}

/// Launches the test model on node 0 of `c` with these options; the name the APIs serve it by.
fn launch(c: &TestCluster, extra: &[&str]) -> String {
    let path = common::model_path();
    let args = [&["run", path.to_str().unwrap(), "--context", "512", "--threads", "1"][..], extra].concat();
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    c.get_json(0, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string()
}

/// A completion of `prompt` (greedy unless `sampling` says): its text and usage.
fn complete(c: &TestCluster, name: &str, prompt: &str, max_tokens: usize, sampling: Value) -> (String, Value) {
    let mut body = json!({ "model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": true });
    body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
    let (status, answer) = c.post_json(0, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}\n{}", c.logs());
    (answer["choices"][0]["text"].as_str().unwrap().to_string(), answer["usage"].clone())
}

fn kept(usage: &Value) -> u64 {
    usage["completion_tokens_details"]["accepted_prediction_tokens"].as_u64().unwrap()
}

/// The code edit, greedy: the text one process gives decoding a token at a time, with drafts kept.
fn check_the_code_edit_answers_as_one_process(c: &TestCluster, name: &str, expected: &str) -> Value {
    let (text, usage) = complete(c, name, CODE_EDIT, 48, json!({}));
    assert_eq!(text, expected, "the code edit with speculation");
    assert!(kept(&usage) > 0, "the copied body came from drafts: {usage}");
    let rejected = usage["completion_tokens_details"]["rejected_prediction_tokens"].as_u64().unwrap();
    eprintln!("code edit: {} of {} drafted tokens kept", kept(&usage), kept(&usage) + rejected);
    usage
}

#[test]
fn one_node_drafts_from_the_prompt_and_answers_as_one_process() {
    let c = one_node();
    let name = launch(&c, &["--sequences", "2", "--speculate", "on"]);
    let expected = common::single_process(CODE_EDIT, 48);
    check_the_code_edit_answers_as_one_process(&c, &name, &expected);

    // Two requests at once, each verifying its own drafts in the same steps.
    let other = "one two three four five, one two three four five, one two three";
    let other_expected = common::single_process(other, 32);
    let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[0].api_port);
    let requests: Vec<_> = [(CODE_EDIT, 48), (other, 32)]
        .into_iter()
        .map(|(prompt, max_tokens)| {
            let url = url.clone();
            let body = json!({ "model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "ignore_eos": true });
            std::thread::spawn(move || {
                let answer: Value = ureq::post(&url).send_json(body).unwrap().body_mut().read_json().unwrap();
                answer["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let answers: Vec<String> = requests.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(answers, vec![expected.clone(), other_expected], "batched, each with its own drafts");

    // A client hanging up while its drafts are on the way: the request ends and its slot is free.
    // (A stage's counters reach the API with its next report: each check waits for the count so far.)
    let head = || c.get_json(0, "/api/instances")[0]["stages"][0]["stats"].clone();
    let counted = |requests: u64| {
        c.wait_for(Duration::from_secs(30), &format!("stage 0 to count {requests} requests ended"), || {
            let stats = head();
            stats["requests"].as_u64() == Some(requests) && stats["active_requests"] == 0
        });
    };
    counted(3);
    let generated = head()["generated_tokens"].as_u64().unwrap();
    {
        use std::io::BufRead;
        let body = json!({ "model": name, "prompt": CODE_EDIT, "max_tokens": 400, "temperature": 0,
                           "ignore_eos": true, "stream": true });
        let response = ureq::post(&url).send_json(body).unwrap();
        let mut reader = std::io::BufReader::new(response.into_body().into_reader());
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 && !line.contains(r#""text":"#) {
            line.clear();
        }
    }
    counted(4);
    let after = head()["generated_tokens"].as_u64().unwrap() - generated;
    assert!(after < 400, "the request went on for all its {after} tokens after its client hung up");
    check_the_code_edit_answers_as_one_process(&c, &name, &expected);

    // Sampled requests verify drafts by the distribution (its test is the sampler's); here they run.
    let sampled = json!({ "temperature": 0.7, "seed": 3 });
    let (text, usage) = complete(&c, &name, CODE_EDIT, 32, sampled);
    assert!(!text.is_empty() && usage["completion_tokens"] == 32, "{usage}");

    // The counters reach `shoal ps` and the instance's stats.
    counted(6);
    let stats = head();
    assert!(stats["accepted_tokens"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["drafted_tokens"].as_u64() >= stats["accepted_tokens"].as_u64(), "{stats}");
    let ps = String::from_utf8_lossy(&c.cli(0, &["ps"]).stdout).into_owned();
    assert!(ps.contains("speculation: ") && ps.contains("drafted tokens kept"), "{ps}");
}

/// With drafting off, nothing is drafted and the answer is the same.
#[test]
fn drafting_off_drafts_nothing() {
    let c = one_node();
    // A launch asking for more drafted tokens than a step may carry is refused, saying the range.
    let out = c.cli(0, &["run", common::model_path().to_str().unwrap(), "--draft-tokens", "33"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 to 32"), "{}", String::from_utf8_lossy(&out.stderr));
    let name = launch(&c, &["--sequences", "1", "--speculate", "off"]);
    let (text, usage) = complete(&c, &name, CODE_EDIT, 24, json!({}));
    assert_eq!(text, common::single_process(CODE_EDIT, 24));
    assert_eq!(kept(&usage), 0, "{usage}");
    assert_eq!(usage["completion_tokens_details"]["rejected_prediction_tokens"], 0, "{usage}");
}

/// Three stages on three netns nodes: the drafts travel ahead of the step to the last stage, which
/// verifies them; and a tensor-parallel group of two, whose ranks compute every drafted row.
#[test]
fn a_pipeline_and_a_tensor_parallel_group_verify_drafts_as_one_process_does() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.env.push(("SHOAL_PROMPT_CACHE".into(), "0".into()));
    c.form(&[]);
    let name = launch(&c, &["--layers", "node0:0-9,node1:10-19,node2:20-29", "--speculate", "on"]);
    check_the_code_edit_answers_as_one_process(&c, &name, &common::single_process(CODE_EDIT, 48));
    let out = c.cli(0, &["stop", &name]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    let name = launch(&c, &["--parallel", "tensor", "--nodes", "node0,node1", "--speculate", "on"]);
    let instances = c.get_json(0, "/api/instances");
    let info = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").unwrap().clone();
    assert_eq!(info["plan"]["parallel"], "tensor", "{info:#}");
    let shares: Vec<f64> =
        info["plan"]["stages"].as_array().unwrap().iter().map(|s| s["share"].as_f64().unwrap()).collect();
    let expected = common::group_process(CODE_EDIT, 48, &shares);
    check_the_code_edit_answers_as_one_process(&c, &name, &expected);
}

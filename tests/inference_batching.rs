//! Continuous batching with real processes: concurrent greedy requests — of different prompts and
//! lengths, one joining while the others decode, one whose client hangs up mid-way — each give exactly
//! what they give alone, on one node and through three nodes of a split ring, and the stages really ran
//! several requests per step. A full queue answers 429 at once with a clear message, the requests that
//! waited report their wait, a hung-up request frees its slot, and nothing hangs.

mod common;

use common::cluster::TestCluster;
use serde_json::{json, Value};
use std::io::BufRead;
use std::sync::mpsc;
use std::time::Duration;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

/// Prompts and how many tokens each decodes.
const CASES: [(&str, usize); 4] = [
    ("The capital of France is", 24),
    ("Write a short poem about the sea.", 9),
    ("1, 2, 3, 4,", 31),
    ("<|im_start|>user\nName three rivers.<|im_end|>\n<|im_start|>assistant\n", 16),
];

/// Launches the model as a pipeline (a ring of layer ranges, what these tests batch through; placement
/// might otherwise chain a group with a stage where memory is short).
fn launch(c: &TestCluster, context: &str, sequences: &str) {
    let model = common::model_path();
    let args = [
        "run",
        model.to_str().unwrap(),
        "--context",
        context,
        "--sequences",
        sequences,
        "--threads",
        "1",
        "--parallel",
        "pipeline",
    ];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
}

fn body(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({ "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "stream": stream })
}

/// A whole completion from node `i` in a thread of its network: the status and the answer.
fn complete(c: &TestCluster, i: usize, prompt: &str, max_tokens: usize) -> std::thread::JoinHandle<(u16, Value)> {
    let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[i].api_port);
    let body = body(prompt, max_tokens, false);
    c.in_network(i, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = agent.post(&url).send_json(body).expect("the API answers");
        (response.status().as_u16(), response.body_mut().read_json().unwrap_or(Value::Null))
    })
}

/// Streams a completion from node `i`: says on `first` when its first text came, then reads on until
/// `hang_up` says to stop (the connection is dropped, which cancels the request) or the stream ends;
/// returns the text.
fn stream(
    c: &TestCluster,
    i: usize,
    prompt: &str,
    max_tokens: usize,
    first: mpsc::Sender<()>,
    hang_up: Option<mpsc::Receiver<()>>,
) -> std::thread::JoinHandle<String> {
    let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[i].api_port);
    let body = body(prompt, max_tokens, true);
    c.in_network(i, move || {
        let response = ureq::post(&url).send_json(body).expect("the stream starts");
        let mut text = String::new();
        for line in std::io::BufReader::new(response.into_body().into_reader()).lines() {
            let line = line.expect("the stream goes on");
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            assert!(chunk["error"].is_null(), "the stream failed: {chunk}");
            let piece = chunk["choices"][0]["text"].as_str().unwrap_or_default();
            if text.is_empty() && !piece.is_empty() {
                let _ = first.send(());
                if let Some(hang_up) = &hang_up {
                    let _ = hang_up.recv();
                    return text + piece;
                }
            }
            text.push_str(piece);
        }
        text
    })
}

fn head_stats(c: &TestCluster) -> Value {
    c.get_json(0, "/api/instances")[0]["stages"][0]["stats"].clone()
}

/// A prompt of about 250 tokens: run in chunks beside the others' decode rows on one node, and cut
/// into chunks that follow each other through the stages of a ring.
fn long_prompt() -> String {
    (0..60).map(|i| format!("item {i},")).collect::<Vec<_>>().join(" ")
}

/// The four cases and a long prompt at once — the first alone until its first token, then the others
/// joining it, and another request whose client hangs up after its first token — each equal to the one
/// process's answer (which runs each prompt in one piece); every stage ran steps of several requests.
fn concurrent_requests_give_what_each_gives_alone(c: &TestCluster) {
    let (first_tx, first_rx) = mpsc::channel();
    let (first_prompt, first_tokens) = CASES[0];
    let leader = stream(c, 0, first_prompt, first_tokens, first_tx.clone(), None);
    first_rx.recv_timeout(Duration::from_secs(60)).expect("the first request streams");
    let (hang_up_tx, hang_up_rx) = mpsc::channel();
    let quitter = stream(c, 1 % c.nodes.len(), "Once upon a time", 400, first_tx, Some(hang_up_rx));
    let long = long_prompt();
    let others: Vec<(&str, usize)> = CASES[1..].iter().copied().chain([(long.as_str(), 6)]).collect();
    let joined: Vec<_> = others.iter().map(|&(prompt, n)| complete(c, c.nodes.len() - 1, prompt, n)).collect();
    first_rx.recv_timeout(Duration::from_secs(60)).expect("the request that hangs up streams");
    hang_up_tx.send(()).unwrap();
    quitter.join().unwrap();
    assert_eq!(leader.join().unwrap(), common::single_process(first_prompt, first_tokens), "the first request");
    for (&(prompt, n), handle) in others.iter().zip(joined) {
        let (status, answer) = handle.join().unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["text"].as_str().unwrap(), common::single_process(prompt, n), "{prompt:?}");
    }
    // The request that hung up ends and frees its slot: nothing stays active.
    c.wait_for(Duration::from_secs(30), "every request to end", || head_stats(c)["active_requests"] == 0);
    let instances = c.get_json(0, "/api/instances");
    for stage in instances[0]["stages"].as_array().unwrap() {
        let (steps, rows) = (stage["stats"]["steps"].as_u64().unwrap(), stage["stats"]["rows"].as_u64().unwrap());
        assert!(
            rows > steps,
            "stage {} ran no step of several requests ({rows} rows in {steps} steps)",
            stage["layers"]
        );
    }
}

#[test]
fn one_node_batches_concurrent_requests_exactly() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(1);
    c.form(&[]);
    launch(&c, "512", "4");
    concurrent_requests_give_what_each_gives_alone(&c);
}

#[test]
fn a_full_queue_answers_429_and_the_waiting_requests_report_their_wait() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(1);
    c.form(&[]);
    // One slot: one request runs (long enough to outlast the checks) and at most four wait.
    launch(&c, "2048", "1");
    let (first_tx, first_rx) = mpsc::channel();
    let (hang_up_tx, hang_up_rx) = mpsc::channel();
    let running = stream(&c, 0, "Once upon a time", 2000, first_tx, Some(hang_up_rx));
    first_rx.recv_timeout(Duration::from_secs(60)).expect("the running request streams");
    let waiting: Vec<_> = (0..4).map(|_| complete(&c, 0, CASES[1].0, 3)).collect();
    c.wait_for(Duration::from_secs(30), "four requests to wait", || head_stats(&c)["queued_requests"] == 4);

    let (status, answer) = complete(&c, 0, CASES[1].0, 3).join().unwrap();
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "model_busy", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("busy") && message.contains("try again"), "{message}");

    // The running request's client hangs up: its slot goes to the first in the queue, and so on.
    hang_up_tx.send(()).unwrap();
    running.join().unwrap();
    let want = common::single_process(CASES[1].0, 3);
    for handle in waiting {
        let (status, answer) = handle.join().unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["text"].as_str().unwrap(), want);
        let queued = answer["shoal"]["queue_ms"].as_f64().unwrap();
        assert!(queued > 0.0, "a request that waited for its slot reports its wait: {answer}");
    }
    let (status, answer) = complete(&c, 0, CASES[1].0, 3).join().unwrap();
    assert_eq!((status, answer["shoal"]["queue_ms"].as_f64()), (200, Some(0.0)), "{answer}");
}

#[test]
fn three_nodes_batch_requests_through_a_split_ring() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.form(&["--memory-limit", "80MB"]);
    launch(&c, "512", "4");
    let instances = c.get_json(0, "/api/instances");
    assert_eq!(instances[0]["stages"].as_array().unwrap().len(), 3, "three stages: {instances:#}");
    concurrent_requests_give_what_each_gives_alone(&c);
}

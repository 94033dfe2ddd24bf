//! The command line as a new user meets it, with real `shoal node` processes on loopback: sizes without
//! a unit, contexts and token counts that make no sense refused with what to give instead; one node per
//! data directory; `shoal ps`, `shoal stop` and `shoal status` showing and stopping what runs; a second
//! launch under a running model's name refused (or replacing it with `--replace`); suggested commands
//! that keep the node's address; workers that still start after the node's binary file was replaced; a
//! launch as soon as the node answers; and errors that say each cause once.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::json;
use std::process::Output;
use std::time::{Duration, Instant};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `shoal ARGS` (no node involved).
fn shoal(args: &[&str]) -> Output {
    common::shoal().args(args).output().unwrap()
}

fn refused(out: &Output, says: &str) {
    assert!(!out.status.success(), "accepted: {}", text(out));
    assert!(text(out).contains(says), "the refusal does not say {says:?}: {}", text(out));
}

#[test]
fn numbers_that_make_no_sense_are_refused_with_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    // `--memory-limit 64` used to mean 64 bytes.
    refused(&shoal(&["node", "--data-dir", data_dir, "--memory-limit", "64"]), "add one, e.g. 64GB");
    refused(&shoal(&["chat", "--max-tokens", "0", "--message", "hi"]), "0 would do nothing");
    let model = common::model_path();
    let model = model.to_str().unwrap();
    refused(&shoal(&["generate", "--model", model, "--prompt", "hi", "--max-tokens", "0"]), "0 would do nothing");
    refused(&shoal(&["run", model, "--context", "0"]), "0 would do nothing");
}

#[test]
fn an_error_says_each_cause_once() {
    // It used to say "cannot open the model file …: No such file or directory (os error 2): No such file
    // or directory (os error 2)".
    let missing = "/nonexistent/shoal-cli-test.gguf";
    let out = shoal(&["generate", "--model", missing, "--prompt", "hi"]);
    refused(&out, &format!("cannot open the model file {missing}: "));
    assert_eq!(text(&out).matches("os error 2").count(), 1, "{}", text(&out));
}

/// Starts `shoal node` on `data_dir` beside a running node and returns its output once it exits
/// (within 10 s, or the test fails: it should not start).
fn second_node(data_dir: &std::path::Path) -> Output {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = common::shoal()
        .args(["node", "--bind", "127.0.0.1", "--no-mdns", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(out) => out,
        Err(_) => {
            let _ = std::process::Command::new("kill").arg(pid.to_string()).status();
            panic!("a second node on the same data directory still runs after {:?}", started.elapsed());
        }
    }
}

#[test]
fn one_node_per_data_directory_and_what_runs_is_listed_stopped_and_not_launched_twice() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]); // started, answering, with its telemetry (a launch needs it)
    let api = format!("127.0.0.1:{}", c.nodes[0].api_port);

    // A second node on the same directory would come up as the same identity: it stops at once and
    // names the node in the way.
    let out = second_node(&c.nodes[0].data_dir);
    refused(&out, "is in use by a node (process ");
    assert!(text(&out).contains(&format!("API {api}")), "{}", text(&out));
    assert!(c.status(0).is_some(), "the first node still answers");

    // Without mDNS the join hint carries this node's address.
    let code = c.cli(0, &["code"]);
    assert!(code.status.success(), "{}", text(&code));
    let hint = String::from_utf8_lossy(&code.stderr).to_string();
    assert!(hint.contains("mDNS is off"), "{hint}");
    assert!(hint.contains(&format!("@{}", c.nodes[0].control_addr())), "the address to join through: {hint}");

    let model = common::model_path();
    let model = model.to_str().unwrap();
    // A context beyond what the model was trained on is refused, not clamped in silence.
    refused(&c.cli(0, &["run", model, "--context", "100000"]), "more than the 8192 this model was trained on");
    refused(&c.cli(0, &["run", model, "--batch", "100000"]), "a batch of 100000 tokens cannot be used: give 1 to 8192");

    assert!(String::from_utf8_lossy(&c.cli(0, &["ps"]).stdout).contains("no model runs"));
    // Prompts run in steps of at most 128 tokens.
    let launch = ["run", model, "--context", "256", "--sequences", "1", "--threads", "1", "--batch", "128"];
    let out = c.cli(0, &launch);
    assert!(out.status.success(), "shoal run failed: {}\n{}", text(&out), c.logs());
    let hint = format!("shoal chat --model {MODEL} --node {api}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&hint), "the chat hint keeps --node: {}", text(&out));

    let ps = text(&c.cli(0, &["ps"]));
    let line = ps.lines().find(|l| l.contains(MODEL)).unwrap_or_else(|| panic!("ps lists the model: {ps}"));
    assert!(line.contains("ready") && line.contains("node0 0-29 ready CPU"), "ps names each stage's device: {ps}");
    let first_id = line.split_whitespace().next().unwrap().to_string();
    let status = text(&c.cli(0, &["status"]));
    assert!(status.contains(&first_id) && status.contains(MODEL), "status shows the instance: {status}");
    assert!(!status.contains("GiB"), "sizes in decimal units, as the dashboard shows them: {status}");

    // The same model again is refused, naming what runs and how to stop it.
    let again = c.cli(0, &launch);
    refused(&again, &format!("`{MODEL}` already runs as instance {first_id}"));
    assert!(text(&again).contains("shoal stop"), "{}", text(&again));
    let models = c.get_json(0, "/v1/models");
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");

    // max_tokens 0 runs nothing, and so reports no prefill rate.
    let (code, reply) = c.post_json(
        0,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}),
    );
    assert_eq!(code, 200, "{reply}");
    assert_eq!(reply["shoal"]["prefill_tokens_per_second"], 0.0, "{reply}");

    // --replace stops the running one first.
    let replaced = c.cli(0, &[&launch[..], &["--replace"]].concat());
    assert!(replaced.status.success(), "shoal run --replace failed: {}\n{}", text(&replaced), c.logs());
    let ps = text(&c.cli(0, &["ps"]));
    assert!(!ps.contains(&first_id) && ps.contains(MODEL), "{ps}");
    let all = text(&c.cli(0, &["ps", "--all"]));
    assert!(all.contains(&first_id) && all.contains("stopped"), "{all}");

    let stopped = c.cli(0, &["stop", MODEL]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    assert!(String::from_utf8_lossy(&c.cli(0, &["ps"]).stdout).contains("no model runs"));
    refused(&c.cli(0, &["stop", MODEL]), "no model runs at all");
    // Chat says what became of the last instance, not only that nothing runs.
    let chat = c.cli(0, &["chat", "--message", "Hi"]);
    refused(&chat, &format!("the last one, `{MODEL}` (instance "));
    assert!(text(&chat).contains("stopped"), "{}", text(&chat));
}

#[test]
fn workers_start_after_the_node_binary_is_replaced() {
    let _one_at_a_time = common::cluster::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("shoal");
    std::fs::copy(env!("CARGO_BIN_EXE_shoal"), &copy).unwrap();
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.binary = Some(copy.clone());
    // Launched as soon as the node answers: the node reports what it offers only once it has timed its
    // memory and products, and the launch waits for that rather than finding no node to run on.
    c.start(0, &[]);
    c.wait_ready(0);
    let offered_yet = c.status(0).is_some_and(|s| s.nodes.iter().all(|n| n.telemetry.is_some()));

    // As a rebuild does: the file at the node's path is replaced by another one.
    std::fs::remove_file(&copy).unwrap();
    std::fs::write(&copy, "#!/bin/sh\nexit 3\n").unwrap();
    let model = common::model_path();
    let out = c.cli(0, &["run", model.to_str().unwrap(), "--context", "256", "--sequences", "1", "--threads", "1"]);
    assert!(out.status.success(), "shoal run failed: {}\n{}", text(&out), c.logs());
    if offered_yet {
        common::skipped(
            "the node had reported its telemetry before the launch: its wait was not exercised",
            common::AllowedSkip::TelemetryCameFirst,
        );
    }
    let (code, reply) = c.post_json(
        0,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(code, 200, "{reply}");
    assert!(!reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{reply}");
    // The worker shows the node's path, not a file descriptor.
    let workers = c.descendants(0);
    assert!(workers.iter().any(|(_, cmdline)| cmdline.starts_with(copy.to_str().unwrap())), "{workers:?}");
}

//! Real coding agents against a node (issue 48 item 3), pinned in tests/agents/package.json and
//! installed by `scripts/prerequisites --tests`, run non-interactively on SmolLM2 for a turn and then a
//! resumed session's next turn, which finds the first in the prompt cache: OpenAI's Codex CLI
//! (`codex exec --json`) with a model provider whose base URL is this node's `/v1` and whose wire API is
//! `responses`. Its real request (developer instructions of some 4,500 tokens, function tools, hosted
//! tools the node leaves out, `store: false`) is served, and Codex reads the streamed events and ends
//! the turn with the usage the node reported. SmolLM2 is no coding model: what it answers is not
//! checked, only that the agent and the node understand each other. Claude Code and OpenCode were run
//! by hand (see docs/apis.md): with SmolLM2 their turns run to its context's end, too long for CI.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `codex exec --json ARGS` in `work` against node 0; its events.
fn codex_exec(c: &TestCluster, home: &Path, work: &Path, args: &[&str]) -> Vec<Value> {
    let provider = format!(
        "model_providers.shoal={{name=\"shoal\", base_url=\"http://127.0.0.1:{}/v1\", wire_api=\"responses\"}}",
        c.nodes[0].api_port
    );
    let out = Command::new(agent("codex"))
        .args(["exec", "--json", "--skip-git-repo-check", "-c", "model_provider=shoal", "-c", &provider])
        .args(["-m", "SmolLM2-135M-Instruct.Q4_1"])
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("HOME", home)
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    // A turn that failed exits with 1 (which `turn_end` tells apart); anything else is Codex failing.
    let turn_failed = events.iter().any(|e| e["type"] == "turn.failed");
    assert!(
        out.status.success() || turn_failed,
        "codex exec failed: {}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
    events
}

/// The turn's end: its usage when it completed, or Codex's own words for why it did not.
fn turn_end(events: &[Value]) -> Result<&Value, String> {
    if let Some(done) = events.iter().find(|e| e["type"] == "turn.completed") {
        return Ok(&done["usage"]);
    }
    let failed = events.iter().find(|e| e["type"] == "turn.failed").map(|e| e["error"]["message"].to_string());
    Err(failed.unwrap_or_else(|| format!("no turn ended: {events:?}")))
}

#[test]
fn codex_runs_a_turn_and_resumes_it_through_the_responses_api() {
    // Codex's prompt is some 4,550 SmolLM2 tokens, and Codex sets no reply limit: the instance's own
    // keeps the first turn short enough for the resumed one to fit the context.
    let c = serving("5120", "64");
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();

    let events = codex_exec(&c, home.path(), work.path(), &["Say hello."]);
    match turn_end(&events) {
        Ok(usage) => {
            assert!(usage["input_tokens"].as_u64().unwrap() > 4000, "Codex's whole prompt was counted: {usage}");
            let said = events.iter().any(|e| e["item"]["type"] == "agent_message");
            assert!(said, "Codex showed the reply: {events:?}");
        }
        // At the context's end the response is incomplete, which Codex reports in its own words.
        Err(why) => assert!(why.contains("max_output_tokens"), "{why}\n{events:?}\n{}", c.logs()),
    }
    let first = counters_after(&c, 1);
    assert!(first["prompt_tokens"].as_u64().unwrap() > 4000, "{first}");

    // The session resumed: its next request carries the first turn, which the prompt cache gives back.
    let events = codex_exec(&c, home.path(), work.path(), &["resume", "--last", "Say it again."]);
    if let Err(why) = turn_end(&events) {
        assert!(why.contains("max_output_tokens"), "{why}\n{events:?}\n{}", c.logs());
    }
    let stats = counters_after(&c, first["requests"].as_u64().unwrap() + 1);
    assert!(stats["cached_tokens"].as_u64().unwrap() > 4000, "the first turn came back from the cache: {stats}");

    // A turn beyond the context is refused in the words Codex knows (`context_length_exceeded`).
    let long = "Read this. ".repeat(300);
    let events = codex_exec(&c, home.path(), work.path(), &[long.as_str()]);
    let why = turn_end(&events).expect_err("a prompt beyond the context cannot complete");
    assert!(why.contains("context window"), "Codex saw the context was exceeded: {why}\n{events:?}");
}

/// `tests/agents/node_modules/.bin/NAME`.
fn agent(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents/node_modules/.bin").join(name);
    assert!(bin.exists(), "{name} is missing: run scripts/prerequisites --tests (npm ci in tests/agents)");
    bin
}

/// A node serving SmolLM2 with `context` tokens per request and replies of at most `max_reply` tokens.
fn serving(context: &str, max_reply: &str) -> TestCluster {
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]);
    let model = common::model_path();
    let args = ["--context", context, "--max-reply-tokens", max_reply, "--sequences", "2"];
    let out = c.cli(0, &[&["run", model.to_str().unwrap()][..], &args].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    c
}

/// Stage 0's counters once `requests` requests have finished.
fn counters_after(c: &TestCluster, requests: u64) -> Value {
    let stats = || c.get_json(0, "/api/instances")[0]["stages"][0]["stats"].clone();
    c.wait_for(std::time::Duration::from_secs(10), "the requests' counters", || {
        stats()["requests"].as_u64() >= Some(requests)
    });
    stats()
}

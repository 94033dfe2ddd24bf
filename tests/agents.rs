//! Real coding agents against a node (issue 48 item 3). OpenAI's Codex CLI (`@openai/codex`, pinned in
//! tests/agents/package.json, installed by `scripts/prerequisites --tests`) runs non-interactively
//! (`codex exec --json`) with a model provider whose base URL is this node's `/v1` and whose wire API is
//! `responses`, on SmolLM2: its real request (developer instructions of some 4,500 tokens, its function
//! tools, hosted tools the node leaves out, `store: false`) is served, Codex reads the streamed events
//! and ends the turn with the usage the node reported, and a resumed session's next turn finds the first
//! in the prompt cache. SmolLM2 is no coding model: what it answers is not checked, only that the
//! agent and the node understand each other. Not here yet: Claude Code and OpenCode.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn codex() -> PathBuf {
    let codex = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents/node_modules/.bin/codex");
    assert!(codex.exists(), "Codex is missing: run scripts/prerequisites --tests (npm ci in tests/agents)");
    codex
}

/// Runs `codex exec --json ARGS` in `work` against node 0; its events.
fn codex_exec(c: &TestCluster, home: &Path, work: &Path, args: &[&str]) -> Vec<Value> {
    let provider = format!(
        "model_providers.shoal={{name=\"shoal\", base_url=\"http://127.0.0.1:{}/v1\", wire_api=\"responses\"}}",
        c.nodes[0].api_port
    );
    let out = Command::new(codex())
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
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]);
    let model = common::model_path();
    // Codex's prompt is some 4,550 SmolLM2 tokens: a context a little longer bounds the reply.
    let args = ["run", model.to_str().unwrap(), "--context", "5120", "--sequences", "2"];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
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
    let stats = || c.get_json(0, "/api/instances")[0]["stages"][0]["stats"].clone();
    c.wait_for(std::time::Duration::from_secs(10), "the first turn's counters", || {
        stats()["requests"].as_u64() >= Some(1)
    });
    assert!(stats()["prompt_tokens"].as_u64().unwrap() > 4000, "{}", stats());

    // The session resumed: its next request carries the first turn, which the prompt cache gives back.
    let events = codex_exec(&c, home.path(), work.path(), &["resume", "--last", "Say it again."]);
    if let Err(why) = turn_end(&events) {
        assert!(why.contains("max_output_tokens"), "{why}\n{events:?}\n{}", c.logs());
    }
    c.wait_for(std::time::Duration::from_secs(10), "the second turn's counters", || {
        stats()["requests"].as_u64() >= Some(2)
    });
    let stats = stats();
    assert!(stats["cached_tokens"].as_u64().unwrap() > 4000, "the first turn came back from the cache: {stats}");
}

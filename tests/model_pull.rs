//! `shoal pull` and `POST /api/models/pull` against a hub the test runs on loopback (`common::hub`, in
//! Hugging Face's URL layout with the SmolLM2 file's real sha256 and range support): progress to 100 %,
//! resume after a dropped connection, a corrupted byte, no network.

mod common;

use common::hub::{start_hub, start_hub_on, start_hub_with, until_pull_ends, Faults, HubNode, FILE, REPO};
use shoal::model::pull::{self, Hub, PullProgress, PullRequest, PullState};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

fn request() -> PullRequest {
    PullRequest::parse(&format!("{REPO}:{FILE}")).unwrap()
}

fn downloaded(models: &Path) -> PathBuf {
    models.join(REPO.replace('/', "--")).join(FILE)
}

#[test]
fn pull_reports_progress_to_100_percent_and_the_file_equals_the_source() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let mut reports: Vec<PullProgress> = Vec::new();
    let paths =
        pull::pull(&Hub::new(&hub.endpoint, None), dir.path(), &request(), &mut |p| reports.push(p.clone())).unwrap();
    assert_eq!(paths, vec![downloaded(dir.path())]);
    assert_eq!(std::fs::read(&paths[0]).unwrap(), std::fs::read(common::model_path()).unwrap());
    let last = reports.last().unwrap();
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    assert_eq!((last.state, last.bytes_done, last.bytes_total), (PullState::Done, size, size));
    assert!(reports.iter().any(|p| p.state == PullState::Verifying), "no verifying step reported");
    assert!(reports.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done), "progress went backwards");
    assert!(!PathBuf::from(format!("{}.part", paths[0].display())).exists());
}

#[test]
fn an_interrupted_transfer_resumes_with_a_range_request_and_matches_byte_for_byte() {
    let hub = start_hub(Faults { drop_after: Some(3_000_000), drops: 1, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let out = common::shoal()
        .args(["pull", &format!("{REPO}:{FILE}"), "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .output()
        .unwrap();
    assert!(out.status.success(), "shoal pull failed: {}", String::from_utf8_lossy(&out.stderr));
    let file = downloaded(&dir.path().join("models"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), file.display().to_string());
    assert_eq!(std::fs::read(&file).unwrap(), std::fs::read(common::model_path()).unwrap());
    let ranges = hub.ranges();
    assert_eq!(ranges, vec![None, Some("bytes=3000000-".to_string())], "the resume must fetch only the rest");
}

#[test]
fn a_part_file_left_by_an_earlier_run_is_resumed_from_its_end() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let source = std::fs::read(common::model_path()).unwrap();
    let target = downloaded(dir.path());
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(format!("{}.part", target.display()), &source[..1_234_567]).unwrap();
    pull::pull(&Hub::new(&hub.endpoint, None), dir.path(), &request(), &mut |_| {}).unwrap();
    assert_eq!(hub.ranges(), vec![Some("bytes=1234567-".to_string())]);
    assert_eq!(std::fs::read(&target).unwrap(), source);
}

#[test]
fn a_corrupted_byte_fails_the_checksum_and_leaves_no_file() {
    let hub = start_hub(Faults { corrupt_at: Some(5_000_000), ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let error = pull::pull(&Hub::new(&hub.endpoint, None), dir.path(), &request(), &mut |_| {}).unwrap_err();
    let message = format!("{error:#}");
    assert!(message.contains("checksum") && message.contains("deleted"), "{message}");
    let target = downloaded(dir.path());
    assert!(!target.exists(), "a damaged download was kept as valid");
    assert!(!PathBuf::from(format!("{}.part", target.display())).exists(), "the damaged .part was kept");
}

#[test]
fn a_split_model_is_pulled_whole_when_its_quantization_is_named() {
    let parts: Vec<(String, Vec<u8>)> =
        (1..=3).map(|i| (format!("Q8_0/big-Q8_0-0000{i}-of-00003.gguf"), vec![i as u8; 700_000 + i * 1000])).collect();
    let mut files = parts.clone();
    files.push(("big-Q4_K_M.gguf".into(), vec![9; 1000]));
    // Five entries with the README: the hub lists them over three pages, all of which must be read.
    let hub = start_hub_with(files, Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let hub_client = Hub::new(&hub.endpoint, None);
    let several = pull::pull(&hub_client, dir.path(), &PullRequest::parse(REPO).unwrap(), &mut |_| {});
    let message = several.unwrap_err().to_string();
    assert!(message.contains("big-Q8_0") && message.contains("big-Q4_K_M.gguf"), "{message}");
    let mut last = None;
    let request = PullRequest::parse(&format!("{REPO}:Q8_0")).unwrap();
    let paths = pull::pull(&hub_client, dir.path(), &request, &mut |p| last = Some(p.clone())).unwrap();
    assert_eq!(paths.len(), 3);
    for ((name, data), path) in parts.iter().zip(&paths) {
        assert_eq!(path, &downloaded(dir.path()).with_file_name(name), "parts in order");
        assert_eq!(&std::fs::read(path).unwrap(), data);
    }
    let total: u64 = parts.iter().map(|(_, d)| d.len() as u64).sum();
    let last = last.unwrap();
    assert_eq!((last.state, last.bytes_done, last.bytes_total), (PullState::Done, total, total));
}

#[test]
fn an_unreachable_hub_is_a_clear_error() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = common::shoal()
        .args(["pull", REPO, "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", format!("http://{closed}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach {closed}")) && stderr.contains("HF_ENDPOINT"), "{stderr}");
}

#[test]
fn an_unknown_repository_says_so() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let request = PullRequest::parse("nobody/nothing").unwrap();
    let error = pull::pull(&Hub::new(&hub.endpoint, None), dir.path(), &request, &mut |_| {}).unwrap_err();
    assert!(error.to_string().contains("has no model nobody/nothing"), "{error}");
}

/// A node refuses a malformed `POST /api/models/pull`, downloads on a good one (`REPO:FILE`), reports
/// `model_pull` events up to done, and then lists the model in `GET /api/models`.
#[test]
fn the_api_pulls_in_the_background_with_progress_events() {
    let hub = start_hub(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let (node, events) = HubNode::start("puller", &hub, dir.path());
    let base = node.base.clone();
    // Bad input is refused at once, with the reason and the parameter.
    for bad in ["not-a-repo", "test-org/name:"] {
        node.assert_pull_refused(serde_json::json!({"repo": bad}), "repo");
    }
    // The file is named in `repo`, as `shoal pull` and the dashboard write it.
    let id = node.start_pull(serde_json::json!({"repo": format!("{REPO}:{FILE}")}));
    let mut states = Vec::new();
    let finished = until_pull_ends(events, &id, |event| {
        states.push(event["progress"]["state"].as_str().unwrap().to_string());
    });
    assert_eq!(finished["error"], serde_json::Value::Null, "{finished}");
    assert_eq!(finished["progress"]["bytes_done"], finished["progress"]["bytes_total"]);
    assert!(states.contains(&"downloading".to_string()), "{states:?}");
    let models: serde_json::Value =
        ureq::get(&format!("{base}/api/models")).call().unwrap().into_body().read_json().unwrap();
    drop(node);
    let listed = models.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{models}");
    assert_eq!(listed[0]["runnable"], true, "{models}");
    assert_eq!(listed[0]["source"]["kind"], "shoal");
}

/// The hub answers a download with a redirect to another host (as huggingface.co sends files to its
/// CDN): the pull follows it, whole and by ranges, and the hub's token goes to the hub only.
#[test]
fn a_redirect_to_another_host_is_followed_without_the_token() {
    let files = vec![(FILE.to_string(), std::fs::read(common::model_path()).unwrap())];
    let cdn = start_hub_on("127.0.0.2:0", files, Faults::default());
    let hub = start_hub(Faults { redirect_to: Some(cdn.endpoint.clone()), ..Faults::default() });
    let with_token = Hub::new(&hub.endpoint, Some("hf_secret".into()));
    let dir = tempfile::tempdir().unwrap();
    let paths = pull::pull(&with_token, dir.path(), &request(), &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), std::fs::read(common::model_path()).unwrap());
    let shard_dir = tempfile::tempdir().unwrap();
    shoal::model::shard::pull_shard(&with_token, shard_dir.path(), &request(), 0..2, &mut |_| {}).unwrap();
    assert!(!hub.served().is_empty() && hub.served().iter().all(|s| s.authorized), "the hub gets its token");
    let fetched = cdn.served();
    assert!(fetched.len() >= 2, "both downloads came from the other host: {fetched:?}");
    assert!(fetched.iter().all(|s| !s.authorized), "the token went to another host: {fetched:?}");
}

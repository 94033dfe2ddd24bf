//! Downloads of GGUF models from a Hugging Face–compatible hub (`HF_ENDPOINT`, default huggingface.co)
//! into `<data-dir>/models/ORG--NAME/FILE`: the file list and sha256 from the hub's tree API, the bytes
//! through a `.part` file resumed with HTTP range requests, and a checksum check before the file is
//! renamed into place. A shard already at the destination ([`super::shard`]) is completed in place
//! instead: only its holes are fetched, then the whole file's checksum is checked. Progress goes to a
//! callback (the CLI's bar, the API's events).

use super::library::split_part;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// How many times one file's transfer is resumed after the connection drops.
const ATTEMPTS: usize = 4;

/// What to download: `REPO` (its GGUF model) or `REPO:FILE` (a file, or a quantization such as Q4_K_M).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, ts_rs::TS)]
#[ts(rename = "HubPullRequest", optional_fields = nullable)]
pub struct PullRequest {
    pub repo: String,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub revision: Option<String>,
}

impl PullRequest {
    /// Parses `ORG/NAME` or `ORG/NAME:FILE`.
    pub fn parse(spec: &str) -> anyhow::Result<PullRequest> {
        let (repo, file) = match spec.split_once(':') {
            Some((repo, file)) => (repo, Some(file.to_string())),
            None => (spec, None),
        };
        if repo.split('/').count() != 2 || repo.split('/').any(str::is_empty) {
            anyhow::bail!("{spec:?} is not a Hugging Face model: write ORG/NAME or ORG/NAME:FILE");
        }
        Ok(PullRequest { repo: repo.to_string(), file, revision: None })
    }

    pub(crate) fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

/// Where a download is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum PullState {
    Resolving,
    Downloading,
    Verifying,
    Done,
    Failed,
}

/// A download's progress over all its files.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
pub struct PullProgress {
    /// The file being transferred now.
    pub file: String,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes per second since the transfer (re)started.
    pub rate_bytes_per_second: u64,
    pub eta_seconds: Option<u64>,
    pub state: PullState,
}

/// One file of a hub repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    pub path: String,
    pub size: u64,
    /// The LFS object id, which is the file's sha256.
    pub sha256: Option<String>,
}

/// How long a download may go without a byte before it counts as a broken connection.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

fn http_agent(stall: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(stall))
        .build()
        .into()
}

/// A Hugging Face–compatible hub.
#[derive(Clone)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    http: ureq::Agent,
}

impl Hub {
    /// The hub `HF_ENDPOINT` names (huggingface.co by default), with `HF_TOKEN` when set.
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
        Hub::new(&endpoint, std::env::var("HF_TOKEN").ok())
    }

    pub fn new(endpoint: &str, token: Option<String>) -> Hub {
        let http = http_agent(STALL_TIMEOUT);
        Hub { endpoint: endpoint.trim_end_matches('/').to_string(), token, http }
    }

    /// The same hub, with a transfer that sends nothing for `stall` counting as broken (resumed where
    /// it stopped) instead of the default minute.
    pub fn with_stall_timeout(self, stall: Duration) -> Hub {
        Hub { http: http_agent(stall), ..self }
    }

    fn get(&self, url: &str, range_from: Option<u64>) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut request = self.http.get(url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(from) = range_from {
            request = request.header("Range", format!("bytes={from}-"));
        }
        request.call().map_err(|e| {
            let host = self.endpoint.split("://").nth(1).unwrap_or(&self.endpoint);
            anyhow::anyhow!("cannot reach {host}: {e}. Set HF_ENDPOINT or check the network")
        })
    }

    /// The download URL of `path` in `repo` at `revision`.
    pub fn file_url(&self, repo: &str, revision: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{revision}/{path}", self.endpoint)
    }

    /// Asks for the bytes `range` (end exclusive) of `url`. The token goes only to the hub itself,
    /// never to another server (a peer serving a file).
    pub(super) fn get_range(&self, url: &str, range: &Range<u64>) -> Result<ureq::http::Response<ureq::Body>, String> {
        let mut request = self.http.get(url).header("Range", format!("bytes={}-{}", range.start, range.end - 1));
        if let Some(token) = self.token.as_ref().filter(|_| url.starts_with(&format!("{}/", self.endpoint))) {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        request.call().map_err(|e| e.to_string())
    }

    /// Every file of `repo` at `revision`, with sizes and sha256 sums. The hub lists a large repository
    /// in pages, each naming the next in its `Link` header; every page is read.
    pub fn files(&self, repo: &str, revision: &str) -> anyhow::Result<Vec<HubFile>> {
        let mut url = format!("{}/api/models/{repo}/tree/{revision}?recursive=true", self.endpoint);
        let mut entries: Vec<serde_json::Value> = Vec::new();
        for _ in 0..MAX_TREE_PAGES {
            let response = self.get(&url, None)?;
            let status = response.status();
            if status == 401 || status == 403 || status == 404 {
                anyhow::bail!(
                    "{} has no model {repo} at revision {revision} (answer {status}); check the name, or set HF_TOKEN for a private or gated model",
                    self.endpoint
                );
            }
            if !status.is_success() {
                anyhow::bail!("{} answered {status} to the file list of {repo}", self.endpoint);
            }
            let next = response.headers().get("link").and_then(|v| v.to_str().ok()).and_then(next_page);
            let body = response.into_body().read_to_string()?;
            let page: Vec<serde_json::Value> = serde_json::from_str(&body).map_err(|e| {
                anyhow::anyhow!("the file list of {repo} from {} is not what a hub sends: {e}", self.endpoint)
            })?;
            entries.extend(page);
            // The token goes with the next page only when the hub itself serves it.
            match next.filter(|n| n.starts_with(&format!("{}/", self.endpoint))) {
                Some(next) => url = next,
                None => return Ok(hub_files(&entries)),
            }
        }
        anyhow::bail!("the file list of {repo} runs past {MAX_TREE_PAGES} pages; name the file to download (REPO:FILE)")
    }
}

/// Pages of a repository's file list read at most.
const MAX_TREE_PAGES: usize = 200;

/// The URL of `rel="next"` in a `Link` header (`<URL>; rel="next", <URL>; rel="prev"`).
fn next_page(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        let next = params.split(';').any(|p| p.trim().trim_start_matches("rel=").trim_matches('"') == "next");
        let url = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        next.then(|| url.to_string())
    })
}

/// The files (not folders) of a hub file list.
fn hub_files(entries: &[serde_json::Value]) -> Vec<HubFile> {
    entries
        .iter()
        .filter(|e| e["type"].as_str() != Some("directory"))
        .filter_map(|e| {
            Some(HubFile {
                path: e["path"].as_str()?.to_string(),
                size: e["lfs"]["size"].as_u64().or(e["size"].as_u64())?,
                sha256: e["lfs"]["oid"].as_str().map(|s| s.trim_start_matches("sha256:").to_lowercase()),
            })
        })
        .collect()
}

/// The GGUF files `request` names among `files`: a file (with the other parts of its split set), the
/// one model of the repository, or the one quantization matching `request.file`.
pub fn choose_files(request: &PullRequest, files: &[HubFile]) -> anyhow::Result<Vec<HubFile>> {
    let ggufs: Vec<&HubFile> = files.iter().filter(|f| f.path.to_lowercase().ends_with(".gguf")).collect();
    let set_name = |f: &HubFile| split_part(Path::new(&f.path)).map(|(base, _, _)| base).unwrap_or(f.path.clone());
    let mut sets: Vec<String> = Vec::new();
    for name in ggufs.iter().map(|f| set_name(f)) {
        if !sets.contains(&name) {
            sets.push(name);
        }
    }
    let chosen: Vec<String> = match &request.file {
        Some(wanted) => {
            if let Some(exact) = ggufs.iter().find(|f| &f.path == wanted) {
                vec![set_name(exact)]
            } else if let Some(exact) = files.iter().find(|f| &f.path == wanted) {
                return Ok(vec![exact.clone()]);
            } else {
                let lower = wanted.to_lowercase();
                sets.iter().filter(|s| s.to_lowercase().contains(&lower)).cloned().collect()
            }
        }
        None => sets.clone(),
    };
    match chosen.len() {
        1 => {
            let mut set: Vec<HubFile> = ggufs.into_iter().filter(|f| set_name(f) == chosen[0]).cloned().collect();
            set.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(set)
        }
        0 if sets.is_empty() => anyhow::bail!("{} has no GGUF files; shoal runs GGUF models", request.repo),
        0 => anyhow::bail!(
            "{} has no file matching {:?}; its GGUF models are: {}",
            request.repo,
            request.file.as_deref().unwrap_or_default(),
            sets.join(", ")
        ),
        _ => anyhow::bail!(
            "{} has several GGUF models; choose one with {}:FILE, one of: {}",
            request.repo,
            request.repo,
            chosen.join(", ")
        ),
    }
}

/// The directory a repository's files go to: `models_dir/ORG--NAME`.
pub fn repo_dir(models_dir: &Path, repo: &str) -> PathBuf {
    models_dir.join(repo.replace('/', "--"))
}

/// Where the hub file `path` of `repo` goes under `models_dir` (both names checked: they come from the
/// API and from the hub's listing, and must not lead out of the models folder).
pub fn hub_destination(models_dir: &Path, repo: &str, path: &str) -> Result<PathBuf, super::names::NameError> {
    super::names::repo(repo)?;
    super::names::relative(path)?;
    let destination = repo_dir(models_dir, repo).join(path);
    super::names::check_inside(models_dir, &destination)?;
    Ok(destination)
}

/// Downloads what `request` names into `models_dir`, reporting progress to `progress`. Returns the
/// paths of the downloaded files (the first is the one to open).
pub fn pull(
    hub: &Hub,
    models_dir: &Path,
    request: &PullRequest,
    progress: &mut dyn FnMut(&PullProgress),
) -> anyhow::Result<Vec<PathBuf>> {
    let mut report = PullProgress {
        file: request.file.clone().unwrap_or_default(),
        bytes_done: 0,
        bytes_total: 0,
        rate_bytes_per_second: 0,
        eta_seconds: None,
        state: PullState::Resolving,
    };
    progress(&report);
    let files = choose_files(request, &hub.files(&request.repo, request.revision())?)?;
    report.bytes_total = files.iter().map(|f| f.size).sum();
    let mut paths = Vec::new();
    for file in &files {
        report.file = file.path.clone();
        let url = hub.file_url(&request.repo, request.revision(), &file.path);
        let destination = hub_destination(models_dir, &request.repo, &file.path)?;
        let done_before = report.bytes_done;
        download_file(hub, &url, file, &destination, &mut |done, rate, state| {
            report.bytes_done = done_before + done;
            report.rate_bytes_per_second = rate;
            report.eta_seconds = (rate > 0).then(|| (report.bytes_total - report.bytes_done) / rate);
            report.state = state;
            progress(&report);
        })?;
        report.bytes_done = done_before + file.size;
        paths.push(destination);
    }
    report.state = PullState::Done;
    report.eta_seconds = Some(0);
    progress(&report);
    Ok(paths)
}

/// One file: resume its `.part`, verify, rename. `progress(bytes of this file, rate, state)`. A shard
/// of the file already there (see [`super::shard`]) is completed in place instead.
fn download_file(
    hub: &Hub,
    url: &str,
    file: &HubFile,
    destination: &Path,
    progress: &mut dyn FnMut(u64, u64, PullState),
) -> anyhow::Result<()> {
    if super::shard::is_shard(destination) {
        return super::shard::complete(hub, url, file, destination, progress);
    }
    if std::fs::metadata(destination).is_ok_and(|m| m.len() == file.size) {
        progress(file.size, 0, PullState::Downloading);
        return Ok(());
    }
    if let Some(dir) = destination.parent() {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let part = PathBuf::from(format!("{}.part", destination.display()));
    let needed = file.size.saturating_sub(std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0));
    if let Some(free) = crate::util::free_disk_bytes(destination).filter(|&free| free < needed) {
        return Err(super::shard::ShardError::NoSpace { path: destination.into(), needed, free }.into());
    }
    let mut last_error = None;
    for attempt in 0..ATTEMPTS {
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if have > file.size {
            std::fs::remove_file(&part)?;
            continue;
        }
        if have == file.size {
            break;
        }
        match transfer(hub, url, &part, have, file.size, progress) {
            Ok(()) => break,
            Err(Interrupted::Fatal(e)) => return Err(e),
            Err(Interrupted::Retry(e)) => {
                tracing::warn!(
                    "download of {} interrupted (attempt {}): {}; resuming",
                    file.path,
                    attempt + 1,
                    crate::errors::chain(&e)
                );
                last_error = Some(e);
            }
        }
    }
    let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if have != file.size {
        let e = last_error.unwrap_or_else(|| anyhow::anyhow!("the hub sent {have} of {} bytes", file.size));
        anyhow::bail!(
            "the download of {} stopped at {have} of {} bytes: {}. Run the same command again to resume",
            file.path,
            file.size,
            crate::errors::chain(&e)
        );
    }
    progress(file.size, 0, PullState::Verifying);
    if let Some(expected) = &file.sha256 {
        let actual = sha256_of(&part)?;
        if &actual != expected {
            let _ = std::fs::remove_file(&part);
            anyhow::bail!(
                "{} failed its checksum: the hub says sha256 {expected}, the download has {actual}; the damaged file was deleted, run the command again",
                file.path
            );
        }
    }
    std::fs::rename(&part, destination)
        .map_err(|e| anyhow::anyhow!("cannot move the download into {}: {e}", destination.display()))?;
    Ok(())
}

enum Interrupted {
    /// The connection dropped or the server misbehaved: resume.
    Retry(anyhow::Error),
    /// Resuming will not help (unreachable hub, a refused file, a full disk).
    Fatal(anyhow::Error),
}

/// Appends the bytes from `have` on to `part`.
fn transfer(
    hub: &Hub,
    url: &str,
    part: &Path,
    have: u64,
    size: u64,
    progress: &mut dyn FnMut(u64, u64, PullState),
) -> Result<(), Interrupted> {
    let response = hub.get(url, (have > 0).then_some(have)).map_err(Interrupted::Fatal)?;
    let status = response.status();
    let mut start = have;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(|e| Interrupted::Fatal(anyhow::anyhow!("cannot write {}: {e}", part.display())))?;
    if status == 200 {
        // The server ignored the range: start over.
        out.set_len(0).map_err(|e| Interrupted::Fatal(e.into()))?;
        start = 0;
    } else if status != 206 {
        return Err(Interrupted::Fatal(anyhow::anyhow!("the hub answered {status} for {url}")));
    }
    let mut body = response.into_body().into_reader();
    let mut buffer = vec![0u8; 1 << 20];
    let mut done = start;
    let began = Instant::now();
    let mut last_report = Instant::now() - Duration::from_secs(1);
    loop {
        let n = match body.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Interrupted::Retry(anyhow::anyhow!("the connection broke: {e}"))),
        };
        out.write_all(&buffer[..n])
            .map_err(|e| Interrupted::Fatal(anyhow::anyhow!("cannot write {}: {e}", part.display())))?;
        done += n as u64;
        if last_report.elapsed() >= Duration::from_millis(200) || done == size {
            let seconds = began.elapsed().as_secs_f64().max(1e-3);
            progress(done, ((done - start) as f64 / seconds) as u64, PullState::Downloading);
            last_report = Instant::now();
        }
    }
    out.flush().map_err(|e| Interrupted::Fatal(e.into()))?;
    if done < size {
        return Err(Interrupted::Retry(anyhow::anyhow!("the connection closed after {done} of {size} bytes")));
    }
    Ok(())
}

/// The sha256 of a file, in lowercase hex.
pub fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_pages_from_link_headers() {
        let link = r#"<https://huggingface.co/api/models/a/b/tree/main?cursor=xyz>; rel="next""#;
        assert_eq!(next_page(link).as_deref(), Some("https://huggingface.co/api/models/a/b/tree/main?cursor=xyz"));
        let both = r#"<https://h/prev>; rel="prev", <https://h/next?c=2>; rel=next"#;
        assert_eq!(next_page(both).as_deref(), Some("https://h/next?c=2"));
        assert_eq!(next_page(r#"<https://h/prev>; rel="prev""#), None);
        assert_eq!(next_page("garbage"), None);
    }

    fn file(path: &str) -> HubFile {
        HubFile { path: path.into(), size: 1, sha256: None }
    }

    #[test]
    fn parses_specs() {
        let r = PullRequest::parse("org/name:model-Q4_K_M.gguf").unwrap();
        assert_eq!((r.repo.as_str(), r.file.as_deref()), ("org/name", Some("model-Q4_K_M.gguf")));
        assert!(PullRequest::parse("just-a-name").is_err());
    }

    #[test]
    fn chooses_a_quantization_with_all_its_parts() {
        let files = [
            file("README.md"),
            file("m-Q4_K_M.gguf"),
            file("Q8/m-Q8_0-00002-of-00002.gguf"),
            file("Q8/m-Q8_0-00001-of-00002.gguf"),
        ];
        let all = PullRequest::parse("o/m").unwrap();
        let error = choose_files(&all, &files).unwrap_err().to_string();
        assert!(error.contains("m-Q4_K_M.gguf") && error.contains("m-Q8_0"), "{error}");
        let q8 = PullRequest { file: Some("q8_0".into()), ..all.clone() };
        assert_eq!(choose_files(&q8, &files).unwrap().len(), 2);
        let q4 = PullRequest { file: Some("m-Q4_K_M.gguf".into()), ..all };
        assert_eq!(choose_files(&q4, &files).unwrap(), vec![file("m-Q4_K_M.gguf")]);
    }
}

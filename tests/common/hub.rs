//! A Hugging Face–compatible hub on loopback for the download tests: the hub's URL layout
//! (`/api/models/REPO/tree/REV`, in pages of two entries linked by `Link: <…>; rel="next"`, and
//! `/REPO/resolve/REV/FILE`), real sha256 sums, range requests
//! (`bytes=A-B` and `bytes=A-`), a log of every file request with the body bytes it was sent, and faults
//! on purpose (a dropped connection, a flipped byte, a wrong length, an error status, no range support).

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const REPO: &str = "test-org/SmolLM2-135M-Instruct-GGUF";
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// What the hub does wrong. Faults touch only file requests whose range starts at or after `from`.
#[derive(Default, Clone)]
pub struct Faults {
    pub from: usize,
    /// Close the connection after this many body bytes, on the first `drops` answers.
    pub drop_after: Option<usize>,
    pub drops: usize,
    /// Instead of closing it, hold the connection silent for a few seconds after `drop_after` bytes,
    /// then send the rest (a client without a stall timeout gets it all in one answer).
    pub stall: bool,
    /// Flip the byte at this offset of every answer holding it.
    pub corrupt_at: Option<usize>,
    /// Send (and announce) a body this many bytes shorter than the range asked for.
    pub short_by: Option<usize>,
    /// Answer with this status and no file bytes.
    pub status: Option<u16>,
    /// Answer ranges with the whole file (200), as a server without range support does.
    pub ignore_range: bool,
    /// Answer every file request with `302 Found` to the same path on this server (another host, as the
    /// real hub sends downloads to its CDN).
    pub redirect_to: Option<String>,
}

/// One file request as the hub saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Served {
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// The first byte sent.
    pub start: u64,
    /// Body bytes sent.
    pub bytes: u64,
    /// Whether it carried an `Authorization` header.
    pub authorized: bool,
}

pub struct LoopbackHub {
    pub endpoint: String,
    served: Arc<Mutex<Vec<Served>>>,
}

impl LoopbackHub {
    /// The `Range` header of every file request (None when it had none).
    pub fn ranges(&self) -> Vec<Option<String>> {
        self.served().into_iter().map(|s| s.range).collect()
    }

    pub fn served(&self) -> Vec<Served> {
        self.served.lock().unwrap().clone()
    }

    /// Forgets the requests so far.
    pub fn clear(&self) {
        self.served.lock().unwrap().clear();
    }
}

/// A hub holding the SmolLM2 file (and a README) in `REPO`.
pub fn start_hub(faults: Faults) -> LoopbackHub {
    start_hub_with(vec![(FILE.to_string(), std::fs::read(super::model_path()).unwrap())], faults)
}

struct HostedFile {
    path: String,
    data: Vec<u8>,
    sha: String,
}

/// A hub holding `files` (path, contents) and a README in `REPO`.
pub fn start_hub_with(files: Vec<(String, Vec<u8>)>, faults: Faults) -> LoopbackHub {
    start_hub_on("127.0.0.1:0", files, faults)
}

/// [`start_hub_with`] listening on `address` (another loopback address stands for another host).
pub fn start_hub_on(address: &str, files: Vec<(String, Vec<u8>)>, faults: Faults) -> LoopbackHub {
    let files: Arc<Vec<HostedFile>> = Arc::new(
        files
            .into_iter()
            .map(|(path, data)| HostedFile { sha: hex::encode(Sha256::digest(&data)), path, data })
            .collect(),
    );
    let listener = TcpListener::bind(address).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(Mutex::new(Vec::new()));
    let drops_done = Arc::new(AtomicUsize::new(0));
    let log = served.clone();
    let base = endpoint.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (files, log, faults, drops_done) = (files.clone(), log.clone(), faults.clone(), drops_done.clone());
            let base = base.clone();
            std::thread::spawn(move || serve(stream, &base, &files, &log, &faults, &drops_done));
        }
    });
    LoopbackHub { endpoint, served }
}

fn respond(stream: &mut TcpStream, status: &str, extra: &str, body: &[u8]) {
    let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// `bytes=A-B` or `bytes=A-` → (A, B + 1 or the end).
fn parse_range(range: &str, len: usize) -> Option<(usize, usize)> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = a.parse().ok()?;
    let end = if b.is_empty() { len } else { b.parse::<usize>().ok()? + 1 };
    (start < end && end <= len).then_some((start, end))
}

/// Entries of a page of the file list: the hub pages long lists, naming the next page in `Link`.
const TREE_PAGE: usize = 2;

fn serve(
    mut stream: TcpStream,
    endpoint: &str,
    files: &[HostedFile],
    log: &Mutex<Vec<Served>>,
    faults: &Faults,
    drops: &AtomicUsize,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let (mut range, mut authorized) = (None, false);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
            authorized |= name.eq_ignore_ascii_case("authorization");
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let hosted = files.iter().find(|f| path == format!("/{REPO}/resolve/main/{}", f.path));
    if path.starts_with(&format!("/api/models/{REPO}/tree/main")) {
        let mut tree = vec![serde_json::json!({"type": "file", "path": "README.md", "size": 6, "oid": "0123"})];
        for f in files {
            tree.push(serde_json::json!({"type": "file", "path": f.path, "size": f.data.len(), "oid": "4567",
                "lfs": {"oid": f.sha, "size": f.data.len(), "pointerSize": 134}}));
        }
        let from: usize = path.split("cursor=").nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let page = serde_json::Value::Array(tree.iter().skip(from).take(TREE_PAGE).cloned().collect());
        let mut extra = "Content-Type: application/json\r\n".to_string();
        if from + TREE_PAGE < tree.len() {
            let next = format!("{endpoint}/api/models/{REPO}/tree/main?recursive=true&cursor={}", from + TREE_PAGE);
            extra += &format!("Link: <{next}>; rel=\"next\"\r\n");
        }
        respond(&mut stream, "200 OK", &extra, page.to_string().as_bytes());
    } else if let (Some(_), Some(elsewhere)) = (hosted, &faults.redirect_to) {
        log.lock().unwrap().push(Served { range, start: 0, bytes: 0, authorized });
        respond(&mut stream, "302 Found", &format!("Location: {elsewhere}{path}\r\n"), b"");
    } else if let Some(HostedFile { data, .. }) = hosted {
        let asked = range.as_deref().map(|r| parse_range(r, data.len()));
        let (start, mut end) = match asked {
            None => (0, data.len()),
            Some(Some(span)) => span,
            Some(None) => {
                log.lock().unwrap().push(Served { range, start: 0, bytes: 0, authorized });
                let extra = format!("Content-Range: bytes */{}\r\n", data.len());
                respond(&mut stream, "416 Range Not Satisfiable", &extra, b"");
                return;
            }
        };
        let faulty = start >= faults.from;
        let mut served = Served { range: range.clone(), start: start as u64, bytes: 0, authorized };
        if let Some(status) = faults.status.filter(|_| faulty) {
            log.lock().unwrap().push(served);
            respond(&mut stream, &format!("{status} Failing On Purpose"), "", b"");
            return;
        }
        let ranged = range.is_some() && !(faults.ignore_range && faulty);
        let (status, extra) = if ranged {
            ("206 Partial Content", format!("Content-Range: bytes {start}-{}/{}\r\n", end - 1, data.len()))
        } else {
            end = data.len();
            ("200 OK", String::new())
        };
        let start = if ranged { start } else { 0 };
        let mut body = data[start..end].to_vec();
        if let Some(at) = faults.corrupt_at.filter(|&at| faulty && at >= start && at < end) {
            body[at - start] ^= 0x55;
        }
        if let Some(short) = faults.short_by.filter(|_| faulty) {
            body.truncate(body.len().saturating_sub(short));
        }
        let drop = faults.drop_after.filter(|_| faulty && drops.fetch_add(1, Ordering::SeqCst) < faults.drops);
        if let Some(n) = drop {
            let head =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let n = n.min(body.len());
            let _ = stream.write_all(&body[..n]);
            served.bytes = n as u64;
            log.lock().unwrap().push(served);
            let _ = stream.flush();
            if faults.stall {
                std::thread::sleep(std::time::Duration::from_secs(3));
                let _ = stream.write_all(&body[n..]);
                let _ = stream.flush();
            }
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        served.bytes = body.len() as u64;
        log.lock().unwrap().push(served);
        respond(&mut stream, status, &extra, &body);
    } else {
        respond(&mut stream, "404 Not Found", "", b"{\"error\":\"Repository not found\"}");
    }
    let _ = reader.read(&mut [0u8; 1]);
}

/// A `shoal node` on loopback whose hub is `hub` (killed when dropped).
pub struct HubNode {
    pub child: std::process::Child,
    pub base: String,
}

impl HubNode {
    /// Starts the node and opens its event stream once the API answers. The node's control port is its
    /// API port + 1, which nothing reserves: when another process took it and the node exited, the node
    /// is started again on other ports.
    pub fn start(name: &str, hub: &LoopbackHub, dir: &std::path::Path) -> (HubNode, ureq::http::Response<ureq::Body>) {
        use std::time::{Duration, Instant};
        let mut attempts = 0;
        'start: loop {
            attempts += 1;
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut child = super::shoal()
                .args(["node", "--name", name, "--port", &port.to_string(), "--bind", "127.0.0.1", "--no-mdns"])
                .arg("--data-dir")
                .arg(dir.join("data"))
                .env("HF_ENDPOINT", &hub.endpoint)
                .env("HF_HOME", dir.join("hf"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let base = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            let events = loop {
                match ureq::get(&format!("{base}/api/events")).call() {
                    Ok(response) => break response,
                    Err(_) if attempts < 5 && child.try_wait().ok().flatten().is_some() => continue 'start,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                    Err(e) => panic!("the node did not start: {e}"),
                }
            };
            return (HubNode { child, base }, events);
        }
    }

    /// `POST /api/models/pull` with `body`, which the node must refuse as a bad `param`.
    pub fn assert_pull_refused(&self, body: serde_json::Value, param: &str) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut refused = agent.post(&format!("{}/api/models/pull", self.base)).send_json(&body).unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{body}");
        let answer: serde_json::Value = refused.body_mut().read_json().unwrap();
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }

    /// `POST /api/models/pull` with `body`, accepted: the pull's id.
    pub fn start_pull(&self, body: serde_json::Value) -> String {
        let started: serde_json::Value = ureq::post(&format!("{}/api/models/pull", self.base))
            .send_json(body)
            .unwrap()
            .into_body()
            .read_json()
            .unwrap();
        started["id"].as_str().unwrap().to_string()
    }
}

impl Drop for HubNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `model_pull` events of pull `id` from an event stream, up to the one that ends it (done or
/// failed), each passed to `seen`; returns that last one.
pub fn until_pull_ends(
    events: ureq::http::Response<ureq::Body>,
    id: &str,
    mut seen: impl FnMut(&serde_json::Value),
) -> serde_json::Value {
    let mut lines = BufReader::new(events.into_body().into_reader()).lines();
    loop {
        let line = lines.next().expect("the event stream ended").unwrap();
        let Some(data) = line.strip_prefix("data:") else { continue };
        let event: serde_json::Value = serde_json::from_str(data.trim()).unwrap();
        if event["type"] != "model_pull" || event["id"] != id {
            continue;
        }
        seen(&event);
        if ["done", "failed"].contains(&event["progress"]["state"].as_str().unwrap()) {
            return event;
        }
    }
}

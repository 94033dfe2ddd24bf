//! Several `shoal node`s on one machine for multi-node tests. In netns mode (the default where the test
//! may create network namespaces, i.e. as root) each node gets its own namespace, joined to the others
//! by veth pairs through a bridge in a namespace of its own, with 10.99.0.x addresses that exist only
//! inside those namespaces; mDNS works there. In loopback mode (SHOAL_TEST_NETWORK=loopback, or where
//! namespaces cannot be made) the nodes share 127.0.0.1 with distinct ports and no mDNS. Everything is
//! removed when the cluster is dropped, also when a test panics.

use shoal::cluster::ClusterSnapshot;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    Netns,
    Loopback,
}

pub struct TestNode {
    pub name: String,
    pub namespace: Option<String>,
    pub ip: String,
    pub api_port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl TestNode {
    pub fn control_addr(&self) -> String {
        format!("{}:{}", self.ip, self.api_port + 1)
    }
}

pub struct TestCluster {
    pub network: Network,
    /// Each node sees only its own data directory (the others' are covered by an empty tmpfs in a mount
    /// namespace of its own), as nodes on separate machines do. Off by default.
    pub private_disks: bool,
    /// Environment variables every node this cluster starts gets (never set in the test process: other
    /// tests run in it at the same time).
    pub env: Vec<(String, String)>,
    /// The `shoal` binary nodes start from (default: the one built for these tests).
    pub binary: Option<PathBuf>,
    prefix: String,
    bridge: Option<String>,
    pub nodes: Vec<TestNode>,
    _dir: tempfile::TempDir,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The first port from `from` (then in steps of 1000, staying within 20000-31999) such that it and
/// the next one are free on loopback now: a node listens on both (API and control).
fn free_port_pair(from: u16) -> u16 {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let candidate = |k: u16| 20000 + (from - 20000 + k * 1000) % 12000;
    (0..12).map(candidate).find(|&p| free(p) && free(p + 1)).unwrap_or(from)
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)))
    }
}

fn netns_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let name = format!("shoalprobe{}", std::process::id());
        let ok = ip(&["netns", "add", &name]).is_ok();
        if ok {
            let _ = ip(&["netns", "del", &name]);
        }
        ok
    })
}

/// Multi-node tests start several processes each and measure timing; on a small machine they run one
/// at a time. Hold the returned guard for the whole test.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

impl TestCluster {
    /// `n` nodes (not started yet).
    pub fn new(n: usize) -> TestCluster {
        let network = match std::env::var("SHOAL_TEST_NETWORK").as_deref() {
            Ok("loopback") => Network::Loopback,
            _ if netns_available() => Network::Netns,
            _ => {
                eprintln!("network namespaces are not available here: running the nodes on loopback");
                Network::Loopback
            }
        };
        Self::with_network(n, network)
    }

    pub fn with_network(n: usize, network: Network) -> TestCluster {
        let serial = COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("sh{}x{serial}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = TestCluster {
            network,
            private_disks: false,
            env: Vec::new(),
            binary: None,
            prefix: prefix.clone(),
            bridge: None,
            nodes: Vec::new(),
            _dir: dir,
        };
        if network == Network::Netns {
            let bridge = format!("{prefix}b");
            ip(&["netns", "add", &bridge]).unwrap();
            cluster.bridge = Some(bridge.clone());
            ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]).unwrap();
            ip(&["-n", &bridge, "link", "set", "br0", "up"]).unwrap();
        }
        // Loopback ports: spread by process and serial so parallel tests do not collide.
        // Below the kernel's ephemeral range (32768 and up by default), where outgoing connections take
        // their local ports, so a port chosen here is not already some client's.
        let base = (20000 + (std::process::id() % 120) * 100 + (serial % 10) * 10) as u16;
        for i in 0..n {
            let data_dir = cluster._dir.path().join(format!("node{i}"));
            let log = cluster._dir.path().join(format!("node{i}.log"));
            let (namespace, ip_addr, api_port) = match network {
                Network::Netns => {
                    let ns = format!("{prefix}n{i}");
                    let bridge = cluster.bridge.clone().unwrap();
                    ip(&["netns", "add", &ns]).unwrap();
                    let port = format!("p{i}");
                    ip(&["-n", &bridge, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])
                        .unwrap();
                    ip(&["-n", &bridge, "link", "set", &port, "master", "br0", "up"]).unwrap();
                    let addr = format!("10.99.0.{}", i + 1);
                    ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]).unwrap();
                    ip(&["-n", &ns, "link", "set", "eth0", "up"]).unwrap();
                    ip(&["-n", &ns, "link", "set", "lo", "up"]).unwrap();
                    (Some(ns), addr, shoal::cluster::DEFAULT_API_PORT)
                }
                Network::Loopback => (None, "127.0.0.1".to_string(), free_port_pair(base + (i as u16) * 2)),
            };
            cluster.nodes.push(TestNode {
                name: format!("node{i}"),
                namespace,
                ip: ip_addr,
                api_port,
                data_dir,
                log,
                child: None,
            });
        }
        cluster
    }

    /// A command run in node `i`'s network (its namespace, or here).
    pub fn command_in(&self, i: usize, program: &str) -> Command {
        match &self.nodes[i].namespace {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// Runs `tests/fixtures/SCRIPT PORT MODEL` (a Python script driving official API clients) against
    /// node `i` and parses the one JSON object it prints.
    pub fn python_clients(&self, i: usize, script: &str, model: &str) -> serde_json::Value {
        let script = format!("{}/tests/fixtures/{script}", env!("CARGO_MANIFEST_DIR"));
        let port = self.nodes[i].api_port.to_string();
        let out = self.command_in(i, "python3").args([&script, &port, model]).output().unwrap();
        assert!(
            out.status.success(),
            "the clients failed (pip install openai anthropic ollama): {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        serde_json::from_slice(&out.stdout).expect("the script prints one JSON object")
    }

    /// Starts node `i` with `extra` arguments.
    pub fn start(&mut self, i: usize, extra: &[&str]) {
        self.start_with_env(i, extra, &[]);
    }

    /// Starts node `i` with `extra` arguments and environment variables `env`.
    pub fn start_with_env(&mut self, i: usize, extra: &[&str], env: &[(&str, &str)]) {
        let binary = self.binary.clone().unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_shoal")));
        let binary = binary.to_str().expect("a UTF-8 path");
        let mut cmd = if self.private_disks {
            let mut script = String::new();
            for (j, other) in self.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
                std::fs::create_dir_all(&other.data_dir).unwrap();
                script += &format!("mount -t tmpfs other{j} '{}' && ", other.data_dir.display());
            }
            let mut cmd = self.command_in(i, "unshare");
            cmd.args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &format!("{script}exec \"$@\""),
                "sh",
                binary,
            ]);
            cmd
        } else {
            self.command_in(i, binary)
        };
        let node = &self.nodes[i];
        cmd.args(["-v", "node", "--name", &node.name, "--port", &node.api_port.to_string()]);
        cmd.arg("--data-dir").arg(&node.data_dir);
        if self.network == Network::Loopback {
            cmd.args(["--bind", "127.0.0.1", "--no-mdns"]);
        }
        cmd.args(extra);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&node.log).unwrap();
        cmd.stdout(Stdio::null()).stderr(log).env_remove("RUST_LOG");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v))).envs(env.iter().copied());
        let child = cmd.spawn().unwrap();
        self.nodes[i].child = Some(child);
    }

    /// The processes node `i` started (its workers and theirs), with their command lines.
    pub fn descendants(&self, i: usize) -> Vec<(u32, String)> {
        let Some(root) = self.nodes[i].child.as_ref().map(Child::id) else { return Vec::new() };
        let parent_of = |pid: u32| -> Option<u32> {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|p| p.trim().parse().ok())
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let mut ancestor = parent_of(pid);
            while let Some(a) = ancestor.filter(|&a| a > 1) {
                if a == root {
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    found.push((pid, cmdline));
                    break;
                }
                ancestor = parent_of(a);
            }
        }
        found
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `shoal ARGS --node 127.0.0.1:PORT` in node `i`'s network.
    pub fn cli(&self, i: usize, args: &[&str]) -> Output {
        let mut cmd = self.command_in(i, env!("CARGO_BIN_EXE_shoal"));
        cmd.args(args).args(["--node", &format!("127.0.0.1:{}", self.nodes[i].api_port)]);
        cmd.env_remove("RUST_LOG").output().unwrap()
    }

    /// Node `i`'s view of the cluster (`shoal status --json`), or None while it does not answer.
    pub fn status(&self, i: usize) -> Option<ClusterSnapshot> {
        let out = self.cli(i, &["status", "--json"]);
        if !out.status.success() {
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("status --json is a cluster snapshot"))
    }

    /// Waits until node `i` answers its API.
    pub fn wait_ready(&self, i: usize) {
        self.wait_for(Duration::from_secs(10), &format!("node {i} to answer"), || self.status(i).is_some());
    }

    /// A join code made on node `i`.
    pub fn code(&self, i: usize) -> String {
        let out = self.cli(i, &["code"]);
        assert!(out.status.success(), "shoal code: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Starts every node with `extra` arguments, the first one alone and the others joining it with its
    /// code, and waits until each sees all of them alive with their telemetry.
    pub fn form(&mut self, extra: &[&str]) {
        self.form_with(extra, &[]);
    }

    /// [`TestCluster::form`], node `i` also started with `own[i]` (when there is one).
    pub fn form_with(&mut self, extra: &[&str], own: &[&[&str]]) {
        let n = self.nodes.len();
        let own_args = |i: usize| own.get(i).copied().unwrap_or_default();
        let first: Vec<&str> = extra.iter().chain(own_args(0)).copied().collect();
        self.start(0, &first);
        self.wait_ready(0);
        let code = self.code(0);
        let join = match self.network {
            Network::Netns => code,
            Network::Loopback => format!("{code}@{}", self.nodes[0].control_addr()),
        };
        for i in 1..n {
            let mut args = vec!["--join", join.as_str()];
            args.extend_from_slice(extra);
            args.extend_from_slice(own_args(i));
            self.start(i, &args);
        }
        self.wait_for(Duration::from_secs(15), "the cluster to form with telemetry", || {
            (0..n).all(|i| {
                self.status(i).is_some_and(|s| {
                    s.nodes.len() == n && s.nodes.iter().all(|m| m.telemetry.is_some() && m.status.is_up())
                })
            })
        });
    }

    /// GETs `path` of node `i`'s API from inside its network and parses the JSON answer.
    pub fn get_json(&self, i: usize, path: &str) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}{path}", self.nodes[i].api_port);
        self.in_network(i, move || ureq::get(&url).call().expect("the API answers").into_body().read_json().unwrap())
            .join()
            .unwrap()
    }

    /// POSTs `body` to `path` of node `i`'s API from inside its network; returns the status and the JSON
    /// answer (Null when it is not JSON).
    pub fn post_json(&self, i: usize, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let url = format!("http://127.0.0.1:{}{path}", self.nodes[i].api_port);
        self.in_network(i, move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut response = agent.post(&url).send_json(body).expect("the API answers");
            (response.status().as_u16(), response.body_mut().read_json().unwrap_or(serde_json::Value::Null))
        })
        .join()
        .unwrap()
    }

    /// Launches `model` from node 0 with `shoal run` on the stages `layers` (256 tokens of context, two
    /// sequences, one thread, no drafting: the answers are compared with one process decoding a token at
    /// a time, and a random F16 model's verification rows round otherwise, see `engine_speculation`);
    /// returns the instance once it is ready.
    pub fn launch_ready(&self, model: &std::path::Path, layers: &str) -> serde_json::Value {
        let args = ["run", model.to_str().unwrap(), "--context", "256", "--sequences", "2", "--threads", "1"];
        let args = [&args[..], &["--speculate", "off"]].concat();
        let out = self.cli(0, &[&args[..], &["--layers", layers]].concat());
        assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), self.logs());
        let instances = self.get_json(0, "/api/instances");
        let ready = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").cloned();
        ready.unwrap_or_else(|| panic!("no ready instance: {instances:#}"))
    }

    /// Polls `check` every 50 ms until it holds; panics with the logs after `timeout`.
    pub fn wait_for(&self, timeout: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check() {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out after {timeout:?} waiting for {what}\n{}", self.logs());
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, std::fs::read_to_string(&n.log).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Runs `f` on a thread inside node `i`'s network (its namespace, or here), so that sockets it opens
    /// see what the node sees.
    pub fn in_network<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let ns = self.nodes[i].namespace.clone();
        std::thread::spawn(move || {
            if let Some(ns) = ns {
                enter_namespace(&ns);
            }
            f()
        })
    }

    /// The namespace holding the bridge (netns mode).
    pub fn bridge_namespace(&self) -> Option<&str> {
        self.bridge.as_deref()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        for node in &self.nodes {
            if let Some(ns) = &node.namespace {
                let _ = ip(&["netns", "del", ns]);
            }
        }
        if let Some(b) = &self.bridge {
            let _ = ip(&["netns", "del", b]);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = &self.prefix;
    }
}

/// Moves the calling thread into network namespace `ns`.
pub fn enter_namespace(ns: &str) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("namespace file");
    // SAFETY: setns on a valid namespace file descriptor affects only this thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns into {ns} failed");
}

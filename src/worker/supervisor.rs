//! The agent's side of a worker: spawns `shoal worker` (this same binary, see [`super::executable`]) with the secret in its
//! environment, turns its stdout into events, keeps its stderr in a log file, sends it commands, and
//! reports how it ended. Closing its stdin (or dropping the handle) stops it.

use super::process::{StageDevice, FRONT_TOKEN_ENV, SECRET_ENV};
use super::protocol::{WorkerCommand, WorkerEvent};
use crate::util::LockExt;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;

/// Everything a node needs to start one stage of an instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    pub instance: String,
    pub stage: usize,
    pub stages: usize,
    pub model_path: PathBuf,
    pub layers: Range<usize>,
    pub context: usize,
    pub sequences: usize,
    pub batch: usize,
    /// The KV cache's element type.
    #[serde(default)]
    pub kv_type: crate::engine::KvType,
    /// Tokens of saved prefixes (the prompt cache beyond the slots) to keep in memory, as placement
    /// planned them (none: the worker's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_prefix_tokens: Option<usize>,
    /// Compute threads (0: the node decides: its cores divided by the stages it runs).
    pub threads: usize,
    /// Whether stage 0 drafts tokens (speculative decoding), and at most how many a step.
    #[serde(default)]
    pub speculation: crate::engine::Speculation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_tokens: Option<usize>,
    /// The model file as any node can find or fetch it (`model_path` is where the owner has it).
    #[serde(default)]
    pub file: Option<crate::model::peer_copy::OfferedFile>,
    /// Of a split GGUF set, every part in order (the first is `file`), named `NAME-0000N-of-0000M.gguf`;
    /// empty for a single file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<crate::model::peer_copy::OfferedFile>,
    /// A rank of a tensor-parallel group (then `layers` is the whole model and the stages are the ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorRank>,
    /// Where a whole stage sits in the ring when that is not `stage` of `stages`: chained with
    /// tensor-parallel groups, whose ranks outnumber the ring's stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingPlace>,
}

/// A stage's place in the ring: stage `stage` of `stages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPlace {
    pub stage: usize,
    pub stages: usize,
}

/// Which rank of a tensor-parallel group a worker is, and every rank's share of the model, in rank order
/// (each rank plans the same slices from them: [`crate::model::slice::plan`]); and, when groups are
/// chained as pipeline stages, which stage of the ring its group is (the group's leader is that stage:
/// it takes hidden states from the previous stage and passes its own on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRank {
    pub rank: usize,
    pub shares: Vec<f64>,
    #[serde(default)]
    pub ring_stage: usize,
    #[serde(default = "one")]
    pub ring_stages: usize,
}

fn one() -> usize {
    1
}

impl TensorRank {
    /// Rank `rank` of the one group that runs the whole model.
    pub fn alone(rank: usize, shares: Vec<f64>) -> TensorRank {
        TensorRank { rank, shares, ring_stage: 0, ring_stages: 1 }
    }

    /// The worker arguments that say it.
    pub fn args(&self) -> Vec<String> {
        let shares: Vec<String> = self.shares.iter().map(|s| s.to_string()).collect();
        let mut args = vec!["--tensor-rank".into(), self.rank.to_string(), "--tensor-shares".into(), shares.join(",")];
        if self.ring_stages > 1 {
            args.extend(["--group-stage".into(), self.ring_stage.to_string()]);
            args.extend(["--group-stages".into(), self.ring_stages.to_string()]);
        }
        args
    }
}

impl StageSpec {
    /// Every file of the model as any node can find or fetch it: `parts`, or the one `file`.
    pub fn files(&self) -> Vec<crate::model::peer_copy::OfferedFile> {
        if self.parts.is_empty() {
            self.file.iter().cloned().collect()
        } else {
            self.parts.clone()
        }
    }
}

/// A running worker.
pub struct WorkerHandle {
    pub pid: Option<u32>,
    pub log: PathBuf,
    pub front_token: String,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    kill: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    exited: Arc<AtomicBool>,
}

impl WorkerHandle {
    pub async fn command(&self, command: &WorkerCommand) -> std::io::Result<()> {
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else { return Err(std::io::ErrorKind::BrokenPipe.into()) };
        let mut line = serde_json::to_vec(command).expect("serialisable");
        line.push(b'\n');
        stdin.write_all(&line).await?;
        stdin.flush().await
    }

    /// Stops the worker: closes its stdin, and kills it if it has not exited a second later.
    pub async fn stop(&self) {
        self.stdin.lock().await.take();
        for _ in 0..20 {
            if self.exited.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if let Some(kill) = self.kill.locked().take() {
            let _ = kill.send(());
        }
    }
}

/// How this node runs a worker: its compute threads, its device, and the address its data port listens on.
pub struct WorkerSetup<'a> {
    pub threads: usize,
    pub device: &'a StageDevice,
    pub listen: std::net::IpAddr,
    /// The node's directory for saved prefixes (the prompt cache's disk tier).
    pub prompt_cache_dir: Option<&'a Path>,
}

/// Starts a worker for `spec`. `on_event` receives its events in order; `on_exit` is called once with
/// how it ended (after its last event).
pub fn spawn(
    spec: &StageSpec,
    setup: WorkerSetup<'_>,
    secret: &[u8; 32],
    log_dir: &Path,
    on_event: impl Fn(WorkerEvent) + Send + 'static,
    on_exit: impl FnOnce(String) + Send + 'static,
) -> anyhow::Result<WorkerHandle> {
    std::fs::create_dir_all(log_dir)?;
    let log = log_dir.join(format!("{}-stage{}.log", spec.instance, spec.stage));
    let place = spec.ring.unwrap_or(RingPlace { stage: spec.stage, stages: spec.stages });
    let log_file = std::fs::File::create(&log)?;
    let front_token = hex::encode(rand::random::<[u8; 16]>());
    let mut cmd = super::executable::command()?;
    cmd.arg("worker")
        .arg("--model")
        .arg(&spec.model_path)
        .args(["--layers", &format!("{}-{}", spec.layers.start, spec.layers.end - 1)])
        .args(["--stage", &place.stage.to_string(), "--stages", &place.stages.to_string()])
        .args(["--context", &spec.context.to_string(), "--sequences", &spec.sequences.to_string()])
        .args(["--batch", &spec.batch.to_string(), "--threads", &setup.threads.to_string()])
        .args(["--kv-type", spec.kv_type.name()])
        .args(["--speculate", spec.speculation.name()])
        .args(spec.draft_tokens.iter().flat_map(|n| ["--draft-tokens".to_string(), n.to_string()]))
        .args(spec.saved_prefix_tokens.iter().flat_map(|n| ["--saved-prefix-tokens".to_string(), n.to_string()]))
        .args(["--listen", &setup.listen.to_string()])
        .args(setup.device.args())
        .args(spec.tensor.iter().flat_map(TensorRank::args))
        .args(
            setup.prompt_cache_dir.iter().flat_map(|dir| [std::ffi::OsStr::new("--prompt-cache-dir"), dir.as_os_str()]),
        )
        // The node's own secrets (given to it in its environment) are not the worker's business.
        .env_remove("SHOAL_JOIN_CODE")
        .env_remove("SHOAL_API_TOKEN")
        .env(SECRET_ENV, hex::encode(secret))
        .env(FRONT_TOKEN_ENV, &front_token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start a worker: {e}"))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped");
    let stdin = child.stdin.take();
    let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel::<()>();
    let exited = Arc::new(AtomicBool::new(false));
    let handle = WorkerHandle {
        pid,
        log: log.clone(),
        front_token,
        stdin: tokio::sync::Mutex::new(stdin),
        kill: Mutex::new(Some(kill_tx)),
        exited: exited.clone(),
    };
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut last_failure = None;
        let mut killing = false;
        loop {
            tokio::select! {
                line = lines.next_line() => {
                    let Ok(Some(line)) = line else { break };
                    match serde_json::from_str::<WorkerEvent>(&line) {
                        Ok(event) => {
                            if let WorkerEvent::Failed { error } = &event {
                                last_failure = Some(error.clone());
                            }
                            on_event(event)
                        }
                        Err(_) => tracing::debug!("worker said: {line}"),
                    }
                }
                _ = &mut kill_rx, if !killing => {
                    killing = true;
                    let _ = child.start_kill();
                }
            }
        }
        let status = child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        exited.store(true, Ordering::Relaxed);
        on_exit(last_failure.unwrap_or_else(|| format!("the worker exited ({status}); its log is {}", log.display())));
    });
    Ok(handle)
}

//! The `shoal worker` process: loads one stage, reports its progress to the node agent on stdout,
//! connects into the ring when told, and serves until the agent closes its stdin or the ring breaks.
//! A compute thread owns the stage; async tasks move frames to and from the neighbouring stages and
//! (on stage 0) serve generation requests on localhost.

use super::compute::{
    prefix_identity, Budget, Compute, Head, PrefixDisk, PrefixIndex, PrefixStore, Reuse, Work, FLUSH_AT_STOP,
};
use super::protocol::{FrontEvent, FrontRequest, StageStats, WorkerCommand, WorkerEvent};
use super::supervisor::TensorRank;
use crate::engine::{self, Stage, StageOptions};
use crate::ggml::WeightPlacement;
use crate::model::Model;
use crate::transport::ring::{self, RdmaRoute, TransportReport};
use crate::transport::{self, rdma, FrameSink, FrameSource};
use crate::util::LockExt;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Environment variables the agent passes secrets in (never on the command line, which others can read).
pub const SECRET_ENV: &str = "SHOAL_CLUSTER_SECRET";
pub const FRONT_TOKEN_ENV: &str = "SHOAL_FRONT_TOKEN";

/// Longest token line a front client may send, and longest request line (a request holds its prompt).
const MAX_TOKEN_LINE: u64 = 256;
const MAX_REQUEST_LINE: u64 = 64 << 20;
/// How long a front client has to send its token and request.
const FRONT_OPENING_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub model: PathBuf,
    pub layers: Range<usize>,
    pub stage: usize,
    pub stages: usize,
    pub context: usize,
    pub sequences: usize,
    pub batch: usize,
    pub kv_type: engine::KvType,
    pub threads: usize,
    pub listen: IpAddr,
    pub device: StageDevice,
    /// A rank of a tensor-parallel group: it loads its slice of each of `layers`; its group is the
    /// stage the rank's `ring_stage` says (`stage` and `stages` then number the instance's workers).
    pub tensor: Option<TensorRank>,
    /// Where the stage keeps its saved prefixes on disk (the prompt cache's second tier); none: memory
    /// only.
    pub prompt_cache_dir: Option<PathBuf>,
    /// Tokens of saved prefixes to keep in memory, as placement planned (none: a context per slot).
    pub saved_prefix_tokens: Option<usize>,
    /// Stage 0's drafting (speculative decoding) and its most drafted tokens a step.
    pub speculation: engine::Speculation,
    pub draft_tokens: usize,
}

impl WorkerConfig {
    /// Whether this worker runs its stage in the ring: any but a group's followers.
    pub fn leads(&self) -> bool {
        self.tensor.as_ref().is_none_or(|t| t.rank == 0)
    }

    /// The worker's stage in the ring, and the ring's stages: a group's rank's are its group's.
    pub fn ring_place(&self) -> (usize, usize) {
        match &self.tensor {
            Some(t) => (t.ring_stage, t.ring_stages),
            None => (self.stage, self.stages),
        }
    }
}

/// The device a node's stages compute on (`shoal node --device`), and where their weights live on it
/// (`--copy-weights`, `--no-repack`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageDevice {
    pub name: Option<String>,
    pub weights: WeightPlacement,
}

impl StageDevice {
    /// Whether the stages compute on a GPU (the named device, else the best there is), not the CPU.
    pub fn on_gpu(&self) -> bool {
        let device = crate::ggml::Device::chosen(self.name.as_deref());
        device.is_ok_and(|d| d.kind() != crate::ggml::DeviceKind::Cpu)
    }

    /// The worker arguments that pass this choice on.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = self.name.iter().flat_map(|n| ["--device".to_string(), n.clone()]).collect();
        match self.weights {
            WeightPlacement::Automatic => {}
            WeightPlacement::Copied => args.push("--copy-weights".into()),
            WeightPlacement::AsInFile => args.push("--no-repack".into()),
            WeightPlacement::Mapped => args.push("--no-huge-pages".into()),
        }
        args
    }
}

fn emit(event: &WorkerEvent) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, event);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Whether the worker's layers fit its place in the ring: the first stage starts at the model's first
/// layer and no other does, the last ends at its last layer and no other does (a lone stage or group
/// holds every layer). A stage that breaks this would take or pass on the wrong kind of rows.
fn check_ring_place(config: &WorkerConfig, model_layers: usize) -> anyhow::Result<()> {
    let (stage, stages) = config.ring_place();
    let layers = &config.layers;
    let first = (stage == 0) == (layers.start == 0);
    let last = (stage + 1 == stages) == (layers.end == model_layers);
    if stage >= stages || !first || !last {
        anyhow::bail!(
            "stage {stage} of {stages} cannot run layers {}-{} of a model of {model_layers} layers: the first \
             stage starts at layer 0 and the last ends at the last layer",
            layers.start,
            layers.end.saturating_sub(1)
        );
    }
    Ok(())
}

/// Runs the worker; reports a failure as its last event and returns it.
pub fn run(config: WorkerConfig, secret: [u8; 32], front_token: String) -> anyhow::Result<()> {
    let result = run_inner(config, secret, front_token);
    if let Err(e) = &result {
        emit(&WorkerEvent::Failed { error: crate::errors::chain(e) });
    }
    result
}

fn run_inner(config: WorkerConfig, secret: [u8; 32], front_token: String) -> anyhow::Result<()> {
    emit(&WorkerEvent::Loading { progress: 0.0 });
    let model = Model::open(&config.model)?;
    check_ring_place(&config, model.config().layers)?;
    let options = StageOptions {
        context: config.context,
        sequences: config.sequences,
        threads: config.threads,
        batch: config.batch,
        device: config.device.name.clone(),
        weights: config.device.weights,
        kv_type: config.kv_type,
        // Drafts reach the last stage only where stage 0 makes them.
        draft_rows: match config.speculation.for_model(model.config()) {
            engine::Speculation::Off => 0,
            _ => config.draft_tokens,
        },
    };
    let group = match &config.tensor {
        Some(tensor) => {
            let slices = crate::model::slice::plan(&model, &tensor.shares).map_err(anyhow::Error::msg)?;
            Some(crate::engine::parallel::Group::unlinked(slices, tensor.rank).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    let mut last = 0.0;
    let stage = Stage::load_resident(&model, config.layers.clone(), options, group, |p| {
        if p - last >= 0.05 || p >= 1.0 {
            last = p;
            emit(&WorkerEvent::Loading { progress: p });
        }
    })?;
    // The stage that samples constrains structured output with the model's vocabulary (in a
    // tensor-parallel group, the leader).
    let samples = stage.is_last() && config.leads();
    let grammars = if samples { Some(engine::Grammars::new(model.tokenizer()?)) } else { None };
    let mut prefixes = prefix_store(&config, &stage);
    let head = if config.ring_place().0 == 0 && config.leads() {
        let tokenizer = model.tokenizer()?;
        let template = model.chat_template(&tokenizer)?;
        // SHOAL_PROMPT_CACHE=0 turns the prompt cache off (to measure what it saves).
        let reuse = match std::env::var("SHOAL_PROMPT_CACHE").as_deref() {
            Ok("0") => Reuse::Off,
            _ => Reuse::of(stage.config(), stage.context(), stage.options().batch),
        };
        let head = Head::new(tokenizer, template, config.sequences, reuse)
            .with_speculation(config.speculation.for_model(stage.config()), config.draft_tokens);
        Some(match prefixes.as_mut().and_then(|store| saved_prefix_index(store, reuse)) {
            Some(index) => head.with_saved_prefixes(index),
            None => head,
        })
    } else {
        None
    };
    drop(model);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(serve(config, stage, head, prefixes, grammars, secret, front_token))
}

/// Most bytes of saved prefixes a stage keeps on disk, unless `SHOAL_PROMPT_CACHE_DISK` says otherwise
/// (bytes; 0 turns the disk tier off).
const SAVED_PREFIX_DISK_BYTES: u64 = 8 << 30;

/// How many positions of saved prefixes a stage keeps in memory and on disk: in memory as many as
/// placement gave the instance room for (`--saved-prefix-tokens`; else one more context per slot;
/// `SHOAL_PROMPT_CACHE_MEMORY` overrides both), on disk as many as [`SAVED_PREFIX_DISK_BYTES`] (or
/// `SHOAL_PROMPT_CACHE_DISK`) of this stage's rows hold. A recurrent state counts as the positions of
/// rows its bytes would hold.
fn saved_prefix_budget(config: &WorkerConfig, stage: &Stage) -> Budget {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let planned = config.saved_prefix_tokens.unwrap_or(config.sequences * stage.context());
    let memory = env("SHOAL_PROMPT_CACHE_MEMORY").map_or(planned, |p| p as usize);
    let per_position = (stage.prefix_bytes(1) - stage.prefix_bytes(0)).max(1);
    let disk = (env("SHOAL_PROMPT_CACHE_DISK").unwrap_or(SAVED_PREFIX_DISK_BYTES) / per_position as u64) as usize;
    Budget { memory, disk, state_cost: stage.prefix_bytes(0).div_ceil(per_position) }
}

/// This stage's saved prefixes (the prompt cache beyond its slots), where it can keep them: in memory,
/// and on disk under the worker's prompt-cache directory. `SHOAL_PROMPT_CACHE=0` turns them off too.
fn prefix_store(config: &WorkerConfig, stage: &Stage) -> Option<PrefixStore> {
    if std::env::var("SHOAL_PROMPT_CACHE").as_deref() == Ok("0") || stage.saves_prefixes().is_err() {
        return None;
    }
    let budget = saved_prefix_budget(config, stage);
    let disk = config.prompt_cache_dir.as_ref().filter(|_| budget.disk > 0).and_then(|dir| {
        let opened = prefix_identity(&config.model, stage).and_then(|identity| PrefixDisk::open(dir, identity));
        opened.map_err(|e| tracing::warn!("saved prefixes stay in memory: {}: {e}", dir.display())).ok()
    });
    Some(PrefixStore::new(disk, budget))
}

/// Stage 0's index of the saved prefixes, within the stage's budget, starting from what the disk kept.
fn saved_prefix_index(store: &mut PrefixStore, reuse: Reuse) -> Option<PrefixIndex> {
    if !matches!(reuse, Reuse::AnyPrefix | Reuse::Whole) {
        return None;
    }
    let budget = store.budget();
    let on_disk = store.take_found_on_disk();
    let index = PrefixIndex::new(reuse, budget.memory, store.has_disk().then_some(budget.disk), on_disk);
    Some(index.with_state_cost(budget.state_cost))
}

async fn serve(
    config: WorkerConfig,
    stage: Stage,
    head: Option<Head>,
    prefixes: Option<PrefixStore>,
    grammars: Option<engine::Grammars>,
    secret: [u8; 32],
    front_token: String,
) -> anyhow::Result<()> {
    let data = TcpListener::bind(SocketAddr::new(config.listen, 0)).await?;
    let front = if head.is_some() { Some(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?) } else { None };
    emit(&WorkerEvent::Listening {
        data_port: data.local_addr()?.port(),
        front_port: front.as_ref().map(|f| f.local_addr().map(|a| a.port())).transpose()?,
        memory: stage.memory(),
        device: stage.device().name(),
    });

    let (work_tx, work_rx) = std::sync::mpsc::channel::<Work>();
    let stats = Arc::new(Mutex::new(StageStats::default()));
    let is_head = head.is_some();

    // Commands from the agent; closing stdin ends the worker.
    let (next_tx, next_rx) = tokio::sync::oneshot::channel::<(SocketAddr, Option<RdmaRoute>)>();
    let (group_tx, group_rx) = tokio::sync::oneshot::channel::<(Vec<SocketAddr>, Vec<Option<RdmaRoute>>)>();
    let flush = work_tx.clone();
    tokio::spawn(async move {
        let mut next_tx = Some(next_tx);
        let mut group_tx = Some(group_tx);
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match serde_json::from_str::<WorkerCommand>(&line) {
                Ok(WorkerCommand::Connect { next, rdma }) => {
                    if let Some(tx) = next_tx.take() {
                        let _ = tx.send((next, rdma));
                    }
                }
                Ok(WorkerCommand::ConnectGroup { peers, rdma }) => {
                    if let Some(tx) = group_tx.take() {
                        let _ = tx.send((peers, rdma));
                    }
                }
                Ok(WorkerCommand::Stop) => break,
                Err(e) => tracing::warn!("ignoring a malformed command from the agent: {e}"),
            }
        }
        // Stage 0 saves what the prompt cache has not saved yet (the agent kills a worker a second
        // after asking it to stop).
        let (done, flushed) = std::sync::mpsc::channel();
        if is_head && flush.send(Work::Flush(done)).is_ok() {
            let _ = tokio::task::spawn_blocking(move || flushed.recv_timeout(FLUSH_AT_STOP * 4 / 3)).await;
        }
        std::process::exit(0);
    });

    // The ring: accept the previous stage and connect to the next (over RDMA where the agent chose it),
    // then hand both to the compute thread (and, on stage 0, the previous stage to a reader thread, as
    // stage 0 also takes requests).
    let mut sink: Option<Box<dyn FrameSink>> = None;
    let mut source: Option<Box<dyn FrameSource>> = None;
    if let Some(tensor) = &config.tensor {
        // A rank of a tensor-parallel group: connect to the other ranks, then the leader runs as the
        // stage its group is (the only one, or one of groups chained in a ring) and the others follow it.
        let (peers, routes) =
            group_rx.await.map_err(|_| anyhow::anyhow!("the agent never said where the other ranks are"))?;
        let links = connect_group(tensor.rank, &peers, routes, &data, &secret).await?;
        stage.group().expect("a rank has its group").link(Box::new(links)).map_err(anyhow::Error::msg)?;
        if tensor.rank > 0 {
            return follow(stage, stats).await;
        }
    }
    // A group's stage is its leader's: the previous stage reaches it on its data port, as the ranks
    // did. Until the ranks have linked the port is theirs (a ring connection would be read as a rank's
    // greeting), so the agent connects the previous stage to a group only once the group's other ranks
    // are ready, which they are once linked.
    let stages = config.ring_place().1;
    if stages > 1 {
        let (inbound, outbound) = tokio::join!(accept_previous(&data, &secret), connect_next(next_rx, &secret));
        source = Some(inbound?);
        sink = Some(outbound?);
    }
    let (recycle_tx, recycle_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let compute = Compute::new(stage, stages, head, sink, Some(recycle_tx), stats.clone(), grammars);
    let compute = match prefixes {
        Some(store) => compute.with_prefix_store(store),
        None => compute,
    };
    let compute_thread = match (is_head, source) {
        (true, source) => {
            if let Some(mut source) = source {
                let work = work_tx.clone();
                std::thread::spawn(move || loop {
                    let mut buf = recycle_rx.try_recv().unwrap_or_default();
                    if let Err(e) = source.recv_into(&mut buf) {
                        let _ = work.send(Work::RingBroken(format!("the previous stage is gone ({e})")));
                        return;
                    }
                    if work.send(Work::Frame(buf)).is_err() {
                        return;
                    }
                });
            }
            std::thread::spawn(move || compute.run(work_rx))
        }
        (false, Some(source)) => std::thread::spawn(move || compute.run_relay(source)),
        (false, None) => anyhow::bail!("a stage after the first needs a ring"),
    };

    if let Some(front) = front {
        let work = work_tx.clone();
        let token: Arc<str> = front_token.into();
        tokio::spawn(async move {
            let ids = Arc::new(AtomicU64::new(1));
            while let Ok((stream, _)) = front.accept().await {
                let (work, token, ids) = (work.clone(), token.clone(), ids.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve_front(stream, &token, work, ids).await {
                        tracing::debug!("a front connection ended: {e}");
                    }
                });
            }
        });
    }

    let stats_task = report_stats_every_second(stats.clone());
    emit(&WorkerEvent::Ready);
    drop(work_tx);
    let reason = tokio::task::spawn_blocking(move || compute_thread.join()).await;
    stats_task.abort();
    let reason = match reason {
        Ok(Ok(reason)) => reason,
        _ => "the compute thread panicked".to_string(),
    };
    anyhow::bail!("{reason}")
}

/// Sends the stage's stats to the agent once a second until aborted.
fn report_stats_every_second(stats: Arc<Mutex<StageStats>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let s = stats.locked().clone();
            emit(&WorkerEvent::Stats { stats: s });
        }
    })
}

/// A rank of a tensor-parallel group other than the leader: reports ready, then runs the leader's steps
/// until it ends the group or a link breaks, counting its steps, their compute time and its sums' time
/// in its stats as the leader does.
async fn follow(mut stage: Stage, stats: Arc<Mutex<StageStats>>) -> anyhow::Result<()> {
    let stats_task = report_stats_every_second(stats.clone());
    emit(&WorkerEvent::Ready);
    let record = move |stage: &Stage, step: crate::engine::parallel::FollowedStep| {
        let sum_p50 = || stage.group().and_then(|g| g.sum_p50());
        stats.locked().record_step(step.tokens, step.rows, step.took, sum_p50);
    };
    let ended =
        tokio::task::spawn_blocking(move || crate::engine::parallel::follow_reporting(&mut stage, record)).await;
    stats_task.abort();
    match ended {
        Ok(Ok(())) => anyhow::bail!("the group's leader ended it"),
        Ok(Err(reason)) => anyhow::bail!("{reason}"),
        Err(_) => anyhow::bail!("the compute thread panicked"),
    }
}

/// Connects this rank to the others of its group, then starts RDMA on the pairs the agent chose it for;
/// each pair's transport goes to the agent.
async fn connect_group(
    rank: usize,
    peers: &[SocketAddr],
    routes: Vec<Option<RdmaRoute>>,
    data: &TcpListener,
    secret: &[u8; 32],
) -> anyhow::Result<transport::group::RankLinks> {
    let mut links = transport::group::connect(rank, peers, data, secret).await.map_err(anyhow::Error::msg)?;
    let started = tokio::task::spawn_blocking(move || {
        let opener = rdma::open::platform();
        let report: transport::group::GroupReport =
            Arc::new(|peer, transport| emit(&WorkerEvent::GroupLink { peer, transport }));
        let setup = transport::group::RdmaSetup {
            routes: &routes,
            opener: &*opener,
            report,
            patience: transport::group::RdmaPatience::default(),
        };
        links.start_rdma(setup).map(|()| links)
    })
    .await?;
    started.map_err(|e| anyhow::anyhow!("starting the group's links failed: {e}"))
}

/// Accepts the previous stage and opens the link from it (with RDMA if it offers it).
async fn accept_previous(data: &TcpListener, secret: &[u8; 32]) -> anyhow::Result<Box<dyn FrameSource>> {
    let tcp = transport::accept_tcp(data, secret).await?;
    let opened = tokio::task::spawn_blocking(move || {
        ring::open_inbound(tcp, &*rdma::open::platform(), ring::RingTimeouts::default())
    })
    .await?;
    opened.map_err(|e| anyhow::anyhow!("opening the link from the previous stage failed: {e}"))
}

/// Connects to the next stage once the agent says where it is, over RDMA if the agent chose it; each
/// change of the link's transport goes to the agent.
async fn connect_next(
    next: tokio::sync::oneshot::Receiver<(SocketAddr, Option<RdmaRoute>)>,
    secret: &[u8; 32],
) -> anyhow::Result<Box<dyn FrameSink>> {
    let (next, route) = next.await.map_err(|_| anyhow::anyhow!("the agent never said where the next stage is"))?;
    // The next stage may still be starting; keep trying for a while.
    let mut tries = 0;
    let tcp = loop {
        match transport::connect_tcp(next, secret).await {
            Ok(c) => break c,
            Err(e) if tries < 50 => {
                tries += 1;
                tracing::debug!("connecting to the next stage at {next}: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => anyhow::bail!("cannot connect to the next stage at {next}: {e}"),
        }
    };
    let report: TransportReport = Arc::new(|transport| emit(&WorkerEvent::RingLink { transport }));
    let opened = tokio::task::spawn_blocking(move || {
        ring::open_outbound(tcp, route.as_ref(), &*rdma::open::platform(), report, ring::RingTimeouts::default())
    })
    .await?;
    opened.map_err(|e| anyhow::anyhow!("opening the link to the next stage at {next} failed: {e}"))
}

/// One client on the front port: a token line, a request line, then events until the request ends.
async fn serve_front(
    stream: TcpStream,
    token: &str,
    work: std::sync::mpsc::Sender<Work>,
    ids: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let opening = async {
        let given = read_line_bounded(&mut read, MAX_TOKEN_LINE).await?;
        if given.len() != token.len() || !given.bytes().zip(token.bytes()).fold(true, |ok, (a, b)| ok & (a == b)) {
            anyhow::bail!("wrong front token");
        }
        read_line_bounded(&mut read, MAX_REQUEST_LINE).await
    };
    let line = tokio::time::timeout(FRONT_OPENING_TIMEOUT, opening)
        .await
        .map_err(|_| anyhow::anyhow!("no request within {FRONT_OPENING_TIMEOUT:?}"))??;
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let request: FrontRequest = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            let event = FrontEvent::Error { message: format!("malformed request: {e}"), client_error: true };
            write.write_all(format!("{}\n", serde_json::to_string(&event)?).as_bytes()).await?;
            return Ok(());
        }
    };
    let id = ids.fetch_add(1, Ordering::Relaxed);
    let mut scratch = [0u8; 256];
    work.send(Work::Request { id, request: Box::new(request), events: events_tx })
        .map_err(|_| anyhow::anyhow!("the stage stopped"))?;
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return Ok(()) };
                let end = event.is_final();
                let line = format!("{}\n", serde_json::to_string(&event)?);
                if write.write_all(line.as_bytes()).await.is_err() {
                    let _ = work.send(Work::Cancel { id });
                    return Ok(());
                }
                if end {
                    return Ok(());
                }
            }
            // Anything the client sends after its request is ignored; its end cancels the request.
            closed = read.read(&mut scratch) => {
                if matches!(closed, Ok(0) | Err(_)) {
                    let _ = work.send(Work::Cancel { id });
                    return Ok(());
                }
            }
        }
    }
}

/// One line (without its newline) of at most `max` bytes; longer is an error, not an allocation.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(reader: &mut R, max: u64) -> anyhow::Result<String> {
    let mut line = Vec::new();
    (&mut *reader).take(max + 1).read_until(b'\n', &mut line).await?;
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() as u64 > max {
        anyhow::bail!("a line longer than {max} bytes");
    }
    Ok(String::from_utf8(line)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(layers: Range<usize>, stage: usize, stages: usize, tensor: Option<TensorRank>) -> WorkerConfig {
        WorkerConfig {
            model: PathBuf::from("m.gguf"),
            layers,
            stage,
            stages,
            context: 256,
            sequences: 1,
            batch: 32,
            kv_type: engine::KvType::F16,
            threads: 1,
            listen: IpAddr::from([127, 0, 0, 1]),
            device: StageDevice::default(),
            tensor,
            prompt_cache_dir: None,
            saved_prefix_tokens: None,
            speculation: engine::Speculation::Auto,
            draft_tokens: engine::DEFAULT_DRAFT_TOKENS,
        }
    }

    #[test]
    fn a_stage_runs_only_the_layers_its_place_in_the_ring_allows() {
        let group = |rank, ring_stage, ring_stages| {
            Some(TensorRank { ring_stage, ring_stages, ..TensorRank::alone(rank, vec![1.0, 1.0]) })
        };
        for ok in [
            config(0..30, 0, 1, None),
            config(0..10, 0, 3, None),
            config(10..20, 1, 3, None),
            config(20..30, 2, 3, None),
            // A lone group's ranks are numbered as the instance's workers; the group is the ring's one stage.
            config(0..30, 1, 2, group(1, 0, 1)),
            config(15..30, 2, 3, group(1, 1, 2)),
        ] {
            assert!(check_ring_place(&ok, 30).is_ok(), "{:?} {:?}", ok.layers, ok.tensor);
        }
        for bad in [
            config(0..10, 0, 1, None),
            config(10..30, 0, 2, None),
            config(0..30, 1, 2, None),
            config(0..20, 2, 2, None),
            config(0..10, 0, 2, group(0, 0, 1)),
            config(0..15, 1, 2, group(1, 1, 2)),
        ] {
            let error = check_ring_place(&bad, 30).unwrap_err().to_string();
            assert!(error.contains("cannot run layers"), "{error}");
        }
    }

    #[tokio::test]
    async fn front_lines_are_bounded() {
        let mut input: &[u8] = b"token\nrest";
        assert_eq!(super::read_line_bounded(&mut input, 8).await.unwrap(), "token");
        let long = vec![b'x'; 100];
        let mut input: &[u8] = &long;
        assert!(super::read_line_bounded(&mut input, 10).await.is_err());
    }
}

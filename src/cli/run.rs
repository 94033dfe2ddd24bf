//! `shoal run MODEL_PATH`: launches a model on the cluster (placement preview, then the stages'
//! progress), and returns once it is ready to serve; `--replace` stops what runs under its name first.
//! Time spent fetching shares of the model does not count against its ten minutes: only time without
//! progress does.

use super::client::NodeAddress;
use shoal::instances::{InstanceInfo, InstanceState};
use shoal::worker::WorkerState;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct RunArgs {
    /// The GGUF file, a path on the node that launches it (--node); the other nodes that run a stage
    /// fetch their share of it unless they hold it already.
    model: PathBuf,
    #[command(flatten)]
    node: NodeAddress,
    /// Explicit placement: NODE:FIRST-LAST,… in ring order (NODE is a name or an id prefix).
    #[arg(long)]
    layers: Option<String>,
    /// How to split the model: `pipeline` (layer ranges, one node after another), `tensor` (a slice of
    /// every layer on every node of a group, faster over fast links) or `chain` (layer ranges, each run
    /// by a group or by one node: for nodes whose links differ). Default: the fastest placement
    /// predicts.
    #[arg(long, conflicts_with = "layers")]
    parallel: Option<shoal::placement::Parallelism>,
    /// Run on exactly these nodes (names or id prefixes), in this order: the ring of a pipeline, or the
    /// ranks of a tensor-parallel group (the first leads); a chain is planned over some of them.
    #[arg(long, value_delimiter = ',', conflicts_with = "layers")]
    nodes: Vec<String>,
    /// Context of each request, in tokens (default: 2048, or the model's trained context when that is
    /// less; more than the model was trained on is refused).
    #[arg(long, value_parser = super::at_least_one)]
    context: Option<usize>,
    /// Requests served at once.
    #[arg(long, default_value_t = 4)]
    sequences: usize,
    /// Compute threads per stage (default: each node's cores divided by its stages).
    #[arg(long)]
    threads: Option<usize>,
    /// Most prompt tokens a step takes (default 512): a longer prompt runs in chunks of this many. A
    /// larger batch takes more memory on every stage.
    #[arg(long, value_parser = super::at_least_one)]
    batch: Option<usize>,
    /// The KV cache's element type on every stage: f16 (default), q8_0 or q4_0 (about half and a quarter
    /// of the memory per token of context, with their rounding).
    #[arg(long)]
    kv_type: Option<shoal::engine::KvType>,
    /// Tokens of conversations to keep in memory beyond the requests' slots, so that one coming back
    /// prefills only what is new (default: one more context per slot, as far as the nodes' memory
    /// allows; 0 keeps none). The disk keeps more, in each node's data directory
    #[arg(long)]
    prompt_cache: Option<usize>,
    /// Most tokens any reply may have, whatever a request asks (default: up to the context's end): a
    /// bound for clients that set none, such as coding agents.
    #[arg(long, value_parser = super::at_least_one)]
    max_reply_tokens: Option<usize>,
    /// Speculative decoding: requests draft the tokens that followed the same few tokens earlier in
    /// their prompt or reply, and the model checks them all in one step — auto (default: drafting stops
    /// for a request while too few drafts are kept to pay for them), on, or off
    #[arg(long)]
    speculate: Option<shoal::engine::Speculation>,
    /// Most drafted tokens a request's step carries (default 8, at most 32)
    #[arg(long, value_parser = super::at_least_one)]
    draft_tokens: Option<usize>,
    /// The name clients use (default: the model's own).
    #[arg(long)]
    name: Option<String>,
    /// Only show the placement.
    #[arg(long)]
    preview: bool,
    /// Stop the instance that already runs under this name first (otherwise the launch is refused).
    #[arg(long, conflicts_with = "preview")]
    replace: bool,
}

/// How long a launch may go without any stage's progress changing.
const PATIENCE: Duration = Duration::from_secs(600);

#[derive(serde::Deserialize)]
struct Preview {
    model: String,
    plan: shoal::placement::Plan,
    #[serde(default)]
    fetches: Vec<Option<shoal::instances::ShareNeed>>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let model = std::fs::canonicalize(&args.model).unwrap_or(args.model.clone());
    let body = serde_json::json!({
        "model": model, "layers": args.layers, "context": args.context, "sequences": args.sequences,
        "threads": args.threads, "batch": args.batch, "kv_type": args.kv_type, "prompt_cache": args.prompt_cache,
        "max_reply_tokens": args.max_reply_tokens, "speculation": args.speculate, "draft_tokens": args.draft_tokens,
        "name": args.name, "parallel": args.parallel,
        "nodes": (!args.nodes.is_empty()).then_some(&args.nodes),
    });
    if args.replace {
        let name = args.name.clone().or_else(|| shoal::model::library::model_name(&model));
        replace(&args.node, name.as_deref().unwrap_or_default())?;
    }
    let preview: Preview = args.node.post("/api/placements/preview", body.clone())?;
    let plan = &preview.plan;
    let split = match plan.parallel {
        shoal::placement::Parallelism::Pipeline => format!("{} stage(s)", plan.stages.len()),
        shoal::placement::Parallelism::Tensor => format!("tensor parallel over {} nodes", plan.stages.len()),
        shoal::placement::Parallelism::Chain => {
            let sizes: Vec<String> = plan.ring().iter().map(|g| g.len().to_string()).collect();
            format!("a chain of groups of {} node(s) over {} nodes", sizes.join(", "), plan.stages.len())
        }
    };
    println!("{}: {split}, {:.1} MB in all", preview.model, plan.total_bytes as f64 / 1e6);
    for (i, s) in preview.plan.stages.iter().enumerate() {
        let fetch = match preview.fetches.get(i).cloned().flatten() {
            None => String::new(),
            Some(need) => match need.from {
                Some(from) => format!(", fetches its {:.1} MB share from {from}", need.bytes as f64 / 1e6),
                None => ", lacks its share and nothing in reach has it".to_string(),
            },
        };
        // A tensor-parallel rank's share, relative to its group's others'; in a chain, of its layers.
        let rank = plan.rank_of(i);
        let share = rank.as_ref().map_or(1.0, |r| r.shares[r.rank] / r.shares.iter().sum::<f64>());
        let layers = match rank {
            Some(r) if r.ring_stages > 1 => format!("layers {}-{} ", s.layers.start, s.layers.end - 1),
            _ => String::new(),
        };
        let part = match &s.slice {
            Some(slice) => format!(
                "{layers}{:>3.0}% heads {:>2}-{:<2} ffn {}-{}{}",
                100.0 * share,
                slice.query_heads.start,
                slice.query_heads.end - 1,
                slice.feed_forward.start,
                slice.feed_forward.end.saturating_sub(1),
                if slice.experts.is_empty() {
                    String::new()
                } else {
                    format!(" experts {}-{}", slice.experts.start, slice.experts.end - 1)
                }
            ),
            None => format!("layers {:>3}-{:<3}", s.layers.start, s.layers.end - 1),
        };
        println!(
            "  {:<16} {part} {:>8.1} MB of {:>8.1} MB offered{fetch}",
            s.node_name,
            s.bytes.total() as f64 / 1e6,
            s.offer as f64 / 1e6
        );
    }
    println!("  prompt cache: {} tokens of conversations kept in memory beyond the slots", plan.saved_prefix_tokens);
    if let Some(tps) = plan.expected_decode_tokens_per_second {
        println!("  expected decode ≈ {tps:.0} tokens/s (links {} µs per token)", plan.ring_us);
    }
    for other in &plan.alternatives {
        let rate = other.expected_decode_tokens_per_second.map(|r| format!(" ≈ {r:.0} tokens/s")).unwrap_or_default();
        let over = if other.nodes.is_empty() { String::new() } else { format!(" over {}", other.nodes.join(", ")) };
        println!("  not {}{over}{rate}: {}", other.parallel, other.reason);
    }
    if args.preview {
        return Ok(());
    }
    let info: InstanceInfo = args.node.post("/api/instances", body)?;
    let mut deadline = Instant::now() + PATIENCE;
    let mut shown = String::new();
    let mut watched = info.id;
    let mut shown_error = None;
    loop {
        let now: InstanceInfo = args.node.get(&format!("/api/instances/{watched}"))?;
        let line = now
            .stages
            .iter()
            .map(|s| {
                let state = format!("{} {:?} {:.0}%", s.node_name, s.state, s.progress * 100.0).to_lowercase();
                match &s.fetch {
                    Some(f) if s.state == WorkerState::Fetching && f.bytes_per_second > 0 => {
                        format!("{state} ({:.1} MB/s from {})", f.bytes_per_second as f64 / 1e6, f.from)
                    }
                    _ => state,
                }
            })
            .collect::<Vec<_>>()
            .join(" · ");
        if line != shown {
            eprintln!("  {line}");
            shown = line;
            deadline = Instant::now() + PATIENCE;
        }
        match now.state {
            InstanceState::Ready => {
                println!(
                    "ready: instance {} serves `{}`; try  shoal chat --model {}{}",
                    now.id,
                    now.model,
                    now.model,
                    args.node.flag()
                );
                return Ok(());
            }
            InstanceState::Replaced if now.replaced_by.is_some() => {
                let next = now.replaced_by.unwrap_or_default();
                eprintln!("  placed again as instance {next}");
                watched = next;
            }
            InstanceState::Failed | InstanceState::Stopped | InstanceState::Replaced => {
                anyhow::bail!("the instance {:?}: {}", now.state, now.error.unwrap_or_default())
            }
            InstanceState::Recovering => {
                if now.error != shown_error {
                    eprintln!("  {}", now.error.clone().unwrap_or_default());
                    shown_error = now.error;
                }
                std::thread::sleep(Duration::from_millis(200))
            }
            InstanceState::Launching if Instant::now() > deadline => {
                anyhow::bail!(
                    "the instance {} made no progress for 10 minutes; it keeps launching on the cluster (see `shoal ps{1}` or the dashboard; stop it with `shoal stop {0}{1}`)",
                    now.id,
                    args.node.flag()
                )
            }
            InstanceState::Launching => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Stops the active instances named `name` and waits until the node no longer counts them as running.
fn replace(node: &NodeAddress, name: &str) -> anyhow::Result<()> {
    let instances: Vec<InstanceInfo> = node.get("/api/instances")?;
    let running: Vec<&InstanceInfo> = instances.iter().filter(|i| i.state.is_active() && i.model == name).collect();
    for i in &running {
        let _: InstanceInfo = node.delete(&format!("/api/instances/{}", i.id))?;
        eprintln!("stopped instance {} (`{name}`) to replace it", i.id);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running.is_empty() && Instant::now() < deadline {
        let now: Vec<InstanceInfo> = node.get("/api/instances")?;
        if !now.iter().any(|i| i.state.is_active() && i.model == name) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

//! `shoal bench`: prefill and decode tokens/s (pp/tg medians as llama-bench reports them), load time and
//! peak memory, as a table or JSON.

use shoal::engine::bench::{self, BenchOptions};
use shoal::engine::default_threads;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The GGUF model file (without --cluster).
    #[arg(long, required_unless_present = "cluster")]
    model: Option<PathBuf>,
    /// Measure the model running on the cluster, through the node's API.
    #[arg(long)]
    cluster: bool,
    /// With --cluster: the instance's model name (default: the first one running).
    #[arg(long, requires = "cluster")]
    name: Option<String>,
    #[command(flatten)]
    node: super::client::NodeAddress,
    /// Compute threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Prompt length of the prefill test.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens of the decode test.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Repetitions of each test (the median is reported).
    #[arg(long, default_value_t = 5)]
    repetitions: usize,
    /// Measure the model split into in-process stages at these layers.
    #[arg(long, value_delimiter = ',')]
    split: Vec<usize>,
    #[command(flatten)]
    device: super::devices::DeviceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.cluster {
        return run_cluster(&args);
    }
    let options = BenchOptions {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: args.repetitions,
        threads: args.threads.unwrap_or_else(default_threads),
        splits: args.split.clone(),
        stage: args.device.apply(shoal::engine::StageOptions::default())?,
    };
    let report = bench::run(args.model.as_deref().expect("clap requires it"), &options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "model      {} ({:.1} MiB), {} stage(s), {} threads",
        report.model,
        mib(report.model_bytes),
        report.stages,
        report.threads
    );
    println!("device     {} (weights {})", report.devices.join(", "), report.weights);
    println!(
        "pp{:<8} {:>8.1} tok/s  (median of {})",
        report.prompt_tokens, report.prefill_tokens_per_second, report.repetitions
    );
    println!(
        "tg{:<8} {:>8.1} tok/s  (median of {})",
        report.gen_tokens, report.decode_tokens_per_second, report.repetitions
    );
    println!("load       {:>8.3} s", report.load_seconds);
    if let Some(peak) = report.peak_resident_bytes {
        println!("peak RSS   {:>8.1} MiB", mib(peak));
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct ClusterReport {
    model: String,
    stages: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    repetitions: usize,
    prefill_tokens_per_second: f64,
    decode_tokens_per_second: f64,
    time_to_first_token_ms: f64,
    /// Median per-hop link time of a decode step (µs), for multi-stage instances.
    hop_p50_us: Option<u64>,
}

/// Prefill and decode rates through the running instance: random prompt tokens, greedy, end-of-text
/// ignored, medians over the repetitions (the first run warms up and is not counted).
fn run_cluster(args: &BenchArgs) -> anyhow::Result<()> {
    use rand::{Rng, SeedableRng};
    let instances: Vec<shoal::instances::InstanceInfo> = args.node.get("/api/instances")?;
    let instance = instances
        .into_iter()
        .filter(|i| i.state == shoal::instances::InstanceState::Ready)
        .find(|i| args.name.as_ref().is_none_or(|n| *n == i.model || *n == i.id))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no ready instance{}; start one with `shoal run`",
                args.name.as_ref().map(|n| format!(" called {n}")).unwrap_or_default()
            )
        })?;
    if args.prompt_tokens + args.gen_tokens >= instance.context {
        anyhow::bail!(
            "the instance's context ({}) is too small for {} + {} tokens; launch with a larger --context",
            instance.context,
            args.prompt_tokens,
            args.gen_tokens
        );
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let vocabulary = instance.plan.vocabulary as u32;
    let mut reports = Vec::new();
    for round in 0..=args.repetitions.max(1) {
        let prompt: Vec<u32> = (0..args.prompt_tokens.max(1)).map(|_| rng.random_range(0..vocabulary)).collect();
        let body = serde_json::json!({
            "model": instance.model, "prompt": prompt, "max_tokens": args.gen_tokens,
            "temperature": 0, "ignore_eos": true,
        });
        let answer: serde_json::Value = args.node.post("/v1/completions", body)?;
        let report: shoal::worker::GenerationReport = serde_json::from_value(answer["shoal"].clone())?;
        if round > 0 {
            reports.push(report);
        }
    }
    let median =
        |f: &dyn Fn(&shoal::worker::GenerationReport) -> f64| bench::median(&reports.iter().map(f).collect::<Vec<_>>());
    let hops: Vec<f64> = reports.iter().filter_map(|r| r.hop_p50_us.map(|h| h as f64)).collect();
    let report = ClusterReport {
        model: instance.model.clone(),
        stages: instance.stages.len(),
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: reports.len(),
        prefill_tokens_per_second: median(&|r| r.prefill_tokens_per_second),
        decode_tokens_per_second: median(&|r| r.decode_tokens_per_second),
        time_to_first_token_ms: median(&|r| r.time_to_first_token_ms),
        hop_p50_us: (!hops.is_empty()).then(|| bench::median(&hops) as u64),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("model      {} on {} stage(s), through the cluster API", report.model, report.stages);
    println!(
        "pp{:<8} {:>8.1} tok/s  (median of {})",
        report.prompt_tokens, report.prefill_tokens_per_second, report.repetitions
    );
    println!("tg{:<8} {:>8.1} tok/s", report.gen_tokens, report.decode_tokens_per_second);
    println!("ttft       {:>8.1} ms", report.time_to_first_token_ms);
    if let Some(h) = report.hop_p50_us {
        println!("hop p50    {h:>8} µs per link per decode step");
    }
    Ok(())
}

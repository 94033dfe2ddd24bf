//! `shoal bench`: prefill and decode tokens/s (pp/tg medians as llama-bench reports them), load time and
//! peak memory, as a table or JSON; with `--concurrency`, the decode rate of several sequences batched;
//! with `--cluster`, the same through a running instance ([`cluster`]).

#[path = "bench_cluster.rs"]
mod cluster;

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
    /// Sequences decoding at once (batched in one step; through the cluster, concurrent requests): the
    /// aggregate and per-sequence decode rates.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Measure the model split into in-process stages at these layers.
    #[arg(long, value_delimiter = ',')]
    split: Vec<usize>,
    /// Measure the model as a tensor-parallel group of this many ranks on threads of this process
    /// (each with --threads compute threads), linked by channels: the group without a network.
    #[arg(long, default_value_t = 1, conflicts_with = "split")]
    tensor_parallel: usize,
    #[command(flatten)]
    device: super::devices::DeviceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.cluster {
        return cluster::run(&args);
    }
    let options = BenchOptions {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: args.repetitions,
        concurrency: args.concurrency.max(1),
        threads: args.threads.unwrap_or_else(default_threads),
        splits: args.split.clone(),
        tensor_parallel: args.tensor_parallel,
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
    let repacked = match report.repacked_bytes {
        0 => String::new(),
        bytes => format!(", {:.1} MiB of them repacked", mib(bytes)),
    };
    println!("device     {} (weights {}{repacked})", report.devices.join(", "), report.weights);
    println!("built for  target-cpu {}", report.built_for_cpu);
    println!(
        "pp{:<8} {:>8.1} tok/s  (median of {})",
        report.prompt_tokens, report.prefill_tokens_per_second, report.repetitions
    );
    println!(
        "tg{:<8} {:>8.1} tok/s  (median of {})",
        report.gen_tokens, report.decode_tokens_per_second, report.repetitions
    );
    if let Some(batched) = &report.batched {
        println!(
            "tg{:<8} {:>8.1} tok/s  in all, {} sequences batched ({:.2}x one sequence), {:.1} tok/s each",
            report.gen_tokens,
            batched.aggregate_tokens_per_second,
            batched.sequences,
            batched.aggregate_tokens_per_second / report.decode_tokens_per_second,
            batched.per_sequence_tokens_per_second
        );
    }
    println!("load       {:>8.3} s", report.load_seconds);
    if let Some(peak) = report.peak_resident_bytes {
        println!("peak RSS   {:>8.1} MiB", mib(peak));
    }
    Ok(())
}

//! `shoal bench`: prefill and decode tokens/s (pp/tg medians as llama-bench reports them), load time and
//! peak memory, as a table or JSON.

use shoal::engine::bench::{self, BenchOptions};
use shoal::engine::default_threads;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The GGUF model file.
    #[arg(long)]
    model: PathBuf,
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
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let options = BenchOptions {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: args.repetitions,
        threads: args.threads.unwrap_or_else(default_threads),
        splits: args.split,
    };
    let report = bench::run(&args.model, &options)?;
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

//! Command-line parsing, logging set-up and error reporting shared by every subcommand.

mod bench;
mod chat;
mod client;
mod code;
mod devices;
mod doctor;
mod generate;
mod leave;
mod links;
mod models;
mod node;
mod ps;
mod run;
mod status;
mod tokenize;
mod worker;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "shoal", version, about = "Run one large language model across several computers")]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace). RUST_LOG overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt with a local model (optionally split into stages).
    Generate(generate::GenerateArgs),
    /// Print the token ids of the text on stdin as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Measure prefill and decode tokens/s of a model on this machine.
    Bench(bench::BenchArgs),
    /// List the devices this machine can run models on (the CPU; a GPU where this build has one).
    Devices(devices::DevicesArgs),
    /// Run this machine's node agent headless (cluster, discovery, links, API).
    Node(shoal::node::NodeOptions),
    /// Show the cluster: members, memory pool, links, model instances, nearby clusters.
    Status(status::StatusArgs),
    /// Make a join code for a new machine (valid 10 minutes).
    Code(code::CodeArgs),
    /// Leave the cluster (the node starts a cluster of its own).
    Leave(leave::LeaveArgs),
    /// Show the links between members; --measure measures their throughput now.
    Links(links::LinksArgs),
    /// Check whether this node can use RDMA over Thunderbolt (and what to fix).
    Doctor(doctor::DoctorArgs),
    /// Launch a model on the cluster (split over the nodes as placement decides).
    Run(run::RunArgs),
    /// List the model instances the cluster runs: name, state, stages and their nodes.
    Ps(ps::PsArgs),
    /// Stop a model instance (by its model's name or its id).
    Stop(ps::StopArgs),
    /// List the models this node has (shoal's directory, the Hugging Face cache, added files).
    Models(models::ModelsArgs),
    /// Download a GGUF model from Hugging Face: REPO or REPO:FILE.
    Pull(models::PullArgs),
    /// Chat with a model running on the cluster.
    Chat(chat::ChatArgs),
    /// One stage of a model instance (started by `shoal node`).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Devices(args) => devices::run(args),
        Command::Node(args) => node::run(args),
        Command::Status(args) => status::run(args),
        Command::Code(args) => code::run(args),
        Command::Leave(args) => leave::run(args),
        Command::Links(args) => links::run(args),
        Command::Worker(args) => worker::run(args),
        Command::Run(args) => run::run(args),
        Command::Ps(args) => ps::ps(args),
        Command::Stop(args) => ps::stop(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Models(args) => models::run(args),
        Command::Pull(args) => models::pull(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", shoal::errors::chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// Reads all of stdin as UTF-8 text.
fn read_stdin() -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the prompt from stdin (it must be UTF-8 text)")?;
    Ok(text)
}

/// Parses a count that must be at least 1 (`--max-tokens`, `--context`): 0 would run nothing and report
/// nonsense.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("0 would do nothing: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{text:?} is not a whole number ({e})")),
    }
}

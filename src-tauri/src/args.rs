//! The app's command line: the node's options (the same as `shoal node`, also from `SHOAL_*` variables),
//! or `worker …` when the agent starts a model stage.

use clap::{Parser, Subcommand};
use shoal::node::NodeOptions;
use shoal::worker::args::WorkerArgs;

#[derive(Parser)]
#[command(name = "shoal-app", version, about = "shoal's menu-bar app", args_conflicts_with_subcommands = true)]
pub struct AppArgs {
    #[command(subcommand)]
    pub command: Option<AppCommand>,
    #[command(flatten)]
    pub node: NodeOptions,
}

#[derive(Subcommand)]
pub enum AppCommand {
    /// One stage of a model instance (started by the node agent).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,shoal=info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

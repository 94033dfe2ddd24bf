//! How a node is started: the options shared by `shoal node` and the app (which runs the same agent
//! in-process), and starting the agent and its API from them.

use crate::api::{self, ApiConfig};
use crate::cluster::{self, Agent, AgentConfig, JoinTarget};
use crate::desktop::quit::QuitSwitch;
use crate::instances::Instances;
use crate::node::{DataDir, DataDirLock};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct NodeOptions {
    /// Where the node keeps its identity and membership (default: the platform's data directory).
    #[arg(long, env = "SHOAL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The node's name in the cluster (default: the host name).
    #[arg(long, env = "SHOAL_NAME")]
    pub name: Option<String>,
    /// The API port; the control port (which other nodes connect to) is the next one.
    #[arg(long, env = "SHOAL_PORT", default_value_t = crate::cluster::DEFAULT_API_PORT)]
    pub port: u16,
    /// The address the API listens on. Anything but loopback needs --api-token.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub listen: IpAddr,
    /// Token required for API actions when --listen is not loopback. Prefer the environment variable
    /// SHOAL_API_TOKEN: a command-line argument shows in every user's process list.
    #[arg(long, env = "SHOAL_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Also serve Ollama's API on this port (Ollama's own is 11434), on the --listen address with the same
    /// token and checks, for clients that cannot be pointed at another port.
    #[arg(long, env = "SHOAL_OLLAMA_PORT")]
    pub ollama_port: Option<u16>,
    /// The address the control port listens on (all interfaces by default).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub bind: IpAddr,
    /// Join a cluster: CODE (found nearby by mDNS) or CODE@HOST[:PORT] (HOST's control port). Prefer the
    /// environment variable SHOAL_JOIN_CODE: a command-line argument shows in every user's process list.
    #[arg(long, env = "SHOAL_JOIN_CODE", hide_env_values = true)]
    pub join: Option<JoinTarget>,
    /// Another node's control address to connect to, for networks without multicast (repeatable).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// Do not use mDNS (no advertising, no discovery).
    #[arg(long, env = "SHOAL_NO_MDNS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_mdns: bool,
    /// Most memory this node offers to models, e.g. 64MB or 48GiB (default: what is available, less
    /// headroom for the OS).
    #[arg(long, value_parser = crate::util::parse_bytes)]
    pub memory_limit: Option<u64>,
    /// The device this node's stages compute on, as `shoal devices` names it (default: the first GPU,
    /// else the CPU).
    #[arg(long, env = "SHOAL_DEVICE")]
    pub device: Option<String>,
    /// Copy the weights into the device's memory even where it could compute on the mapped file (what a
    /// discrete GPU needs; on the CPU, a way to test that path).
    #[arg(long)]
    pub copy_weights: bool,
    /// On the CPU, compute on the weights exactly as the file lays them out: no copy into ggml's
    /// interleaved layout, whose kernels multiply Q4_0, Q4_K, IQ4_NL and MXFP4 (on ARM also Q5_K, Q6_K
    /// and Q8_0) matrices faster. Loads faster, computes slower.
    #[arg(long, conflicts_with = "copy_weights")]
    pub no_repack: bool,
    /// On Linux's CPU, compute on the weights that are not repacked in place in the mapped file, as macOS
    /// does, rather than on a copy in huge pages (which decodes faster; the copy takes the memory the
    /// mapped pages would). Loads faster, computes slower.
    #[arg(long, conflicts_with_all = ["copy_weights", "no_repack"])]
    pub no_huge_pages: bool,
    /// Launch this model (a GGUF file) as soon as the node can place it, unless the cluster already
    /// serves a model of that name.
    #[arg(long = "run", value_name = "MODEL.gguf", env = "SHOAL_RUN")]
    pub run: Option<PathBuf>,
    /// Seconds a member may stay down before this node forgets it (it rejoins by reconnecting).
    #[arg(long, env = "SHOAL_FORGET_DOWN_AFTER", hide = true, default_value_t = cluster::agent::FORGET_DOWN_AFTER.as_secs())]
    pub forget_down_after: u64,
}

/// A node agent that runs, with the address its API answers on.
pub struct StartedNode {
    pub agent: Agent,
    /// The model instances service running on it.
    pub instances: Arc<Instances>,
    pub api_addr: SocketAddr,
    /// The data directory's lock, released when this is dropped (or the process ends).
    pub data_lock: DataDirLock,
    /// What `POST /api/quit` calls: the app makes it end the app.
    pub quit: QuitSwitch,
}

impl NodeOptions {
    /// Starts the agent and its API on the current tokio runtime.
    pub async fn start(mut self) -> anyhow::Result<StartedNode> {
        warn_about_secrets_in_argv(std::env::args());
        if let Some(model) = &self.run {
            let found = std::fs::canonicalize(model).ok().filter(|p| p.is_file());
            let found = found.ok_or_else(|| anyhow::anyhow!("--run {}: no such model file", model.display()))?;
            self.run = Some(found);
        }
        crate::worker::executable::hold();
        if let Some(limit) = api::server::raise_open_file_limit() {
            tracing::debug!("open-file limit: {limit}");
        }
        let api = ApiConfig {
            listen: SocketAddr::new(self.listen, self.port),
            token: self.api_token,
            ollama_listen: self.ollama_port.map(|port| SocketAddr::new(self.listen, port)),
            quit: QuitSwitch::default(),
        };
        let quit = api.quit.clone();
        if !api.listen.ip().is_loopback() && api.token.is_none() {
            anyhow::bail!(
                "--listen {} would let anyone on the network control this node; pass --api-token TOKEN as well",
                self.listen
            );
        }
        let data_dir = DataDir::new(self.data_dir.as_deref())?;
        let mut data_lock = DataDirLock::acquire(&data_dir)?;
        let config = AgentConfig {
            data_dir,
            name: self.name,
            api_port: self.port,
            control_bind: self.bind,
            peers: self.peers,
            mdns: !self.no_mdns,
            memory_limit: self.memory_limit,
            forget_down_after: std::time::Duration::from_secs(self.forget_down_after),
            device: crate::worker::StageDevice {
                name: self.device,
                weights: crate::ggml::WeightPlacement::chosen(self.copy_weights, self.no_repack, self.no_huge_pages),
            },
        };
        let (agent, instances) = cluster::agent::start(config, self.join, Instances::start).await?;
        let api_addr = api::serve(instances.clone(), api).await?;
        if let Some(model) = self.run {
            super::launch_at_start::spawn(instances.clone(), model);
        }
        data_lock.describe(&format!("process {}, API {api_addr}", std::process::id()));
        Ok(StartedNode { agent, instances, api_addr, data_lock, quit })
    }
}

/// Secrets given as command-line arguments are visible to every user of the machine (`ps`): they still
/// work, with a warning naming the environment variable to use instead.
fn warn_about_secrets_in_argv(args: impl Iterator<Item = String>) -> Vec<&'static str> {
    let mut warned = Vec::new();
    for arg in args {
        for (flag, variable) in [("--join", "SHOAL_JOIN_CODE"), ("--api-token", "SHOAL_API_TOKEN")] {
            if (arg == flag || arg.starts_with(&format!("{flag}="))) && !warned.contains(&flag) {
                tracing::warn!(
                    "{flag} on the command line is visible to every user of this machine (ps); set {variable} in the environment instead"
                );
                warned.push(flag);
            }
        }
    }
    warned
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_on_the_command_line_are_warned_about() {
        let args = ["shoal", "node", "--join=ABC@h:1", "--api-token", "t", "--joiner"].map(String::from);
        assert_eq!(super::warn_about_secrets_in_argv(args.into_iter()), ["--join", "--api-token"]);
        let clean = ["shoal", "node", "--port", "1"].map(String::from);
        assert!(super::warn_about_secrets_in_argv(clean.into_iter()).is_empty());
    }
}

//! `shoal node`: runs the node agent headless — cluster membership, discovery, links, and the API.

use shoal::api::{self, ApiConfig};
use shoal::cluster::{self, AgentConfig, JoinTarget};
use shoal::node::DataDir;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Where the node keeps its identity and membership (default: the platform's data directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The node's name in the cluster (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// The API port; the control port (which other nodes connect to) is the next one.
    #[arg(long, default_value_t = cluster::DEFAULT_API_PORT)]
    port: u16,
    /// The address the API listens on. Anything but loopback needs --api-token.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    listen: IpAddr,
    /// Token required for API actions when --listen is not loopback.
    #[arg(long, env = "SHOAL_API_TOKEN")]
    api_token: Option<String>,
    /// The address the control port listens on (all interfaces by default).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    bind: IpAddr,
    /// Join a cluster: CODE (found nearby by mDNS) or CODE@HOST[:PORT] (HOST's control port).
    #[arg(long)]
    join: Option<JoinTarget>,
    /// Another node's control address to connect to, for networks without multicast (repeatable).
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// Do not use mDNS (no advertising, no discovery).
    #[arg(long)]
    no_mdns: bool,
    /// Most memory this node offers to models, e.g. 64MB or 48GiB (default: what is available, less
    /// headroom for the OS).
    #[arg(long, value_parser = shoal::util::parse_bytes)]
    memory_limit: Option<u64>,
}

pub fn run(args: NodeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let config = AgentConfig {
            data_dir: DataDir::new(args.data_dir.as_deref())?,
            name: args.name,
            api_port: args.port,
            control_bind: args.bind,
            peers: args.peers,
            mdns: !args.no_mdns,
            memory_limit: args.memory_limit,
        };
        let api = ApiConfig { listen: SocketAddr::new(args.listen, args.port), token: args.api_token };
        if !api.listen.ip().is_loopback() && api.token.is_none() {
            anyhow::bail!(
                "--listen {} would let anyone on the network control this node; pass --api-token TOKEN as well",
                args.listen
            );
        }
        let agent = cluster::agent::start(config, args.join).await?;
        let addr = api::serve(agent.clone(), api).await?;
        let snapshot = agent.snapshot();
        eprintln!(
            "shoal node {} ({}) — cluster {} with {} member(s); API http://{addr}, control port {}",
            agent.identity.name,
            agent.id().short(),
            snapshot.cluster_id,
            snapshot.nodes.len(),
            agent.config.control_port()
        );
        shutdown_signal().await;
        eprintln!("stopping");
        Ok(())
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

//! `shoal node`: runs the node agent headless — cluster membership, discovery, links, and the API.

use shoal::node::NodeOptions;

pub fn run(options: NodeOptions) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let node = options.start().await?;
        let snapshot = node.agent.snapshot();
        eprintln!(
            "shoal node {} ({}) — cluster {} with {} member(s); API http://{}, control port {}",
            node.agent.identity.name,
            node.agent.id().short(),
            snapshot.cluster_id,
            snapshot.nodes.len(),
            node.api_addr,
            node.agent.config.control_port()
        );
        shutdown_signal().await;
        eprintln!("stopping");
        shoal::instances::stop_all_local(&node.instances).await;
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

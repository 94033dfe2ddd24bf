//! The node agent inside the app: the same agent and API as `shoal node`, on a runtime of its own so the
//! window's event loop never waits on it. Stopping drops the runtime, which ends the agent's tasks and
//! kills its worker processes.

use super::quit::{quitting_stops, QuitSwitch, Stopped};
use crate::cluster::Agent;
use crate::instances::Instances;
use crate::node::NodeOptions;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

pub struct BackgroundNode {
    pub agent: Agent,
    pub instances: Arc<Instances>,
    pub api_addr: SocketAddr,
    /// How the dashboard's "Quit anyway" reaches the app: it sets what quitting does.
    pub quit: QuitSwitch,
    runtime: Option<Runtime>,
    /// Held while the node runs: one node per data directory.
    _data_lock: crate::node::DataDirLock,
}

impl BackgroundNode {
    /// Starts the agent and its API; returns once the API answers (or with the reason it cannot start).
    pub fn start(options: NodeOptions) -> anyhow::Result<BackgroundNode> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shoal-node")
            .enable_all()
            .build()?;
        let node = runtime.block_on(options.start())?;
        Ok(BackgroundNode {
            agent: node.agent,
            instances: node.instances,
            api_addr: node.api_addr,
            quit: node.quit,
            runtime: Some(runtime),
            _data_lock: node.data_lock,
        })
    }

    /// The dashboard's address on this node.
    pub fn dashboard_url(&self) -> String {
        format!("http://{}/", self.api_addr)
    }

    /// The instances that quitting the app would stop (see [`super::quit`]).
    pub fn quitting_stops(&self) -> Vec<Stopped> {
        let instances: Vec<_> = self.instances.registry().instances.values().cloned().collect();
        quitting_stops(self.agent.id(), &instances)
    }

    /// Runs `task` on the node's runtime.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Some(runtime) = &self.runtime {
            runtime.spawn(task);
        }
    }

    /// Stops the agent, its API and its workers.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(3));
        }
    }
}

impl Drop for BackgroundNode {
    fn drop(&mut self) {
        self.stop();
    }
}

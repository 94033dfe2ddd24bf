//! Whether a model fits the cluster right now: the plan a launch with the default context and sequences
//! would get over the offers of the nodes that are up, or how much memory is missing. The numbers are
//! placement's own (`ModelNeeds` and `placement::plan`, `placement::shortfall`), the ones a preview or a
//! launch computes.

use super::lifecycle::{cluster_offers, needs_for};
use super::LaunchRequest;
use crate::cluster::Agent;
use crate::model::{Model, ModelError};
use crate::placement::{self, LinkCost, NodeOffer};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A model against the cluster's memory pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Fit {
    /// A launch with the defaults would be placed now.
    pub fits: bool,
    /// Nodes the plan uses; when it does not fit, the nodes its best split was tried on.
    pub nodes: usize,
    /// Bytes the model needs (weights, KV cache and compute buffers of every stage) on those nodes.
    pub needed_bytes: u64,
    /// What the nodes that are up offer together.
    pub pool_bytes: u64,
    /// What the best split lacks, stage by stage (0 when it fits).
    pub missing_bytes: u64,
    /// The context (tokens per request) and concurrent requests the check assumed: a launch's defaults.
    pub context: usize,
    pub sequences: usize,
    /// Why it does not fit, in the planner's words.
    pub reason: Option<String>,
}

/// The nodes that are up and their links, read once for a whole library.
pub struct PoolOffers {
    nodes: Vec<NodeOffer>,
    links: Vec<LinkCost>,
}

impl PoolOffers {
    pub fn now(agent: &Agent) -> PoolOffers {
        let (nodes, links) = cluster_offers(agent, &[], None);
        PoolOffers { nodes, links }
    }

    /// Opens the model at `path` (blocking: it reads the GGUF header) and checks it against the pool.
    pub fn fit(&self, path: &Path) -> Result<Fit, ModelError> {
        let model = Model::open(path)?;
        let needs = needs_for(&model, &LaunchRequest::default());
        let pool_bytes = self.nodes.iter().map(|n| n.bytes).sum();
        let mut fit = Fit {
            fits: false,
            nodes: 0,
            needed_bytes: needs.stage(0..needs.layers()).total(),
            pool_bytes,
            missing_bytes: 0,
            context: needs.context,
            sequences: needs.sequences,
            reason: None,
        };
        match placement::plan(&needs, &self.nodes, &self.links) {
            Ok(plan) => {
                fit.fits = true;
                fit.nodes = plan.stages.len();
                fit.needed_bytes = plan.total_bytes;
            }
            Err(e) => {
                match placement::shortfall(&needs, &self.nodes, &self.links) {
                    Some(short) => {
                        fit.nodes = short.nodes;
                        fit.needed_bytes = short.needed;
                        fit.missing_bytes = short.missing;
                    }
                    None => fit.missing_bytes = fit.needed_bytes,
                }
                fit.reason = Some(e.to_string());
            }
        }
        Ok(fit)
    }
}

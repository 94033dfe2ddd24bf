//! What is missing when a model fits nowhere: the best split over every node and each stage's
//! shortfall, in numbers ([`Shortfall`]) and in the words the error gives.

use super::{link_table, mb, LinkCost, ModelNeeds, NodeId, NodeOffer, PlacementError, Plan, Ring};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How a model that fits nowhere falls short, from the best split of its layers over every node (the
/// largest offers first, at most one node per layer): the numbers behind the "does not fit" message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shortfall {
    /// Bytes that split needs (weights, KV cache and compute buffers of every stage).
    pub needed: u64,
    /// Bytes its nodes offer together.
    pub offered: u64,
    /// The stages' shortfalls added up: at least `needed - offered`, more when a stage's layers do not fit
    /// its node although the pool as a whole would hold them.
    pub missing: u64,
    /// The nodes of that split.
    pub nodes: usize,
}

/// The best split over every node (as many as the model has layers, the largest offers first).
fn split_over_all(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> Option<Plan> {
    let mut order: Vec<&NodeOffer> = nodes.iter().collect();
    order.sort_by_key(|n| std::cmp::Reverse(n.bytes));
    order.truncate(needs.layers());
    let ring = Ring { needs, nodes: order, links: table };
    ring.split().map(|(ranges, _)| ring.plan(ranges))
}

/// What is missing for `needs` on `nodes`, by the split `plan` would report when nothing fits. None
/// when there is no node to split over.
pub fn shortfall(needs: &ModelNeeds, nodes: &[NodeOffer], links: &[LinkCost]) -> Option<Shortfall> {
    if nodes.is_empty() {
        return None;
    }
    let plan = split_over_all(needs, nodes, &link_table(links))?;
    Some(Shortfall {
        needed: plan.total_bytes,
        offered: plan.stages.iter().map(|s| s.offer).sum(),
        missing: plan.stages.iter().map(|s| s.bytes.total().saturating_sub(s.offer)).sum(),
        nodes: plan.stages.len(),
    })
}

/// Explains what is missing: the best split over every node, and each stage's shortfall.
pub(super) fn does_not_fit(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> PlacementError {
    let mut message = String::new();
    if let Some(plan) = split_over_all(needs, nodes, table) {
        let needed = plan.total_bytes;
        let offered: u64 = plan.stages.iter().map(|s| s.offer).sum();
        message += &format!(
            "{} with a {}-token context needs {} on {} node(s) (weights, KV cache and compute buffers), but they offer {}: {} missing.",
            needs.name,
            needs.context,
            mb(needed),
            plan.stages.len(),
            mb(offered),
            mb(needed.saturating_sub(offered))
        );
        for s in &plan.stages {
            let need = s.bytes.total();
            message += &format!(
                " {} would hold layers {}-{} needing {} of its {}{}.",
                s.node_name,
                s.layers.start,
                s.layers.end - 1,
                mb(need),
                mb(s.offer),
                if need > s.offer { format!(" ({} short)", mb(need - s.offer)) } else { String::new() }
            );
        }
        message += " Add a node, free memory, or use a smaller context (--context) or quantization.";
    } else {
        message = format!("{} has {} layers; it cannot be split over the nodes offered", needs.name, needs.layers());
    }
    PlacementError::DoesNotFit(message)
}

//! Tensor-parallel groups: which nodes form one, whether each rank's slice (weights, the KV cache of its
//! heads, a compute buffer) fits its node, and how fast the group is expected to decode:
//!
//! - each rank reads its slice of the weights once per token, at its node's measured weight rate,
//!   and the ranks compute at the same time, so the slowest rank sets the pace;
//! - every layer sums the ranks' parts twice: each rank sends its part (a token's hidden state) to
//!   every other, which costs the slowest link's one-way latency (half the round trip the link probe's
//!   echo timed between two waiting threads, sealing and system calls included) plus the transfer;
//! - the leader sends each step out and gathers the ranks' rows of the logits at the end.
//!
//! Among the groups that fit, the fastest is chosen (the largest offers first, so equal predictions
//! keep the most capable nodes).

use super::{link_table_hop, needs, subsets, GroupNeeds, ModelNeeds, NodeOffer, Parallelism, Plan, StagePlan};
use crate::model::TensorSlice;
use crate::node::NodeId;
use std::collections::HashMap;

/// How much faster shares that follow the nodes' speeds must be predicted than equal ones to be chosen
/// (where equal shares fit): weight rates are measured, and one node's varies by several percent from
/// one measurement to the next, which must not make alike nodes hold unlike slices.
const UNEVEN_GAIN: f64 = 1.1;

/// The fastest tensor-parallel group of `nodes` that fits `needs`, or why there is none.
pub(super) fn best_group(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> Result<Plan, String> {
    let mut by_offer: Vec<usize> = (0..nodes.len()).collect();
    by_offer.sort_by_key(|&i| std::cmp::Reverse(nodes[i].bytes));
    let mut best: Option<Plan> = None;
    let mut why_not: Vec<String> = Vec::new();
    for group in needs.groups.iter().filter(|g| g.ranks <= nodes.len()) {
        if let Some(reason) = &group.refused {
            why_not.push(format!("over {} nodes: {reason}", group.ranks));
            continue;
        }
        let mut fitted = false;
        for subset in subsets(&by_offer, group.ranks) {
            let members: Vec<&NodeOffer> = subset.iter().map(|&i| &nodes[i]).collect();
            let plan = group_plan(needs, group, &members, table);
            if !fits(&plan) {
                continue;
            }
            fitted = true;
            let better = match (&best, plan.expected_decode_tokens_per_second) {
                (None, _) => true,
                (Some(b), Some(rate)) => b.expected_decode_tokens_per_second.is_none_or(|r| rate > r),
                (Some(_), None) => false,
            };
            if better {
                best = Some(plan);
            }
        }
        if !fitted {
            let rank = needs.rank(&group.slices[0].0, group.slices[0].1);
            why_not.push(format!(
                "over {} nodes each needs about {:.1} MB with an equal share (and no fewer than {:.1} MB \
                 with the least), more than they offer",
                group.ranks,
                rank.total() as f64 / 1e6,
                needs.divider.as_ref().map_or(0, |d| d.whole_bytes() + needs.compute) as f64 / 1e6
            ));
        }
    }
    best.ok_or_else(|| match why_not.as_slice() {
        [] => "tensor parallel needs at least two nodes".to_string(),
        reasons => format!("tensor parallel cannot run this model here: {}", reasons.join("; ")),
    })
}

/// The group of exactly `nodes` (rank order), if the model divides among that many and each rank's
/// slice fits its node.
pub(super) fn group_on(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> Result<Plan, String> {
    let group = needs
        .groups
        .iter()
        .find(|g| g.ranks == nodes.len())
        .ok_or_else(|| format!("tensor parallel runs on 2 to {} nodes, not {}", super::MAX_GROUP, nodes.len()))?;
    if let Some(reason) = &group.refused {
        return Err(format!("tensor parallel over {} nodes cannot run this model: {reason}", nodes.len()));
    }
    let members: Vec<&NodeOffer> = nodes.iter().collect();
    let plan = group_plan(needs, group, &members, table);
    let short: Vec<String> = plan
        .stages
        .iter()
        .filter(|s| s.bytes.total() > s.offer)
        .map(|s| {
            format!(
                "{} needs {:.1} MB but offers {:.1} MB",
                s.node_name,
                s.bytes.total() as f64 / 1e6,
                s.offer as f64 / 1e6
            )
        })
        .collect();
    if !short.is_empty() {
        return Err(format!("the tensor-parallel group does not fit: {}", short.join("; ")));
    }
    Ok(plan)
}

/// The plan of a group of `members` (rank order: the first leads): with equal shares, or with shares
/// that follow the members' speeds and memory (see [`super::shares`]) when that fits where equal shares
/// do not, or is predicted faster.
fn group_plan(
    needs: &ModelNeeds,
    group: &GroupNeeds,
    members: &[&NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> Plan {
    let equal = plan_of(needs, &group.slices, &vec![1.0; members.len()], members, table);
    let Some(divider) = &needs.divider else { return equal };
    let Some(shares) = super::shares::fitted(needs, divider, members) else { return equal };
    let Ok(slices) = divider.plan_with_bytes(&shares) else { return equal };
    if slices == group.slices {
        return equal;
    }
    let balanced = plan_of(needs, &slices, &shares, members, table);
    let faster = match (balanced.expected_decode_tokens_per_second, equal.expected_decode_tokens_per_second) {
        (Some(b), Some(e)) => b >= UNEVEN_GAIN * e,
        _ => false,
    };
    if !fits(&equal) || faster {
        balanced
    } else {
        equal
    }
}

/// Whether every rank's bytes fit its node.
pub(super) fn fits(plan: &Plan) -> bool {
    plan.stages.iter().all(|s| s.bytes.total() <= s.offer)
}

/// The plan of a group of `members` holding `slices` (planned from `shares`).
fn plan_of(
    needs: &ModelNeeds,
    slices: &[(TensorSlice, u64)],
    shares: &[f64],
    members: &[&NodeOffer],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> Plan {
    let (own, slowest) = steps(needs, slices, members);
    let stages: Vec<StagePlan> = members
        .iter()
        .zip(slices)
        .zip(shares)
        .enumerate()
        .map(|(r, ((node, (slice, weights)), share))| StagePlan {
            node: node.id,
            node_name: node.name.clone(),
            layers: 0..needs.layers(),
            expected_step_us: own[r],
            bytes: needs.rank(slice, *weights),
            offer: node.bytes,
            slice: Some(slice.clone()),
            share: Some(*share),
            ring_stage: 0,
        })
        .collect();
    let link_us = link_us(needs, members, &stages, table);
    Plan {
        model: needs.name.clone(),
        context: needs.context,
        vocabulary: needs.vocabulary,
        total_bytes: stages.iter().map(|s| s.bytes.total()).sum(),
        kv_cache_per_1k_tokens: 1024 * needs.kv_per_position,
        recurrent_state_per_sequence: needs.state_per_sequence,
        saved_prefix_tokens: 0,
        expected_decode_tokens_per_second: slowest.map(|s| 1e6 / (s + link_us).max(1) as f64),
        ring_us: link_us,
        stages,
        parallel: Parallelism::Tensor,
        alternatives: Vec::new(),
    }
}

/// The expected decode step of each rank of a group of `members` holding `slices` over the whole model
/// (its own work on average: its share of the chosen experts), and the group's (every layer's sum
/// waits for the busiest rank: see [`needs::expected_slowest`]); links not included.
pub(super) fn steps(
    needs: &ModelNeeds,
    slices: &[(TensorSlice, u64)],
    members: &[&NodeOffer],
) -> (Vec<Option<u64>>, Option<u64>) {
    // Each rank's reads besides the chosen experts.
    let dense: Vec<u64> = slices.iter().map(|(slice, weights)| needs.rank_dense_reads(slice, *weights)).collect();
    let held: Vec<usize> = slices.iter().map(|(slice, _)| slice.experts.len()).collect();
    let (slot, used, experts) = (needs.expert_slot_reads(), needs.experts_used, held.iter().sum::<usize>().max(1));
    let own = members
        .iter()
        .enumerate()
        .map(|(r, node)| node.step_us(dense[r] + slot * (used * held[r]) as u64 / experts as u64))
        .collect();
    let cost = |r: usize, chosen: usize| members[r].step_us(dense[r] + chosen as u64 * slot).map(|us| us as f64);
    (own, needs::expected_slowest(&held, used, &cost).map(|us| us.round() as u64))
}

/// A token's time on a group's links: the step out to every rank, two sums per layer, and the ranks'
/// logits back to the leader.
fn link_us(
    needs: &ModelNeeds,
    members: &[&NodeOffer],
    stages: &[StagePlan],
    table: &HashMap<(NodeId, NodeId), (u64, u64)>,
) -> u64 {
    let hop = |a: NodeId, b: NodeId, bytes: u64| link_table_hop(table, a, b, bytes);
    let leader = members[0].id;
    let step: u64 = members[1..].iter().map(|m| hop(leader, m.id, 64)).max().unwrap_or(0);
    let gather: u64 = members[1..]
        .iter()
        .zip(&stages[1..])
        .map(|(m, s)| {
            let rows = s.slice.as_ref().map_or(0, |slice| slice.vocabulary.len() as u64);
            hop(m.id, leader, 4 * rows)
        })
        .max()
        .unwrap_or(0);
    step + 2 * needs.layers() as u64 * sum_us(needs, members, table) + gather
}

/// One sum of a group's parts: every rank sends its part (a token's hidden state) to every other, so
/// the slowest link sets it.
pub(super) fn sum_us(needs: &ModelNeeds, members: &[&NodeOffer], table: &HashMap<(NodeId, NodeId), (u64, u64)>) -> u64 {
    let mut sum = 0;
    for a in members {
        for b in members.iter().filter(|b| b.id != a.id) {
            sum = sum.max(link_table_hop(table, a.id, b.id, needs.hidden_bytes_per_token));
        }
    }
    sum
}

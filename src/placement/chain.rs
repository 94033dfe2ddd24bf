//! Tensor-parallel groups chained as pipeline stages: the layers split into contiguous ranges as a
//! pipeline's are, each range run by a group (a slice of each of its layers on every rank, see
//! [`super::tensor`]) or by one node whole. A token's hidden state crosses from one range to the next
//! once, while a group sums its parts twice per layer: so a chain pays where links differ — nodes with
//! fast links between them (Thunderbolt) form groups, and only the groups' leaders talk over the slower
//! links between them — or where the model does not divide among all the nodes.
//!
//! Which chains are weighed: of the nodes with the largest offers (at most [`MAX_NODES`]), every subset
//! of three or more, every way to partition it into two or more parts of which one at least is a group
//! (of a size the model divides among), each part led by its node with the largest offer, the parts in
//! every order (past three parts, a greedy order from each first part along the cheapest links between
//! leaders). For each, the layers are split to the fastest predicted token among the splits where every
//! node's bytes fit.
//!
//! A group over some layers is predicted as its lone group's step over the whole model (the busiest
//! rank's reads at its rate, [`super::tensor::steps`]) scaled by the share of a decode step's reads those
//! layers hold, plus two sums per layer, the step out to its ranks (a token, or the hidden states it was
//! handed) and, on the last range, its ranks' logits back to the leader. A whole stage is predicted as a
//! pipeline's. A chain's ranks hold equal shares of their group (a lone group's unlike nodes get shares
//! by speed and memory; a chain's do not).

use super::{link_table_hop, subsets, ModelNeeds, NodeOffer, Parallelism, Plan, StageBytes, StagePlan};
use crate::model::TensorSlice;
use crate::node::NodeId;
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

/// Most nodes (the largest offers) a chain is planned over: the ways to partition and order them grow
/// past what a placement preview may spend.
pub const MAX_NODES: usize = 6;

type LinkTable = HashMap<(NodeId, NodeId), (u64, u64)>;

/// The fastest chain of `nodes` that fits `needs`, or why there is none.
pub(super) fn best_chain(needs: &ModelNeeds, nodes: &[NodeOffer], table: &LinkTable) -> Result<Plan, String> {
    let layers = needs.layers();
    if nodes.len() < 3 || layers < 2 {
        return Err("a chain needs at least three nodes (a group and one more stage) and two layers".into());
    }
    let mut by_offer: Vec<usize> = (0..nodes.len()).collect();
    by_offer.sort_by_key(|&i| std::cmp::Reverse(nodes[i].bytes));
    by_offer.truncate(MAX_NODES);
    let mut sizes = Sizes::new(needs);
    let sums = Sums::new(needs);
    let mut best: Option<(u64, Plan)> = None;
    let mut weighed = false;
    for k in 3..=by_offer.len() {
        for subset in subsets(&by_offer, k) {
            for blocks in partitions(&subset) {
                if blocks.len() < 2 || blocks.len() > layers || blocks.iter().all(|b| b.len() < 2) {
                    continue;
                }
                let Some(runners) = blocks.iter().map(|b| sizes.part(b, nodes, table)).collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                weighed = true;
                let leader_hop =
                    |a: usize, b: usize| link_table_hop(table, nodes[blocks[a][0]].id, nodes[blocks[b][0]].id, 0);
                for order in block_orders(blocks.len(), &leader_hop) {
                    let parts: Vec<&Runner> = order.iter().map(|&b| &runners[b]).collect();
                    let Some((cost, plan)) = chain_plan(needs, &sums, &parts, table) else { continue };
                    if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                        best = Some((cost, plan));
                    }
                }
            }
        }
    }
    match best {
        Some((_, plan)) => Ok(plan),
        None if weighed => Err("no chain of groups and stages fits the nodes' memory".into()),
        None => Err("the model does not divide among any group these nodes could form".into()),
    }
}

/// Every way to partition `items` into blocks (each block keeps `items`' order).
fn partitions(items: &[usize]) -> Vec<Vec<Vec<usize>>> {
    let mut out = Vec::new();
    let mut blocks: Vec<Vec<usize>> = Vec::new();
    fn place(items: &[usize], blocks: &mut Vec<Vec<usize>>, out: &mut Vec<Vec<Vec<usize>>>) {
        let Some((&first, rest)) = items.split_first() else {
            out.push(blocks.clone());
            return;
        };
        for b in 0..blocks.len() {
            blocks[b].push(first);
            place(rest, blocks, out);
            blocks[b].pop();
        }
        blocks.push(vec![first]);
        place(rest, blocks, out);
        blocks.pop();
    }
    place(items, &mut blocks, &mut out);
    out
}

/// Orders of `count` blocks to try: every order up to three, else from each first block the nearest
/// next by `hop` (between leaders).
fn block_orders(count: usize, hop: &dyn Fn(usize, usize) -> u64) -> Vec<Vec<usize>> {
    if count <= 3 {
        let mut all = Vec::new();
        super::permutations((0..count).collect(), 0, &mut all);
        return all;
    }
    super::nearest_orders(&(0..count).collect::<Vec<_>>(), hop)
}

/// A sum over a range of layers that is additive in the layers, plus what the range holds for being
/// the first or the last (the token embeddings, the head) and what every range holds: kept as prefix
/// sums, so that any range costs two lookups. Never asked for every layer at once (a chain has two
/// ranges at least), where a tied head is the embeddings already held.
struct Additive {
    upto: Vec<u64>,
    every: u64,
    first: u64,
    last: u64,
}

impl Additive {
    /// From `f` over `layers` (at least two), which must be of that form on every range but the whole.
    fn of(layers: usize, f: impl Fn(Range<usize>) -> u64) -> Additive {
        let every = f(1..1);
        let first = f(0..0).saturating_sub(every);
        let last = f(layers..layers).saturating_sub(every);
        let mut upto: Vec<u64> = (0..layers).map(|j| f(0..j).saturating_sub(every + first)).collect();
        upto.push(upto[1] + f(1..layers).saturating_sub(every + last));
        Additive { upto, every, first, last }
    }

    fn get(&self, layers: Range<usize>) -> u64 {
        let n = self.upto.len() - 1;
        self.upto[layers.end] - self.upto[layers.start]
            + self.every
            + if layers.start == 0 { self.first } else { 0 }
            + if layers.end == n { self.last } else { 0 }
    }
}

/// A whole stage's weights, a decode step's reads and the KV cache over any layers, and the reads of
/// the whole model.
struct Sums {
    weights: Additive,
    reads: Additive,
    kv: Additive,
    all_reads: u64,
}

impl Sums {
    fn new(needs: &ModelNeeds) -> Sums {
        let l = needs.layers();
        Sums {
            weights: Additive::of(l, |layers| needs.layout.stage_bytes(layers)),
            reads: Additive::of(l, |layers| needs.stage_reads(layers)),
            kv: Additive::of(l, |layers| needs.kv_per_layer[layers].iter().sum()),
            all_reads: needs.stage_reads(0..l).max(1),
        }
    }
}

/// What the chain's parts of each size need, computed once per size: a group's ranks' equal slices and
/// their bytes over any layers.
struct Sizes<'a> {
    needs: &'a ModelNeeds,
    groups: HashMap<usize, Option<Rc<Vec<Rank>>>>,
}

/// A rank of a group of some size: its slice and its weight bytes over any layers.
struct Rank {
    slice: TensorSlice,
    weights: u64,
    bytes: Additive,
}

impl Rank {
    /// What the rank needs over `layers` (`kv`: the whole KV cache over any layers).
    fn held(&self, needs: &ModelNeeds, kv: &Additive, layers: &Range<usize>, last: bool) -> StageBytes {
        needs.rank_over(&self.slice, self.bytes.get(layers.clone()), kv.get(layers.clone()), last)
    }
}

impl<'a> Sizes<'a> {
    fn new(needs: &'a ModelNeeds) -> Sizes<'a> {
        Sizes { needs, groups: HashMap::new() }
    }

    fn ranks(&mut self, size: usize) -> Option<Rc<Vec<Rank>>> {
        let needs = self.needs;
        self.groups
            .entry(size)
            .or_insert_with(|| {
                let divider = needs.divider.as_ref()?;
                let group = needs.groups.iter().find(|g| g.ranks == size && g.refused.is_none())?;
                let ranks = group
                    .slices
                    .iter()
                    .map(|(slice, weights)| Rank {
                        bytes: Additive::of(needs.layers(), |layers| divider.bytes_in(slice, layers)),
                        slice: slice.clone(),
                        weights: *weights,
                    })
                    .collect();
                Some(Rc::new(ranks))
            })
            .clone()
    }

    /// The part of a chain `block` (node indices, its leader first) makes; None when the model does
    /// not divide among that many ranks.
    fn part<'n>(&mut self, block: &[usize], nodes: &'n [NodeOffer], table: &LinkTable) -> Option<Runner<'n>> {
        let members: Vec<&NodeOffer> = block.iter().map(|&i| &nodes[i]).collect();
        if members.len() == 1 {
            return Some(Runner {
                members,
                ranks: None,
                own: Vec::new(),
                step: None,
                sum_us: 0,
                step_out: [0; 2],
                gather: 0,
            });
        }
        let ranks = self.ranks(members.len())?;
        let slices: Vec<(TensorSlice, u64)> = ranks.iter().map(|r| (r.slice.clone(), r.weights)).collect();
        let (own, step) = super::tensor::steps(self.needs, &slices, &members);
        let sum_us = super::tensor::sum_us(self.needs, &members, table);
        let leader = members[0].id;
        let hop = |a: NodeId, b: NodeId, bytes: u64| link_table_hop(table, a, b, bytes);
        let out = |bytes: u64| members[1..].iter().map(|m| hop(leader, m.id, bytes)).max().unwrap_or(0);
        let step_out = [out(64), out(self.needs.hidden_bytes_per_token)];
        let rows = |r: &Rank| 4 * r.slice.vocabulary.len() as u64;
        let gather = members[1..].iter().zip(&ranks[1..]).map(|(m, r)| hop(m.id, leader, rows(r))).max().unwrap_or(0);
        Some(Runner { members, ranks: Some(ranks), own, step, sum_us, step_out, gather })
    }
}

/// One range's runner in a chain: a group (its ranks, their steps over the whole model, one sum's link
/// time, the step out to its ranks when it runs the first layers (a token) or later ones (hidden
/// states), its ranks' logits back to the leader on the last) or one node.
struct Runner<'n> {
    members: Vec<&'n NodeOffer>,
    ranks: Option<Rc<Vec<Rank>>>,
    own: Vec<Option<u64>>,
    step: Option<u64>,
    sum_us: u64,
    step_out: [u64; 2],
    gather: u64,
}

/// The best split of the layers over `parts` in order (the cheapest predicted token among the splits
/// that fit), with its cost (microseconds a token, unknown steps counted as none so the links decide).
fn chain_plan(needs: &ModelNeeds, sums: &Sums, parts: &[&Runner], table: &LinkTable) -> Option<(u64, Plan)> {
    let (g, l) = (parts.len(), needs.layers());
    let Sums { weights, reads, kv, all_reads } = sums;
    let all_reads = *all_reads;
    let hop = |a: NodeId, b: NodeId, bytes: u64| link_table_hop(table, a, b, bytes);
    // A part's bytes on each of its nodes, and its step and link time, for part `i` over `layers`.
    let scaled = |us: Option<u64>, layers: &Range<usize>| {
        us.map(|us| (us as u128 * reads.get(layers.clone()) as u128 / all_reads as u128) as u64)
    };
    // What a runner's nodes hold over `layers`, in its members' order.
    let held = |part: &Runner, layers: &Range<usize>| -> Vec<StageBytes> {
        let last = layers.end == l;
        let Some(ranks) = &part.ranks else {
            let compute = needs.compute + if last { needs.compute_last_extra } else { 0 };
            return vec![StageBytes {
                weights: weights.get(layers.clone()),
                kv_cache: kv.get(layers.clone()),
                compute,
            }];
        };
        ranks.iter().map(|rank| rank.held(needs, kv, layers, last)).collect()
    };
    // Part `i`'s step and link time over `layers`, or None when a node's bytes do not fit.
    let cost = |i: usize, layers: &Range<usize>| -> Option<(u64, u64)> {
        let part = parts[i];
        let last = layers.end == l;
        let fits = match &part.ranks {
            None => held(part, layers)[0].total() <= part.members[0].bytes,
            Some(ranks) => {
                ranks.iter().zip(&part.members).all(|(r, node)| r.held(needs, kv, layers, last).total() <= node.bytes)
            }
        };
        if !fits {
            return None;
        }
        let Some(_) = &part.ranks else {
            return Some((part.members[0].step_us(reads.get(layers.clone())).unwrap_or(0), 0));
        };
        let step_out = part.step_out[usize::from(i > 0)];
        let links = step_out + 2 * layers.len() as u64 * part.sum_us + if last { part.gather } else { 0 };
        Some((scaled(part.step, layers).unwrap_or(0), links))
    };
    // best[i][j]: the cheapest token time with parts 0..i running layers 0..j, and where part i-1 starts.
    let mut best = vec![vec![None::<(u64, usize)>; l + 1]; g + 1];
    best[0][0] = Some((0, 0));
    for i in 1..=g {
        for j in i..=l - (g - i) {
            for start in (i - 1)..j {
                let Some((before, _)) = best[i - 1][start] else { continue };
                if !needs.may_begin_stage(start) {
                    continue;
                }
                let Some((step, links)) = cost(i - 1, &(start..j)) else { continue };
                let cost = before + step + links;
                if best[i][j].is_none_or(|(c, _)| cost < c) {
                    best[i][j] = Some((cost, start));
                }
            }
        }
    }
    let (inside, _) = best[g][l]?;
    let mut ranges = Vec::with_capacity(g);
    let mut end = l;
    for i in (1..=g).rev() {
        let (_, start) = best[i][end]?;
        ranges.push(start..end);
        end = start;
    }
    ranges.reverse();
    // The ring between the parts' leaders: hidden states forward, the sampled token back to the first.
    let leaders: Vec<NodeId> = parts.iter().map(|p| p.members[0].id).collect();
    let ring: u64 = leaders.windows(2).map(|w| hop(w[0], w[1], needs.hidden_bytes_per_token)).sum::<u64>()
        + hop(leaders[g - 1], leaders[0], 4);
    let mut stages = Vec::new();
    let (mut links_us, mut steps_us, mut known) = (ring, 0, true);
    for (i, (part, layers)) in parts.iter().zip(&ranges).enumerate() {
        let (step, links) = cost(i, layers)?;
        let bytes = held(part, layers);
        let own: Vec<Option<u64>> = match &part.ranks {
            None => vec![part.members[0].step_us(reads.get(layers.clone()))],
            Some(_) => part.own.iter().map(|&us| scaled(us, layers)).collect(),
        };
        links_us += links;
        steps_us += step;
        known &= own.iter().all(Option::is_some);
        for (r, node) in part.members.iter().enumerate() {
            stages.push(StagePlan {
                node: node.id,
                node_name: node.name.clone(),
                layers: layers.clone(),
                bytes: bytes[r],
                offer: node.bytes,
                expected_step_us: own[r],
                slice: part.ranks.as_ref().map(|ranks| ranks[r].slice.clone()),
                share: part.ranks.as_ref().map(|_| 1.0),
                ring_stage: i,
            });
        }
    }
    let plan = Plan {
        model: needs.name.clone(),
        context: needs.context,
        vocabulary: needs.vocabulary,
        total_bytes: stages.iter().map(|s| s.bytes.total()).sum(),
        kv_cache_per_1k_tokens: 1024 * needs.kv_per_position,
        recurrent_state_per_sequence: needs.state_per_sequence,
        saved_prefix_tokens: 0,
        ring_us: links_us,
        expected_decode_tokens_per_second: known.then(|| 1e6 / (steps_us + links_us).max(1) as f64),
        stages,
        parallel: Parallelism::Chain,
        alternatives: Vec::new(),
    };
    Some((inside + ring, plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_every_way_to_group_the_items() {
        // Bell numbers: 1, 2, 5, 15, 52.
        for (n, bell) in [(1, 1), (2, 2), (3, 5), (4, 15), (5, 52)] {
            let items: Vec<usize> = (0..n).collect();
            let all = partitions(&items);
            assert_eq!(all.len(), bell, "{n} items");
            let mut seen: Vec<Vec<Vec<usize>>> = all.clone();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), bell, "no partition twice");
            assert!(all.iter().all(|p| p.concat().len() == n));
        }
    }

    /// The prefix sums give what the function gives on every range but the whole, here a stage's bytes
    /// with a first and a last extra and a part every range holds.
    #[test]
    fn additive_ranges_are_the_functions_own() {
        let layer = [5u64, 7, 11, 13, 17];
        let f = |r: Range<usize>| {
            layer[r.clone()].iter().sum::<u64>()
                + 3
                + if r.start == 0 { 100 } else { 0 }
                + if r.end == 5 { 1000 } else { 0 }
        };
        let sums = Additive::of(5, f);
        for a in 0..=5 {
            for b in a..=5 {
                if (a, b) != (0, 5) {
                    assert_eq!(sums.get(a..b), f(a..b), "{a}..{b}");
                }
            }
        }
    }
}

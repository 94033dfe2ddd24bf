//! Placement: which nodes run which part of a model. Memory-true (exact tensor bytes, KV cache for the
//! context, compute buffer, each node's offer after headroom) and link-aware (from measured RTT and
//! throughput). Two ways to split a model:
//!
//! - a pipeline: contiguous layer ranges, a ring of stages ordered to cross the cheapest links. It pools
//!   memory but one stream is no faster than one node: fewer nodes win when the model fits on fewer, and
//!   among equal node counts the fastest expected token time;
//! - tensor parallel ([`tensor`]): every node of a group holds a slice of every layer and the group sums
//!   its parts twice per layer, so one stream runs faster when the links are fast enough;
//! - a chain ([`chain`]): layer ranges as a pipeline's, each run by a group or by one node, for nodes
//!   whose links differ (fast within groups, slower between them).
//!
//! Each mode's decode rate is predicted from the bytes a decode step reads on each node (its weights
//! but the token embeddings; of a mixture of experts, the share of experts a token uses; the cache rows
//! its attention reads at a depth of [`DECODE_DEPTH`] positions), the rate at which each node's CPU
//! multiplies the model's types with the launch's threads (measured at start, `engine::weight_rate`;
//! the memory bandwidth when unknown), and the links' latency (the link probe's echo where it ran)
//! and throughput; the faster that fits is chosen (tensor parallel only when it is predicted clearly
//! faster, by [`TENSOR_MARGIN`]; a chain only when that much faster than a lone group too), unless
//! the launch forces one. The plan says what the other modes would have given, and why they were not
//! chosen.

mod chain;
mod needs;
mod overrides;
mod saved_prefixes;
mod shares;
mod shortfall;
mod tensor;

pub use needs::{GroupNeeds, ModelNeeds, StageBytes, DECODE_DEPTH, MAX_GROUP};
pub use overrides::{parse_layers, pinned, plan_override, LayerAssignment};
pub use saved_prefixes::saved_prefix_tokens;
use shortfall::does_not_fit;
pub use shortfall::{shortfall, Shortfall};

use crate::node::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;

/// What a node can give a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeOffer {
    pub id: NodeId,
    pub name: String,
    /// Bytes it may use (available memory less headroom, capped by --memory-limit and, on macOS, the GPU
    /// limit).
    pub bytes: u64,
    /// Measured memory read bandwidth (bytes/s), which bounds how fast it runs a decode step.
    pub memory_bandwidth: Option<u64>,
    /// Bytes of weights per second a decode step there reads and multiplies, with the threads its stage
    /// will compute with (measured: engine::weight_rate); the memory bandwidth stands in when unknown.
    #[serde(default)]
    pub weight_rate: Option<u64>,
}

impl NodeOffer {
    /// Microseconds a decode step reading `bytes` of weights is expected to take here.
    pub fn step_us(&self, bytes: u64) -> Option<u64> {
        let rate = self.weight_rate.or(self.memory_bandwidth)?;
        Some(bytes.saturating_mul(1_000_000) / rate.max(1))
    }
}

/// A measured link between two nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkCost {
    pub a: NodeId,
    pub b: NodeId,
    pub rtt_us: Option<u64>,
    pub throughput_bps: Option<u64>,
}

/// Assumed for links that have not been measured yet.
const DEFAULT_RTT_US: u64 = 1_000;
const DEFAULT_THROUGHPUT_BPS: u64 = 1_000_000_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct StagePlan {
    pub node: NodeId,
    pub node_name: String,
    pub layers: Range<usize>,
    pub bytes: StageBytes,
    pub offer: u64,
    /// Expected decode time of this stage per token (memory-bound estimate), when the node's bandwidth is known.
    pub expected_step_us: Option<u64>,
    /// A tensor-parallel rank's slice of every layer (its `layers` are then the whole model).
    #[serde(default)]
    pub slice: Option<crate::model::TensorSlice>,
    /// A tensor-parallel rank's share, relative to the group's others (its part of each divided tensor is
    /// its share over their sum): the rank's worker plans its slice from every rank's share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub share: Option<f64>,
    /// Which stage of the ring this is part of: a pipeline's stages are 0, 1, ...; a tensor-parallel
    /// group's ranks all 0; in a chain, a group's ranks (its leader first) share their group's.
    #[serde(default)]
    pub ring_stage: usize,
}

/// How a model is split over nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum Parallelism {
    /// Layer ranges, one after another.
    #[default]
    Pipeline,
    /// A slice of every layer on every node.
    Tensor,
    /// Layer ranges one after another, each run by a tensor-parallel group or by one node.
    Chain,
}

impl std::fmt::Display for Parallelism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Parallelism::Pipeline => "pipeline",
            Parallelism::Tensor => "tensor",
            Parallelism::Chain => "chain",
        })
    }
}

impl std::str::FromStr for Parallelism {
    type Err = String;
    fn from_str(s: &str) -> Result<Parallelism, String> {
        match s {
            "pipeline" => Ok(Parallelism::Pipeline),
            "tensor" => Ok(Parallelism::Tensor),
            "chain" => Ok(Parallelism::Chain),
            other => Err(format!("{other:?} is not a way to split a model: give pipeline, tensor or chain")),
        }
    }
}

/// Another way the model could have been split, as placement weighed it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Alternative {
    pub parallel: Parallelism,
    /// Its nodes, in order (none when it fits nowhere).
    pub nodes: Vec<String>,
    pub expected_decode_tokens_per_second: Option<f64>,
    /// Why it was not chosen, or why it cannot run.
    pub reason: String,
}

/// Tensor parallelism is chosen over a pipeline only when predicted this much faster: the prediction
/// is coarse, and a group costs every node in it for every token.
pub const TENSOR_MARGIN: f64 = 1.15;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Plan {
    pub model: String,
    pub context: usize,
    /// Tokens in the model's vocabulary (valid ids are below it).
    pub vocabulary: usize,
    pub stages: Vec<StagePlan>,
    pub total_bytes: u64,
    /// KV-cache bytes 1024 tokens of one request take across all stages (what a longer context costs).
    #[serde(default)]
    pub kv_cache_per_1k_tokens: u64,
    /// Bytes of one request's recurrent state across all stages (linear-attention layers keep it in
    /// place of KV rows; it does not grow with the context). Included in the stages' `kv_cache`.
    #[serde(default)]
    pub recurrent_state_per_sequence: u64,
    /// Tokens of saved prefixes (the prompt cache beyond the slots) every stage keeps in memory: as many
    /// as asked for (by default a context per slot) where each stage's node offers the memory beyond
    /// what the plan takes, else as many as it does; 0 where the stages save none (a tensor-parallel
    /// group, sliding-window layers). See [`saved_prefix_tokens`].
    #[serde(default)]
    pub saved_prefix_tokens: usize,
    /// Expected time a token spends crossing the links: around a pipeline's ring (half the RTT plus the
    /// hidden state's transfer per hop, and the sampled token's way back), or in a tensor-parallel
    /// group's sums (two per layer) and its logits' way to the leader.
    pub ring_us: u64,
    /// 1 / (the stages' step times + ring time), or for a tensor-parallel group 1 / (its slowest rank's
    /// step time + link time), when every node's bandwidth is known.
    pub expected_decode_tokens_per_second: Option<f64>,
    /// How the model is split.
    #[serde(default)]
    pub parallel: Parallelism,
    /// The other way, as weighed: its prediction and why it was not chosen.
    #[serde(default)]
    pub alternatives: Vec<Alternative>,
}

impl Plan {
    /// The ring's stages in order, each as the indices of its plan stages: one stage, or a group's
    /// ranks (its leader first).
    pub fn ring(&self) -> Vec<Vec<usize>> {
        let all = 0..self.stages.len();
        match self.parallel {
            Parallelism::Pipeline => all.map(|i| vec![i]).collect(),
            Parallelism::Tensor => vec![all.collect()],
            Parallelism::Chain => {
                let mut ring: Vec<Vec<usize>> = Vec::new();
                for (i, stage) in self.stages.iter().enumerate() {
                    match ring.last_mut() {
                        Some(last) if self.stages[last[0]].ring_stage == stage.ring_stage => last.push(i),
                        _ => ring.push(vec![i]),
                    }
                }
                ring
            }
        }
    }

    /// Of a stage that is a rank of a tensor-parallel group: its rank, its group's shares (relative,
    /// equal where the plan gives none: what every rank's worker plans its slice from), and its ring
    /// place (the group's stage of the ring's stages).
    pub fn rank_of(&self, stage: usize) -> Option<RankPlace> {
        let ring = self.ring();
        let (place, group) = ring.iter().enumerate().find(|(_, g)| g.contains(&stage))?;
        if group.len() < 2 {
            return None;
        }
        Some(RankPlace {
            rank: group.iter().position(|&s| s == stage)?,
            shares: group.iter().map(|&s| self.stages[s].share.unwrap_or(1.0)).collect(),
            ring_stage: place,
            ring_stages: ring.len(),
        })
    }
}

/// Where a rank of a tensor-parallel group sits: see [`Plan::rank_of`].
#[derive(Clone, Debug, PartialEq)]
pub struct RankPlace {
    pub rank: usize,
    pub shares: Vec<f64>,
    pub ring_stage: usize,
    pub ring_stages: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlacementError {
    #[error("no node is up to run the model")]
    NoNodes,
    #[error("{0}")]
    DoesNotFit(String),
    #[error("invalid --layers: {0}")]
    BadOverride(String),
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

struct Ring<'a> {
    needs: &'a ModelNeeds,
    nodes: Vec<&'a NodeOffer>,
    links: &'a HashMap<(NodeId, NodeId), (u64, u64)>,
}

/// One way over the link from `a` to `b` with `bytes`: half the RTT plus the transfer (links not
/// measured yet count as [`DEFAULT_RTT_US`] and [`DEFAULT_THROUGHPUT_BPS`]).
fn link_table_hop(links: &HashMap<(NodeId, NodeId), (u64, u64)>, a: NodeId, b: NodeId, bytes: u64) -> u64 {
    let (rtt, bps) = links.get(&(a, b)).copied().unwrap_or((DEFAULT_RTT_US, DEFAULT_THROUGHPUT_BPS));
    rtt / 2 + bytes * 8 * 1_000_000 / bps.max(1)
}

impl Ring<'_> {
    fn hop_us(&self, a: NodeId, b: NodeId, bytes: u64) -> u64 {
        link_table_hop(self.links, a, b, bytes)
    }

    /// Per-token link time around the ring: hidden states forward, the token id back to stage 0.
    fn ring_us(&self) -> u64 {
        let k = self.nodes.len();
        if k == 1 {
            return 0;
        }
        let forward: u64 = (0..k - 1)
            .map(|i| self.hop_us(self.nodes[i].id, self.nodes[i + 1].id, self.needs.hidden_bytes_per_token))
            .sum();
        forward + self.hop_us(self.nodes[k - 1].id, self.nodes[0].id, 4)
    }

    /// Splits the layers into contiguous ranges, one per node in ring order, minimising the largest
    /// share of a node's offer used. Returns the ranges and that share.
    fn split(&self) -> Option<(Vec<Range<usize>>, f64)> {
        let k = self.nodes.len();
        let l = self.needs.layers();
        if k > l {
            return None;
        }
        let load = |node: usize, range: Range<usize>| -> f64 {
            let need = self.needs.stage(range).total() as f64;
            need / self.nodes[node].bytes.max(1) as f64
        };
        // best[i][j]: the smallest worst load with nodes 0..i covering layers 0..j.
        let mut best = vec![vec![f64::INFINITY; l + 1]; k + 1];
        let mut cut = vec![vec![0usize; l + 1]; k + 1];
        best[0][0] = 0.0;
        for i in 1..=k {
            for j in i..=l - (k - i) {
                for start in (i - 1)..j {
                    if best[i - 1][start].is_infinite() || !self.needs.may_begin_stage(start) {
                        continue;
                    }
                    let worst = best[i - 1][start].max(load(i - 1, start..j));
                    if worst < best[i][j] {
                        best[i][j] = worst;
                        cut[i][j] = start;
                    }
                }
            }
        }
        let mut ranges = Vec::with_capacity(k);
        let mut end = l;
        for i in (1..=k).rev() {
            let start = cut[i][end];
            ranges.push(start..end);
            end = start;
        }
        ranges.reverse();
        Some((ranges, best[k][l]))
    }

    fn plan(&self, ranges: Vec<Range<usize>>) -> Plan {
        let stages: Vec<StagePlan> = self
            .nodes
            .iter()
            .zip(ranges)
            .enumerate()
            .map(|(ring_stage, (node, layers))| {
                let bytes = self.needs.stage(layers.clone());
                StagePlan {
                    ring_stage,
                    node: node.id,
                    node_name: node.name.clone(),
                    expected_step_us: node.step_us(self.needs.stage_reads(layers.clone())),
                    layers,
                    bytes,
                    offer: node.bytes,
                    slice: None,
                    share: None,
                }
            })
            .collect();
        let ring_us = self.ring_us();
        let steps: Option<u64> = stages.iter().map(|s| s.expected_step_us).sum();
        Plan {
            model: self.needs.name.clone(),
            context: self.needs.context,
            vocabulary: self.needs.vocabulary,
            total_bytes: stages.iter().map(|s| s.bytes.total()).sum(),
            kv_cache_per_1k_tokens: 1024 * self.needs.kv_per_position,
            recurrent_state_per_sequence: self.needs.state_per_sequence,
            saved_prefix_tokens: 0,
            expected_decode_tokens_per_second: steps.map(|s| 1e6 / (s + ring_us).max(1) as f64),
            ring_us,
            stages,
            parallel: Parallelism::Pipeline,
            alternatives: Vec::new(),
        }
    }

    /// Expected microseconds per token (unknown bandwidths count as equal, so the ring decides).
    fn cost(&self, plan: &Plan) -> u64 {
        plan.stages.iter().map(|s| s.expected_step_us.unwrap_or(0)).sum::<u64>() + plan.ring_us
    }
}

fn link_table(links: &[LinkCost]) -> HashMap<(NodeId, NodeId), (u64, u64)> {
    let mut table = HashMap::new();
    for l in links {
        let v = (l.rtt_us.unwrap_or(DEFAULT_RTT_US), l.throughput_bps.unwrap_or(DEFAULT_THROUGHPUT_BPS));
        table.insert((l.a, l.b), v);
        table.entry((l.b, l.a)).or_insert(v);
    }
    table
}

/// Orders of `nodes` to try as rings: every order for small rings, else a greedy nearest-neighbour ring
/// from each start.
fn orders(nodes: &[usize], ring: &dyn Fn(&[usize]) -> u64) -> Vec<Vec<usize>> {
    if nodes.len() <= 5 {
        let mut all = Vec::new();
        permutations(nodes.to_vec(), 0, &mut all);
        return all;
    }
    nearest_orders(nodes, &|a, b| ring(&[a, b]))
}

/// From each of `items` first, the order that always goes on to the nearest item left by `hop`.
fn nearest_orders(items: &[usize], hop: &dyn Fn(usize, usize) -> u64) -> Vec<Vec<usize>> {
    items
        .iter()
        .map(|&first| {
            let mut order = vec![first];
            let mut rest: Vec<usize> = items.iter().copied().filter(|&n| n != first).collect();
            let mut last = first;
            while let Some(pos) = (0..rest.len()).min_by_key(|&p| hop(last, rest[p])) {
                last = rest.remove(pos);
                order.push(last);
            }
            order
        })
        .collect()
}

fn permutations(mut items: Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
    if k == items.len() {
        out.push(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items.clone(), k + 1, out);
        items.swap(k, i);
    }
}

/// The plan for `needs` on `nodes`: the fastest that fits of the best pipeline, the best tensor-parallel
/// group and the best chain of groups (see [`choose`]), or the mode `forced` says; with the others as
/// alternatives.
pub fn plan_mode(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    links: &[LinkCost],
    forced: Option<Parallelism>,
) -> Result<Plan, PlacementError> {
    let table = link_table(links);
    let pipeline = plan(needs, nodes, links);
    let group = tensor::best_group(needs, nodes, &table).map_err(PlacementError::DoesNotFit);
    let chain = chain::best_chain(needs, nodes, &table).map_err(PlacementError::DoesNotFit);
    choose([(Parallelism::Pipeline, pipeline), (Parallelism::Tensor, group), (Parallelism::Chain, chain)], forced)
}

/// The plan among `candidates` (a pipeline, a group, a chain, in that order): the one `forced` names, or
/// the last that is predicted [`TENSOR_MARGIN`] faster than every earlier one that fits (a group must
/// gain that much over the pipeline, a chain over both), else the first that fits. The others become its
/// alternatives, saying why.
fn choose(
    candidates: [(Parallelism, Result<Plan, PlacementError>); 3],
    forced: Option<Parallelism>,
) -> Result<Plan, PlacementError> {
    let rate = |p: &Plan| p.expected_decode_tokens_per_second;
    let chosen = match forced {
        Some(mode) => candidates
            .iter()
            .position(|(m, _)| *m == mode)
            .ok_or_else(|| PlacementError::DoesNotFit(format!("{mode} was not weighed")))?,
        None => {
            let mut chosen: Option<usize> = None;
            for (i, (_, plan)) in candidates.iter().enumerate() {
                let Ok(plan) = plan else { continue };
                // Faster by the margin than every earlier mode that fits (the first that fits needs none).
                let faster = candidates[..i].iter().all(|(_, before)| match before {
                    Ok(before) => matches!((rate(plan), rate(before)), (Some(r), Some(b)) if r >= TENSOR_MARGIN * b),
                    Err(_) => true,
                });
                if faster {
                    chosen = Some(i);
                }
            }
            match chosen {
                Some(c) => c,
                // Nothing fits: the pipeline's reason (it says what is missing where).
                None => {
                    let [(_, pipeline), ..] = candidates;
                    return Err(pipeline.err().unwrap_or(PlacementError::NoNodes));
                }
            }
        }
    };
    // Each mode's rate, where it fits: what a mode passed over is measured against.
    let fitted: Vec<(usize, Parallelism, Option<f64>)> =
        candidates.iter().enumerate().filter_map(|(j, (m, p))| Some((j, *m, rate(p.as_ref().ok()?)))).collect();
    let mut rest = Vec::new();
    let mut plan = None;
    for (i, (mode, candidate)) in candidates.into_iter().enumerate() {
        if i == chosen {
            plan = Some(candidate?);
        } else {
            rest.push((i, mode, candidate));
        }
    }
    let mut plan = plan.ok_or(PlacementError::NoNodes)?;
    let words = |mode: Parallelism| match mode {
        Parallelism::Pipeline => "a pipeline",
        Parallelism::Tensor => "tensor parallel",
        Parallelism::Chain => "a chain of groups",
    };
    for (i, mode, candidate) in rest {
        plan.alternatives.push(match candidate {
            Ok(other) => {
                let r = rate(&other);
                // A mode after the chosen one fell short of the margin over an earlier mode; one before
                // it was outrun by the chosen.
                let short_of = fitted.iter().filter(|(j, ..)| *j < i).find_map(|&(_, m, b)| match (r, b) {
                    (Some(r), Some(b)) if r < TENSOR_MARGIN * b => Some((m, r / b)),
                    _ => None,
                });
                let reason = match (forced, short_of, r, rate(&plan)) {
                    (Some(asked), ..) => format!("{} was asked for", words(asked)),
                    (None, Some((m, ratio)), ..) if i > chosen => format!(
                        "predicted {ratio:.2}x as fast as {}, less than the {TENSOR_MARGIN:.2}x it must gain",
                        words(m)
                    ),
                    (None, _, Some(r), Some(c)) => format!(
                        "{} over {} nodes is predicted {:.2}x as fast",
                        words(plan.parallel),
                        plan.stages.len(),
                        c / r
                    ),
                    _ => "the nodes' speed is not measured yet, so its gain cannot be predicted".into(),
                };
                Alternative {
                    parallel: mode,
                    nodes: other.stages.iter().map(|s| s.node_name.clone()).collect(),
                    expected_decode_tokens_per_second: r,
                    reason,
                }
            }
            Err(e) => Alternative {
                parallel: mode,
                nodes: Vec::new(),
                expected_decode_tokens_per_second: None,
                reason: match (mode, e) {
                    (Parallelism::Pipeline, PlacementError::DoesNotFit(_)) => "no pipeline fits".into(),
                    (_, e) => e.to_string(),
                },
            },
        });
    }
    Ok(plan)
}

/// The plan on exactly `nodes`, in their order: a pipeline whose ring they form (layers split by
/// their offers), or a tensor-parallel group whose ranks they are, or the best chain of groups of some
/// of them (`parallel`; by default the fastest that fits, as [`choose`] decides).
pub fn plan_on(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    links: &[LinkCost],
    parallel: Option<Parallelism>,
) -> Result<Plan, PlacementError> {
    let table = link_table(links);
    let pipeline = || -> Result<Plan, PlacementError> {
        let ring = Ring { needs, nodes: nodes.iter().collect(), links: &table };
        match ring.split() {
            Some((ranges, worst)) if worst <= 1.0 => Ok(ring.plan(ranges)),
            _ => Err(does_not_fit(needs, nodes, &table)),
        }
    };
    let group = || tensor::group_on(needs, nodes, &table).map_err(PlacementError::DoesNotFit);
    let chain = || chain::best_chain(needs, nodes, &table).map_err(PlacementError::DoesNotFit);
    match parallel {
        Some(Parallelism::Pipeline) => pipeline(),
        Some(Parallelism::Tensor) => group(),
        Some(Parallelism::Chain) => chain(),
        None => {
            let mut plan = choose(
                [(Parallelism::Pipeline, pipeline()), (Parallelism::Tensor, group()), (Parallelism::Chain, chain())],
                None,
            )?;
            plan.alternatives.clear();
            Ok(plan)
        }
    }
}

/// The pipeline on the fewest nodes that fits, fastest among those.
pub fn plan(needs: &ModelNeeds, nodes: &[NodeOffer], links: &[LinkCost]) -> Result<Plan, PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let table = link_table(links);
    let n = nodes.len().min(8);
    // Largest offers first, so smaller subsets are tried with the most capable nodes.
    let mut by_offer: Vec<usize> = (0..nodes.len()).collect();
    by_offer.sort_by_key(|&i| std::cmp::Reverse(nodes[i].bytes));
    let pair_cost = |pair: &[usize]| -> u64 {
        let ring = Ring { needs, nodes: pair.iter().map(|&i| &nodes[i]).collect(), links: &table };
        ring.hop_us(ring.nodes[0].id, ring.nodes[1].id, needs.hidden_bytes_per_token)
    };
    for k in 1..=n {
        let mut best: Option<(u64, Plan)> = None;
        for subset in subsets(&by_offer[..n], k) {
            for order in orders(&subset, &pair_cost) {
                let ring = Ring { needs, nodes: order.iter().map(|&i| &nodes[i]).collect(), links: &table };
                let Some((ranges, worst)) = ring.split() else { continue };
                if worst > 1.0 {
                    continue;
                }
                let plan = ring.plan(ranges);
                let cost = ring.cost(&plan);
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, plan));
                }
            }
        }
        if let Some((_, plan)) = best {
            return Ok(plan);
        }
    }
    Err(does_not_fit(needs, nodes, &table))
}

fn subsets(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    if items.len() < k {
        return Vec::new();
    }
    let mut with: Vec<Vec<usize>> = subsets(&items[1..], k - 1)
        .into_iter()
        .map(|mut s| {
            s.insert(0, items[0]);
            s
        })
        .collect();
    with.extend(subsets(&items[1..], k));
    with
}

//! Placement: which nodes run which part of a model. Memory-true (exact tensor bytes, KV cache for the
//! context, compute buffer, each node's offer after headroom) and link-aware (from measured RTT and
//! throughput). Two ways to split a model:
//!
//! - a pipeline: contiguous layer ranges, a ring of stages ordered to cross the cheapest links. It pools
//!   memory but one stream is no faster than one node: fewer nodes win when the model fits on fewer, and
//!   among equal node counts the fastest expected token time;
//! - tensor parallel ([`tensor`]): every node of a group holds a slice of every layer and the group sums
//!   its parts twice per layer, so one stream runs faster when the links are fast enough.
//!
//! Each mode's decode rate is predicted from the bytes a decode step reads on each node (its weights
//! but the token embeddings; of a mixture of experts, the share of experts a token uses; the cache rows
//! its attention reads at a depth of [`DECODE_DEPTH`] positions), the rate at which each node's CPU
//! multiplies the model's types with the launch's threads (measured at start, `engine::weight_rate`;
//! the memory bandwidth when unknown), and the links' latency (the link probe's echo where it ran)
//! and throughput; the faster that fits is chosen (tensor parallel only when it is predicted clearly
//! faster, by [`TENSOR_MARGIN`]), unless the launch forces one. The plan says what the other
//! mode would have given, and why it was not chosen.

mod needs;
mod shares;
mod tensor;

pub use needs::{GroupNeeds, ModelNeeds, StageBytes, DECODE_DEPTH, MAX_GROUP};

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
}

impl std::fmt::Display for Parallelism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Parallelism::Pipeline => "pipeline",
            Parallelism::Tensor => "tensor",
        })
    }
}

impl std::str::FromStr for Parallelism {
    type Err = String;
    fn from_str(s: &str) -> Result<Parallelism, String> {
        match s {
            "pipeline" => Ok(Parallelism::Pipeline),
            "tensor" => Ok(Parallelism::Tensor),
            other => Err(format!("{other:?} is not a way to split a model: give pipeline or tensor")),
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
    /// Each stage's share of a tensor-parallel group, relative (equal where the plan gives none): what
    /// every rank's worker plans its slice from.
    pub fn shares(&self) -> Vec<f64> {
        self.stages.iter().map(|s| s.share.unwrap_or(1.0)).collect()
    }
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

/// One node's part of an explicit override: a node (name, id or id prefix) and its layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerAssignment {
    pub node: String,
    pub layers: Range<usize>,
}

/// Parses `NODE:0-9,NODE:10-29` (inclusive ranges, in ring order).
pub fn parse_layers(spec: &str) -> Result<Vec<LayerAssignment>, PlacementError> {
    spec.split(',')
        .map(|part| {
            let bad = || PlacementError::BadOverride(format!("{part:?} is not NODE:FIRST-LAST"));
            let (node, range) = part.trim().rsplit_once(':').ok_or_else(bad)?;
            let (a, b) = range.split_once('-').ok_or_else(bad)?;
            let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
            if node.is_empty() || b < a {
                return Err(bad());
            }
            Ok(LayerAssignment { node: node.to_string(), layers: a..b.checked_add(1).ok_or_else(bad)? })
        })
        .collect()
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
                    if best[i - 1][start].is_infinite() {
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
            .map(|(node, layers)| {
                let bytes = self.needs.stage(layers.clone());
                StagePlan {
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
    (0..nodes.len())
        .map(|first| {
            let mut order = vec![nodes[first]];
            let mut rest: Vec<usize> = nodes.iter().copied().filter(|&n| n != nodes[first]).collect();
            while !rest.is_empty() {
                let (pos, _) = rest
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, &n)| ring(&[*order.last().expect("non-empty"), n]))
                    .expect("non-empty");
                order.push(rest.remove(pos));
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

/// The plan for `needs` on `nodes`: the faster of the best pipeline and the best tensor-parallel group
/// that fit (a group only when [`TENSOR_MARGIN`] faster), or the mode `forced` says; with the other
/// mode as an alternative.
pub fn plan_mode(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    links: &[LinkCost],
    forced: Option<Parallelism>,
) -> Result<Plan, PlacementError> {
    let pipeline = plan(needs, nodes, links);
    let group = tensor::best_group(needs, nodes, &link_table(links));
    let rate = |p: &Plan| p.expected_decode_tokens_per_second;
    let summary = |p: &Plan, reason: String| Alternative {
        parallel: p.parallel,
        nodes: p.stages.iter().map(|s| s.node_name.clone()).collect(),
        expected_decode_tokens_per_second: rate(p),
        reason,
    };
    let refused = |parallel, reason: String| Alternative {
        parallel,
        nodes: Vec::new(),
        expected_decode_tokens_per_second: None,
        reason,
    };
    let chosen = match (forced, pipeline, group) {
        (Some(Parallelism::Tensor), pipeline, group) => {
            let mut plan = group.map_err(PlacementError::DoesNotFit)?;
            plan.alternatives.push(match pipeline {
                Ok(p) => summary(&p, "tensor parallel was asked for".into()),
                Err(e) => refused(Parallelism::Pipeline, e.to_string()),
            });
            plan
        }
        (Some(Parallelism::Pipeline), pipeline, group) => {
            let mut plan = pipeline?;
            plan.alternatives.push(match group {
                Ok(g) => summary(&g, "a pipeline was asked for".into()),
                Err(reason) => refused(Parallelism::Tensor, reason),
            });
            plan
        }
        (None, Ok(mut pipeline), Ok(mut group)) => {
            let faster = match (rate(&group), rate(&pipeline)) {
                (Some(g), Some(p)) => g >= TENSOR_MARGIN * p,
                _ => false,
            };
            if faster {
                let why = format!(
                    "tensor parallel over {} nodes is predicted {:.2}x as fast",
                    group.stages.len(),
                    rate(&group).unwrap_or(0.0) / rate(&pipeline).unwrap_or(1.0)
                );
                group.alternatives.push(summary(&pipeline, why));
                group
            } else {
                let why = match (rate(&group), rate(&pipeline)) {
                    (Some(g), Some(p)) => format!(
                        "predicted {:.2}x as fast as the pipeline, less than the {TENSOR_MARGIN:.2}x it must gain",
                        g / p
                    ),
                    _ => "the nodes' speed is not measured yet, so its gain cannot be predicted".into(),
                };
                pipeline.alternatives.push(summary(&group, why));
                pipeline
            }
        }
        (None, Ok(mut pipeline), Err(reason)) => {
            pipeline.alternatives.push(refused(Parallelism::Tensor, reason));
            pipeline
        }
        (None, Err(_), Ok(mut group)) => {
            group.alternatives.push(refused(Parallelism::Pipeline, "no pipeline fits".into()));
            group
        }
        (None, Err(e), Err(_)) => return Err(e),
    };
    Ok(chosen)
}

/// The nodes `names` (names or id prefixes, as in an override) name, in that order: each must name
/// exactly one node that is up, and none twice.
pub fn pinned(nodes: &[NodeOffer], names: &[String]) -> Result<Vec<NodeOffer>, PlacementError> {
    let mut chosen: Vec<NodeOffer> = Vec::new();
    for name in names {
        let node = match nodes_named(nodes, name).as_slice() {
            [one] => (*one).clone(),
            [] => return Err(PlacementError::BadOverride(format!("no node up is called {name}"))),
            _ => return Err(PlacementError::BadOverride(format!("{name} names more than one node"))),
        };
        if chosen.iter().any(|c| c.id == node.id) {
            return Err(PlacementError::BadOverride(format!("{name} is named twice")));
        }
        chosen.push(node);
    }
    if chosen.is_empty() {
        return Err(PlacementError::BadOverride("name at least one node".into()));
    }
    Ok(chosen)
}

/// The plan on exactly `nodes`, in their order: a pipeline whose ring they form (layers split by
/// their offers), or a tensor-parallel group whose ranks they are (`parallel`; by default the faster
/// that fits, a group only when [`TENSOR_MARGIN`] faster).
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
    let group = || tensor::group_on(needs, nodes, &table);
    match parallel {
        Some(Parallelism::Pipeline) => pipeline(),
        Some(Parallelism::Tensor) => group().map_err(PlacementError::DoesNotFit),
        None => match (pipeline(), group()) {
            (Ok(p), Ok(g)) => {
                let faster = matches!(
                    (g.expected_decode_tokens_per_second, p.expected_decode_tokens_per_second),
                    (Some(g), Some(p)) if g >= TENSOR_MARGIN * p
                );
                Ok(if faster { g } else { p })
            }
            (Ok(p), Err(_)) => Ok(p),
            (Err(_), Ok(g)) => Ok(g),
            (Err(e), Err(_)) => Err(e),
        },
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
fn does_not_fit(
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

/// The plan an explicit `--layers` override describes, if it fits.
/// The nodes a name in an override means: an exact name or id wins; otherwise an id prefix of at least
/// four characters (a shorter one would match random ids by chance: "b" names every id starting with b).
fn nodes_named<'a>(nodes: &'a [NodeOffer], name: &str) -> Vec<&'a NodeOffer> {
    let exact: Vec<&NodeOffer> = nodes.iter().filter(|n| n.name == name || n.id.to_string() == name).collect();
    if !exact.is_empty() || name.len() < 4 {
        return exact;
    }
    nodes.iter().filter(|n| n.id.to_string().starts_with(name)).collect()
}

pub fn plan_override(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    links: &[LinkCost],
    assignment: &[LayerAssignment],
) -> Result<Plan, PlacementError> {
    let mut expected = 0;
    let mut chosen = Vec::new();
    for a in assignment {
        if a.layers.start != expected {
            return Err(PlacementError::BadOverride(format!(
                "ranges must cover layers 0-{} in order; {} starts at {} where {expected} was expected",
                needs.layers() - 1,
                a.node,
                a.layers.start
            )));
        }
        expected = a.layers.end;
        match nodes_named(nodes, &a.node).as_slice() {
            [one] => chosen.push(*one),
            [] => return Err(PlacementError::BadOverride(format!("no node up is called {}", a.node))),
            _ => return Err(PlacementError::BadOverride(format!("{} names more than one node", a.node))),
        }
    }
    if expected != needs.layers() {
        return Err(PlacementError::BadOverride(format!(
            "ranges end at layer {} but the model has {} layers",
            expected.saturating_sub(1),
            needs.layers()
        )));
    }
    let table = link_table(links);
    let ring = Ring { needs, nodes: chosen, links: &table };
    let plan = ring.plan(assignment.iter().map(|a| a.layers.clone()).collect());
    let short: Vec<String> = plan
        .stages
        .iter()
        .filter(|s| s.bytes.total() > s.offer)
        .map(|s| {
            format!(
                "{} needs {} for layers {}-{} but offers {}",
                s.node_name,
                mb(s.bytes.total()),
                s.layers.start,
                s.layers.end - 1,
                mb(s.offer)
            )
        })
        .collect();
    if !short.is_empty() {
        return Err(PlacementError::DoesNotFit(format!("the requested split does not fit: {}", short.join("; "))));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_overrides_parse() {
        let a = parse_layers("studio-1:0-9, 1a2b:10-29").unwrap();
        assert_eq!(a[0], LayerAssignment { node: "studio-1".into(), layers: 0..10 });
        assert_eq!(a[1].layers, 10..30);
        assert!(parse_layers("x:9-0").is_err());
        assert!(parse_layers("x:0-").is_err());
        assert!(parse_layers(":0-3").is_err());
    }
}

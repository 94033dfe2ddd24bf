//! What running a model costs, stage by stage: the exact tensor bytes of its layers (from the GGUF),
//! the embeddings on the first stage and the output head on the last, the KV cache for the requested
//! context, and the compute buffer.

use crate::engine::weight_rate::TypeReads;
use crate::engine::CACHE_BLOCK;
use crate::model::slice::Divider;
use crate::model::{layout, CacheRow, Model, ModelLayout, TensorSlice};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;

/// Most ranks a tensor-parallel group is planned with (decided where a group is divided).
pub use crate::model::slice::MAX_GROUP;

/// Memory a stage needs, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct StageBytes {
    pub weights: u64,
    pub kv_cache: u64,
    pub compute: u64,
}

impl StageBytes {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.compute
    }
}

/// The memory model of one model at one context size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelNeeds {
    pub name: String,
    pub layout: ModelLayout,
    /// KV-cache bytes of each layer for the whole context of every sequence (layers differ: DeepSeek's
    /// latent attention caches far less than full keys and values).
    pub kv_per_layer: Vec<u64>,
    /// KV-cache bytes one more position of one sequence takes (in the layers that see the whole context).
    pub kv_per_position: u64,
    /// Of each layer, the bytes one position of one sequence takes (0 in a linear-attention layer), and
    /// whether any layer keeps a sliding window's ring instead (then no prefix can be saved).
    #[serde(default)]
    pub kv_per_layer_position: Vec<u64>,
    #[serde(default)]
    pub sliding_layers: bool,
    /// Bytes of one sequence's recurrent state in every linear-attention layer (Qwen3.5, Qwen3-Next,
    /// Kimi K3): constant in the context, and counted in `kv_per_layer` beside the KV rows.
    #[serde(default)]
    pub state_per_sequence: u64,
    /// Compute-buffer bytes of a stage (its largest step).
    pub compute: u64,
    /// Extra compute bytes on the last stage (the logits).
    pub compute_last_extra: u64,
    /// Bytes of one token's hidden state on the wire (f32).
    pub hidden_bytes_per_token: u64,
    /// Layers at which a pipeline stage may not begin (GLM-5.2's layers that reuse an earlier layer's
    /// sparse-attention choice): no plan cuts the model before them.
    pub no_stage_starts: Vec<usize>,
    pub context: usize,
    pub sequences: usize,
    pub vocabulary: usize,
    /// Tensor-parallel groups of 2 to [`MAX_GROUP`] equal nodes: each rank's share, or why the model
    /// cannot be divided among that many.
    #[serde(default)]
    pub groups: Vec<GroupNeeds>,
    /// Bytes of each layer a decode step reads: all its weights, or of a mixture of experts the share
    /// of its experts a token uses.
    #[serde(default)]
    pub decode_reads: Vec<u64>,
    /// The bytes of the layers and the output head, by ggml's name of their type, and their rows: a
    /// node reads each type at its own rate for its rows' length, so a step's time depends on the mix.
    /// The attention's reads of the F16 cache (see `attention_reads`) are one more entry of the mix.
    #[serde(default)]
    pub weight_mix: Vec<TypeReads>,
    /// Bytes of the KV cache each layer's attention reads for one token at [`DECODE_DEPTH`]: every
    /// query head reads its key and value rows of each position it sees (so a key/value head shared by
    /// several query heads counts once for each), in rows of one head's width. Included in
    /// `decode_reads`: in SmolLM2's decode on one thread, attention took 9 % of the time.
    #[serde(default)]
    pub attention_reads: Vec<u64>,
    /// Bytes of the routed experts of every layer, and of those a token uses (a mixture of experts).
    #[serde(default)]
    pub expert_bytes: u64,
    #[serde(default)]
    pub expert_reads: u64,
    /// Experts each token is routed to (0 for a dense model).
    #[serde(default)]
    pub experts_used: usize,
    /// How the model divides among ranks by any shares (none when it cannot be divided: `groups` say
    /// why).
    #[serde(default)]
    pub divider: Option<Divider>,
}

/// The depth a predicted decode rate is for: the mean of 128 tokens decoded from an empty context
/// (llama-bench's tg128, what `shoal bench` reports as decode). Deeper, attention reads more.
pub const DECODE_DEPTH: usize = 64;

/// A tensor-parallel group of `ranks` equal shares of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupNeeds {
    pub ranks: usize,
    /// Each rank's slice and its weights' exact bytes, in rank order; empty when `refused`.
    pub slices: Vec<(TensorSlice, u64)>,
    /// Why the model cannot be divided among `ranks` nodes.
    pub refused: Option<String>,
}

impl ModelNeeds {
    /// Needs of `model` with `context` positions for each of `sequences` concurrent requests, processing
    /// prompts in steps of `batch` tokens, with an F16 KV cache.
    pub fn of(model: &Model, context: usize, sequences: usize, batch: usize) -> ModelNeeds {
        Self::of_kv(model, context, sequences, batch, crate::engine::KvType::F16)
    }

    /// [`ModelNeeds::of`] with a KV cache of `kv_type` (its bytes; the decode rate is predicted as for
    /// F16 rows).
    pub fn of_kv(
        model: &Model,
        context: usize,
        sequences: usize,
        batch: usize,
        kv_type: crate::engine::KvType,
    ) -> ModelNeeds {
        let c = model.config();
        // The step size a stage uses: its batch, at most the context asked for (as `Stage::load` clamps it).
        let batch = batch.clamp(1, context.max(1));
        let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
        // Each layer's F16 cache row (keys and values, or DeepSeek's latent) per position it holds: the
        // context, or for a sliding-window layer a ring of its window's positions.
        // A linear-attention layer keeps a recurrent state per sequence instead, whatever the context,
        // and copies of it at a few earlier positions (checkpoints, so that a sequence can go back).
        let rows: Vec<_> = (0..c.layers).map(|l| c.cache_row(l)).collect();
        let kv_per_layer = rows
            .iter()
            .enumerate()
            .map(|(layer, row)| {
                let held = crate::engine::kv_cache_positions(row, context, batch);
                let rows = crate::engine::kv_bytes_per_position(row, kv_type) * held as u64;
                let states = 1 + crate::engine::STATE_CHECKPOINTS as u64;
                (rows + c.linear_state_bytes(layer) * states) * sequences.max(1) as u64
            })
            .collect();
        // What each further position costs: the layers that see the whole context.
        let kv_per_position =
            rows.iter().filter(|r| r.window.is_none()).map(|r| crate::engine::kv_bytes_per_position(r, kv_type)).sum();
        // Measured on ggml's CPU back end: about 4 activations of the widest projection per token,
        // plus the F16 attention mask, plus slack (an upper bound of what `Stage::load` reserves).
        // A mixture-of-experts layer holds each token's chosen experts' activations side by side, and
        // its router's scores for every expert.
        let experts_wide = c.moe.map_or(0, |m| m.experts_used * m.expert_feed_forward + m.experts);
        let linear_wide = c.linear_attention.as_ref().map_or(0, |l| 2 * l.conv_channels());
        let widest = c.feed_forward.max(c.embedding).max(experts_wide).max(linear_wide) as u64;
        // On the CPU a step of many rows widens Q5_0 weights to Q8_0 in the compute buffer, one at a time.
        let widened = if batch as i64 >= crate::ggml::WIDEN_FROM_ROWS { largest_widened(model) } else { 0 };
        // A linear-attention layer's step reads and writes each sequence's state in the compute buffer
        // (zeros for a sequence it begins, the delta rule's state after the step).
        let linear_states =
            c.linear_attention.as_ref().map_or(0, |l| 3 * l.state_bytes() * sequences.clamp(1, batch) as u64);
        // Sparse attention scores every attended position for each row (F32), then narrows a copy of
        // the mask to the chosen ones (F16, a few times over), beside its indexer's queries.
        let sparse = c
            .sparse_attention
            .as_ref()
            .map_or(0, |s| 16 * context as u64 + 12 * s.top_k.min(context) as u64 + 8 * (s.heads * s.width) as u64);
        // MiniMax M3's block-sparse attention scores every attended position per key/value head (F32)
        // and builds each head's mask from them (F32, then F16).
        let block_sparse = c.block_sparse.map_or(0, |_| context as u64 * (10 * c.kv_heads as u64 + 16));
        let compute = batch as u64 * (16 * widest + 2 * context as u64 + sparse + block_sparse)
            + (1 << 20)
            + widened
            + linear_states;
        let experts = expert_bytes(model);
        let divider = Divider::of(model);
        let groups = (2..=MAX_GROUP)
            .map(|ranks| {
                let planned = divider.as_ref().map_err(Clone::clone).and_then(|d| d.plan_with_bytes(&vec![1.0; ranks]));
                match planned {
                    Ok(slices) => GroupNeeds { ranks, slices, refused: None },
                    Err(reason) => GroupNeeds { ranks, slices: Vec::new(), refused: Some(reason) },
                }
            })
            .collect();
        let attention: Vec<TypeReads> = rows.iter().map(|row| attention_reads(c, row, context)).collect();
        let mut weight_mix = weight_mix(model);
        weight_mix.push(TypeReads {
            dtype: "f16".into(),
            bytes: attention.iter().map(|a| a.bytes).sum(),
            rows: attention.iter().map(|a| a.rows).sum(),
        });
        let decode_reads = decode_reads(model).iter().zip(&attention).map(|(weights, a)| weights + a.bytes).collect();
        ModelNeeds {
            groups,
            divider: divider.ok(),
            decode_reads,
            attention_reads: attention.iter().map(|a| a.bytes).collect(),
            weight_mix,
            expert_bytes: experts.0,
            expert_reads: experts.1,
            experts_used: c.moe.map_or(0, |m| m.experts_used),
            name: model.name(),
            layout: model.layout().clone(),
            kv_per_layer,
            state_per_sequence: (0..c.layers).map(|layer| c.linear_state_bytes(layer)).sum(),
            kv_per_position,
            kv_per_layer_position: rows.iter().map(|r| crate::engine::kv_bytes_per_position(r, kv_type)).collect(),
            sliding_layers: rows.iter().any(|r| r.window.is_some()),
            compute,
            compute_last_extra: 4 * c.vocabulary as u64,
            // The widest boundary's: Kimi K3's hidden state grows with its residual checkpoints.
            hidden_bytes_per_token: 4 * c.hidden_width(c.layers.saturating_sub(1)) as u64,
            no_stage_starts: (0..c.layers).filter(|&l| !c.may_begin_stage(l)).collect(),
            context,
            sequences: sequences.max(1),
            vocabulary: c.vocabulary,
        }
    }

    /// With the last stage's step of every sequence's decode row and `drafted` drafted tokens, each
    /// asking logits (speculative decoding): its compute buffer holds the larger of that step's logits
    /// and the batch's own activations (measured: with SmolLM2, 8 drafts add nothing beside a batch of
    /// 512, and 0.3 MB beside one of 64).
    pub fn with_draft_rows(mut self, drafted: usize) -> ModelNeeds {
        let logits = 4 * self.vocabulary as u64 * (self.sequences + drafted) as u64;
        self.compute_last_extra = self.compute_last_extra.max(logits.saturating_sub(self.compute));
        self
    }

    /// Whether a stage may begin at `layer`.
    pub fn may_begin_stage(&self, layer: usize) -> bool {
        !self.no_stage_starts.contains(&layer)
    }

    pub fn layers(&self) -> usize {
        self.layout.layers.len()
    }

    /// What a tensor-parallel rank holding `slice` (of `weights` bytes) needs: its weights, the KV cache
    /// of its own heads, and a whole stage's compute buffer (its activations are as wide as the model's)
    /// with its share of the logits.
    pub fn rank(&self, slice: &TensorSlice, weights: u64) -> StageBytes {
        self.rank_over(slice, weights, self.kv_per_layer.iter().sum(), true)
    }

    /// [`ModelNeeds::rank`] of a rank of a group over some layers only (groups chained as pipeline
    /// stages): `weights` its bytes of them, `kv` the whole KV cache of those layers; only the `last`
    /// layers' ranks hold rows of the logits.
    pub fn rank_over(&self, slice: &TensorSlice, weights: u64, kv: u64, last: bool) -> StageBytes {
        let kv_heads = slice.total(crate::model::layout::Part::KvHeads).max(1) as u64;
        let logits = self.compute_last_extra * slice.vocabulary.len() as u64 / self.vocabulary.max(1) as u64;
        StageBytes {
            weights,
            kv_cache: kv * slice.kv_heads.len() as u64 / kv_heads,
            compute: self.compute + if last { logits } else { 0 },
        }
    }

    /// Bytes a decode step of a stage running `layers` reads: its layers' (see `decode_reads`), and on
    /// the last stage the output norm and head; not the token embeddings, of which it reads a row.
    pub fn stage_reads(&self, layers: Range<usize>) -> u64 {
        let l = &self.layout;
        let per_layer = if self.decode_reads.len() == l.layers.len() { &self.decode_reads } else { &l.layers };
        let head = if l.tied_output { l.embedding } else { l.output_head };
        let last = layers.end == self.layers();
        per_layer[layers].iter().sum::<u64>() + l.rope_factors + if last { l.output_norm + head } else { 0 }
    }

    /// Bytes a decode step of a tensor-parallel rank holding `slice` (`weights` bytes) multiplies besides
    /// the routed experts a token chooses: its weights but the token embeddings and its experts, and its
    /// query heads' attention reads. The chosen experts it holds add [`ModelNeeds::expert_slot_reads`]
    /// each: on the CPU a rank computes only the slots of the experts it holds (see
    /// [`expected_slowest`] for what the group waits for). On another device ggml's `mul_mat_id` would
    /// compute every slot, which this does not model: ranks run on the CPU.
    pub fn rank_dense_reads(&self, slice: &TensorSlice, weights: u64) -> u64 {
        let experts = slice.total(crate::model::layout::Part::Experts).max(1) as u64;
        let held = slice.experts.len() as u64;
        let heads = slice.total(crate::model::layout::Part::QueryHeads).max(1) as u64;
        let attention = self.attention_reads.iter().sum::<u64>() * slice.query_heads.len() as u64 / heads;
        weights.saturating_sub(self.layout.embedding).saturating_sub(self.expert_bytes * held / experts) + attention
    }

    /// Bytes one of a token's chosen experts adds to a decode step: its rows in every layer with
    /// experts (0 for a dense model).
    pub fn expert_slot_reads(&self) -> u64 {
        self.expert_reads / self.experts_used.max(1) as u64
    }

    /// What a stage running `layers` needs.
    pub fn stage(&self, layers: Range<usize>) -> StageBytes {
        let last = layers.end == self.layers();
        StageBytes {
            weights: self.layout.stage_bytes(layers.clone()),
            kv_cache: self.kv_per_layer[layers.clone()].iter().sum(),
            compute: self.compute + if last { self.compute_last_extra } else { 0 },
        }
    }
}

/// What one layer's attention reads of its F16 cache for a token at [`DECODE_DEPTH`] (at most the
/// context, or the layer's window): each query head its key row and its value row of every position
/// (DeepSeek's latent attention: the latent, once as keys and once as values), one dot product or
/// accumulation of a head's width each.
fn attention_reads(c: &crate::model::ModelConfig, row: &CacheRow, context: usize) -> TypeReads {
    let positions = DECODE_DEPTH.min(context).min(row.window.unwrap_or(usize::MAX)) as u64;
    let heads = c.heads.max(1) as u64;
    let per_head = if row.values_in_keys {
        2 * row.key_width as u64
    } else {
        (row.key_width + row.value_width) as u64 / c.kv_heads.max(1) as u64
    };
    TypeReads { dtype: "f16".into(), bytes: 2 * heads * positions * per_head, rows: 2 * heads * positions }
}

/// The expected step of a tensor-parallel group whose rank `r` takes `cost(r, x)` to compute a step in
/// which it holds `x` of a token's `used` chosen experts, rank `r` holding `held[r]` of the experts:
/// the expected largest cost over the ranks, as every layer's sum waits for the busiest rank. The
/// experts are chosen at random, none twice. Exact: every way the chosen experts can fall on the
/// ranks, weighted by the number of ways to choose them (at most [`MAX_FALLS`] ways of counting them;
/// past that, from a file asking for unusually many experts, each rank at its even share, which
/// underestimates the wait). With 8 of 64 experts chosen and two equal ranks the busier holds 5.0 of
/// them on average, not 4 (with 4 ranks 3.4, not 2); with unequal ranks the larger is mostly the
/// busier. `None` when a cost is unknown; a dense model (nothing chosen) costs its slowest rank.
pub fn expected_slowest(held: &[usize], used: usize, cost: &dyn Fn(usize, usize) -> Option<f64>) -> Option<f64> {
    let total: usize = held.iter().sum();
    let used = used.min(total);
    // How many counts (x_0, ..., x_r) summing to `used` there are to walk, at most.
    let falls = ways(used + held.len().max(1) - 1, held.len().max(1) - 1);
    if falls > MAX_FALLS as f64 {
        let even = |r: usize| (used * held[r]).div_ceil(total.max(1));
        return (0..held.len()).map(|r| cost(r, even(r))).try_fold(0f64, |m, c| Some(m.max(c?)));
    }
    // cost[r][x] for every count a rank can hold.
    let table: Vec<Vec<f64>> = held
        .iter()
        .enumerate()
        .map(|(r, &h)| (0..=h.min(used)).map(|x| cost(r, x)).collect())
        .collect::<Option<_>>()?;
    let mut falls = Falls { held, table: &table, sum: 0.0 };
    falls.walk(0, used, 1.0, 0.0);
    Some(falls.sum / ways(total, used))
}

/// The ways a token's chosen experts fall on a group's ranks, and the sum of their weighted largest costs.
struct Falls<'a> {
    held: &'a [usize],
    table: &'a [Vec<f64>],
    sum: f64,
}

impl Falls<'_> {
    /// Adds every way ranks `r..` can hold `left` of the chosen experts, `weight` ways for the ranks before
    /// whose largest cost is `largest`.
    fn walk(&mut self, r: usize, left: usize, weight: f64, largest: f64) {
        let Some(&held) = self.held.get(r) else {
            if left == 0 {
                self.sum += weight * largest;
            }
            return;
        };
        let rest: usize = self.held[r + 1..].iter().sum();
        for x in left.saturating_sub(rest)..=left.min(held) {
            self.walk(r + 1, left - x, weight * ways(held, x), largest.max(self.table[r][x]));
        }
    }
}

/// Ways to choose `k` of `n`.
fn ways(n: usize, k: usize) -> f64 {
    (0..k).map(|i| (n - i) as f64 / (i + 1) as f64).product()
}

/// Most ways of counting how a token's chosen experts fall on the ranks that [`expected_slowest`] walks:
/// 8 of them over 8 ranks (DeepSeek V3, Kimi K2, Qwen3-MoE, GLM) are 6,435, 10 over 8 are 19,448.
/// Placement asks for every group it weighs, so a file asking for many more must not cost seconds.
const MAX_FALLS: usize = 50_000;

/// Bytes of `model`'s routed experts, and of those a token uses.
fn expert_bytes(model: &Model) -> (u64, u64) {
    use crate::model::layout::{self, Part, Split};
    let c = model.config();
    let Some(moe) = c.moe else { return (0, 0) };
    let all: u64 = (0..c.layers)
        .flat_map(|layer| layout::layer_tensors(c, layer))
        .filter(|t| matches!(t.split, Split::Along { part: Part::Experts, .. }))
        .filter_map(|t| Some(model.tensor(&t.name)?.bytes))
        .sum();
    (all, all * moe.experts_used as u64 / moe.experts.max(1) as u64)
}

/// Bytes of each layer of `model` a decode step reads (see [`ModelNeeds::decode_reads`]).
fn decode_reads(model: &Model) -> Vec<u64> {
    use crate::model::layout::{self, Part, Split};
    let c = model.config();
    let used = c.moe.map_or(1.0, |m| m.experts_used as f64 / m.experts.max(1) as f64);
    (0..c.layers)
        .map(|layer| {
            layout::layer_tensors(c, layer)
                .iter()
                .filter_map(|t| {
                    let bytes = model.tensor(&t.name)?.bytes;
                    Some(match t.split {
                        Split::Along { part: Part::Experts, .. } => (bytes as f64 * used) as u64,
                        _ => bytes,
                    })
                })
                .sum()
        })
        .collect()
}

/// The bytes of the largest widened copy of a layer's Q5_0 matrix (see `ggml::widen`); experts' 3-D
/// tensors and the output head are never widened.
fn largest_widened(model: &Model) -> u64 {
    let c = model.config();
    (0..c.layers)
        .flat_map(|layer| layout::layer_tensors(c, layer))
        .filter_map(|t| model.tensor(&t.name))
        .filter(|info| info.dtype == crate::ggml::DType::Q5_0 && info.shape.len() == 2)
        .map(|info| crate::ggml::widened_bytes(info.shape.iter().product()))
        .max()
        .unwrap_or(0)
}

/// The bytes of `model`'s layers and output head by type (see [`ModelNeeds::weight_mix`]),
/// most bytes first.
fn weight_mix(model: &Model) -> Vec<TypeReads> {
    let c = model.config();
    let mut by_type: HashMap<&'static str, TypeReads> = HashMap::new();
    // The output head, or the token embeddings it shares.
    let head = model.tensor(layout::OUTPUT).or_else(|| model.tensor(layout::TOKEN_EMBEDDING));
    let layers = (0..c.layers).flat_map(|layer| layout::layer_tensors(c, layer));
    for info in layers.filter_map(|t| model.tensor(&t.name)).chain(head) {
        let reads = by_type.entry(info.dtype.name()).or_default();
        reads.bytes += info.bytes;
        // ggml order: the first dimension is a row; the others count rows (of every expert).
        reads.rows += info.shape.iter().skip(1).product::<u64>().max(1);
    }
    let mut mix: Vec<TypeReads> =
        by_type.into_iter().map(|(name, reads)| TypeReads { dtype: name.to_string(), ..reads }).collect();
    mix.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.dtype.cmp(&b.dtype)));
    mix
}

#[cfg(test)]
mod tests {
    use super::expected_slowest;

    fn choose(n: u64, k: u64) -> f64 {
        (0..k).map(|i| (n - i) as f64 / (i + 1) as f64).product()
    }

    /// The expected largest number of a token's chosen experts one of `held.len()` ranks holds.
    fn busiest(held: &[usize], used: usize) -> f64 {
        expected_slowest(held, used, &|_, x| Some(x as f64)).unwrap()
    }

    /// Two ranks: the busier holds max(X, used - X) of the chosen experts, X hypergeometric, summed
    /// directly; for 4 and 8 ranks, the values Python's exact integer arithmetic gives for the same
    /// count (`math.comb` over every way to take at most m from each rank).
    #[test]
    fn the_busiest_rank_holds_more_than_an_even_share_of_the_chosen_experts() {
        for (experts, used) in [(64u64, 8u64), (128, 8), (32, 4), (384, 8)] {
            let half = experts / 2;
            let expected: f64 = (0..=used)
                .map(|x| x.max(used - x) as f64 * choose(half, x) * choose(experts - half, used - x))
                .sum::<f64>()
                / choose(experts, used);
            let got = busiest(&[half as usize; 2], used as usize);
            assert!((got - expected).abs() < 1e-9, "{experts}/{used}: {got} against {expected}");
        }
        assert!((busiest(&[32; 2], 8) / 4.0 - 1.255_634_687).abs() < 1e-6);
        assert!((busiest(&[16; 4], 8) / 2.0 - 1.715_891_056).abs() < 1e-6);
        assert!((busiest(&[48; 8], 8) / 1.0 - 2.574_975_065).abs() < 1e-6);
        // One rank, or every expert chosen: no rank waits for another's experts.
        assert_eq!(busiest(&[64], 8), 8.0);
        assert!((busiest(&[4, 4], 8) - 4.0).abs() < 1e-9);
    }

    /// Ranks of unequal shares, counted by hand: of 6 experts, ranks holding 4 and 2, a token choosing 2.
    /// Both from the first (6 ways): it holds 2; one from each (8 ways): 1 each; both from the second
    /// (1 way): 2. The busier holds (6·2 + 8·1 + 1·2) / 15 on average. With costs, each way counts its
    /// slower rank: the first computing 10 + 3 per expert, the second 4 + 9 per expert.
    #[test]
    fn unequal_ranks_are_counted_by_the_way_the_chosen_experts_fall() {
        assert!((busiest(&[4, 2], 2) - 22.0 / 15.0).abs() < 1e-9);
        let cost = |r: usize, x: usize| Some(if r == 0 { 10.0 + 3.0 * x as f64 } else { 4.0 + 9.0 * x as f64 });
        let by_hand = (6.0 * f64::max(16.0, 4.0) + 8.0 * f64::max(13.0, 13.0) + 1.0 * f64::max(10.0, 22.0)) / 15.0;
        assert!((expected_slowest(&[4, 2], 2, &cost).unwrap() - by_hand).abs() < 1e-9);
        // Too many ways to count (40 chosen over 8 ranks): each rank at its even share, rounded up.
        assert_eq!(busiest(&[16; 8], 40), 5.0);
        assert!((busiest(&[15, 1], 8) - 7.5).abs() < 1e-9, "8 of 16: the larger rank holds 8 or 7, as often");
        // A dense model costs its slowest rank; an unknown cost leaves the step unknown.
        assert_eq!(expected_slowest(&[0, 0], 0, &|r, _| Some(r as f64 + 1.0)), Some(2.0));
        assert_eq!(expected_slowest(&[4, 2], 2, &|r, _| (r == 0).then_some(1.0)), None);
    }
}

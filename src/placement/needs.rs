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
    /// Compute-buffer bytes of a stage (its largest step).
    pub compute: u64,
    /// Extra compute bytes on the last stage (the logits).
    pub compute_last_extra: u64,
    /// Bytes of one token's hidden state on the wire (f32).
    pub hidden_bytes_per_token: u64,
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
    /// How the model divides among ranks by any shares (none when it cannot be divided: `groups` say
    /// why).
    #[serde(default)]
    pub divider: Option<Divider>,
}

/// The depth a predicted decode rate is for: the mean of 128 tokens decoded from an empty context
/// (llama-bench's tg128, what `shoal bench` reports as decode). Deeper, attention reads more.
pub const DECODE_DEPTH: usize = 64;

/// Most ranks a tensor-parallel group is planned with (a Thunderbolt mesh links at most 8 Macs).
pub const MAX_GROUP: usize = 8;

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
    /// prompts in steps of `batch` tokens.
    pub fn of(model: &Model, context: usize, sequences: usize, batch: usize) -> ModelNeeds {
        let c = model.config();
        // The step size a stage uses: its batch, at most the context asked for (as `Stage::load` clamps it).
        let batch = batch.clamp(1, context.max(1));
        let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
        // Each layer's F16 cache row (keys and values, or DeepSeek's latent) per position it holds: the
        // context, or for a sliding-window layer a ring of its window's positions.
        let rows: Vec<_> = (0..c.layers).map(|l| c.cache_row(l)).collect();
        let kv_per_layer = rows
            .iter()
            .map(|row| {
                let held = crate::engine::kv_cache_positions(row, context, batch);
                row.bytes_per_position() * held as u64 * sequences.max(1) as u64
            })
            .collect();
        // What each further position costs: the layers that see the whole context.
        let kv_per_position = rows.iter().filter(|r| r.window.is_none()).map(CacheRow::bytes_per_position).sum();
        // Measured on ggml's CPU back end: about 4 activations of the widest projection per token,
        // plus the F16 attention mask, plus slack (an upper bound of what `Stage::load` reserves).
        // A mixture-of-experts layer holds each token's chosen experts' activations side by side, and
        // its router's scores for every expert.
        let experts_wide = c.moe.map_or(0, |m| m.experts_used * m.expert_feed_forward + m.experts);
        let widest = c.feed_forward.max(c.embedding).max(experts_wide) as u64;
        let compute = batch as u64 * (16 * widest + 2 * context as u64) + (1 << 20);
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
            name: model.name(),
            layout: model.layout().clone(),
            kv_per_layer,
            kv_per_position,
            compute,
            compute_last_extra: 4 * c.vocabulary as u64,
            hidden_bytes_per_token: 4 * c.embedding as u64,
            context,
            sequences: sequences.max(1),
            vocabulary: c.vocabulary,
        }
    }

    pub fn layers(&self) -> usize {
        self.layout.layers.len()
    }

    /// What a tensor-parallel rank holding `slice` (of `weights` bytes) needs: its weights, the KV cache
    /// of its own heads, and a whole stage's compute buffer (its activations are as wide as the model's)
    /// with its share of the logits.
    pub fn rank(&self, slice: &TensorSlice, weights: u64) -> StageBytes {
        let kv_all: u64 = self.kv_per_layer.iter().sum();
        let kv_heads = slice.total(crate::model::layout::Part::KvHeads).max(1) as u64;
        let logits = self.compute_last_extra * slice.vocabulary.len() as u64 / self.vocabulary.max(1) as u64;
        StageBytes {
            weights,
            kv_cache: kv_all * slice.kv_heads.len() as u64 / kv_heads,
            compute: self.compute + logits,
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

    /// Bytes a decode step of a tensor-parallel rank holding `slice` (`weights` bytes) multiplies: its
    /// weights but the token embeddings and its experts, its query heads' attention reads, and its
    /// experts' share of the expert bytes a token reads: on the CPU a rank computes only the slots of
    /// the experts it holds (with experts chosen evenly, that share). On another device ggml's
    /// `mul_mat_id` would compute every slot, which this does not model: ranks run on the CPU.
    pub fn rank_reads(&self, slice: &TensorSlice, weights: u64) -> u64 {
        let experts = slice.total(crate::model::layout::Part::Experts).max(1) as u64;
        let held = slice.experts.len() as u64;
        let heads = slice.total(crate::model::layout::Part::QueryHeads).max(1) as u64;
        let attention = self.attention_reads.iter().sum::<u64>() * slice.query_heads.len() as u64 / heads;
        weights.saturating_sub(self.layout.embedding).saturating_sub(self.expert_bytes * held / experts)
            + self.expert_reads * held / experts
            + attention
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

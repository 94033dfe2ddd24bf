//! The building blocks every architecture's graph is made of, written once: RMS norm, a linear layer
//! with an optional bias, attention over the stage's KV cache (`attention`), the dense SwiGLU
//! feed-forward and the mixture-of-experts feed-forward (`feed_forward`) — llama.cpp's `build_norm`,
//! `build_attn`, `build_ffn` and `build_moe_ffn`, op for op, so our numbers equal llama.cpp's. Here too:
//! the shape of a step (its sequences' segments) and what every layer of it shares.

mod attention;
mod block_sparse;
mod feed_forward;
mod linear_attention;
mod sparse_attention;

pub(super) use attention::{attend, attend_masked, attend_segments, concat_rows, CachedKeys, MaskOf};
pub use attention::{attention, attention_block, attention_block_with, AttentionParams, QkNorm};
pub use block_sparse::block_sparse_attention;
pub use feed_forward::{
    feed_forward, gated_feed_forward, moe_feed_forward, moe_feed_forward_routed_by, sparse_or_dense_feed_forward,
    Activation,
};
pub use linear_attention::{
    decay, delta_net, gated_delta_net, kimi_delta_attention, DeltaNetInputs, DeltaNetWeights, OutputGate,
};
pub(super) use sparse_attention::{indexer, reused_choice};

use super::kv_cache::KvCache;
use super::recurrent_state::RecurrentState;
use crate::ggml::{Collective, DType, GraphBuilder, SetTensorRef, Tensor};
use crate::model::{LinearAttention, ModelConfig, TensorSlice};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

/// Graph inputs, set before every compute.
pub(super) mod input {
    pub const TOKENS: &str = "tokens";
    pub const HIDDEN: &str = "hidden";
    pub const POSITIONS: &str = "positions";
    /// Four positions per token, section after section, for RoPE by sections (Qwen3.5's M-RoPE).
    pub const POSITION_SECTIONS: &str = "position_sections";
    pub const CACHE_ROWS: &str = "cache_rows";
    /// The rows of the sliding layers' rings.
    pub const CACHE_ROWS_SLIDING: &str = "cache_rows_sliding";
    pub const MASK: &str = "mask";
    /// The mask of sliding-window layers.
    pub const MASK_SLIDING: &str = "mask_sliding";
    /// On the last stage, the rows whose logits are wanted (when not every row's).
    pub const OUTPUT_ROWS: &str = "output_rows";
    /// The Walsh-Hadamard rotations of keys (with queries) and of values before a quantized cache.
    pub const ROTATE_KEYS: &str = "rotate_keys";
    pub const ROTATE_VALUES: &str = "rotate_values";
    /// The Walsh-Hadamard rotation of the lightning indexer's queries and keys (DeepSeek V3.2).
    pub const ROTATE_INDEXER: &str = "rotate_indexer";
}

/// One sequence's part of a step: its tokens are consecutive rows of the step, and its queries attend
/// only to its own sequence's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SegmentShape {
    pub seq: usize,
    pub tokens: usize,
    /// Cache rows attended (a whole number of cache blocks).
    pub attended: usize,
    /// Ring rows the sliding layers attend (0 without such layers).
    pub attended_sliding: usize,
    /// The segment begins its sequence (its first row is position 0): its queries attend only to this
    /// step's own keys, which an architecture may compute in a cheaper form (DeepSeek's latent
    /// attention, see `arch::deepseek2`).
    pub fresh: bool,
}

/// One run of a step's segments that attends as one ([`GraphShape::located_runs`]).
pub(super) struct AttentionRun {
    /// Indices into the step's segments.
    pub segments: Range<usize>,
    /// The first segment's first row in the step, and the start of its part of the mask input
    /// (elements).
    pub row: usize,
    pub mask: usize,
}

/// Cache rows from which ggml's CPU flash attention splits a lone query row's cache across threads
/// (its `use_split_kv_path`); from there on a decode row attends alone (see
/// [`GraphShape::attention_runs`]).
pub(super) const SPLIT_KV_FROM: usize = 512;

/// Everything that fixes a graph's shape. Two steps with equal shapes run the same graph with new inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct GraphShape {
    /// Tokens of the step, all segments together.
    pub tokens: usize,
    /// The step's sequences, in row order.
    pub segments: Vec<SegmentShape>,
    /// Rows of logits the last stage returns (every row's when equal to `tokens`).
    pub outputs: usize,
}

impl GraphShape {
    /// Where each segment's rows begin.
    pub fn row_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().scan(0, |at, s| {
            let start = *at;
            *at += s.tokens;
            Some(start)
        })
    }

    /// The segments whose attention runs as one (ranges of segment indices, in order): runs of decode
    /// rows (one token each) of consecutive sequences attending over the same cache rows become one
    /// flash attention over a batch of sequences (ggml's fourth dimension), where each would otherwise
    /// add its own attention, views and a join to every layer. Every other segment is a run of its own.
    ///
    /// A lone decode row over [`SPLIT_KV_FROM`] cache rows or more attends alone: ggml's CPU splits such
    /// a row's cache across threads and would round its sums differently from the same row in a batch,
    /// and a request must give the same result batched as alone.
    pub fn attention_runs(&self) -> Vec<Range<usize>> {
        let joins = |a: &SegmentShape, b: &SegmentShape| {
            a.tokens == 1
                && b.tokens == 1
                && b.seq == a.seq + 1
                && a.attended == b.attended
                && a.attended_sliding == b.attended_sliding
                && a.attended.max(a.attended_sliding) < SPLIT_KV_FROM
        };
        let mut runs: Vec<Range<usize>> = Vec::new();
        for (i, segment) in self.segments.iter().enumerate() {
            match runs.last_mut() {
                Some(run) if joins(&self.segments[run.end - 1], segment) => run.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
        runs
    }

    /// [`Self::attention_runs`], each with where its first segment begins: its first row in the step
    /// and its part of the causal mask (or, `sliding`, of the sliding mask) in that mask's input.
    pub fn located_runs(&self, sliding: bool) -> Vec<AttentionRun> {
        let rows: Vec<usize> = self.row_offsets().collect();
        let (masks, _) = self.mask_offsets(sliding);
        self.attention_runs()
            .into_iter()
            .map(|segments| AttentionRun { row: rows[segments.start], mask: masks[segments.start], segments })
            .collect()
    }

    /// Where each segment's part of the causal mask (or, `sliding`, of the sliding mask) begins, in
    /// elements of the flat mask input, and the input's whole length.
    pub fn mask_offsets(&self, sliding: bool) -> (Vec<usize>, usize) {
        let mut at = 0;
        let offsets = self
            .segments
            .iter()
            .map(|s| {
                let start = at;
                at += s.tokens * if sliding { s.attended_sliding } else { s.attended };
                start
            })
            .collect();
        (offsets, at)
    }
}

/// What every layer of one step shares: the model's hyper-parameters, the stage's cache and the step's
/// inputs.
pub struct StepContext<'a, 'g> {
    pub config: &'a ModelConfig,
    pub(super) layers: Range<usize>,
    pub(super) cache: &'a KvCache,
    /// The recurrent state of the stage's linear-attention layers.
    pub(super) state: &'a RecurrentState,
    pub(super) shape: GraphShape,
    pub(super) rope_mode: i32,
    pub(super) positions: Tensor<'g>,
    /// The step's positions by sections, when the model turns RoPE by sections.
    pub(super) position_sections: Option<Tensor<'g>>,
    /// Where the step's positions go in the cache, when a layer of the stage sees the whole context.
    pub(super) cache_rows: Option<Tensor<'g>>,
    /// Where the step's positions go in the sliding layers' rings, when a layer of the stage slides.
    pub(super) cache_rows_sliding: Option<Tensor<'g>>,
    /// The causal mask, when a layer of the stage attends to the whole context.
    pub(super) mask: Option<Tensor<'g>>,
    /// The sliding-window mask, when a layer of the stage slides.
    pub(super) mask_sliding: Option<Tensor<'g>>,
    pub(super) rope_factors: Option<Tensor<'g>>,
    /// On the model's last layer, when not every row's logits are wanted: the rows whose are.
    pub(super) output_rows: Option<Tensor<'g>>,
    /// On a rank of a tensor-parallel group: its share of the model and the group's sum.
    pub(super) parallel: Option<Parallel<'a>>,
    /// With a quantized KV cache: the rotations of keys (and queries) and of values (see
    /// [`crate::engine::KvType::rotations`]).
    pub(super) rotate_keys: Option<Tensor<'g>>,
    pub(super) rotate_values: Option<Tensor<'g>>,
    /// With sparse attention: the rotation of the lightning indexer's queries and keys.
    pub(super) rotate_indexer: Option<Tensor<'g>>,
    /// With sparse attention: the positions the stage's last layer with an indexer chose, per run of
    /// the step (by the run's first row), for the layers after it that reuse them (GLM-5.2).
    pub(super) sparse_choices: RefCell<Vec<(usize, Tensor<'g>)>>,
}

/// A tensor-parallel rank's part in a graph: the heads, columns and experts it holds, and the sum over
/// the group that completes what each rank computes of a layer.
#[derive(Clone, Copy)]
pub(super) struct Parallel<'a> {
    pub slice: &'a TensorSlice,
    pub collective: &'a Arc<dyn Collective>,
    /// Whether the rank computes on the CPU, where its experts' products can skip the slots of
    /// experts it does not hold (a custom op; another device would have to hand them to the CPU).
    pub on_cpu: bool,
}

impl<'g> StepContext<'_, 'g> {
    /// Queries and keys rotated (and values) as a quantized cache stores them, when it does.
    pub fn rotated_for_cache(
        &self,
        g: &'g GraphBuilder,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>, Tensor<'g>) {
        let (q, k) = match self.rotate_keys {
            Some(r) => (g.mul_mat_hadamard(r, q), g.mul_mat_hadamard(r, k)),
            None => (q, k),
        };
        let v = self.rotate_values.map_or(v, |r| g.mul_mat_hadamard(r, v));
        (q, k, v)
    }

    /// Attention's output rotated back, when the values were rotated (the rotation is its own inverse).
    pub fn unrotated_values(&self, g: &'g GraphBuilder, out: Tensor<'g>) -> Tensor<'g> {
        self.rotate_values.map_or(out, |r| g.mul_mat_hadamard(r, out))
    }

    /// The linear-attention layers' shape this graph computes: the model's, or a tensor-parallel
    /// rank's share of their heads.
    pub fn linear_attention(&self) -> &LinearAttention {
        self.state.shape()
    }

    /// Tokens in this step.
    pub fn tokens(&self) -> i64 {
        self.shape.tokens as i64
    }

    /// Query heads this graph computes (a tensor-parallel rank's share of them).
    pub fn heads(&self) -> usize {
        self.parallel.map_or(self.config.heads, |p| p.slice.query_heads.len())
    }

    /// Key/value heads this graph computes and caches.
    pub fn kv_heads(&self) -> usize {
        self.parallel.map_or(self.config.kv_heads, |p| p.slice.kv_heads.len())
    }

    /// The query heads in runs that attend alike: (query heads, the key/value heads they read), counted
    /// from this graph's first. One run unless a tensor-parallel rank holds part of a key/value group.
    pub fn head_runs(&self) -> Vec<(Range<usize>, Range<usize>)> {
        match self.parallel {
            Some(p) => p.slice.head_runs(),
            None => vec![(0..self.config.heads, 0..self.config.kv_heads)],
        }
    }

    /// A layer's output as the whole model computes it: on a tensor-parallel rank, the sum of `partial`
    /// over the group (each rank computed it from its heads, columns or experts); else `partial` itself.
    pub fn complete(&self, g: &'g GraphBuilder, partial: Tensor<'g>) -> Tensor<'g> {
        match self.parallel {
            Some(p) => g.all_reduce(partial, p.collective),
            None => partial,
        }
    }

    /// The routed experts this graph holds, when a tensor-parallel rank holds only some of them, and
    /// whether it computes on the CPU.
    fn held_experts(&self) -> Option<(Range<usize>, bool)> {
        self.parallel
            .map(|p| (p.slice.experts.clone(), p.on_cpu))
            .filter(|(held, _)| held.len() < self.config.moe.map_or(0, |m| m.experts))
    }

    /// On the model's last layer only the rows whose logits are wanted are needed further on: drops the
    /// others from the attention output and its residual, as llama.cpp does before the feed-forward.
    /// `x` ([width, tokens], after the model's last layer) cut to the rows whose logits are wanted,
    /// for architectures that mix the last layer's output further before pruning (Kimi K3).
    pub fn output_rows_of(&self, g: &'g GraphBuilder, x: Tensor<'g>) -> Tensor<'g> {
        match self.output_rows {
            Some(rows) => g.get_rows(x, rows),
            None => x,
        }
    }

    pub fn prune_last_layer(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        h: Tensor<'g>,
        residual: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>) {
        match self.output_rows {
            Some(rows) if layer + 1 == self.config.layers => (g.get_rows(h, rows), g.get_rows(residual, rows)),
            _ => (h, residual),
        }
    }
}

/// RMS norm of `x` times `weight`.
pub fn norm<'g>(g: &'g GraphBuilder, x: Tensor<'g>, weight: &SetTensorRef, eps: f32) -> Tensor<'g> {
    g.mul(g.rms_norm(x, eps), g.stored(weight))
}

/// `weight · x`, plus `bias` when there is one.
pub fn linear<'g>(
    g: &'g GraphBuilder,
    weight: &SetTensorRef,
    bias: Option<&SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let y = g.mul_mat(g.stored(weight), x);
    match bias {
        Some(b) => g.add(y, g.stored(b)),
        None => y,
    }
}

/// The input of the first layer: token embeddings on the first stage, hidden states elsewhere.
pub(super) fn stage_input<'g>(
    g: &'g GraphBuilder,
    embedding: Option<&SetTensorRef>,
    width: usize,
    tokens: i64,
) -> Tensor<'g> {
    match embedding {
        Some(table) => {
            let ids = g.input(input::TOKENS, DType::I32, &[tokens]);
            g.get_rows(g.stored(table), ids)
        }
        None => g.input(input::HIDDEN, DType::F32, &[width as i64, tokens]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(seq: usize, tokens: usize, attended: usize) -> SegmentShape {
        SegmentShape { seq, tokens, attended, attended_sliding: 0, fresh: false }
    }

    fn runs(segments: Vec<SegmentShape>) -> Vec<Range<usize>> {
        let tokens = segments.iter().map(|s| s.tokens).sum();
        GraphShape { tokens, outputs: segments.len(), segments }.attention_runs()
    }

    #[test]
    fn decode_rows_of_neighbouring_sequences_attend_as_one() {
        let decode = |seq| segment(seq, 1, 256);
        assert_eq!(runs(vec![decode(0), decode(1), decode(2), decode(3)]), vec![0..4]);
        // A gap in the sequences, a prompt and a longer cache each start a run of their own.
        assert_eq!(runs(vec![decode(0), decode(1), decode(3), decode(4)]), vec![0..2, 2..4]);
        assert_eq!(runs(vec![decode(0), decode(1), segment(2, 7, 256), decode(3)]), vec![0..2, 2..3, 3..4]);
        assert_eq!(runs(vec![decode(0), segment(1, 1, 512), decode(2)]), vec![0..1, 1..2, 2..3]);
        assert_eq!(runs(vec![segment(0, 3, 256), segment(1, 3, 256)]), vec![0..1, 1..2]);
    }

    #[test]
    fn rows_over_long_caches_attend_alone_as_a_lone_row_would() {
        let long = |seq| segment(seq, 1, SPLIT_KV_FROM);
        assert_eq!(runs(vec![long(0), long(1)]), vec![0..1, 1..2]);
        let sliding = |seq| SegmentShape { attended_sliding: SPLIT_KV_FROM, ..segment(seq, 1, 256) };
        assert_eq!(runs(vec![sliding(0), sliding(1)]), vec![0..1, 1..2]);
    }
}

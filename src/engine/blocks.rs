//! The building blocks every architecture's graph is made of, written once: RMS norm, a linear layer
//! with an optional bias, attention over the stage's KV cache, the dense SwiGLU feed-forward and the
//! mixture-of-experts feed-forward (llama.cpp's `build_norm`, `build_attn`, `build_ffn` and
//! `build_moe_ffn`, op for op, so our numbers equal llama.cpp's).

use super::kv_cache::KvCache;
use super::weights::LayerWeights;
use crate::ggml::{Collective, DType, GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::{ExpertActivation, ExpertGroups, Gating, ModelConfig, MoeParams, TensorSlice};
use std::ops::Range;
use std::sync::Arc;

/// Graph inputs, set before every compute.
pub(super) mod input {
    pub const TOKENS: &str = "tokens";
    pub const HIDDEN: &str = "hidden";
    pub const POSITIONS: &str = "positions";
    pub const CACHE_ROWS: &str = "cache_rows";
    /// The rows of the sliding layers' rings.
    pub const CACHE_ROWS_SLIDING: &str = "cache_rows_sliding";
    pub const MASK: &str = "mask";
    /// The mask of sliding-window layers.
    pub const MASK_SLIDING: &str = "mask_sliding";
    /// On the last stage, the rows whose logits are wanted (when not every row's).
    pub const OUTPUT_ROWS: &str = "output_rows";
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
    pub(super) shape: GraphShape,
    pub(super) rope_mode: i32,
    pub(super) positions: Tensor<'g>,
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
}

/// A tensor-parallel rank's part in a graph: the heads, columns and experts it holds, and the sum over
/// the group that completes what each rank computes of a layer.
#[derive(Clone, Copy)]
pub(super) struct Parallel<'a> {
    pub slice: &'a TensorSlice,
    pub collective: &'a Arc<dyn Collective>,
}

impl<'g> StepContext<'_, 'g> {
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

    /// The routed experts this graph holds, when a tensor-parallel rank holds only some of them.
    fn held_experts(&self) -> Option<Range<usize>> {
        self.parallel
            .map(|p| p.slice.experts.clone())
            .filter(|held| held.len() < self.config.moe.map_or(0, |m| m.experts))
    }

    /// On the model's last layer only the rows whose logits are wanted are needed further on: drops the
    /// others from the attention output and its residual, as llama.cpp does before the feed-forward.
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

/// How one layer's attention differs from the usual.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Q is multiplied by this after RoPE (Gemma), and the attention logits by `kq_scale`.
    pub q_scale: Option<f32>,
    pub kq_scale: f32,
    /// The layer attends through the sliding window.
    pub sliding: bool,
}

impl AttentionParams {
    /// The model's RoPE and scale, or its sliding-window RoPE on a sliding layer.
    pub fn of(config: &ModelConfig, layer: usize) -> AttentionParams {
        let (freq_base, freq_scale, sliding) = match &config.sliding_window {
            Some(w) if config.is_sliding(layer) => (w.freq_base, w.freq_scale, true),
            _ => (config.rope.freq_base, config.rope.freq_scale, false),
        };
        AttentionParams { freq_base, freq_scale, q_scale: None, kq_scale: config.attention_scale, sliding }
    }
}

/// The attention half of a pre-norm layer, as most architectures have it: `x + attention(norm(x))`
/// with `attn_norm`, on the model's last layer only for the row whose logits are wanted. Its result
/// is the feed-forward's input (and residual).
pub fn attention_block<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let normed = norm(g, x, w.req("attn_norm.weight"), step.config.rms_epsilon);
    let h = attention(g, step, layer, w, normed, &AttentionParams::of(step.config, layer));
    let (h, residual) = step.prune_last_layer(g, layer, h, x);
    g.add(h, residual)
}

/// Self-attention of one layer with the standard tensor names (`attn_q`, `attn_k`, `attn_v` with
/// optional biases, optional per-head `attn_q_norm`/`attn_k_norm`, `attn_output`): projections, RoPE,
/// the cache write, attention over the cached positions and the output projection.
pub fn attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
    params: &AttentionParams,
) -> Tensor<'g> {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let (heads, kv_heads) = (step.heads(), step.kv_heads());
    let local = layer - step.layers.start;
    let mut q = g.reshape_3d(linear(g, w.req("attn_q.weight"), w.get("attn_q.bias"), x), hd, heads as i64, t);
    let mut k = g.reshape_3d(linear(g, w.req("attn_k.weight"), w.get("attn_k.bias"), x), hd, kv_heads as i64, t);
    let v = g.reshape_3d(linear(g, w.req("attn_v.weight"), w.get("attn_v.bias"), x), hd, kv_heads as i64, t);
    if let (Some(qn), Some(kn)) = (w.get("attn_q_norm.weight"), w.get("attn_k_norm.weight")) {
        q = norm(g, q, qn, c.rms_epsilon);
        k = norm(g, k, kn, c.rms_epsilon);
    }
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: step.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: params.freq_base,
        freq_scale: params.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    };
    let q = g.rope(q, step.positions, step.rope_factors, &rope);
    let k = g.rope(k, step.positions, step.rope_factors, &rope);
    let q = match params.q_scale {
        Some(scale) => g.scale(q, scale),
        None => q,
    };

    let width = (kv_heads * c.head_dim) as i64;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    let rows = if params.sliding {
        step.cache_rows_sliding.expect("a stage with sliding layers has their cache rows")
    } else {
        step.cache_rows.expect("a stage with global layers has their cache rows")
    };
    step.cache.store(g, local, k_rows, Some(v_rows), rows);
    let sinks = w.get("attn_sinks.weight").map(|s| g.stored(s));
    let keys = CachedKeys { layer: local, key_head: c.head_dim, value_head: c.head_dim, sliding: params.sliding };
    let attended = attend(g, step, q, keys, params.kq_scale, sinks);
    let merged = g.reshape_2d(attended, hd * heads as i64, t);
    // The output projection of a rank's heads is its part of the sum; the bias is added once, to the sum.
    let projected = step.complete(g, g.mul_mat(g.stored(w.req("attn_output.weight")), merged));
    match w.get("attn_output.bias") {
        Some(b) => g.add(projected, g.stored(b)),
        None => projected,
    }
}

/// Which cached keys and values a layer's queries attend to.
#[derive(Clone, Copy, Debug)]
pub(super) struct CachedKeys {
    /// The layer's index within the stage.
    pub layer: usize,
    pub key_head: usize,
    pub value_head: usize,
    /// Through the sliding window (the layer's ring and the sliding mask).
    pub sliding: bool,
}

/// Attention of the step's queries `q` ([key_head, heads, tokens], this step's keys and values already
/// stored) over the cache: each segment's rows over its own sequence's cached positions, through its
/// part of the mask, with the sinks when the layer has them; a run of decoding sequences in one flash
/// attention (see [`GraphShape::attention_runs`]). Returns [value_head, heads, tokens].
pub(super) fn attend<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    keys: CachedKeys,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
) -> Tensor<'g> {
    let shape = &step.shape;
    let mask = if keys.sliding { step.mask_sliding } else { step.mask };
    let mask = mask.expect("the stage's graph has the mask of each of its layers' kinds");
    let (mask_offsets, _) = shape.mask_offsets(keys.sliding);
    let row_offsets: Vec<usize> = shape.row_offsets().collect();
    let [d, heads, ..] = q.shape();
    let q_strides = q.strides();
    let parts: Vec<Tensor<'g>> = shape
        .attention_runs()
        .into_iter()
        .map(|run| {
            let first = shape.segments[run.start];
            let (t, n) = (first.tokens, run.len());
            let attended = if keys.sliding { first.attended_sliding } else { first.attended };
            // [d, heads, tokens, sequences]: each sequence's rows follow the one before's.
            let row_bytes = q_strides[2];
            let q = g.view(
                q,
                &[d, heads, t as i64, n as i64],
                &[q_strides[1], row_bytes, t * row_bytes],
                row_offsets[run.start] * row_bytes,
            );
            let mask_bytes = attended * t * 2;
            let mask = g.view(
                mask,
                &[attended as i64, t as i64, 1, n as i64],
                &[attended * 2, mask_bytes, mask_bytes],
                mask_offsets[run.start] * 2,
            );
            let (k, v) =
                step.cache.view(g, keys.layer, first.seq..first.seq + n, attended, keys.key_head, keys.value_head);
            let out = attend_heads(g, step, q, k, v, Scoring { mask, kq_scale, sinks }); // [d_v, heads, t, n]
            let [d_v, out_heads, ..] = out.shape();
            if n == 1 {
                return out;
            }
            g.reshape_3d(out, d_v, out_heads, (t * n) as i64)
        })
        .collect();
    concat_rows(g, &parts)
}

/// How queries score the keys: through `mask`, scaled by `kq_scale`, with the sinks when the layer has
/// them.
#[derive(Clone, Copy)]
struct Scoring<'g> {
    mask: Tensor<'g>,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
}

/// Flash attention of queries `q` ([d, heads, tokens, sequences]) over keys `k` and values `v` ([d,
/// kv_heads, positions, sequences]): in one run of heads, or on a rank holding part of a key/value group,
/// each run of heads on its own, joined by head. [d_v, heads, tokens, sequences].
fn attend_heads<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    scoring: Scoring<'g>,
) -> Tensor<'g> {
    let head_runs = step.head_runs();
    if let [_] = head_runs.as_slice() {
        return attend_run(g, q, k, v, scoring);
    }
    let run_outputs: Vec<Tensor<'g>> = head_runs
        .into_iter()
        .map(|(heads, kv)| {
            let of = |x: Tensor<'g>, range: &Range<usize>| {
                let [width, _, rows, sequences] = x.shape();
                let st = x.strides();
                g.view(x, &[width, range.len() as i64, rows, sequences], &[st[1], st[2], st[3]], range.start * st[1])
            };
            let sinks = scoring.sinks.map(|s| g.view(s, &[heads.len() as i64], &[], heads.start * s.strides()[0]));
            attend_run(g, of(q, &heads), of(k, &kv), of(v, &kv), Scoring { sinks, ..scoring })
        })
        .collect();
    run_outputs.into_iter().reduce(|a, b| g.concat(a, b, 1)).expect("a rank holds a query head")
}

/// Flash attention of queries `q` ([d, heads, tokens, sequences]) over keys `k` and values `v` ([d,
/// kv_heads, positions, sequences]), each query head reading key/value head `h / (heads / kv_heads)`;
/// [d_v, heads, tokens, sequences].
fn attend_run<'g>(
    g: &'g GraphBuilder,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    scoring: Scoring<'g>,
) -> Tensor<'g> {
    let q = g.permute(q, [0, 2, 1, 3]);
    let (k, v) = (g.permute(k, [0, 2, 1, 3]), g.permute(v, [0, 2, 1, 3]));
    let out = g.flash_attention(q, k, v, scoring.mask, scoring.kq_scale);
    match scoring.sinks {
        Some(sinks) => g.attention_sinks(out, sinks),
        None => out,
    }
}

/// `parts` joined along their last dimension, pairwise so that each value is copied about log₂(parts)
/// times rather than once per part after it.
fn concat_rows<'g>(g: &'g GraphBuilder, parts: &[Tensor<'g>]) -> Tensor<'g> {
    match parts {
        [one] => *one,
        _ => {
            let (a, b) = parts.split_at(parts.len() / 2);
            g.concat(concat_rows(g, a), concat_rows(g, b), 2)
        }
    }
}

/// The dense SwiGLU feed-forward `down(silu(gate·x) ⊙ up·x)` over the tensors `ffn_{gate,up,down}` +
/// `suffix` (`""` for a dense layer's own, `"_shexp"` for a shared expert).
pub fn feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LayerWeights,
    suffix: &str,
    x: Tensor<'g>,
) -> Tensor<'g> {
    gated_feed_forward(g, step, w, suffix, x, Activation::Silu)
}

/// The gate's activation in a gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation.
    Gelu,
}

/// `down(act(gate·x) ⊙ up·x)` over `ffn_{gate,up,down}` + `suffix` (on a tensor-parallel rank, over
/// its columns of the inner width, summed over the group).
pub fn gated_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LayerWeights,
    suffix: &str,
    x: Tensor<'g>,
    activation: Activation,
) -> Tensor<'g> {
    let up = g.mul_mat(g.stored(w.req(&format!("ffn_up{suffix}.weight"))), x);
    let gate = g.mul_mat(g.stored(w.req(&format!("ffn_gate{suffix}.weight"))), x);
    let h = match activation {
        Activation::Silu => g.swiglu(gate, up),
        Activation::Gelu => g.geglu(gate, up),
    };
    step.complete(g, g.mul_mat(g.stored(w.req(&format!("ffn_down{suffix}.weight"))), h))
}

/// The mixture-of-experts feed-forward over `ffn_gate_inp` (the router) and the 3-D expert tensors
/// `ffn_{gate,up,down}_exps`: route each token to its top `experts_used` experts, run only those
/// experts' rows (`mul_mat_id`), and sum their outputs by weight. `exp_probs_b`, when the layer has it,
/// biases the choice of experts but not their weights (DeepSeek V3, GLM-4.5). A tensor-parallel rank
/// that holds some of the experts routes alike, runs only the chosen experts it holds (the others'
/// weights zeroed) and sums with the group.
pub fn moe_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LayerWeights,
    p: &MoeParams,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let [n_embd, tokens, ..] = x.shape();
    let (n_expert, n_used) = (p.experts as i64, p.experts_used as i64);
    let logits = linear(g, w.req("ffn_gate_inp.weight"), w.get("ffn_gate_inp.bias"), x); // [experts, tokens]
    let probs = match p.gating {
        Gating::Softmax => g.soft_max(logits),
        Gating::Sigmoid => g.sigmoid(logits),
        Gating::SoftmaxWeight => logits,
    };
    let selection = match w.get("exp_probs_b.bias") {
        Some(bias) => g.add(probs, g.stored(bias)),
        None => probs,
    };
    let selection = match p.groups {
        Some(groups) => only_best_groups(g, selection, groups, tokens),
        None => selection,
    };
    let selected = g.argsort_top_k(selection, n_used); // I32 [used, tokens]
    let mut weights = g.get_rows(g.reshape_3d(probs, 1, n_expert, tokens), selected); // [1, used, tokens]
    if p.gating == Gating::SoftmaxWeight {
        weights = g.reshape_3d(g.soft_max(g.reshape_2d(weights, n_used, tokens)), 1, n_used, tokens);
    }
    if p.normalize {
        let flat = g.reshape_2d(weights, n_used, tokens);
        // llama.cpp clamps the sum to F16's smallest normal number against a division by zero.
        let sum = g.clamp(g.sum_rows(flat), 6.103_515_6e-5, f32::INFINITY);
        weights = g.reshape_3d(g.div(flat, sum), 1, n_used, tokens);
    }
    if p.scale != 0.0 && p.scale != 1.0 {
        weights = g.scale(weights, p.scale);
    }
    let held = step.held_experts();
    let selected = match &held {
        Some(held) => {
            weights = g.held_expert_weights(weights, selected, held.clone());
            g.held_expert_ids(selected, held.clone())
        }
        None => selected,
    };
    g.expand(weights);

    let x = g.reshape_3d(x, n_embd, 1, tokens);
    // Each chosen expert's rows, plus its own bias when the experts have them (gpt-oss).
    let expert = |name: &str, input: Tensor<'g>| {
        let y = g.mul_mat_id(g.stored(w.req(&format!("{name}.weight"))), input, selected);
        match w.get(&format!("{name}.bias")) {
            Some(bias) => g.add_id(y, g.stored(bias), selected),
            None => y,
        }
    };
    let up = expert("ffn_up_exps", x); // [ff, used, tokens]
    let gate = expert("ffn_gate_exps", x);
    let h = match p.activation {
        ExpertActivation::Silu => g.swiglu(gate, up),
        ExpertActivation::SwigluOai => g.swiglu_oai(gate, up, 1.702, 7.0),
    };
    let experts = expert("ffn_down_exps", h); // [embd, used, tokens]
    let experts = g.mul(experts, weights);
    g.expand(experts);

    // Views of each chosen slot first, then the sum, in llama.cpp's order.
    let slots: Vec<Tensor<'g>> = (0..n_used as usize)
        .map(|i| {
            let s = experts.strides();
            let view = g.view(experts, &[n_embd, tokens], &[s[2]], i * s[1]);
            g.expand(view);
            view
        })
        .collect();
    let mut out = slots[0];
    for &slot in &slots[1..] {
        out = g.add(out, slot);
        g.expand(out);
    }
    if held.is_some() {
        step.complete(g, out)
    } else {
        out
    }
}

/// The feed-forward of a model whose first layers are dense and the others routed to experts, with
/// shared experts every token also goes through (GLM-4.5, DeepSeek V3).
pub fn sparse_or_dense_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LayerWeights,
    moe: &MoeParams,
    layer: usize,
    x: Tensor<'g>,
) -> Tensor<'g> {
    if !moe.is_sparse(layer) {
        return feed_forward(g, step, w, "", x);
    }
    let routed = moe_feed_forward(g, step, w, moe, x);
    if moe.shared_experts > 0 {
        g.add(routed, feed_forward(g, step, w, "_shexp", x))
    } else {
        routed
    }
}

/// Group-limited routing: the scores `selection` ([experts, tokens]) of experts outside each token's
/// `groups.used` best groups become -∞, a group scoring the sum of its two best experts' scores.
fn only_best_groups<'g>(g: &'g GraphBuilder, selection: Tensor<'g>, groups: ExpertGroups, tokens: i64) -> Tensor<'g> {
    let [n_expert, ..] = selection.shape();
    let (count, used) = (groups.count as i64, groups.used as i64);
    let per_group = n_expert / count;
    let by_group = g.reshape_3d(selection, per_group, count, tokens); // [per_group, groups, tokens]
    let best_two = g.argsort_top_k(by_group, 2); // I32 [2, groups, tokens]
    let best_two = g.get_rows(g.reshape_4d(by_group, [1, per_group, count, tokens]), best_two); // [1, 2, groups, tokens]
    let group_scores = g.sum_rows(g.reshape_3d(best_two, 2, count, tokens)); // [1, groups, tokens]
    let best_groups = g.argsort_top_k(g.reshape_2d(group_scores, count, tokens), used); // I32 [used, tokens]
    let kept = g.get_rows(by_group, best_groups); // [per_group, used, tokens]
    let masked = g.set_rows(g.fill(by_group, f32::NEG_INFINITY), kept, best_groups);
    g.reshape_2d(masked, n_expert, tokens)
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
        SegmentShape { seq, tokens, attended, attended_sliding: 0 }
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

//! Attention over the stage's KV cache: the projections, RoPE and the cache write of a layer, then each
//! run of the step's segments attending over its sequences' cached positions in one flash attention.

use super::{linear, norm, AttentionRun, StepContext};
use crate::ggml::{GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::arch::groups::Attention;
use crate::model::ModelConfig;
use std::ops::Range;

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
    /// How the optional Q/K norms apply.
    pub qk_norm: QkNorm,
}

/// How a layer's Q and K norms (when it has them) apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// To each head on its own, one weight of a head's width.
    PerHead,
    /// To all heads at once, one weight as wide as all of them (MiniMax M2). A tensor-parallel rank
    /// holds its query heads (the group completes their sum of squares) and every key head.
    AcrossHeads,
}

impl AttentionParams {
    /// The model's RoPE and scale, or its sliding-window RoPE on a sliding layer.
    pub fn of(config: &ModelConfig, layer: usize) -> AttentionParams {
        let (freq_base, freq_scale, sliding) = match &config.sliding_window {
            Some(w) if config.is_sliding(layer) => (w.freq_base, w.freq_scale, true),
            _ => (config.rope.freq_base, config.rope.freq_scale, false),
        };
        AttentionParams {
            freq_base,
            freq_scale,
            q_scale: None,
            kq_scale: config.attention_scale,
            sliding,
            qk_norm: QkNorm::PerHead,
        }
    }
}

/// The attention half of a pre-norm layer, as most architectures have it: `x + attention(norm(x))`
/// with the norm's weight `attn_norm`, on the model's last layer only for the row whose logits are
/// wanted. Its result is the feed-forward's input (and residual).
pub fn attention_block<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    attn_norm: &SetTensorRef,
    w: &Attention<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    attention_block_with(g, step, layer, attn_norm, w, x, &AttentionParams::of(step.config, layer))
}

/// [`attention_block`] with the layer's attention as `params` says.
pub fn attention_block_with<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    attn_norm: &SetTensorRef,
    w: &Attention<SetTensorRef>,
    x: Tensor<'g>,
    params: &AttentionParams,
) -> Tensor<'g> {
    let normed = norm(g, x, attn_norm, step.config.rms_epsilon);
    let h = attention(g, step, layer, w, normed, params);
    let (h, residual) = step.prune_last_layer(g, layer, h, x);
    g.add(h, residual)
}

/// Self-attention of one layer with the standard tensors (Q, K and V with optional biases, optional
/// per-head Q/K norms and sinks, the output projection): projections, RoPE, the cache write,
/// attention over the cached positions and the output projection.
pub fn attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &Attention<SetTensorRef>,
    x: Tensor<'g>,
    params: &AttentionParams,
) -> Tensor<'g> {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let (heads, kv_heads) = (step.heads(), step.kv_heads());
    let local = layer - step.layers.start;
    let v = g.reshape_3d(linear(g, &w.v, w.v_bias.as_ref(), x), hd, kv_heads as i64, t);
    let (q, k) = match params.qk_norm {
        QkNorm::PerHead => {
            let mut q = g.reshape_3d(linear(g, &w.q, w.q_bias.as_ref(), x), hd, heads as i64, t);
            let mut k = g.reshape_3d(linear(g, &w.k, w.k_bias.as_ref(), x), hd, kv_heads as i64, t);
            if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
                q = norm(g, q, qn, c.rms_epsilon);
                k = norm(g, k, kn, c.rms_epsilon);
            }
            (q, k)
        }
        QkNorm::AcrossHeads => normed_across_heads(g, step, w, x),
    };
    let rope = rope_params(step, params);
    let q = g.rope(q, step.positions, step.rope_factors, &rope);
    let k = g.rope(k, step.positions, step.rope_factors, &rope);
    let q = match params.q_scale {
        Some(scale) => g.scale(q, scale),
        None => q,
    };
    let (q, k, v) = step.rotated_for_cache(g, q, k, v);

    let width = (kv_heads * c.head_dim) as i64;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    let rows = if params.sliding {
        step.cache_rows_sliding.expect("a stage with sliding layers has their cache rows")
    } else {
        step.cache_rows.expect("a stage with global layers has their cache rows")
    };
    step.cache.store(g, local, k_rows, Some(v_rows), rows);
    let sinks = w.sinks.as_ref().map(|s| g.stored(s));
    let keys = CachedKeys { layer: local, key_head: c.head_dim, value_head: c.head_dim, sliding: params.sliding };
    let attended = step.unrotated_values(g, attend(g, step, q, keys, params.kq_scale, sinks));
    let merged = g.reshape_2d(attended, hd * heads as i64, t);
    // The output projection of a rank's heads is its part of the sum; the bias is added once, to the sum.
    let projected = step.complete(g, g.mul_mat(g.stored(&w.output), merged));
    match &w.output_bias {
        Some(b) => g.add(projected, g.stored(b)),
        None => projected,
    }
}

/// The RoPE of a layer's queries and keys: the model's, in the layer's frequencies.
pub(super) fn rope_params(step: &StepContext<'_, '_>, params: &AttentionParams) -> RopeParams {
    let c = step.config;
    RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: step.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: params.freq_base,
        freq_scale: params.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    }
}

/// Q and K ([head, heads, tokens]) normed across all their heads at once ([`QkNorm::AcrossHeads`]).
/// Unsplit, each is one RMS norm of its whole row, as llama.cpp computes it. On a tensor-parallel rank
/// the query rows are the rank's heads: the norm divides by the root of the group's mean square (the
/// rank's sum of squares completed by the group); the keys are computed for every head, normed whole,
/// and the rank's heads taken.
fn normed_across_heads<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &Attention<SetTensorRef>,
    x: Tensor<'g>,
) -> (Tensor<'g>, Tensor<'g>) {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let q_norm = w.q_norm.as_ref().expect("a layer whose norms span its heads declares them as required");
    let k_norm = w.k_norm.as_ref().expect("a layer whose norms span its heads declares them as required");
    let q = linear(g, &w.q, w.q_bias.as_ref(), x);
    let q = match step.parallel {
        None => norm(g, q, q_norm, c.rms_epsilon),
        Some(_) => {
            let squares = step.complete(g, g.sum_rows(g.sqr(q))); // [1, tokens]
            let width = (c.heads * c.head_dim) as f32;
            let root = g.sqrt(g.scale_bias(squares, 1.0 / width, c.rms_epsilon));
            g.mul(g.div(q, root), g.stored(q_norm))
        }
    };
    let k = norm(g, linear(g, &w.k, None, x), k_norm, c.rms_epsilon); // [hd · all kv heads, tokens]
    let k = match step.parallel {
        None => g.reshape_3d(k, hd, c.kv_heads as i64, t),
        Some(p) => {
            let held = &p.slice.kv_heads;
            let st = k.strides();
            let bytes = 4 * c.head_dim;
            g.view(k, &[hd, held.len() as i64, t], &[bytes, st[1]], held.start * bytes)
        }
    };
    (g.reshape_3d(q, hd, step.heads() as i64, t), k)
}

/// Which cached keys and values a layer's queries attend to.
#[derive(Clone, Copy, Debug)]
pub(in crate::engine) struct CachedKeys {
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
/// attention (see [`super::GraphShape::attention_runs`]). Returns [value_head, heads, tokens].
pub(in crate::engine) fn attend<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    keys: CachedKeys,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
) -> Tensor<'g> {
    attend_masked(g, step, q, keys, kq_scale, sinks, &|_, mask| mask)
}

/// How a layer changes a run's part of the causal mask ([attended, tokens, 1, sequences], F16) before
/// its queries attend through it (sparse attention keeps only the positions its indexer chose).
pub(in crate::engine) type MaskOf<'a, 'g> = &'a dyn Fn(&AttentionRun, Tensor<'g>) -> Tensor<'g>;

/// [`attend`], each run through its part of the mask as `mask_of` changes it.
pub(in crate::engine) fn attend_masked<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    keys: CachedKeys,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
    mask_of: MaskOf<'_, 'g>,
) -> Tensor<'g> {
    let parts: Vec<Tensor<'g>> = step
        .shape
        .located_runs(keys.sliding)
        .iter()
        .map(|run| attend_segments_masked(g, step, q, keys, kq_scale, sinks, run, mask_of))
        .collect();
    concat_rows(g, &parts)
}

/// [`attend`] for one run of the step's segments, located for the layer's kind of mask
/// (`keys.sliding`): the run's rows of `q` over their sequences' cached positions; [value_head, heads,
/// the run's tokens].
pub(in crate::engine) fn attend_segments<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    keys: CachedKeys,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
    run: &AttentionRun,
) -> Tensor<'g> {
    attend_segments_masked(g, step, q, keys, kq_scale, sinks, run, &|_, mask| mask)
}

/// [`attend_segments`] through the run's part of the mask as `mask_of` changes it.
#[allow(clippy::too_many_arguments)]
fn attend_segments_masked<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    q: Tensor<'g>,
    keys: CachedKeys,
    kq_scale: f32,
    sinks: Option<Tensor<'g>>,
    run: &AttentionRun,
    mask_of: MaskOf<'_, 'g>,
) -> Tensor<'g> {
    let mask = if keys.sliding { step.mask_sliding } else { step.mask };
    let mask = mask.expect("the stage's graph has the mask of each of its layers' kinds");
    let [d, heads, ..] = q.shape();
    let q_strides = q.strides();
    let first = step.shape.segments[run.segments.start];
    let (t, n) = (first.tokens, run.segments.len());
    let attended = if keys.sliding { first.attended_sliding } else { first.attended };
    // [d, heads, tokens, sequences]: each sequence's rows follow the one before's.
    let row_bytes = q_strides[2];
    let q = g.view(q, &[d, heads, t as i64, n as i64], &[q_strides[1], row_bytes, t * row_bytes], run.row * row_bytes);
    let mask_bytes = attended * t * 2;
    let mask =
        g.view(mask, &[attended as i64, t as i64, 1, n as i64], &[attended * 2, mask_bytes, mask_bytes], run.mask * 2);
    let mask = mask_of(run, mask);
    let (k, v) = step.cache.view(g, keys.layer, first.seq..first.seq + n, attended, keys.key_head, keys.value_head);
    let out = attend_heads(g, step, q, k, v, Scoring { mask, kq_scale, sinks }); // [d_v, heads, t, n]
    let [d_v, out_heads, ..] = out.shape();
    if n == 1 {
        return out;
    }
    g.reshape_3d(out, d_v, out_heads, (t * n) as i64)
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
pub(in crate::engine) fn concat_rows<'g>(g: &'g GraphBuilder, parts: &[Tensor<'g>]) -> Tensor<'g> {
    match parts {
        [one] => *one,
        _ => {
            let (a, b) = parts.split_at(parts.len() / 2);
            g.concat(concat_rows(g, a), concat_rows(g, b), 2)
        }
    }
}

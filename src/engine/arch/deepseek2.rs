//! DeepSeek V2/V3's layer (`deepseek2`; declared in [`crate::model::arch::Deepseek2`]), as llama.cpp's
//! `src/models/deepseek2.cpp` computes it: multi-head latent attention, in the latent form when the file
//! splits the expansion (`attn_k_b`, `attn_v_b`: queries folded into the latent's space attend over the
//! cached latents) and with full keys and values per head otherwise (`attn_kv_b`); YaRN's magnitude
//! correction in the logits' scale; then a dense feed-forward or routed and shared experts.

use super::{Bound, Graph};
use crate::engine::blocks::{self, AttentionRun, CachedKeys, MaskOf, StepContext};
use crate::ggml::{DType, GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::arch::groups::SparseOrDense;
use crate::model::arch::{Deepseek2, LatentLayer, LatentQuery, LatentValues, LightningIndexer, SplitExpansion};
use crate::model::{LatentAttention, ModelConfig};

impl Graph for Deepseek2 {
    fn attends_fresh_segments_apart(&self, config: &ModelConfig) -> bool {
        config.latent_attention.is_some_and(|mla| mla.absorbed)
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let norms = [&w.attn_norm, &w.ffn_norm];
        latent_layer(g, step, layer, norms, &w.attention, Sparsity::Dense, &w.feed_forward, x)
    }
}

/// Which positions a layer's latent attention reads.
#[derive(Clone, Copy)]
pub(super) enum Sparsity<'w> {
    /// Every earlier position (DeepSeek V3, Kimi K3).
    Dense,
    /// Those its lightning indexer chooses (DeepSeek V3.2; GLM-5's layers with an indexer).
    Indexed(&'w LightningIndexer<SetTensorRef>),
    /// Those the last layer before it with an indexer chose (GLM-5.2's other layers).
    Reused,
}

/// A DeepSeek layer over `x`: `x + attention(norm(x))` (latent attention, as `sparsity` says),
/// then the dense or mixture-of-experts feed-forward behind its norm and residual; `norms` are the
/// attention's and the feed-forward's.
#[allow(clippy::too_many_arguments)]
pub(super) fn latent_layer<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    norms: [&SetTensorRef; 2],
    attention_weights: &LatentLayer<SetTensorRef>,
    sparsity: Sparsity<'_>,
    feed_forward: &SparseOrDense<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let moe = c.moe.as_ref().expect("a DeepSeek model reads its expert parameters when it opens");
    let normed = blocks::norm(g, x, norms[0], c.rms_epsilon);
    let h = attention(g, step, layer, attention_weights, sparsity, normed);
    let (h, residual) = step.prune_last_layer(g, layer, h, x);
    let ffn_in = g.add(h, residual);
    let h = blocks::norm(g, ffn_in, norms[1], c.rms_epsilon);
    g.add(blocks::sparse_or_dense_feed_forward(g, step, feed_forward, moe, h), ffn_in)
}

/// The attention logits' scale: YaRN's magnitude correction (squared, as it applies to both Q and K)
/// over √(query width), computed as llama.cpp does, in f32.
fn kq_scale(config: &ModelConfig, mla: &LatentAttention) -> f32 {
    let stretch = (1.0f32 / config.rope.freq_scale).ln();
    let attn_factor_org = config.rope.attn_factor * (1.0 + 0.1 * stretch);
    let mscale = attn_factor_org * (1.0 + 0.1 * mla.yarn_log_multiplier * stretch);
    mscale * mscale / (mla.key_head as f32).sqrt()
}

/// Multi-head latent attention of one layer over `x` (normed), over the positions `sparsity` says: the
/// result is the output projection's.
fn attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LatentLayer<SetTensorRef>,
    sparsity: Sparsity<'_>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let merged = latent_heads(g, step, layer, w, sparsity, x, true);
    // A rank's heads give its part of the output projection; the group sums the parts.
    step.complete(g, g.mul_mat(g.stored(&w.output), merged))
}

/// Multi-head latent attention of one layer over `x` (normed), before the output projection: each
/// head's values side by side, [value · heads, tokens]. The rotary part of queries and keys is turned
/// by RoPE when `rotate` (DeepSeek), and left as it is otherwise (Kimi K3, which has no positions).
/// Sparse (DeepSeek V3.2, GLM-5: the split form, a query bottleneck), each query attends only to the
/// positions chosen for it, by the layer's lightning indexer, whose key is cached beside the latent,
/// or by an earlier layer's.
pub(super) fn latent_heads<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LatentLayer<SetTensorRef>,
    sparsity: Sparsity<'_>,
    x: Tensor<'g>,
    rotate: bool,
) -> Tensor<'g> {
    let c = step.config;
    let mla = c.latent_attention.expect("deepseek2 reads its attention parameters when the model opens");
    let (t, heads, rope_dims) = (step.tokens(), step.heads() as i64, c.rope.dimensions as i64);
    let (rank, key_head) = (mla.kv_lora_rank as i64, mla.key_head as i64);
    let nope = key_head - rope_dims;
    let f32_bytes = 4usize;

    let (bottleneck, q) = match &w.query {
        LatentQuery::LowRank(low_rank) => {
            let q = g.mul_mat(g.stored(&low_rank.a), x);
            let q = blocks::norm(g, q, &low_rank.a_norm, c.rms_epsilon);
            (Some(q), g.mul_mat(g.stored(&low_rank.b), q))
        }
        LatentQuery::Direct(direct) => (None, g.mul_mat(g.stored(&direct.q), x)),
    };
    let q = g.reshape_3d(q, key_head, heads, t);

    // The compressed latent and the shared rotary part, side by side in each row.
    let kv_cmpr_pe = g.mul_mat(g.stored(&w.kv_a), x);
    let row = (rank + rope_dims) as usize * f32_bytes;
    let kv_cmpr = g.view(kv_cmpr_pe, &[rank, t], &[row], 0);
    let k_pe = g.view(kv_cmpr_pe, &[rope_dims, 1, t], &[row, row], rank as usize * f32_bytes);
    let rope = RopeParams {
        n_dims: rope_dims as i32,
        mode: 0,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    };
    let turn = |x: Tensor<'g>| if rotate { g.rope(x, step.positions, None, &rope) } else { x };
    let k_pe = turn(k_pe);
    let kv_cmpr = blocks::norm(g, kv_cmpr, &w.kv_a_norm, c.rms_epsilon);
    let local = layer - step.layers.start;
    let [_, q_stride1, q_stride2, _] = q.strides();
    let scale = kq_scale(c, &mla);

    let rows = step.cache_rows.expect("a deepseek2 stage's graph has its cache rows");
    let out = match &w.values {
        LatentValues::Split(expansion) => {
            let q_nope = g.view(q, &[nope, heads, t], &[q_stride1, q_stride2], 0);
            let q_pe = g.view(q, &[rope_dims, heads, t], &[q_stride1, q_stride2], nope as usize * f32_bytes);
            let q_pe = turn(q_pe);
            let k = g.concat(g.reshape_3d(kv_cmpr, rank, 1, t), k_pe, 0); // [rank + rope, 1, tokens]
            let k_rows = g.view(k, &[rank + rope_dims, t], &[k.strides()[2]], 0);
            let sparse = match sparsity {
                Sparsity::Indexed(w) => {
                    let bottleneck = bottleneck.expect("a model with a lightning indexer has a query bottleneck");
                    Some(blocks::indexer(g, step, w, x, bottleneck, local))
                }
                Sparsity::Dense | Sparsity::Reused => None,
            };
            let k_rows = match &sparse {
                Some(sparse) => g.concat(k_rows, sparse.keys, 0),
                None => k_rows,
            };
            step.cache.store(g, local, k_rows, None, rows);
            let dims = LatentDims { rank, nope, rope: rope_dims, value: mla.value_head as i64, heads, scale };
            let latent = Latent { q_nope, q_pe, kv_cmpr, k_pe, dims };
            match (&sparse, sparsity) {
                (Some(indexer), _) => {
                    let chosen = |run: &AttentionRun, mask| indexer.narrowed(g, step, run, mask);
                    sparse_latents(g, step, expansion, &latent, local, &chosen)
                }
                (None, Sparsity::Reused) => {
                    let reused = |run: &AttentionRun, mask| blocks::reused_choice(g, step, run, mask);
                    sparse_latents(g, step, expansion, &latent, local, &reused)
                }
                (None, _) => attend_latents(g, step, expansion, &latent, local),
            }
        }
        LatentValues::Joined(expansion) => {
            let kv = g.mul_mat(g.stored(&expansion.kv_b), kv_cmpr);
            let value_head = mla.value_head as i64;
            let kv_row = (nope + value_head) as usize * f32_bytes;
            let k_nope = g.view(kv, &[nope, heads, t], &[kv_row, kv_row * heads as usize], 0);
            let v = g.view(kv, &[value_head, heads, t], &[kv_row, kv_row * heads as usize], nope as usize * f32_bytes);
            let v = g.cont(v);
            let q = if rotate { g.rope_at_offset(g.rope(q, step.positions, None, &rope), nope as i32) } else { q };
            let k = g.concat(k_nope, g.repeat(k_pe, [rope_dims, heads, t, 1]), 0); // [key_head, heads, tokens]
            let k_rows = g.view(k, &[key_head * heads, t], &[k.strides()[2]], 0);
            let v_rows = g.view(v, &[value_head * heads, t], &[v.strides()[2]], 0);
            step.cache.store(g, local, k_rows, Some(v_rows), rows);
            let keys =
                CachedKeys { layer: local, key_head: key_head as usize, value_head: mla.value_head, sliding: false };
            blocks::attend(g, step, q, keys, scale, None)
        }
    };
    let [a, b, ..] = out.shape();
    g.reshape_2d(out, a * b, t)
}

/// The widths of one layer's latent attention, and its logits' scale.
#[derive(Clone, Copy)]
struct LatentDims {
    rank: i64,
    /// Per head: the query/key part without RoPE, the rotary part and the value width.
    nope: i64,
    rope: i64,
    value: i64,
    heads: i64,
    scale: f32,
}

/// One layer's step in the latent form: queries split into their parts without and with RoPE (roped),
/// the normalised latent and the roped shared key part of every row.
struct Latent<'g> {
    q_nope: Tensor<'g>,  // [nope, heads, tokens]
    q_pe: Tensor<'g>,    // [rope, heads, tokens]
    kv_cmpr: Tensor<'g>, // [rank, tokens]
    k_pe: Tensor<'g>,    // [rope, 1, tokens]
    dims: LatentDims,
}

/// Attention of a split-form layer (`attn_k_b`/`attn_v_b`), its rows already cached; [value, heads,
/// tokens]. Each run of segments attends as llama.cpp computes it, queries folded into the latent's
/// space over the cached latents, then expanded into values, except a segment that begins its sequence
/// and is long enough to gain ([`expands`]): its queries attend over its own keys and values, expanded
/// per head from its latents, as DeepSeek's own prefill does. The two are the same product summed in
/// another order (the expanded keys are 1/3 as wide per head as a latent row for DeepSeek V3), so a
/// long prompt's attention costs about a third; the result agrees to rounding, and depends only on the
/// segment, not on what else the step holds.
fn attend_latents<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &SplitExpansion<SetTensorRef>,
    latent: &Latent<'g>,
    layer: usize,
) -> Tensor<'g> {
    let (shape, d) = (&step.shape, latent.dims);
    let runs = shape.located_runs(false);
    let expanded = |run: &AttentionRun| {
        let s = shape.segments[run.segments.start];
        run.segments.len() == 1 && s.fresh && expands(s.tokens, &d)
    };
    let keys = CachedKeys { layer, key_head: (d.rank + d.rope) as usize, value_head: d.rank as usize, sliding: false };
    if !runs.iter().any(expanded) {
        let q = absorbed_queries(g, w, latent);
        return values_of_latents(g, w, blocks::attend(g, step, q, keys, d.scale, None));
    }
    // Folded queries, for the runs that attend over the cache (built only when there are any).
    let absorbed = runs.iter().any(|r| !expanded(r)).then(|| absorbed_queries(g, w, latent));
    let parts: Vec<Tensor<'g>> = runs
        .iter()
        .map(|run| match absorbed {
            Some(q) if !expanded(run) => {
                values_of_latents(g, w, blocks::attend_segments(g, step, q, keys, d.scale, None, run))
            }
            _ => expanded_attention(g, step, w, latent, run),
        })
        .collect();
    blocks::concat_rows(g, &parts)
}

/// Whether a segment of `tokens` positions that begins its sequence attends faster expanded: its
/// causal pairs each save `2·rank − nope − value` products per head, against expanding the key
/// weights once (a transposed, for a quantized file dequantized, copy: about `2·rank·nope` per head).
/// For DeepSeek V3 from 18 tokens on; never for a decode row.
fn expands(tokens: usize, d: &LatentDims) -> bool {
    let saved_per_pair = (2 * d.rank - d.nope - d.value).max(0) as usize;
    tokens * (tokens + 1) / 2 * saved_per_pair > 2 * (d.rank * d.nope) as usize
}

/// Attention of a sparse split-form layer (DeepSeek V3.2, GLM-5), its rows already cached: every run in
/// the latent form, as llama.cpp computes it, each query through the causal mask as `chosen` narrows it
/// to the positions chosen for it; [value, heads, tokens].
fn sparse_latents<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &SplitExpansion<SetTensorRef>,
    latent: &Latent<'g>,
    layer: usize,
    chosen: MaskOf<'_, 'g>,
) -> Tensor<'g> {
    let d = latent.dims;
    let keys = CachedKeys { layer, key_head: (d.rank + d.rope) as usize, value_head: d.rank as usize, sliding: false };
    let q = absorbed_queries(g, w, latent);
    values_of_latents(g, w, blocks::attend_masked(g, step, q, keys, d.scale, None, chosen))
}

/// Queries folded into the latent's space (each head's part without RoPE through `attn_k_b`) beside
/// their rotary part: [rank + rope, heads, tokens].
fn absorbed_queries<'g>(g: &'g GraphBuilder, w: &SplitExpansion<SetTensorRef>, latent: &Latent<'g>) -> Tensor<'g> {
    let q_nope = g.permute(latent.q_nope, [0, 2, 1, 3]);
    let absorbed = g.permute(g.mul_mat(g.stored(&w.k_b), q_nope), [0, 2, 1, 3]);
    g.concat(absorbed, latent.q_pe, 0)
}

/// Each head's attended latent ([rank, heads, rows]) expanded into its values: [value, heads, rows].
fn values_of_latents<'g>(g: &'g GraphBuilder, w: &SplitExpansion<SetTensorRef>, attended: Tensor<'g>) -> Tensor<'g> {
    let per_head = g.permute(attended, [0, 2, 1, 3]);
    let values = g.mul_mat(g.stored(&w.v_b), per_head);
    g.cont(g.permute(values, [0, 2, 1, 3]))
}

/// A segment that begins its sequence, attending over its own positions with keys and values expanded
/// per head from its latents (`attn_k_b` transposed, `attn_v_b`), through its part of the causal mask:
/// [value, heads, tokens].
fn expanded_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &SplitExpansion<SetTensorRef>,
    latent: &Latent<'g>,
    run: &AttentionRun,
) -> Tensor<'g> {
    let segment = step.shape.segments[run.segments.start];
    let (d, t) = (latent.dims, segment.tokens as i64);
    let rows_of = |x: Tensor<'g>| {
        let ([a, b, ..], st) = (x.shape(), x.strides());
        g.view(x, &[a, b, t], &[st[1], st[2]], run.row * st[2])
    };
    let q = g.concat(rows_of(latent.q_nope), rows_of(latent.q_pe), 0); // [nope + rope, heads, t]
    let latent_row = latent.kv_cmpr.strides()[1];
    let latents = g.view(latent.kv_cmpr, &[d.rank, t], &[latent_row], run.row * latent_row);
    // attn_k_b is [nope, rank, heads]: transposed per head, its rows expand a latent into keys.
    let k_b = g.stored(&w.k_b);
    let k_b = if matches!(k_b.dtype(), DType::F32 | DType::F16) { k_b } else { g.cast(k_b, DType::F32) };
    let k_expand = g.reshape_2d(g.cont(g.permute(k_b, [1, 0, 2, 3])), d.rank, d.nope * d.heads);
    let k_nope = g.reshape_3d(g.mul_mat(k_expand, latents), d.nope, d.heads, t);
    let v_expand = g.reshape_2d(g.stored(&w.v_b), d.rank, d.value * d.heads);
    let v = g.reshape_3d(g.mul_mat(v_expand, latents), d.value, d.heads, t);
    let k = g.concat(k_nope, g.repeat(rows_of(latent.k_pe), [d.rope, d.heads, t, 1]), 0);
    // As the cache would hold them, and as flash attention takes them.
    let (k, v) = (g.cast(k, DType::F16), g.cast(v, DType::F16));
    let mask = step.mask.expect("a deepseek2 stage's graph has its mask");
    let mask = g.cont(g.view(mask, &[t, t], &[segment.attended * 2], run.mask * 2));
    let perm = |x: Tensor<'g>| g.permute(x, [0, 2, 1, 3]);
    let out = g.flash_attention(perm(q), perm(k), perm(v), mask, d.scale); // [value, heads, t, 1]
    g.reshape_3d(out, d.value, d.heads, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(rank: i64, nope: i64, value: i64) -> LatentDims {
        LatentDims { rank, nope, rope: 64, value, heads: 128, scale: 1.0 }
    }

    #[test]
    fn a_prompt_expands_once_its_causal_pairs_outweigh_expanding_the_key_weights() {
        // DeepSeek V3 / Kimi K2: a latent of 512, 128 per head without RoPE, values of 128.
        let v3 = dims(512, 128, 128);
        assert!(!expands(1, &v3), "a decode row attends in the latent form");
        assert!(!expands(17, &v3));
        assert!(expands(18, &v3));
        // The random test model (tests/common/random_model.rs): from 8 tokens.
        let random = dims(32, 16, 16);
        assert!(!expands(7, &random));
        assert!(expands(8, &random));
        // Keys and values as wide as the latent gain nothing.
        assert!(!expands(4096, &dims(64, 64, 64)));
    }
}

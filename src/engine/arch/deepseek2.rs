//! DeepSeek V2 and V3, Kimi K2 and the other `deepseek2` files, as llama.cpp's `src/models/deepseek2.cpp`
//! computes them. Attention is multi-head latent attention (MLA): queries pass an optional low-rank
//! bottleneck (`attn_q_a` → `attn_q_a_norm` → `attn_q_b`), keys and values are compressed into one
//! latent per position (`attn_kv_a_mqa` → `attn_kv_a_norm`) plus a rotary part shared by all heads.
//! Files with `attention.key_length_mla` split the expansion into `attn_k_b` and `attn_v_b`: queries are
//! folded into the latent's space, so attention runs over the cached latent itself and the cache holds
//! only `kv_lora_rank` + rotary values per position. Older files carry one `attn_kv_b` that expands full
//! keys and values per head, which the cache then holds. YaRN scales the context, and its magnitude
//! correction scales attention too. The feed-forward is dense in the first `leading_dense_block_count`
//! layers and elsewhere routed experts (softmax for V2, sigmoid with a selection bias and groups for V3)
//! plus shared experts. Next-token-prediction layers are skipped.

use super::ArchSpec;
use crate::engine::blocks::{self, AttentionRun, CachedKeys, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{DType, GraphBuilder, RopeParams, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor, Part};
use crate::model::{CacheRow, ExpertActivation, Gating, LatentAttention, ModelConfig, ModelError, MoeParams};

pub struct Deepseek2;

pub static DEEPSEEK2: Deepseek2 = Deepseek2;

/// llama.cpp's "lite" files (DeepSeek-V2-Lite and kin) have no query bottleneck whatever they say.
fn is_lite(layers: usize, vocabulary: usize) -> bool {
    layers == 27 || layers == 26 || (layers == 48 && vocabulary == 128_256)
}

fn latent_attention(keys: &Keys<'_>, config: &ModelConfig) -> Result<LatentAttention, ModelError> {
    let q_lora_rank = if is_lite(config.layers, config.vocabulary) {
        0
    } else {
        keys.arch_optional_size("attention.q_lora_rank")?
            .ok_or_else(|| keys.arch_invalid("attention.q_lora_rank", "is missing"))?
    };
    let kv_lora_rank = keys.arch_count("attention.kv_lora_rank")?;
    let rope = config.rope.dimensions as usize;
    let split = (
        keys.arch_optional_count("attention.key_length_mla")?,
        keys.arch_optional_count("attention.value_length_mla")?,
    );
    let (key_head, value_head, absorbed) = match split {
        (Some(k), Some(v)) => {
            // The cache's one "head": the latent and the rotary part, of which values are the latent.
            if config.head_dim != kv_lora_rank + rope || config.value_dim != kv_lora_rank || config.kv_heads != 1 {
                return Err(keys.arch_invalid(
                    "attention.key_length",
                    &format!(
                        "is {} with value length {} and {} KV heads; latent attention needs kv_lora_rank + rotary \
                         dimensions ({}), kv_lora_rank ({kv_lora_rank}) and 1",
                        config.head_dim,
                        config.value_dim,
                        config.kv_heads,
                        kv_lora_rank + rope
                    ),
                ));
            }
            (k, v, true)
        }
        (None, None) => {
            if config.kv_heads != config.heads {
                return Err(keys.arch_invalid("attention.head_count_kv", "differs from the head count"));
            }
            (config.head_dim, config.value_dim, false)
        }
        _ => {
            return Err(keys.arch_invalid(
                "attention.key_length_mla",
                "and attention.value_length_mla must both be present or both absent",
            ))
        }
    };
    if key_head <= rope {
        return Err(keys.arch_invalid(
            "rope.dimension_count",
            &format!("is {rope}, which leaves no part without RoPE in heads of {key_head}"),
        ));
    }
    // The file stores 0.1 × mscale_all_dim; llama.cpp divides it back out.
    let yarn_log_multiplier = keys.arch_optional_float("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) as f32 / 0.1;
    Ok(LatentAttention { q_lora_rank, kv_lora_rank, key_head, value_head, absorbed, yarn_log_multiplier })
}

fn experts(keys: &Keys<'_>, config: &ModelConfig) -> Result<MoeParams, ModelError> {
    let (experts, experts_used) = super::expert_counts(keys)?;
    let gating = match keys.arch_optional_size("expert_gating_func")? {
        Some(1) => Gating::Softmax,
        Some(2) => Gating::Sigmoid,
        // Older V2 files say nothing: softmax, except GLM-4.7-Flash, which llama.cpp recognises by shape.
        None | Some(0) if matches!(config.layers, 47 | 48) && config.vocabulary == 154_880 => Gating::Sigmoid,
        None | Some(0) => Gating::Softmax,
        Some(other) => {
            return Err(keys.arch_invalid("expert_gating_func", &format!("is {other}, a gating shoal does not run")))
        }
    };
    Ok(MoeParams {
        experts,
        experts_used,
        expert_feed_forward: keys.arch_count("expert_feed_forward_length")?,
        gating,
        activation: ExpertActivation::Silu,
        normalize: keys.arch_optional_bool("expert_weights_norm")?.unwrap_or(false),
        scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
        shared_experts: keys.arch_count("expert_shared_count")?,
        leading_dense_layers: keys.arch_optional_count("leading_dense_block_count")?.unwrap_or(0).min(config.layers),
        groups: super::expert_groups(keys, experts)?,
    })
}

impl ArchSpec for Deepseek2 {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        if keys.arch_optional_float("attention.temperature_scale")?.is_some_and(|s| s != 0.0) {
            return Err(keys.arch_invalid(
                "attention.temperature_scale",
                "asks for attention temperature tuning (Mistral Large 3), which shoal does not run",
            ));
        }
        let mla = latent_attention(keys, config)?;
        if config.rope.ext_factor != 0.0 {
            // DeepSeek's YaRN: both magnitude scales are mscale_all_dim when it is not 1.
            let all_dims = mla.yarn_log_multiplier;
            let mscale = if all_dims != 0.0 && all_dims != 1.0 { all_dims } else { 1.0 };
            let file_factor = keys.arch_optional_float("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32;
            config.rope.attn_factor = config.rope.yarn_attn_factor(mscale, all_dims, file_factor);
        }
        config.moe = Some(experts(keys, config)?);
        config.latent_attention = Some(mla);
        Ok(())
    }

    fn values_may_differ(&self) -> bool {
        true
    }

    fn attends_fresh_segments_apart(&self, config: &ModelConfig) -> bool {
        config.latent_attention.is_some_and(|mla| mla.absorbed)
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        0
    }

    fn cache_row(&self, config: &ModelConfig, _layer: usize) -> CacheRow {
        match config.latent_attention {
            Some(mla) if mla.absorbed => CacheRow {
                key_width: mla.kv_lora_rank + config.rope.dimensions as usize,
                value_width: mla.kv_lora_rank,
                values_in_keys: true,
                window: None,
            },
            _ => config.standard_cache_row(),
        }
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let mla = config.latent_attention.expect("deepseek2 reads its attention parameters when the model opens");
        let moe = config.moe.as_ref().expect("deepseek2 reads its expert parameters when the model opens");
        let (e, heads, rope) = (config.embedding, config.heads, config.rope.dimensions as usize);
        let (rank, nope) = (mla.kv_lora_rank, mla.key_head - rope);
        let t = |part: &str, shape: &[usize], required: bool| ExpectedTensor::layer(layer, part, shape, required);
        // A tensor-parallel rank holds whole heads: their rows of the query projection and of the
        // per-head expansions, the matching inputs of the output projection. Every rank computes the
        // shared latent (and the query bottleneck) whole, so the latent cache is held by every rank:
        // it is one "head" that every query head reads.
        let mut list = vec![t("attn_norm.weight", &[e], true)];
        if mla.q_lora_rank > 0 {
            list.push(t("attn_q_a.weight", &[e, mla.q_lora_rank], true));
            list.push(t("attn_q_a_norm.weight", &[mla.q_lora_rank], true));
            list.push(t("attn_q_b.weight", &[mla.q_lora_rank, heads * mla.key_head], true).split(1, Part::QueryHeads));
        } else {
            list.push(t("attn_q.weight", &[e, heads * mla.key_head], true).split(1, Part::QueryHeads));
        }
        list.push(t("attn_kv_a_mqa.weight", &[e, rank + rope], true));
        list.push(t("attn_kv_a_norm.weight", &[rank], true));
        if mla.absorbed {
            list.push(t("attn_k_b.weight", &[nope, rank, heads], true).split(2, Part::QueryHeads));
            list.push(t("attn_v_b.weight", &[rank, mla.value_head, heads], true).split(2, Part::QueryHeads));
        } else {
            // Keys and values per head, cached per head: a rank caches its own heads'.
            let kv_b = t("attn_kv_b.weight", &[rank, heads * (nope + mla.value_head)], true);
            list.push(kv_b.split(1, Part::KvHeads));
        }
        list.push(t("attn_output.weight", &[heads * mla.value_head, e], true).split(0, Part::QueryHeads));
        list.push(t("ffn_norm.weight", &[e], true));
        if moe.is_sparse(layer) {
            list.extend(layout::expert_tensors(config, layer, moe));
            list.push(t("exp_probs_b.bias", &[moe.experts], false));
            let width = moe.expert_feed_forward * moe.shared_experts;
            list.extend(layout::feed_forward_tensors(config, layer, "_shexp", width));
        } else {
            list.extend(layout::feed_forward_tensors(config, layer, "", config.feed_forward));
        }
        list
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("deepseek2 reads its expert parameters when the model opens");
        let normed = blocks::norm(g, x, w.req("attn_norm.weight"), c.rms_epsilon);
        let h = attention(g, step, layer, w, normed);
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = blocks::norm(g, ffn_in, w.req("ffn_norm.weight"), c.rms_epsilon);
        g.add(blocks::sparse_or_dense_feed_forward(g, step, w, moe, layer, h), ffn_in)
    }
}

/// The attention logits' scale: YaRN's magnitude correction (squared, as it applies to both Q and K)
/// over √(query width), computed as llama.cpp does, in f32.
fn kq_scale(config: &ModelConfig, mla: &LatentAttention) -> f32 {
    let stretch = (1.0f32 / config.rope.freq_scale).ln();
    let attn_factor_org = config.rope.attn_factor * (1.0 + 0.1 * stretch);
    let mscale = attn_factor_org * (1.0 + 0.1 * mla.yarn_log_multiplier * stretch);
    mscale * mscale / (mla.key_head as f32).sqrt()
}

/// Multi-head latent attention of one layer over `x` (normed): the result is the output projection's.
fn attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let mla = c.latent_attention.expect("deepseek2 reads its attention parameters when the model opens");
    let (t, heads, rope_dims) = (step.tokens(), step.heads() as i64, c.rope.dimensions as i64);
    let (rank, key_head) = (mla.kv_lora_rank as i64, mla.key_head as i64);
    let nope = key_head - rope_dims;
    let f32_bytes = 4usize;

    let q = if mla.q_lora_rank > 0 {
        let q = g.mul_mat(g.stored(w.req("attn_q_a.weight")), x);
        let q = blocks::norm(g, q, w.req("attn_q_a_norm.weight"), c.rms_epsilon);
        g.mul_mat(g.stored(w.req("attn_q_b.weight")), q)
    } else {
        g.mul_mat(g.stored(w.req("attn_q.weight")), x)
    };
    let q = g.reshape_3d(q, key_head, heads, t);

    // The compressed latent and the shared rotary part, side by side in each row.
    let kv_cmpr_pe = g.mul_mat(g.stored(w.req("attn_kv_a_mqa.weight")), x);
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
    let k_pe = g.rope(k_pe, step.positions, None, &rope);
    let kv_cmpr = blocks::norm(g, kv_cmpr, w.req("attn_kv_a_norm.weight"), c.rms_epsilon);
    let local = layer - step.layers.start;
    let [_, q_stride1, q_stride2, _] = q.strides();
    let scale = kq_scale(c, &mla);

    let rows = step.cache_rows.expect("a deepseek2 stage's graph has its cache rows");
    let out = if mla.absorbed {
        let q_nope = g.view(q, &[nope, heads, t], &[q_stride1, q_stride2], 0);
        let q_pe = g.view(q, &[rope_dims, heads, t], &[q_stride1, q_stride2], nope as usize * f32_bytes);
        let q_pe = g.rope(q_pe, step.positions, None, &rope);
        let k = g.concat(g.reshape_3d(kv_cmpr, rank, 1, t), k_pe, 0); // [rank + rope, 1, tokens]
        let k_rows = g.view(k, &[rank + rope_dims, t], &[k.strides()[2]], 0);
        step.cache.store(g, local, k_rows, None, rows);
        let dims = LatentDims { rank, nope, rope: rope_dims, value: mla.value_head as i64, heads, scale };
        attend_latents(g, step, w, &Latent { q_nope, q_pe, kv_cmpr, k_pe, dims }, local)
    } else {
        let kv = g.mul_mat(g.stored(w.req("attn_kv_b.weight")), kv_cmpr);
        let value_head = mla.value_head as i64;
        let kv_row = (nope + value_head) as usize * f32_bytes;
        let k_nope = g.view(kv, &[nope, heads, t], &[kv_row, kv_row * heads as usize], 0);
        let v = g.view(kv, &[value_head, heads, t], &[kv_row, kv_row * heads as usize], nope as usize * f32_bytes);
        let v = g.cont(v);
        let q = g.rope_at_offset(g.rope(q, step.positions, None, &rope), nope as i32);
        let k = g.concat(k_nope, g.repeat(k_pe, [rope_dims, heads, t, 1]), 0); // [key_head, heads, tokens]
        let k_rows = g.view(k, &[key_head * heads, t], &[k.strides()[2]], 0);
        let v_rows = g.view(v, &[value_head * heads, t], &[v.strides()[2]], 0);
        step.cache.store(g, local, k_rows, Some(v_rows), rows);
        let keys = CachedKeys { layer: local, key_head: key_head as usize, value_head: mla.value_head, sliding: false };
        blocks::attend(g, step, q, keys, scale, None)
    };
    let [a, b, ..] = out.shape();
    let merged = g.reshape_2d(out, a * b, t);
    // A rank's heads give its part of the output projection; the group sums the parts.
    step.complete(g, g.mul_mat(g.stored(w.req("attn_output.weight")), merged))
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
    w: &LayerWeights,
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

/// Queries folded into the latent's space (each head's part without RoPE through `attn_k_b`) beside
/// their rotary part: [rank + rope, heads, tokens].
fn absorbed_queries<'g>(g: &'g GraphBuilder, w: &LayerWeights, latent: &Latent<'g>) -> Tensor<'g> {
    let q_nope = g.permute(latent.q_nope, [0, 2, 1, 3]);
    let absorbed = g.permute(g.mul_mat(g.stored(w.req("attn_k_b.weight")), q_nope), [0, 2, 1, 3]);
    g.concat(absorbed, latent.q_pe, 0)
}

/// Each head's attended latent ([rank, heads, rows]) expanded into its values: [value, heads, rows].
fn values_of_latents<'g>(g: &'g GraphBuilder, w: &LayerWeights, attended: Tensor<'g>) -> Tensor<'g> {
    let per_head = g.permute(attended, [0, 2, 1, 3]);
    let values = g.mul_mat(g.stored(w.req("attn_v_b.weight")), per_head);
    g.cont(g.permute(values, [0, 2, 1, 3]))
}

/// A segment that begins its sequence, attending over its own positions with keys and values expanded
/// per head from its latents (`attn_k_b` transposed, `attn_v_b`), through its part of the causal mask:
/// [value, heads, tokens].
fn expanded_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LayerWeights,
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
    let k_b = g.stored(w.req("attn_k_b.weight"));
    let k_b = if matches!(k_b.dtype(), DType::F32 | DType::F16) { k_b } else { g.cast(k_b, DType::F32) };
    let k_expand = g.reshape_2d(g.cont(g.permute(k_b, [1, 0, 2, 3])), d.rank, d.nope * d.heads);
    let k_nope = g.reshape_3d(g.mul_mat(k_expand, latents), d.nope, d.heads, t);
    let v_expand = g.reshape_2d(g.stored(w.req("attn_v_b.weight")), d.rank, d.value * d.heads);
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

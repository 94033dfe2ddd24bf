//! Qwen3.5 / 3.6 (`qwen35` dense, `qwen35moe` mixture-of-experts), as llama.cpp's
//! `src/models/qwen35.cpp` and `qwen35moe.cpp` compute them: layers of linear attention with a
//! recurrent state (the gated delta-net, [`blocks::gated_delta_net`]) and, every
//! `full_attention_interval`-th layer, gated full attention — Q projected together with an output gate,
//! per-head Q/K norms, interleaved M-RoPE on part of each head. Every layer has an RMS norm before its
//! attention and one before its feed-forward (`post_attention_norm`). The MoE layers route each token
//! to softmax-chosen experts and add a shared expert scaled by a sigmoid gate of its own. The files'
//! next-token-prediction layers are skipped (not mapped, not counted).

use super::ArchSpec;
use crate::engine::blocks::{self, attend, linear, norm, CachedKeys, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, RopeParams, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{ExpertActivation, Gating, LinearAttention, ModelConfig, ModelError, MoeParams};

pub struct Qwen35 {
    experts: bool,
}

pub static QWEN35: Qwen35 = Qwen35 { experts: false };
pub static QWEN35MOE: Qwen35 = Qwen35 { experts: true };

/// ggml's interleaved multi-section RoPE (`GGML_ROPE_TYPE_IMROPE`).
const ROPE_INTERLEAVED_SECTIONS: i32 = 40;

impl ArchSpec for Qwen35 {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        config.linear_attention = Some(LinearAttention::read(keys, config.layers)?);
        let sections = keys
            .arch_integers("rope.dimension_sections")
            .filter(|s| !s.is_empty() && s.len() <= 4 && s.iter().all(|&n| n <= 1 << 16))
            .ok_or_else(|| {
                keys.arch_invalid("rope.dimension_sections", "is missing or is not a list of up to four counts")
            })?;
        let mut four = [0i32; 4];
        sections.iter().zip(&mut four).for_each(|(&n, slot)| *slot = n as i32);
        config.rope_sections = Some(four);
        if self.experts {
            let (experts, experts_used) = super::expert_counts(keys)?;
            let expert_feed_forward = keys.arch_count("expert_feed_forward_length")?;
            config.moe = Some(MoeParams {
                experts,
                experts_used,
                expert_feed_forward,
                gating: Gating::Softmax,
                activation: ExpertActivation::Silu,
                normalize: true,
                scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
                shared_experts: 0,
                leading_dense_layers: 0,
                groups: None,
            });
            // The shared expert's width, when the file gives one (else the dense width, as llama.cpp).
            match keys.arch_optional_count("expert_shared_feed_forward_length")? {
                Some(width) => config.feed_forward = width,
                None if config.feed_forward == 0 => {
                    return Err(keys.arch_invalid(
                        "expert_shared_feed_forward_length",
                        "is missing, and so is feed_forward_length: the shared expert's width is unknown",
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        ROPE_INTERLEAVED_SECTIONS
    }

    fn splits_across_ranks(&self) -> Result<(), String> {
        Err("Qwen3.5's linear-attention layers are not divided among tensor-parallel ranks yet; \
             use --parallel pipeline"
            .into())
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let e = config.embedding;
        let t = |name: &str, shape: &[usize]| ExpectedTensor::layer(layer, name, shape, true);
        let mut list = vec![t("attn_norm.weight", &[e]), t("post_attention_norm.weight", &[e])];
        match config.linear_attention.as_ref().filter(|l| l.is_linear(layer)) {
            Some(l) => {
                let (channels, heads) = (l.conv_channels(), l.value_heads);
                list.extend([
                    t("attn_qkv.weight", &[e, channels]),
                    t("attn_gate.weight", &[e, l.inner]),
                    t("ssm_conv1d.weight", &[l.conv_kernel, channels]),
                    t("ssm_dt.bias", &[heads]),
                    t("ssm_a", &[heads]),
                    t("ssm_beta.weight", &[e, heads]),
                    t("ssm_alpha.weight", &[e, heads]),
                    t("ssm_norm.weight", &[l.head_width]),
                    t("ssm_out.weight", &[l.inner, e]),
                ]);
            }
            None => {
                let (hd, q) = (config.head_dim, config.heads * config.head_dim);
                let kv = config.kv_heads * hd;
                list.extend([
                    // Each head's queries and then its output gate.
                    t("attn_q.weight", &[e, 2 * q]),
                    t("attn_k.weight", &[e, kv]),
                    t("attn_v.weight", &[e, kv]),
                    t("attn_output.weight", &[q, e]),
                    t("attn_q_norm.weight", &[hd]),
                    t("attn_k_norm.weight", &[hd]),
                ]);
            }
        }
        match &config.moe {
            Some(moe) => {
                list.extend(layout::expert_tensors(config, layer, moe));
                list.extend(layout::feed_forward_tensors(config, layer, "_shexp", config.feed_forward));
                list.push(t("ffn_gate_inp_shexp.weight", &[e]));
            }
            None => list.extend(layout::feed_forward_tensors(config, layer, "", config.feed_forward)),
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
        let normed = norm(g, x, w.req("attn_norm.weight"), c.rms_epsilon);
        let h = match c.is_linear(layer) {
            true => blocks::gated_delta_net(g, step, layer, w, normed),
            false => gated_attention(g, step, layer, w, normed),
        };
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = norm(g, ffn_in, w.req("post_attention_norm.weight"), c.rms_epsilon);
        let out = match &c.moe {
            Some(moe) => {
                let routed = blocks::moe_feed_forward(g, step, w, moe, h);
                let shared = blocks::feed_forward(g, step, w, "_shexp", h);
                let gate = g.sigmoid(g.mul_mat(g.stored(w.req("ffn_gate_inp_shexp.weight")), h));
                g.add(routed, g.mul(shared, gate))
            }
            None => blocks::feed_forward(g, step, w, "", h),
        };
        g.add(out, ffn_in)
    }
}

/// Qwen3.5's full attention: queries and an output gate from one projection (per head: its queries,
/// then its gate), per-head RMS norms of Q and K, interleaved M-RoPE, attention over the KV cache, the
/// result scaled by σ(gate) before the output projection.
fn gated_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let (heads, kv_heads) = (step.heads() as i64, step.kv_heads() as i64);
    let both = g.reshape_3d(linear(g, w.req("attn_q.weight"), None, x), 2 * hd, heads, t);
    let half = |offset: usize| g.view(both, &[hd, heads, t], &[both.strides()[1], both.strides()[2]], offset);
    let q = norm(g, half(0), w.req("attn_q_norm.weight"), c.rms_epsilon);
    let gate = g.reshape_2d(g.cont(half(hd as usize * 4)), hd * heads, t);
    let k = g.reshape_3d(linear(g, w.req("attn_k.weight"), None, x), hd, kv_heads, t);
    let k = norm(g, k, w.req("attn_k_norm.weight"), c.rms_epsilon);
    let v = g.reshape_3d(linear(g, w.req("attn_v.weight"), None, x), hd, kv_heads, t);
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: step.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    };
    let sections = c.rope_sections.expect("qwen35 reads its RoPE sections when the model opens");
    let positions = step.position_sections.expect("a stage with full-attention layers has their positions");
    let q = g.rope_multi(q, positions, sections, &rope);
    let k = g.rope_multi(k, positions, sections, &rope);
    let (q, k, v) = step.rotated_for_cache(g, q, k, v);
    let width = kv_heads * hd;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    let rows = step.cache_rows.expect("a stage with full-attention layers has their cache rows");
    let local = layer - step.layers.start;
    step.cache.store(g, local, k_rows, Some(v_rows), rows);
    let keys = CachedKeys { layer: local, key_head: c.head_dim, value_head: c.head_dim, sliding: false };
    let attended = step.unrotated_values(g, attend(g, step, q, keys, c.attention_scale, None));
    let attended = g.reshape_2d(attended, hd * heads, t);
    let gated = g.mul(attended, g.sigmoid(gate));
    step.complete(g, g.mul_mat(g.stored(w.req("attn_output.weight")), gated))
}

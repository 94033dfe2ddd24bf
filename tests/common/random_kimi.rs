//! Kimi K3 (`kimi-k3`) in miniature, as random weights: its metadata and layers, written beside the
//! other random models of [`super::random_model`] (which writes the embeddings and tokenizer).

use super::gguf_writer::{GgufWriter, Meta};
use super::random_model::{mla_attention, RandomLinear, RandomMla, RandomModel, Weights};
use shoal::model::Value;

/// Kimi K3's own shape beside its delta attention (`RandomModel::linear`: convolution, head width,
/// every `interval`-th layer latent attention) and latent attention (`RandomModel::mla`).
#[derive(Clone, Copy, Debug)]
pub struct RandomKimi {
    /// The routed experts' latent width.
    pub latent: usize,
    /// Every this many layers a residual checkpoint is banked (0: the plain residual stream).
    pub residual_block: usize,
    /// `kda.gate_lower_bound` (K3: -5), or kimi-linear's softplus decay when `None`.
    pub decay_lower_bound: Option<f32>,
}

/// Kimi K3 in miniature: 5 layers, the third and fifth latent attention (a query bottleneck of 32, a
/// latent of 32 with 8 unturned rotary values, 4 heads) and the others Kimi delta attention (4 heads of
/// 16, a 4-wide convolution, K3's bounded decay); the first layer dense, the others 16 experts of which
/// 4 are used, computing in a latent width of 48, plus a shared expert; a residual checkpoint banked
/// every 2 layers.
pub fn kimi_k3() -> RandomModel {
    let base = super::random_model::deepseek2();
    RandomModel {
        architecture: "kimi-k3",
        layers: 5,
        nextn_layers: 0,
        mla: Some(RandomMla { yarn: false, sigmoid_groups: None, ..base.mla.unwrap() }),
        linear: Some(RandomLinear {
            conv_kernel: 4,
            head_width: 16,
            key_heads: 4,
            value_heads: 4,
            interval: 2,
            sections: [0; 4],
            shared_width: 0,
            fused_input: false,
        }),
        kimi: Some(RandomKimi { latent: 48, residual_block: 2, decay_lower_bound: Some(-5.0) }),
        seed: 0x5eed_0010,
        ..base
    }
}

/// [`kimi_k3`] without residual checkpoints and with kimi-linear's softplus decay: the plain residual
/// stream through every layer.
pub fn kimi_k3_plain() -> RandomModel {
    let k3 = kimi_k3();
    RandomModel {
        kimi: Some(RandomKimi { residual_block: 0, decay_lower_bound: None, ..k3.kimi.unwrap() }),
        seed: 0x5eed_0011,
        ..k3
    }
}

/// [`kimi_k3`] with kimi-linear's softplus decay (and other weights). The tensor-parallel tests bound
/// their difference from the whole model by how far the model moves when nudged; [`kimi_k3`]'s weights
/// turn rounding into whole units of logits at a few tokens (llama.cpp's own two ways of computing
/// the same prompt differ there as much; see tests/engine_batching.rs), which no such bound allows.
pub fn kimi_k3_softplus() -> RandomModel {
    let k3 = kimi_k3();
    RandomModel { kimi: Some(RandomKimi { decay_lower_bound: None, ..k3.kimi.unwrap() }), seed: 0x5eed_0012, ..k3 }
}

/// Whether layer `l` is latent attention (the others are delta attention).
fn is_full(linear: &RandomLinear, l: usize) -> bool {
    (l + 1).is_multiple_of(linear.interval)
}

/// Kimi K3's metadata beyond the common keys.
pub(super) fn metadata(mut g: GgufWriter, model: &RandomModel, kimi: &RandomKimi) -> GgufWriter {
    let (mla, linear) = (model.mla.unwrap(), model.linear.unwrap());
    let k = |key: &str| format!("kimi-k3.{key}");
    let per_layer_kv: Vec<Value> =
        (0..model.layers).map(|l| Value::U32(if is_full(&linear, l) { 1 } else { 0 })).collect();
    g.meta.retain(|(key, _)| *key != k("attention.head_count_kv"));
    g = g
        .meta(&k("attention.head_count_kv"), Meta::Value(Value::Array(per_layer_kv)))
        .meta(&k("attention.q_lora_rank"), Meta::U32(mla.q_lora_rank as u32))
        .meta(&k("attention.kv_lora_rank"), Meta::U32(mla.kv_lora_rank as u32))
        .meta(&k("attention.key_length_mla"), Meta::U32((mla.nope + model.rope_dims) as u32))
        .meta(&k("attention.value_length_mla"), Meta::U32(mla.value_head as u32))
        .meta(&k("ssm.conv_kernel"), Meta::U32(linear.conv_kernel as u32))
        .meta(&k("kda.head_dim"), Meta::U32(linear.head_width as u32))
        .meta(&k("leading_dense_block_count"), Meta::U32(model.leading_dense as u32))
        .meta(&k("expert_shared_count"), Meta::U32(model.shared_experts as u32))
        .meta(&k("expert_gating_func"), Meta::U32(2))
        .meta(&k("expert_weights_scale"), Meta::F32(2.5))
        .meta(&k("expert_weights_norm"), Meta::Value(Value::Bool(true)))
        .meta(&k("expert_latent_length"), Meta::U32(kimi.latent as u32))
        .meta(&k("activation.situ_beta"), Meta::F32(2.0))
        .meta(&k("activation.situ_linear_beta"), Meta::F32(4.0))
        .meta(&k("attn_res.block_size"), Meta::U32(kimi.residual_block as u32));
    if let Some(bound) = kimi.decay_lower_bound {
        g = g.meta(&k("kda.gate_lower_bound"), Meta::F32(bound));
    }
    g
}

/// Every layer's tensors and the final residual mix.
pub(super) fn layers(mut g: GgufWriter, model: &RandomModel, kimi: &RandomKimi, w: &mut Weights) -> GgufWriter {
    let (mla, linear) = (model.mla.unwrap(), model.linear.unwrap());
    let e = model.embedding as u64;
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    if kimi.residual_block > 0 {
        g = g.f32_values("output_res_score.weight", &[e], &w.uniform(e, 0.5));
    }
    for l in 0..model.layers {
        let n = |part: &str| format!("blk.{l}.{part}");
        if is_full(&linear, l) {
            // The attention norm, latent attention, the output projection and the feed-forward norm.
            g = mla_attention(g, model, &mla, l, w);
            let gated = (model.heads * mla.value_head) as u64;
            g = g.f16_values(&n("attn_gate.weight"), &[e, gated], &w.uniform(e * gated, proj(e)));
        } else {
            g = g.f32_values(&n("attn_norm.weight"), &[e], &w.around_one(e, 0.1)).f32_values(
                &n("ffn_norm.weight"),
                &[e],
                &w.around_one(e, 0.1),
            );
            g = delta_attention(g, &linear, l, e, w);
        }
        if kimi.residual_block > 0 {
            g = g.f32_values(&n("attn_res_score.weight"), &[e], &w.uniform(e, 0.5)).f32_values(
                &n("ffn_res_score.weight"),
                &[e],
                &w.uniform(e, 0.5),
            );
        }
        g = feed_forward(g, model, kimi, l, w);
    }
    g
}

/// Layer `l`'s Kimi delta attention.
fn delta_attention(mut g: GgufWriter, linear: &RandomLinear, l: usize, e: u64, w: &mut Weights) -> GgufWriter {
    let n = |part: &str| format!("blk.{l}.{part}");
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    let (head, heads, kernel) = (linear.head_width as u64, linear.value_heads as u64, linear.conv_kernel as u64);
    let inner = head * heads;
    for part in ["attn_q", "attn_k", "attn_v"] {
        g = g.f16_values(&n(&format!("{part}.weight")), &[e, inner], &w.uniform(e * inner, proj(e)));
    }
    for part in ["q", "k", "v"] {
        let name = n(&format!("ssm_conv1d_{part}.weight"));
        g = g.f32_values(&name, &[kernel, 1, inner], &w.uniform(kernel * inner, 0.6));
    }
    // -exp(A_log): negative, so that each channel decays.
    let a: Vec<f32> = w.uniform(heads, 0.5).into_iter().map(|v| -(v + 1.0)).collect();
    g.f16_values(&n("ssm_f_a.weight"), &[e, head], &w.uniform(e * head, proj(e)))
        .f16_values(&n("ssm_f_b.weight"), &[head, inner], &w.uniform(head * inner, proj(head)))
        .f16_values(&n("ssm_beta.weight"), &[e, heads], &w.uniform(e * heads, proj(e)))
        .f32_values(&n("ssm_a"), &[heads], &a)
        .f32_values(&n("ssm_dt.bias"), &[inner], &w.uniform(inner, 0.5))
        .f16_values(&n("ssm_g.weight"), &[e, inner], &w.uniform(e * inner, proj(e)))
        .f32_values(&n("ssm_norm.weight"), &[head], &w.around_one(head, 0.1))
        .f16_values(&n("attn_output.weight"), &[inner, e], &w.uniform(inner * e, proj(inner)))
}

/// Layer `l`'s feed-forward: dense among the leading layers, else latent experts and a shared expert.
fn feed_forward(g: GgufWriter, model: &RandomModel, kimi: &RandomKimi, l: usize, w: &mut Weights) -> GgufWriter {
    let n = |part: &str| format!("blk.{l}.{part}");
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    let e = model.embedding as u64;
    if l < model.leading_dense {
        let ff = model.feed_forward as u64;
        return g
            .f16_values(&n("ffn_gate.weight"), &[e, ff], &w.uniform(e * ff, proj(e)))
            .f16_values(&n("ffn_up.weight"), &[e, ff], &w.uniform(e * ff, proj(e)))
            .f16_values(&n("ffn_down.weight"), &[ff, e], &w.uniform(ff * e, proj(ff)));
    }
    let (n_exp, f, latent) = (model.experts as u64, model.expert_feed_forward as u64, kimi.latent as u64);
    let sf = f * model.shared_experts as u64;
    g.f16_values(&n("ffn_gate_inp.weight"), &[e, n_exp], &w.uniform(e * n_exp, proj(e) * 2.0))
        .f32_values(&n("exp_probs_b.bias"), &[n_exp], &w.uniform(n_exp, 0.3))
        .f16_values(&n("ffn_routed_down.weight"), &[e, latent], &w.uniform(e * latent, proj(e)))
        .f16_values(&n("ffn_gate_exps.weight"), &[latent, f, n_exp], &w.uniform(latent * f * n_exp, proj(latent)))
        .f16_values(&n("ffn_up_exps.weight"), &[latent, f, n_exp], &w.uniform(latent * f * n_exp, proj(latent)))
        .f16_values(&n("ffn_down_exps.weight"), &[f, latent, n_exp], &w.uniform(f * latent * n_exp, proj(f)))
        .f32_values(&n("ffn_routed_norm.weight"), &[latent], &w.around_one(latent, 0.1))
        .f16_values(&n("ffn_routed_up.weight"), &[latent, e], &w.uniform(latent * e, proj(latent)))
        .f16_values(&n("ffn_gate_shexp.weight"), &[e, sf], &w.uniform(e * sf, proj(e)))
        .f16_values(&n("ffn_up_shexp.weight"), &[e, sf], &w.uniform(e * sf, proj(e)))
        .f16_values(&n("ffn_down_shexp.weight"), &[sf, e], &w.uniform(sf * e, proj(sf)))
}

//! Qwen3-Next's layer (`qwen3next`; declared in [`crate::model::arch::Qwen3Next`]), as llama.cpp's
//! `src/models/qwen3next.cpp` computes it: the gated delta-net from its own projections (split or
//! fused input, beta and alpha from one `ssm_ba`), or Qwen3.5's gated full attention with NeoX RoPE;
//! then routed experts and the gated shared expert; each behind an RMS norm and a residual.

use super::qwen35::{gated_attention, gated_shared_experts};
use super::{Bound, Graph};
use crate::engine::blocks::{self, linear, norm, DeltaNetInputs, DeltaNetWeights, OutputGate, StepContext};
use crate::ggml::{GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::{DeltaNetInput, GroupedDeltaNet, Qwen3Next, Qwen3NextMixer};
use crate::model::LinearAttention;

impl Graph for Qwen3Next {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("qwen3next reads its expert parameters when the model opens");
        let normed = norm(g, x, &w.attn_norm, c.rms_epsilon);
        let h = match &w.mixer {
            Qwen3NextMixer::Linear(net) => grouped_delta_net(g, step, layer, net, normed),
            Qwen3NextMixer::Full(attention) => gated_attention(g, step, layer, attention, normed),
        };
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = norm(g, ffn_in, &w.post_attention_norm, c.rms_epsilon);
        g.add(gated_shared_experts(g, step, &w.experts, moe, h), ffn_in)
    }
}

/// Qwen3-Next's gated delta-net over `x` (normed, [embedding, tokens]): its projections, then the
/// convolution, delta rule and gated output every gated delta-net shares ([`blocks::delta_net`]).
fn grouped_delta_net<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &GroupedDeltaNet<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let shape = step.linear_attention();
    let t = step.tokens();
    let (key_heads, value_heads) = (shape.key_heads as i64, shape.value_heads as i64);
    let per_key = value_heads / key_heads;
    let (mixed, gate) = match &w.input {
        DeltaNetInput::Split(split) => (linear(g, &split.qkv, None, x), linear(g, &split.gate, None, x)),
        DeltaNetInput::Fused(fused) => unfused(g, shape, linear(g, &fused.qkvz, None, x), t),
    };
    // Per key head: its group's betas, then their alphas.
    let ba = g.reshape_3d(linear(g, &w.beta_alpha, None, x), 2 * per_key, key_heads, t);
    let half = |offset: usize| g.view(ba, &[per_key, key_heads, t], &[ba.strides()[1], ba.strides()[2]], offset);
    let beta = g.reshape_2d(g.sigmoid(g.cont(half(0))), value_heads, t);
    let alpha = g.reshape_2d(g.cont(half(per_key as usize * 4)), value_heads, t);
    let inputs = DeltaNetInputs { mixed, gate, beta, decay: blocks::decay(g, alpha, &w.dt_bias, &w.a) };
    let weights = DeltaNetWeights { conv: g.stored(&w.conv), norm: &w.norm, output: &w.output, gate: OutputGate::Silu };
    blocks::delta_net(g, step, layer, inputs, weights)
}

/// `ssm_in`'s output ([channels + inner, tokens], per key head its queries, keys, values and gates)
/// reordered as `attn_qkv` and `attn_gate` give them: all queries, all keys, all values [channels,
/// tokens], and the gates [inner, tokens].
fn unfused<'g>(g: &'g GraphBuilder, shape: &LinearAttention, qkvz: Tensor<'g>, t: i64) -> (Tensor<'g>, Tensor<'g>) {
    let (head, key_heads) = (shape.head_width as i64, shape.key_heads as i64);
    let values_per_key = shape.inner as i64 / key_heads;
    let per_key = 2 * head + 2 * values_per_key;
    let grouped = g.reshape_3d(qkvz, per_key, key_heads, t);
    let part = |width: i64, offset: i64| {
        let view =
            g.view(grouped, &[width, key_heads, t], &[grouped.strides()[1], grouped.strides()[2]], offset as usize * 4);
        g.reshape_2d(g.cont(view), width * key_heads, t)
    };
    let (q, k) = (part(head, 0), part(head, head));
    let (v, z) = (part(values_per_key, 2 * head), part(values_per_key, 2 * head + values_per_key));
    (g.concat(g.concat(q, k, 0), v, 0), z)
}

//! Kimi K3's layer (`kimi-k3`; declared in [`crate::model::arch::KimiK3`]), as llama.cpp's
//! `src/models/kimi-k3.cpp` computes it: the residual stream with its banked checkpoints mixed before
//! attention and before the feed-forward, Kimi delta attention or gated latent attention without RoPE,
//! and a situ feed-forward (dense, or latent routed experts plus shared experts).
//!
//! The hidden state between layers (and between pipeline stages) carries the checkpoints: per token,
//! the banked layer inputs one after the other, then the running stream, each `embedding` wide
//! ([`crate::model::ModelConfig::hidden_width`]). A layer that banks (every `attn_res.block_size`-th)
//! appends its input and restarts the stream from its attention's output.

use super::deepseek2::{latent_heads, Sparsity};
use super::{Bound, Graph};
use crate::engine::blocks::{self, norm, Activation, StepContext};
use crate::ggml::{GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::{GatedLatentAttention, KimiFeedForward, KimiK3, KimiMixer, LatentExperts};
use crate::model::{ExpertActivation, ModelConfig, MoeParams};

impl Graph for KimiK3 {
    /// Its latent attention is DeepSeek's split form, whose fresh segments may attend expanded.
    fn attends_fresh_segments_apart(&self, _config: &ModelConfig) -> bool {
        true
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("kimi-k3 reads its expert parameters when the model opens");
        let Residual { banked, stream } = Residual::of(g, c, layer, x);
        let scores = w.residual_scores.as_ref();
        let attention_in = mix(g, c, banked, stream, scores.map(|s| &s.attention));
        let banks = c.residual_block.is_some_and(|block| layer.is_multiple_of(block));
        let banked = if banks { Some(append(g, banked, stream)) } else { banked };
        let normed = norm(g, attention_in, &w.attn_norm, c.rms_epsilon);
        let h = match &w.mixer {
            KimiMixer::Linear(delta) => blocks::kimi_delta_attention(g, step, layer, delta, normed),
            KimiMixer::Full(attention) => gated_latent_attention(g, step, layer, attention, normed),
        };
        let stream = if banks { h } else { g.add(stream, h) };
        let ffn_in = mix(g, c, banked, stream, scores.map(|s| &s.feed_forward));
        let h = norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        let h = match &w.feed_forward {
            KimiFeedForward::Dense(dense) => blocks::gated_feed_forward(g, step, dense.matrices(), h, situ(moe)),
            KimiFeedForward::Sparse(experts) => latent_experts(g, step, experts, moe, h),
        };
        Residual { banked, stream: g.add(stream, h) }.joined(g)
    }

    fn after_last_layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        output_mix: Option<&SetTensorRef>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let Residual { banked, stream } = Residual::of(g, c, c.layers, x);
        step.output_rows_of(g, mix(g, c, banked, stream, output_mix))
    }
}

/// The hidden state entering a layer, taken apart: the banked checkpoints ([embedding, checkpoints,
/// tokens], none before the first bank) and the running stream ([embedding, tokens]).
struct Residual<'g> {
    banked: Option<Tensor<'g>>,
    stream: Tensor<'g>,
}

impl<'g> Residual<'g> {
    /// `x` ([hidden width, tokens]) entering layer `layer`, as views.
    fn of(g: &'g GraphBuilder, c: &ModelConfig, layer: usize, x: Tensor<'g>) -> Residual<'g> {
        let checkpoints = c.residual_checkpoints(layer) as i64;
        if checkpoints == 0 {
            return Residual { banked: None, stream: x };
        }
        let (e, t) = (c.embedding as i64, x.shape()[1]);
        let [_, row, ..] = x.strides();
        let vector = e as usize * 4;
        let banked = g.view(x, &[e, checkpoints, t], &[vector, row], 0);
        let stream = g.cont(g.view(x, &[e, t], &[row], checkpoints as usize * vector));
        Residual { banked: Some(banked), stream }
    }

    /// The hidden state leaving a layer: the checkpoints, then the stream, per token.
    fn joined(self, g: &'g GraphBuilder) -> Tensor<'g> {
        match self.banked {
            None => self.stream,
            Some(banked) => {
                let all = append(g, Some(banked), self.stream);
                let [e, n, t, _] = all.shape();
                g.reshape_2d(all, e * n, t)
            }
        }
    }
}

/// `banked` with `stream` appended as its newest checkpoint: [embedding, checkpoints + 1, tokens].
fn append<'g>(g: &'g GraphBuilder, banked: Option<Tensor<'g>>, stream: Tensor<'g>) -> Tensor<'g> {
    let [e, t, ..] = stream.shape();
    let checkpoint = g.reshape_3d(g.cont(stream), e, 1, t);
    match banked {
        Some(banked) => g.concat(banked, checkpoint, 1),
        None => checkpoint,
    }
}

/// The residual mix a layer reads: each banked checkpoint and the stream scored per token (RMS-normed,
/// times `score`, summed), a softmax over the scores, and the checkpoints' and stream's raw values
/// summed by it. The stream alone when nothing is banked yet or the model mixes nothing.
fn mix<'g>(
    g: &'g GraphBuilder,
    c: &ModelConfig,
    banked: Option<Tensor<'g>>,
    stream: Tensor<'g>,
    score: Option<&SetTensorRef>,
) -> Tensor<'g> {
    let (Some(banked), Some(score)) = (banked, score) else { return stream };
    let [_, n, t, _] = banked.shape();
    let eps = c.rms_epsilon;
    let banked_scores = g.sum_rows(g.mul(g.rms_norm(banked, eps), g.stored(score))); // [1, n, tokens]
    let banked_scores = g.reshape_2d(banked_scores, n, t);
    let stream_scores = g.sum_rows(g.mul(g.rms_norm(stream, eps), g.stored(score))); // [1, tokens]
    let probs = g.soft_max(g.concat(banked_scores, stream_scores, 0)); // [n + 1, tokens]
    let row = probs.strides()[1];
    let banked_weights = g.cont(g.view(probs, &[n, t], &[row], 0));
    let stream_weight = g.cont(g.view(probs, &[1, t], &[row], n as usize * 4));
    g.add(g.weighted_streams(banked, banked_weights), g.mul(stream, stream_weight))
}

/// The situ activation of the model's experts (every Kimi K3 feed-forward uses it).
fn situ(moe: &MoeParams) -> Activation {
    match moe.activation {
        ExpertActivation::Situ { beta, linear_beta } => Activation::Situ { beta, linear_beta },
        _ => Activation::Silu,
    }
}

/// Latent attention without RoPE, its heads' output scaled by σ(`attn_gate` · x) (x: the normed layer
/// input), then projected.
fn gated_latent_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &GatedLatentAttention<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let heads = latent_heads(g, step, layer, &w.attention, Sparsity::Dense, x, false);
    let heads = match &w.gate {
        Some(gate) => g.mul(heads, g.sigmoid(g.mul_mat(g.stored(gate), x))),
        None => heads,
    };
    // A tensor-parallel rank's heads give its part of the output projection; the group sums the parts.
    step.complete(g, g.mul_mat(g.stored(&w.attention.output), heads))
}

/// The routed experts in their latent width (the router reading `x` whole), the latent norm and the
/// projection back, plus the shared experts over `x`.
fn latent_experts<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LatentExperts<SetTensorRef>,
    moe: &MoeParams,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let latent_in = match &w.latent {
        Some(latent) => g.mul_mat(g.stored(&latent.down), x),
        None => x,
    };
    let mut out = blocks::moe_feed_forward_routed_by(g, step, &w.routed, moe, x, latent_in);
    if let Some(latent) = &w.latent {
        if let Some(latent_norm) = &latent.norm {
            out = norm(g, out, latent_norm, c.rms_epsilon);
        }
        out = g.mul_mat(g.stored(&latent.up), out);
    }
    match &w.shared {
        Some(shared) => g.add(out, blocks::gated_feed_forward(g, step, shared.matrices(), x, situ(moe))),
        None => out,
    }
}

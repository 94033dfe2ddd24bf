//! Gemma 3's layer (`gemma3`; declared in [`crate::model::arch::Gemma3`]), as llama.cpp's
//! `src/models/gemma3.cpp` computes it: Q scaled before the product (the product then left unscaled),
//! RMS norms before and after the attention and the GELU-gated feed-forward.

use super::{Bound, Graph};
use crate::engine::blocks::{self, Activation, AttentionParams, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::Gemma3;

impl Graph for Gemma3 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let eps = c.rms_epsilon;
        let params =
            AttentionParams { q_scale: Some(c.attention_scale), kq_scale: 1.0, ..AttentionParams::of(c, layer) };
        let h = blocks::attention(g, step, layer, &w.attention, blocks::norm(g, x, &w.attn_norm, eps), &params);
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let h = blocks::norm(g, h, &w.post_attention_norm, eps);
        let attended = g.add(h, residual);
        let h = blocks::norm(g, attended, &w.ffn_norm, eps);
        let h = blocks::gated_feed_forward(g, step, w.feed_forward.matrices(), h, Activation::Gelu);
        let h = blocks::norm(g, h, &w.post_ffw_norm, eps);
        g.add(h, attended)
    }
}

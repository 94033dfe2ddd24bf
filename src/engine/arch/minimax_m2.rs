//! MiniMax M2's layer (`minimax-m2`; declared in [`crate::model::arch::MinimaxM2`]), as llama.cpp's
//! `src/models/minimax-m2.cpp` computes it: attention with Q and K normed across all heads, then the
//! routed experts, each behind an RMS norm and a residual.

use super::{Bound, Graph};
use crate::engine::blocks::{self, AttentionParams, QkNorm, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::MinimaxM2;

impl Graph for MinimaxM2 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("minimax-m2 reads its expert parameters when the model opens");
        let params = AttentionParams { qk_norm: QkNorm::AcrossHeads, ..AttentionParams::of(c, layer) };
        let ffn_in = blocks::attention_block_with(g, step, layer, &w.attn_norm, &w.attention, x, &params);
        let h = blocks::norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        g.add(blocks::moe_feed_forward(g, step, &w.experts, moe, h), ffn_in)
    }
}

//! gpt-oss's layer (`gpt-oss`; declared in [`crate::model::arch::GptOss`]), as llama.cpp's
//! `src/models/openai-moe.cpp` computes it: attention with sinks, then the experts behind a
//! `post_attention_norm`.

use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::GptOss;

impl Graph for GptOss {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("gpt-oss reads its expert parameters when the model opens");
        let ffn_in = blocks::attention_block(g, step, layer, &w.attn_norm, &w.attention, x);
        let h = blocks::norm(g, ffn_in, &w.post_attention_norm, c.rms_epsilon);
        g.add(blocks::moe_feed_forward(g, step, &w.experts, moe, h), ffn_in)
    }
}

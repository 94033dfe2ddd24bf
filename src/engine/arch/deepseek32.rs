//! DeepSeek V3.2's layer (`deepseek32`; declared in [`crate::model::arch::Deepseek32`]), as llama.cpp's
//! `src/models/deepseek32.cpp` computes it: DeepSeek V3's layer whose latent attention is sparse, each
//! query attending only to the positions the layer's lightning indexer chooses for it.

use super::deepseek2::{latent_layer, Sparsity};
use super::{Bound, Graph};
use crate::engine::blocks::StepContext;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::Deepseek32;

impl Graph for Deepseek32 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let norms = [&w.attn_norm, &w.ffn_norm];
        latent_layer(g, step, layer, norms, &w.attention, Sparsity::Indexed(&w.indexer), &w.feed_forward, x)
    }
}

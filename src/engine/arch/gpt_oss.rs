//! OpenAI's gpt-oss (`gpt-oss`), as llama.cpp's `src/models/openai-moe.cpp` computes it: attention with
//! biases on Q, K, V and the output and a learned sink per head (a logit in each softmax that attends to
//! nothing); every other layer attends through a sliding window; a `post_attention_norm` before the
//! feed-forward, whose experts have biases of their own, are chosen by the router's raw logits (plus
//! its bias) and weighed by a softmax over the chosen ones, and use a clamped SwiGLU. Its expert weights
//! usually come as MXFP4.

use super::ArchSpec;
use crate::engine::blocks::{self, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor, Part};
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct GptOss;

pub static GPT_OSS: GptOss = GptOss;

/// gpt-oss's default: layers alternate, the first slides.
const DEFAULT_PATTERN: usize = 2;

impl ArchSpec for GptOss {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        let mut window = super::sliding_window(keys, config, DEFAULT_PATTERN, config.rope.freq_base)?
            .ok_or_else(|| keys.arch_invalid("attention.sliding_window", "is missing"))?;
        window.freq_scale = config.rope.freq_scale;
        config.sliding_window = Some(window);
        let (experts, experts_used) = super::expert_counts(keys)?;
        config.moe = Some(MoeParams {
            experts,
            experts_used,
            expert_feed_forward: keys.arch_count("expert_feed_forward_length")?,
            gating: Gating::SoftmaxWeight,
            activation: ExpertActivation::SwigluOai,
            normalize: false,
            scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
            shared_experts: 0,
            leading_dense_layers: 0,
            groups: super::expert_groups(keys, experts)?,
        });
        Ok(())
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let moe = config.moe.as_ref().expect("gpt-oss reads its expert parameters when the model opens");
        let (e, f, n) = (config.embedding, moe.expert_feed_forward, moe.experts);
        let t = |part: &str, shape: &[usize]| ExpectedTensor::layer(layer, part, shape, true);
        let mut list = layout::attention_tensors(config, layer, None);
        list.push(t("attn_sinks.weight", &[config.heads]).split(0, Part::QueryHeads));
        list.push(t("post_attention_norm.weight", &[e]));
        list.extend(layout::expert_tensors(config, layer, moe));
        list.push(t("ffn_gate_inp.bias", &[n]));
        list.push(t("ffn_gate_exps.bias", &[f, n]).split(1, Part::Experts));
        list.push(t("ffn_up_exps.bias", &[f, n]).split(1, Part::Experts));
        list.push(t("ffn_down_exps.bias", &[e, n]).split(1, Part::Experts));
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
        let moe = c.moe.as_ref().expect("gpt-oss reads its expert parameters when the model opens");
        let ffn_in = blocks::attention_block(g, step, layer, w, x);
        let h = blocks::norm(g, ffn_in, w.req("post_attention_norm.weight"), c.rms_epsilon);
        g.add(blocks::moe_feed_forward(g, step, w, moe, h), ffn_in)
    }
}

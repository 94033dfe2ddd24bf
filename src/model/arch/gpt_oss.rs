//! OpenAI's gpt-oss (`gpt-oss`): attention with biases on Q, K, V and the output and a learned sink per
//! head (a logit in each softmax that attends to nothing); every other layer attends through a sliding
//! window; a `post_attention_norm` before the feed-forward, whose experts have biases of their own, are
//! chosen by the router's raw logits (plus its bias) and weighed by a softmax over the chosen ones, and
//! use a clamped SwiGLU. Its expert weights usually come as MXFP4.

use super::groups::{Attention, Experts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::layout::Part;
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct GptOss;

tensor_group! {
    /// A gpt-oss layer.
    pub struct GptOssLayer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        post_attention_norm: tensor "post_attention_norm.weight",
        experts: group Experts,
    }
}

/// gpt-oss's default: layers alternate, the first slides.
const DEFAULT_PATTERN: usize = 2;

impl Declare for GptOss {
    type Layer = GptOssLayer<Declared>;

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

    fn layer(&self, config: &ModelConfig, _layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("gpt-oss reads its expert parameters when the model opens");
        let (e, f, n) = (config.embedding, moe.expert_feed_forward, moe.experts);
        GptOssLayer {
            attn_norm: Declared::new(&[e]),
            attention: Attention {
                sinks: Some(Declared::new(&[config.heads]).split(0, Part::QueryHeads)),
                ..Attention::declare(config, None)
            },
            post_attention_norm: Declared::new(&[e]),
            experts: Experts {
                router_bias: Some(Declared::new(&[n])),
                gate_bias: Some(Declared::new(&[f, n]).split(1, Part::Experts)),
                up_bias: Some(Declared::new(&[f, n]).split(1, Part::Experts)),
                down_bias: Some(Declared::new(&[e, n]).split(1, Part::Experts)),
                ..Experts::declare(config, moe)
            },
        }
    }
}

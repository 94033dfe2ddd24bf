//! GLM-4.5, 4.6 and 4.7 (`glm4moe`): attention with biases on Q, K and V (and per-head Q/K norms in the
//! files that have them), RoPE on the first `rope.dimension_count` values of each head; a
//! `post_attention_norm` before the feed-forward, which is dense in the first
//! `leading_dense_block_count` layers and elsewhere routed experts (sigmoid scores; `exp_probs_b`
//! biases which experts are chosen, not their weights) plus a shared expert. The next-token-prediction
//! layers at the end of the file are skipped.

use super::groups::{Attention, SparseOrDense};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct Glm4Moe;

tensor_group! {
    /// A GLM-4.5 layer.
    pub struct Glm4MoeLayer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        post_attention_norm: tensor "post_attention_norm.weight",
        feed_forward: group SparseOrDense,
    }
}

impl Declare for Glm4Moe {
    type Layer = Glm4MoeLayer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        if keys.arch_sections_in_use("rope.dimension_sections") {
            return Err(
                keys.arch_invalid("rope.dimension_sections", "asks for multimodal RoPE, which shoal does not run")
            );
        }
        let (experts, experts_used) = super::expert_counts(keys)?;
        let expert_feed_forward = keys.arch_count("expert_feed_forward_length")?;
        let gating = match keys.arch_optional_count("expert_gating_func")? {
            None | Some(2) => Gating::Sigmoid,
            Some(1) => Gating::Softmax,
            Some(other) => {
                return Err(keys.arch_invalid("expert_gating_func", &format!("is {other}, a gating shoal does not run")))
            }
        };
        let leading_dense_layers = keys.arch_optional_count("leading_dense_block_count")?.unwrap_or(0);
        config.moe = Some(MoeParams {
            experts,
            experts_used,
            expert_feed_forward,
            gating,
            activation: ExpertActivation::Silu,
            normalize: keys.arch_optional_bool("expert_weights_norm")?.unwrap_or(false),
            scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
            shared_experts: keys.arch_optional_count("expert_shared_count")?.unwrap_or(0),
            leading_dense_layers: leading_dense_layers.min(config.layers),
            groups: super::expert_groups(keys, experts)?,
        });
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("glm4moe reads its expert parameters when the model opens");
        Glm4MoeLayer {
            attn_norm: Declared::new(&[config.embedding]),
            attention: Attention::declare(config, Some(false)),
            post_attention_norm: Declared::new(&[config.embedding]),
            feed_forward: SparseOrDense::declare(config, moe, layer, true),
        }
    }
}

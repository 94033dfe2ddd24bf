//! MiniMax M2, M2.1 and M2.5 (`minimax-m2`): grouped-query attention whose queries and keys are
//! RMS-normed across all heads at once (each norm weight as wide as all its heads, not one head), NeoX
//! RoPE on the first `rope.dimension_count` values of each head; routed experts in every layer, chosen
//! by sigmoid scores plus a selection bias (`exp_probs_b`), their weights normalised to sum to one and
//! not scaled (llama.cpp reads no scale for this architecture); each expert as wide as
//! `feed_forward_length`. No shared expert, no dense layer.

use super::groups::{Attention, Experts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::layout::Part;
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct MinimaxM2;

tensor_group! {
    /// A MiniMax M2 layer.
    pub struct MinimaxM2Layer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        ffn_norm: tensor "ffn_norm.weight",
        experts: group Experts,
    }
}

impl Declare for MinimaxM2 {
    type Layer = MinimaxM2Layer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        let (experts, experts_used) = super::expert_counts(keys)?;
        let gating = match keys.arch_optional_count("expert_gating_func")? {
            None | Some(2) => Gating::Sigmoid,
            Some(1) => Gating::Softmax,
            Some(other) => {
                return Err(keys.arch_invalid("expert_gating_func", &format!("is {other}, a gating shoal does not run")))
            }
        };
        config.moe = Some(MoeParams {
            experts,
            experts_used,
            // As llama.cpp reads the experts' shape (converted files write both keys alike).
            expert_feed_forward: config.feed_forward,
            gating,
            activation: ExpertActivation::Silu,
            normalize: true,
            scale: 0.0,
            shared_experts: 0,
            leading_dense_layers: 0,
            groups: None,
        });
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn layer(&self, config: &ModelConfig, _layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("minimax-m2 reads its expert parameters when the model opens");
        let (q, kv) = (config.heads * config.head_dim, config.kv_heads * config.head_dim);
        // A tensor-parallel rank holds its query heads' share of the Q norm (the group sums the squares
        // the norm divides by) and every key head with the whole K norm: keys are few, and normed whole
        // they are exactly the unsplit model's; the rank then takes its own key heads.
        let attention = Attention {
            q_norm: Some(Declared::new(&[q]).split(0, Part::QueryHeads)),
            k: Declared::new(&[config.embedding, kv]),
            k_norm: Some(Declared::new(&[kv])),
            k_bias: None,
            ..Attention::declare(config, None)
        };
        MinimaxM2Layer {
            attn_norm: Declared::new(&[config.embedding]),
            attention,
            ffn_norm: Declared::new(&[config.embedding]),
            experts: Experts { selection_bias: Some(Declared::new(&[moe.experts])), ..Experts::declare(config, moe) },
        }
    }
}
